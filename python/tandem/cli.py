"""`tandem` command line: `tandem bench <name> ...`, `tandem info`, `tandem launch ...`."""

from __future__ import annotations

import sys

USAGE = """usage: tandem <command> [args]

commands:
  bench transport [-n N] [--out DIR] ...   put bandwidth and flag latency (N ranks; MPS on one GPU)
  bench gemm [--out DIR]                   the GEMM core vs cuBLAS, FP8 vs _scaled_mm, world 1
  bench tp -n N [--out DIR]                AG+GEMM / GEMM+RS / GEMM+AR vs cuBLAS + torch collective (naive)
  bench roles -n N [--out DIR]             the comm roles alone: GB/s per SM vs plain copies and cudaMemcpy
  bench train -n N [--out DIR]             a TP MLP block's forward + backward: tandem.nn fused / unfused vs naive
  bench moe -n N [--out DIR]               MoE dispatch+grouped GEMM fused vs unfused vs torch per expert
  bench attention -n N [--out DIR]         ring attention vs SDPA flash (N = 1) or a torch ring (N > 1)
  tune -n N [--shapes ...] [--out FILE]    measure the TP ops' modes and SM splits; write mode="auto"'s table
  launch -n N -- CMD ...                   run CMD as N ranks (same as python -m tandem.launch)
  info                                     GPUs, SM counts, MPS, build
"""


def info() -> int:
    import tandem
    from tandem.mps import gpu_count

    print(f"tandem {tandem.__version__}")
    try:
        print(f"native module: {tandem.cmake_prefix_path()}")
        from tandem._native import native

        print(f"built for CUDA architectures: {native().cuda_architectures}")
    except tandem.TandemError as e:
        print(f"native module: missing ({e})")
    n = gpu_count()
    print(f"GPUs (nvidia-smi): {n}")
    if n:
        import torch

        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            print(f"  {i}: {p.name}, {p.multi_processor_count} SMs, sm_{p.major}{p.minor}")
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "bench":
        if not rest:
            print(USAGE)
            return 2
        if rest[0] == "transport":
            from .bench.transport import main as bench_transport

            return bench_transport(rest[1:])
        if rest[0] == "gemm":
            from .bench.gemm import main as bench_gemm

            return bench_gemm(rest[1:])
        if rest[0] == "tp":
            from .bench.tp import main as bench_tp

            return bench_tp(rest[1:])
        if rest[0] == "train":
            from .bench.train import main as bench_train

            return bench_train(rest[1:])
        if rest[0] == "roles":
            from .bench.roles import main as bench_roles

            return bench_roles(rest[1:])
        if rest[0] == "moe":
            from .bench.moe import main as bench_moe

            return bench_moe(rest[1:])
        if rest[0] == "attention":
            from .bench.attention import main as bench_attention

            return bench_attention(rest[1:])
        print(f"unknown benchmark {rest[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    if cmd == "tune":
        from .tune import main as tune_main

        return tune_main(rest)
    if cmd == "launch":
        from .launch import main as launch_main

        return launch_main(rest)
    if cmd == "info":
        return info()
    print(f"unknown command {cmd!r}\n{USAGE}", file=sys.stderr)
    return 2
