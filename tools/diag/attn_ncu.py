"""tandem's ring attention forward at world 1 and SDPA's cuDNN forward at one shape, for Nsight Compute to profile
side by side (issue 25: the shapes furthest behind cuDNN, e.g. B 8, S 2048, 32 / 8 heads, causal: 0.61-0.69).

    python -m tandem.launch -n 1 -- ncu --clock-control none --nvtx --nvtx-include "profile/" \
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
        --section LaunchStats python tools/diag/attn_ncu.py --batch 8 --seq 2048 --heads 32 --heads-kv 8 --causal

Each side runs twice unprofiled (warm-up: workspaces, cuDNN's plan), then once inside the NVTX range "profile", so
ncu profiles exactly one launch of each (tandem's kernel and whatever cuDNN launches). The outputs are compared
(max |diff|, printed) so that a wrong launch is not profiled unnoticed.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import tandem.ops  # noqa: F401
from tandem.ops import attention
from tandem.transport import Communicator


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--heads-kv", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    a = ap.parse_args()
    comm = Communicator(heap_bytes=1 << 30, timeout_s=30)
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(a.batch, a.seq, h, a.dim, device="cuda", dtype=torch.bfloat16, generator=g)
               for h in (a.heads, a.heads_kv, a.heads_kv))
    gqa = dict(enable_gqa=True) if a.heads_kv != a.heads else {}

    def mine():
        return attention.ring_attention(comm, q, k, v, causal=a.causal)[0]

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=a.causal, **gqa).transpose(1, 2)

    for _ in range(2):
        mine(), cudnn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("profile")
    o_mine = mine()
    o_ref = cudnn()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    comm.check()
    print(f"shape B {a.batch} S {a.seq} H {a.heads}/{a.heads_kv} d {a.dim} causal {a.causal}: "
          f"max |tandem - cudnn| = {float((o_mine.float() - o_ref.float()).abs().max()):.3e}")
    comm.destroy()


if __name__ == "__main__":
    main()
