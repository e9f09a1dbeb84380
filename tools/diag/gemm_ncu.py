"""Run a few GEMM configurations and cuBLAS at one shape, for Nsight Compute to profile (issue 23: why a
configuration runs below cuBLAS on the device at shapes like 777 x 4104 x 4096, where every tile is one per SM).

    ncu --clock-control none --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --section MemoryWorkloadAnalysis -k regex:"device_kernel|nvjet|sm90" \
        python tools/diag/gemm_ncu.py --shape 777x4104x4096 --variants coop_128x256_c1,swap_coop_256x128_c1

torch.matmul runs once first (the reference), then each configuration --calls times, then torch.matmul --calls
times; nothing is warmed up, so ncu profiles every launch that matches -k, in the order the script prints (pass
--launch-skip / --launch-count to narrow it). Random bf16 data; each configuration's result is checked against the
reference, so a wrong configuration is not profiled unnoticed.
"""

from __future__ import annotations

import argparse

import torch

import tandem.ops  # noqa: F401
from tandem.ops.gemm import gemm_with


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="777x4104x4096")
    ap.add_argument("--variants", default="coop_128x256_c1,swap_coop_256x128_c1")
    ap.add_argument("--calls", type=int, default=2)
    a = ap.parse_args()
    m, n, k = (int(v) for v in a.shape.split("x"))
    torch.manual_seed(0)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    ref = torch.matmul(x, w)
    order = ["cublas(reference)"]
    for name in a.variants.split(","):
        for _ in range(a.calls):
            d = gemm_with(x, w, variant=name)
            order.append(name)
        torch.cuda.synchronize()
        rel = float((d.float() - ref.float()).norm() / ref.float().norm())
        print(f"{name}: rel. difference from torch.matmul {rel:.2e}", flush=True)
    for _ in range(a.calls):
        torch.matmul(x, w)
        order.append("cublas")
    torch.cuda.synchronize()
    print("launch order:", " ".join(order), flush=True)


if __name__ == "__main__":
    main()
