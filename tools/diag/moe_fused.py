"""Diagnostic: where does the fused MoE dispatch+GEMM spend its time? Times fused and unfused at one config over
the dispatch blocks, the SMs given to the kernel, the GEMM scheduler's poll sleep (TANDEM_MOE_POLL_NS) and a
rank-local routing (no cross-rank rows), then records one fused launch's per-block timeline (TANDEM_MOE_TRACE=1:
globaltimer stamps, one clock for all MPS ranks) and prints each phase's spread over the blocks.

With the claimed dispatch (branch moe-claims: every block enters the dispatch, the first comm_blocks to join send,
every block computes) the roles below are "sent rows" (slot 3 stamped) and "did not"; a sender's slot 2 is its first
GEMM tile, not the count rows' arrival, and slot 4 is the end of its arrival wait after its GEMM
(kernels/src/moe/moe_common.cuh has the slot map).

    python -m tandem.launch -n 2 -- python tools/diag/moe_fused.py [--hidden 2048 --inter 1024 --experts 64 --k 6
                                                                    --tokens 4096] [--quick]
"""

import argparse
import os

import torch

import tandem._native as n
from tandem.bench import common
from tandem.ops import moe
from tandem.transport import Communicator

ap = argparse.ArgumentParser()
ap.add_argument("--hidden", type=int, default=2048)
ap.add_argument("--inter", type=int, default=1024)
ap.add_argument("--experts", type=int, default=64)
ap.add_argument("--k", type=int, default=6)
ap.add_argument("--tokens", type=int, default=4096)
ap.add_argument("--quick", action="store_true")
args = ap.parse_args()

comm = Communicator(heap_bytes=8 << 30, timeout_s=30)
world, rank = comm.world_size, comm.rank
H, I, E, k, T = args.hidden, args.inter, args.experts, args.k, args.tokens
epr = E // world
torch.manual_seed(rank)
w = torch.randn(epr, H, I, device="cuda", dtype=torch.bfloat16) / H ** 0.5
x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
ids_any = torch.rand(T, E, device="cuda").topk(k, dim=1).indices.to(torch.int32)
# every pair to this rank's own experts: the same work without cross-rank rows
ids_local = (torch.rand(T, epr, device="cuda").topk(min(k, epr), dim=1).indices + rank * epr).to(torch.int32)


def t(fn):
    comm.barrier()
    return common.time_launches(fn, warmup=2, reps=3 if args.quick else 5) * 1e3


rows = []
base = dict(sm=comm.sm_count, blocks=0, poll="5000", ids="any")
variants = [base, dict(base, blocks=4), dict(base, blocks=16), dict(base, poll="0"), dict(base, poll="2000"),
            dict(base, poll="20000"), dict(base, sm=comm.sm_count - 10), dict(base, ids="local")]
if args.quick:
    variants = variants[:1] + variants[-2:]
for v in variants:
    os.environ["TANDEM_MOE_POLL_NS"] = v["poll"]
    ids = ids_any if v["ids"] == "any" else ids_local
    tf = t(lambda: moe.moe_dispatch_gemm(comm, x, ids, w, max_tokens=T, mode="fused", comm_blocks=v["blocks"],
                                         sm_count=v["sm"]))
    tu = t(lambda: moe.moe_dispatch_gemm(comm, x, ids, w, max_tokens=T, mode="unfused", comm_blocks=v["blocks"],
                                         sm_count=v["sm"]))
    rows.append((v, tf, tu))
os.environ.pop("TANDEM_MOE_POLL_NS", None)

# one traced fused launch (default plan)
comm.barrier()
torch.cuda.synchronize()
os.environ["TANDEM_MOE_TRACE"] = "1"
moe.moe_dispatch_gemm(comm, x, ids_any, w, max_tokens=T, mode="fused")
torch.cuda.synchronize()
os.environ.pop("TANDEM_MOE_TRACE")
trace = n.native().kernels.moe_trace_snapshot()
comm.check()
grid = comm.sm_count
blocks = [trace[b * 8:(b + 1) * 8] for b in range(grid)]
t0 = min(b[0] for b in blocks if b[0])
# gather every rank's timeline on rank 0 through the store-backed all_gather of small tensors: use the heap
tl = comm.zeros((world, grid, 8), torch.int64)
tl[rank] = torch.tensor(blocks, dtype=torch.int64, device="cuda")
torch.cuda.synchronize()
comm.barrier()
mine = [comm.peer_view(tl, q)[q].cpu() for q in range(world)]
comm.barrier()
if rank == 0:
    print(f"# moe fused diag: world {world}, {comm.sm_count} SMs a rank, H/I/E/k {H}/{I}/{E}/{k}, tokens {T}")
    print("| SMs | dispatch blocks | poll ns | routing | fused ms | unfused ms | unfused/fused |")
    print("|---|---|---|---|---|---|---|")
    for v, tf, tu in rows:
        print(f"| {v['sm']} | {v['blocks'] or 'auto'} | {v['poll']} | {v['ids']} | {tf:.3f} | {tu:.3f} | {tu / tf:.2f} |")
    g0 = min(int(m[:, 0][m[:, 0] > 0].min()) for m in mine)
    print("\n# traced fused launch, us from the first block start (min / median / max over blocks)")
    names = {"dispatch": ["start", "ready", "counts", "sent", "arrived", "end"],
             "gemm": ["start", "shapes", "first tile", "-", "gemm done", "end"]}
    for q, m in enumerate(mine):
        m = m.clone()
        # dispatch blocks have slot 3 (sent) set; gemm blocks do not
        is_disp = m[:, 3] > 0
        for role, sel in (("dispatch", is_disp), ("gemm", ~is_disp)):
            mm = m[sel]
            if mm.shape[0] == 0:
                continue
            parts = []
            for s, nm in enumerate(names[role]):
                col = mm[:, s]
                col = col[col > 0]
                if nm == "-" or col.numel() == 0:
                    continue
                us = (col - g0).double() / 1e3
                parts.append(f"{nm} {us.min():.0f}/{us.median():.0f}/{us.max():.0f}")
            if role == "gemm":
                late = int(((mm[:, 0] - g0).double() / 1e3 > 200).sum())
                parts.append(f"{late} blocks started > 200 us late")
                waits = mm[:, 6].double() / 1e3
                parts.append(f"later waits {waits.sum():.0f} us total over {int(mm[:, 7].sum())}")
            print(f"rank {q} {role} ({mm.shape[0]} blocks): " + "; ".join(parts))
comm.destroy()
