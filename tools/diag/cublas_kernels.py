#!/usr/bin/env python3
"""Which kernels cuBLAS (torch.matmul) and cuBLASLt (torch._scaled_mm) launch for bench gemm's shapes (issue 23).

tandem's GEMM trails cuBLAS most at a few ragged and very large shapes even with its best CUTLASS configuration
(docs/results.md, 2026-12-06: 777 x 4104 x 4096 at 0.72, 16384 x 28672 x 8192 at 0.91). cuBLAS's kernel names say
what it runs there: tile ("tilesize128x256x64"), cluster ("cluster2x1x1"), split-K ("splitK", "segment_k") or
stream-K, and any extra reduction kernel. This prints, per shape, every CUDA kernel one call launched and its
time (torch.profiler, after warm-ups), as JSON lines to stdout and, with --out, to a file.

    python3 tools/diag/cublas_kernels.py [--shapes MxNxK,...] [--fp8] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))


def kernels_of(fn, warmup: int = 3):
    """[(kernel name, device us)] of one call of fn (after `warmup` calls), in launch order."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    out = []
    for e in prof.events():
        if str(getattr(e, "device_type", "")).endswith("CUDA"):  # the kernels (and memsets), not the host's calls
            us = next((float(getattr(e, f)) for f in ("device_time", "cuda_time", "self_device_time_total",
                                                      "device_time_total") if getattr(e, f, None)), 0.0)
            out.append((e.name, round(us, 2)))
    return out


def main(argv=None) -> int:
    import torch

    from tandem.bench.gemm import SHAPES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=None, help="MxNxK,... (default: bench gemm's 24)")
    ap.add_argument("--fp8", action="store_true", help="also torch._scaled_mm with tensor-wise and row-wise scales")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")] if a.shapes else SHAPES
    lines = []
    for m, n, k in shapes:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        cases = [("bf16", lambda: torch.matmul(x, w))]
        if a.fp8:
            n16 = n + (-n) % 16
            xa = x.to(torch.float8_e4m3fn)
            wb = torch.randn(n16, k, device="cuda").to(torch.float8_e4m3fn).t()
            one = torch.ones((), device="cuda")
            ra, rb = torch.ones(m, 1, device="cuda"), torch.ones(1, n16, device="cuda")
            cases += [("fp8_tensor", lambda: torch._scaled_mm(xa, wb, one, one, out_dtype=torch.bfloat16)),
                      ("fp8_row", lambda: torch._scaled_mm(xa, wb, ra, rb, out_dtype=torch.bfloat16))]
        for kind, fn in cases:
            try:
                ks = kernels_of(fn)
            except Exception as e:  # noqa: BLE001 - a case that cannot run says why; the others go on
                ks = [(f"error: {str(e).splitlines()[0][:160]}", 0.0)]
            line = dict(m=m, n=n, k=k, kind=kind, kernels=ks, device=torch.cuda.get_device_name())
            lines.append(line)
            print(json.dumps(line), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(lines, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
