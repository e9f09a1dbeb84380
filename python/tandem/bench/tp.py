"""AG+GEMM, GEMM+RS and GEMM+AR benchmark, N ranks (MPS on one GPU): fused vs unfused (tandem's own all-gather /
reduction kernel, then the GEMM, sequentially: the same transport without overlap) and vs the GEMM alone
(torch.matmul / cuBLAS on the same local problem: the compute floor), in the same run. CUDA events, warm-ups,
median. NCCL cannot host several ranks on one GPU, so the NCCL baseline waits for a multi-GPU machine.

    python -m tandem bench tp -n 2 [--out DIR]
"""

from __future__ import annotations

import os

# (M total, N, K) of the layer; AG: A_local = M/W x K, B = K x N; RS: A = M x K/W, B = K/W x N.
SHAPES = [(8192, 4096, 8192), (16384, 8192, 4096), (1024, 4096, 8192)]
SMALL_OUT_BYTES = 8 << 20  # AR outputs up to this size are also timed one-shot and two-shot


def run(shapes, reps, out_dir, command):
    import torch

    from .. import ops  # noqa: F401
    from ..ops import tp
    from ..transport import Communicator
    from . import common

    comm = Communicator(heap_bytes=8 << 30, timeout_s=60)
    world, rank = comm.world_size, comm.rank
    rows, data = [], []
    for m, n, k in shapes:
        ml, kl = m // world, k // world
        a_local = torch.randn(ml, k, device="cuda", dtype=torch.bfloat16)
        b_ag = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        a_rs = torch.randn(m, kl, device="cuda", dtype=torch.bfloat16)
        b_rs = torch.randn(kl, n, device="cuda", dtype=torch.bfloat16)
        a_full = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        res = {}
        for op, fn in (
            ("ag_fused", lambda: tp.ag_gemm(comm, a_local, b_ag, mode="fused")),
            ("ag_unfused", lambda: tp.ag_gemm(comm, a_local, b_ag, mode="unfused")),
            ("ag_gemm_only", lambda: torch.matmul(a_full, b_ag)),
            ("rs_fused", lambda: tp.gemm_rs(comm, a_rs, b_rs, mode="fused")),
            ("rs_unfused", lambda: tp.gemm_rs(comm, a_rs, b_rs, mode="unfused")),
            ("rs_gemm_only", lambda: torch.matmul(a_rs, b_rs)),
            ("ar_fused", lambda: tp.gemm_ar(comm, a_rs, b_rs, mode="fused")),
            ("ar_unfused", lambda: tp.gemm_ar(comm, a_rs, b_rs, mode="unfused")),
        ) + ((
            ("ar_one_shot", lambda: tp.gemm_ar(comm, a_rs, b_rs, mode="fused", algo="one_shot")),
            ("ar_two_shot", lambda: tp.gemm_ar(comm, a_rs, b_rs, mode="fused", algo="two_shot")),
        ) if m * n * 2 <= SMALL_OUT_BYTES else ()):
            comm.barrier()
            res[op] = common.time_launches(fn, warmup=3, reps=reps)
        comm.check()
        flop_ag, flop_rs = 2.0 * m * n * k, 2.0 * m * n * kl
        d = dict(m=m, n=n, k=k, world=world, **{f"{key}_ms": v * 1e3 for key, v in res.items()})
        d["ag_fused_tflops"] = flop_ag / res["ag_fused"] / 1e12
        d["rs_fused_tflops"] = flop_rs / res["rs_fused"] / 1e12
        d["ag_speedup_vs_unfused"] = res["ag_unfused"] / res["ag_fused"]
        d["rs_speedup_vs_unfused"] = res["rs_unfused"] / res["rs_fused"]
        d["ar_fused_tflops"] = flop_rs / res["ar_fused"] / 1e12
        d["ar_speedup_vs_unfused"] = res["ar_unfused"] / res["ar_fused"]
        data.append(d)
        rows.append([f"{m}x{n}x{k}", "AG+GEMM", f"{res['ag_fused'] * 1e3:.3f}", f"{res['ag_unfused'] * 1e3:.3f}",
                     f"{res['ag_gemm_only'] * 1e3:.3f}", f"{d['ag_fused_tflops']:.0f}",
                     f"{d['ag_speedup_vs_unfused']:.2f}", f"{res['ag_gemm_only'] / res['ag_fused']:.2f}"])
        rows.append([f"{m}x{n}x{k}", "GEMM+RS", f"{res['rs_fused'] * 1e3:.3f}", f"{res['rs_unfused'] * 1e3:.3f}",
                     f"{res['rs_gemm_only'] * 1e3:.3f}", f"{d['rs_fused_tflops']:.0f}",
                     f"{d['rs_speedup_vs_unfused']:.2f}", f"{res['rs_gemm_only'] / res['rs_fused']:.2f}"])
        rows.append([f"{m}x{n}x{k}", "GEMM+AR", f"{res['ar_fused'] * 1e3:.3f}", f"{res['ar_unfused'] * 1e3:.3f}",
                     f"{res['rs_gemm_only'] * 1e3:.3f}", f"{d['ar_fused_tflops']:.0f}",
                     f"{d['ar_speedup_vs_unfused']:.2f}", f"{res['rs_gemm_only'] / res['ar_fused']:.2f}"])
        for algo in ("one_shot", "two_shot"):
            if f"ar_{algo}" in res:
                t = res[f"ar_{algo}"]
                rows.append([f"{m}x{n}x{k}", f"GEMM+AR {algo.replace('_', '-')}", f"{t * 1e3:.3f}",
                             f"{res['ar_unfused'] * 1e3:.3f}", f"{res['rs_gemm_only'] * 1e3:.3f}",
                             f"{flop_rs / t / 1e12:.0f}", f"{res['ar_unfused'] / t:.2f}",
                             f"{res['rs_gemm_only'] / t:.2f}"])
    tp.release_workspaces(comm)
    if rank == 0:
        meta = common.header(command)
        table = common.markdown_table(
            ["M x N x K", "op", "fused ms", "unfused ms", "GEMM alone ms (cuBLAS)", "fused TFLOP/s (rank)",
             "unfused/fused", "GEMM alone/fused"], rows)
        print(f"# tandem TP ops, world {world} ({comm.sm_count} SMs a rank) — {meta['device']}, commit "
              f"{meta['commit']}, {meta['date']}")
        print(table)
        common.write_outputs(out_dir, f"tp_w{world}", meta, table, dict(rows=data))
        if out_dir:
            plot(rows, world, os.path.join(out_dir, f"tp_w{world}.png"))
    comm.destroy()


def plot(rows, world, path):
    """Grouped bars: fused / unfused / GEMM alone (ms) per shape and op."""
    from . import common

    common.grouped_bars(path, [f"{r[1]}\n{r[0]}" for r in rows],
                        [(name, [float(r[col]) for r in rows])
                         for name, col in (("fused", 2), ("unfused", 3), ("GEMM alone (cuBLAS)", 4))],
                        "ms per rank", f"tandem TP ops, world {world} (MPS ranks on one GPU)")


def main(argv=None) -> int:
    from . import common

    ap = common.parser("tp", __doc__, reps=10)
    ap.add_argument("--shapes", default=None, help="MxNxK,...")
    a = ap.parse_args(argv)
    rc = common.relaunch("tp", a.nprocs, argv)
    if rc is not None:
        return rc
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")] if a.shapes else SHAPES
    run(shapes, a.reps, a.out, common.command_line("tp", argv))
    return 0
