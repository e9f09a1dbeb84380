"""Diagnostic (issue 26): how much faster than the unfused chain can a fused MoE layer be on this machine?

Issue 26 asks for the whole layer (dispatch, GEMM 1, SwiGLU, GEMM 2, combine) in one persistent kernel, >= 1.3x
the unfused chain (torch.ops.tandem.moe_ffn's default) at 4k-16k tokens a rank. A fused kernel saves the chain's
launches and full-grid boundaries, and can hide the dispatch and combine behind the GEMMs; it cannot make the
experts' GEMMs themselves cheaper (the weights are streamed once either way). So, per config and token count,
every rank at once (as the layer runs), this times in one run, columns interleaved in rounds (bench.common
.time_columns_ms):

* layer: moe_ffn as a user calls it (the unfused chain and its plan; at world 1 its mode "auto" runs the fused
  dispatch + GEMM 1 kernel, moe._use_fused);
* dispatch / combine: the chain's communication steps alone (moe.dispatch_rows, moe.run_combine);
* gemm1[impl] / gemm2[impl]: the experts' GEMMs alone on rows already in the dispatch layout, by torch's grouped
  GEMM (torch._grouped_mm) and by tandem's (moe_layer.grouped_gemm_rows, 1x1 and 2x1 clusters);
* swiglu: the activation between them (moe_layer.swiglu_received).

and prints, with compute = min over impl of gemm1 + swiglu + min over impl of gemm2 and gemms = the same without
the SwiGLU (a fused kernel can apply it in GEMM 1's epilogue):

  ceiling = layer / gemms   the most any fusion that keeps these GEMMs can gain here: communication hidden
                             for free, the activation folded in, no launch or boundary left. Issue 26's 1.3x is
                             out of reach by fusion alone wherever this is below 1.3.
  chain parts = dispatch + gemm1 + swiglu + gemm2 + combine against layer (how much of the layer the parts explain).

On one GPU the ranks' "communication" is copies through the same HBM that streams the weights, so hiding it costs
bandwidth the GEMMs use; the ceiling above is optimistic for this machine, which is the point: a value below the
target settles it, a value above does not promise it.

    python -m tandem.launch -n 2 -- python tools/diag/moe_fusion_ceiling.py [--configs deepseek,small]
        [--tokens 1024,4096,16384] [--reps 12] [--rounds 3] [--out DIR]

Each rank writes moe_fusion_ceiling_r{rank}.json into --out (default $OUT when set) after every row; rank 0 prints
its rows. A shape whose tensors and workspaces would not fit the GPU's share of a rank (an estimate every rank
computes alike, so that all skip it together: an out-of-memory error on one rank only would leave the others
waiting in a collective) is skipped and said so. The "dispatch" column is the dispatch-only launch, which also
copies the received rows out of its workspace (the layer's unfused path does not), so "parts" overstates the
layer's share a little; the ceiling does not use it.
"""

import argparse
import json
import os

import torch

from tandem import ops  # noqa: F401  (registers the ops)
from tandem.bench import common
from tandem.bench.moe import _communicator, _configs
from tandem.ops import _runtime as rt
from tandem.ops import moe, moe_layer

ap = argparse.ArgumentParser()
ap.add_argument("--configs", default="deepseek,small")
ap.add_argument("--tokens", default="1024,4096,16384")
ap.add_argument("--reps", type=int, default=12)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--out", default=os.environ.get("OUT"))
args = ap.parse_args()

comm = _communicator()
world, rank = comm.world_size, comm.rank
rows = []
_HEAP = common.heap_bytes_for(40 << 30)  # what _communicator asked for


def fits(hidden, inter, epr, k, tokens) -> bool:
    """Whether one shape's tensors fit this rank's share of the GPU beside its heap, and its symmetric workspaces the
    heap (an estimate, the same on every rank: they share one GPU and one argument list). Per rank: the weights;
    rows, y, the activation and z at the receive capacity (tokens x k x world rows, as the dispatch sizes it); the
    layer's own y, activation and z again while it runs. The heap holds the dispatch-only and the layer's dispatch
    workspaces (received rows each) and the combine's."""
    cap = tokens * k * world
    weights = 2 * epr * hidden * 3 * inter
    acts = 2 * cap * (hidden + 2 * inter + inter + hidden)  # rows_x, y, a, z (bf16)
    layer = 2 * cap * (2 * inter + inter + hidden)         # the layer's own y, activation and z while it runs
    torch_bytes = weights + acts + layer
    heap_bytes = 2 * (2 * cap * hidden) + 2 * cap * hidden
    return heap_bytes < 0.9 * _HEAP and torch_bytes < 0.85 * (common.gpu_bytes_per_rank() - _HEAP)


def write_rows():
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"moe_fusion_ceiling_r{rank}.json"), "w") as fh:
            json.dump(rows, fh, indent=1)

for name, hidden, inter, experts, k, epr in _configs(args.configs.split(","), world):
    torch.manual_seed(1234 + rank)
    w1 = torch.randn(epr, hidden, 2 * inter, device="cuda", dtype=torch.bfloat16) / hidden ** 0.5
    w2 = torch.randn(epr, inter, hidden, device="cuda", dtype=torch.bfloat16) / inter ** 0.5
    for tokens in [int(t) for t in args.tokens.split(",")]:
        if not fits(hidden, inter, epr, k, tokens):
            if rank == 0:
                print(f"{name} {tokens} tokens w{world}: skipped (would not fit this rank's share of the GPU)",
                      flush=True)
            continue
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        ids = torch.rand(tokens, experts, device="cuda").topk(k, dim=1).indices.to(torch.int32)
        wts = torch.softmax(torch.randn(tokens, k, device="cuda"), dim=1).to(torch.bfloat16)
        # the operands of the steps, once (the ids checked here; the timed calls skip the host-synced check)
        rows_x, layout = moe.dispatch_rows(comm, x, ids, epr, tokens)
        lv = moe.layout_view(comm, layout, epr, tokens, k)
        ends = lv["expert_offset"][1:]
        y = torch._grouped_mm(rows_x, w1, offs=ends)
        a = moe_layer.swiglu_received(y, layout, inter)
        z = torch._grouped_mm(a, w2, offs=ends)
        torch.cuda.synchronize()
        columns = {
            "layer": lambda: moe_layer.moe_ffn(comm, x, ids, wts, w1, w2, max_tokens=tokens),
            "dispatch": lambda: moe.dispatch_rows(comm, x, ids, epr, tokens, check_ids=False),
            "gemm1_torch": lambda: torch._grouped_mm(rows_x, w1, offs=ends),
            "gemm1_tandem_c1": lambda: moe_layer.grouped_gemm_rows(comm, rows_x, w1, lv, 0, 1),
            "gemm1_tandem_c2": lambda: moe_layer.grouped_gemm_rows(comm, rows_x, w1, lv, 0, 2),
            "swiglu": lambda: moe_layer.swiglu_received(y, layout, inter),
            "gemm2_torch": lambda: torch._grouped_mm(a, w2, offs=ends),
            "gemm2_tandem_c1": lambda: moe_layer.grouped_gemm_rows(comm, a, w2, lv, 0, 1),
            "gemm2_tandem_c2": lambda: moe_layer.grouped_gemm_rows(comm, a, w2, lv, 0, 2),
            "combine": lambda: moe.run_combine(comm, z, layout, ids, wts, tokens, 0, check_ids=False),
        }
        ms, spread = common.time_columns_ms(comm, columns, warmup=3, reps=args.reps, rounds=args.rounds)
        comm.check()  # a device-side timeout or capacity report raises here instead of passing as a time
        g1 = min((v for key, v in ms.items() if key.startswith("gemm1") and v), default=None)
        g2 = min((v for key, v in ms.items() if key.startswith("gemm2") and v), default=None)
        gemms = g1 + g2 if g1 and g2 else None
        compute = gemms + (ms["swiglu"] or 0.0) if gemms else None
        parts = sum(ms[key] or 0.0 for key in ("dispatch", "swiglu", "combine")) + gemms if gemms else None
        row = dict(config=name, tokens=tokens, world=world, rank=rank, hidden=hidden, inter=inter, experts=experts,
                   topk=k, ms=ms, spread=spread, gemms_ms=gemms, compute_ms=compute, parts_ms=parts,
                   ceiling=ms["layer"] / gemms if ms["layer"] and gemms else None,
                   ceiling_with_swiglu=ms["layer"] / compute if ms["layer"] and compute else None,
                   run=common.header("tools/diag/moe_fusion_ceiling.py"))
        rows.append(row)
        write_rows()
        if rank == 0:
            f = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
            print(f"{name} {tokens} tokens w{world}: layer {f(ms['layer'])} | dispatch {f(ms['dispatch'])} "
                  f"gemm1 {f(g1)} swiglu {f(ms['swiglu'])} gemm2 {f(g2)} combine {f(ms['combine'])} | parts "
                  f"{f(parts)} | ceiling layer/gemms {f(row['ceiling'])} (with swiglu {f(row['ceiling_with_swiglu'])})"
                  f" | spread max {max((v for v in spread.values() if v), default=0.0):.2f}", flush=True)
        del rows_x, layout, lv, y, a, z, x, columns
        rt.release_workspaces(comm)  # collective: every rank, after every shape (the heap holds one shape's)
        torch.cuda.empty_cache()
write_rows()
comm.barrier()
comm.destroy()
