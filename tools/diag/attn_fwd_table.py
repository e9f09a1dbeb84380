"""Diagnostic (issue 25): tandem's ring-attention forward at world 1 against SDPA's cuDNN and flash forwards, at the
shapes of issue 25's table, in one process: forward only (bench attention also times the backward, which takes
most of its time), for before/after comparisons of forward-kernel changes within one device call.

    python -m tandem.launch -n 1 -- python tools/diag/attn_fwd_table.py [--reps 20] [--out DIR] [--label NAME]

TFLOP/s = 4 B Hq S^2 d (halved when causal) / time; CUDA events, 3 warm-ups, median of --reps launches
(tandem.bench.common.time_launches). Prints one row a shape and the geometric mean of tandem / cuDNN; writes
attn_fwd_<label>.json into --out (default $OUT when set).
"""

from __future__ import annotations

import argparse
import json
import math
import os

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tandem.ops  # noqa: F401
from tandem.bench import common
from tandem.ops import attention
from tandem.transport import Communicator

# (B, S, Hq, Hkv, d, causal): issue 25's table
SHAPES = [(1, 8192, 16, 16, 128, False), (1, 8192, 16, 16, 128, True), (1, 32768, 16, 16, 128, True),
          (2, 8192, 32, 8, 128, True), (4, 4096, 32, 32, 64, False), (8, 2048, 32, 8, 128, True),
          (1, 16384, 8, 1, 128, True)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", default=os.environ.get("OUT"))
    ap.add_argument("--label", default="run")
    a = ap.parse_args()
    comm = Communicator(heap_bytes=1 << 30, timeout_s=60)
    rows = []
    for b, s, hq, hkv, d, causal in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(1)
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for h in (hq, hkv, hkv))
        gqa = dict(enable_gqa=True) if hkv != hq else {}
        scale = d ** -0.5

        def sdpa(backend):
            def fn():
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                          is_causal=causal, scale=scale, **gqa)
            return fn

        def mine():
            return attention.ring_attention(comm, q, k, v, causal=causal)[0]

        ref = sdpa(SDPBackend.CUDNN_ATTENTION)().transpose(1, 2)
        diff = float((mine().float() - ref.float()).abs().max())
        flop = 4.0 * b * hq * s * s * d / (2 if causal else 1)
        ms = {name: common.time_launches(fn, warmup=3, reps=a.reps) * 1e3
              for name, fn in (("tandem", mine), ("cudnn", sdpa(SDPBackend.CUDNN_ATTENTION)),
                               ("flash", sdpa(SDPBackend.FLASH_ATTENTION)))}
        r = dict(b=b, s=s, hq=hq, hkv=hkv, d=d, causal=causal, max_abs_diff_vs_cudnn=diff,
                 **{f"{n}_ms": t for n, t in ms.items()}, **{f"{n}_tflops": flop / t / 1e9 for n, t in ms.items()})
        r["tandem_over_cudnn"] = r["tandem_tflops"] / r["cudnn_tflops"]
        rows.append(r)
        print(f"{a.label}: B{b} S{s} H{hq}/{hkv} d{d} {'causal' if causal else 'full'}: tandem {r['tandem_tflops']:.0f} "
              f"cuDNN {r['cudnn_tflops']:.0f} flash {r['flash_tflops']:.0f} TFLOP/s, tandem/cuDNN "
              f"{r['tandem_over_cudnn']:.3f} (max |diff| {diff:.1e})", flush=True)
        del q, k, v, ref
    geo = math.exp(sum(math.log(r["tandem_over_cudnn"]) for r in rows) / len(rows))
    print(f"{a.label}: geometric mean tandem/cuDNN {geo:.3f} over {len(rows)} shapes", flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        meta = common.header(f"tools/diag/attn_fwd_table.py --reps {a.reps} --label {a.label}")
        with open(os.path.join(a.out, f"attn_fwd_{a.label}.json"), "w") as f:
            json.dump(dict(meta=meta, rows=rows, geomean_tandem_over_cudnn=geo), f, indent=1)
    comm.destroy()


if __name__ == "__main__":
    main()
