"""GEMM core benchmark at world 1: TFLOP/s of torch.ops.tandem.gemm next to cuBLAS (torch.matmul) in the same
process, bf16, at the shapes of issue 4. CUDA events, warm-ups, median; several input sets rotate so that the
L2 does not hold them."""

from __future__ import annotations


SHAPES = [(8192, 8192, 8192), (8192, 6144, 12288), (16384, 3584, 8192)]  # M, N, K


def run(shapes, reps, out_dir, command):
    import torch

    from .. import ops  # noqa: F401
    from ..ops.gemm import gemm_with
    from . import common

    rows, data = [], []
    for m, n, k in shapes:
        sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                 torch.randn(k, n, device="cuda", dtype=torch.bfloat16)) for _ in range(3)]
        i = [0]

        def pick():
            i[0] = (i[0] + 1) % len(sets)
            return sets[i[0]]

        t_tandem = common.time_launches(lambda: torch.ops.tandem.gemm(*pick()), warmup=5, reps=reps)
        t_cublas = common.time_launches(lambda: torch.matmul(*pick()), warmup=5, reps=reps)
        # the scheduler's swizzle (the op's default is 1), in the same run
        t_swz = {s: common.time_launches(lambda s=s: gemm_with(*pick(), swizzle=s), warmup=3, reps=reps)
                 for s in (2, 4, 8)}
        a, b = sets[0]
        ref = (a.float() @ b.float())
        got = torch.ops.tandem.gemm(a, b).float()
        rel = float((got - ref).norm() / ref.norm())
        flop = 2.0 * m * n * k
        d = dict(m=m, n=n, k=k, tandem_tflops=flop / t_tandem / 1e12, cublas_tflops=flop / t_cublas / 1e12,
                 rel_err=rel)
        d["ratio"] = d["tandem_tflops"] / d["cublas_tflops"]
        d["swizzle_tflops"] = {s: flop / t / 1e12 for s, t in t_swz.items()}
        best = max(d["swizzle_tflops"], key=d["swizzle_tflops"].get)
        data.append(d)
        rows.append([f"{m}x{n}x{k}", f"{d['tandem_tflops']:.0f}", f"{d['cublas_tflops']:.0f}", f"{d['ratio']:.3f}",
                     " / ".join(f"{d['swizzle_tflops'][s]:.0f}" for s in (2, 4, 8)),
                     f"{d['swizzle_tflops'][best] / d['cublas_tflops']:.3f} (swizzle {best})", f"{rel:.1e}"])
        sets = []  # free this shape's inputs before the next
    meta = common.header(command)
    table = common.markdown_table(["M x N x K (bf16)", "tandem TFLOP/s", "cuBLAS TFLOP/s", "tandem/cuBLAS",
                                   "swizzle 2 / 4 / 8 TFLOP/s", "best swizzle/cuBLAS", "rel. error vs fp32"], rows)
    print(f"# tandem GEMM core vs cuBLAS — {meta['device']}, commit {meta['commit']}, {meta['date']}")
    print(table)
    common.write_outputs(out_dir, "gemm_w1", meta, table, dict(rows=data))
    return data


def main(argv=None) -> int:
    from . import common

    ap = common.parser("gemm", __doc__, reps=20, ranks=False)
    ap.add_argument("--shapes", default=None, help="MxNxK,MxNxK,...")
    a = ap.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")] if a.shapes else SHAPES
    run(shapes, a.reps, a.out, common.command_line("gemm", argv))
    return 0
