"""Where moe_ffn's time goes (issue 26): the unfused chain's steps timed one by one, N ranks under MPS.

    python -m tandem.launch -n 2 -- python tools/diag/moe_layer_steps.py [--configs deepseek,small]
        [--tokens 1024,4096] [--reps 10] [--out DIR]

Why: on an H100 (2026-12-06, docs/results.md) moe_ffn took 38 ms at the DeepSeek config with 1,024 tokens a rank
and 40.5 ms with 4,096, while a reading of the code accounts for about 16 and 33 ms (helper analysis: dispatch
with 8 blocks ~0.5 / 1.9 ms, GEMM 1 with 128-row tiles padded per expert ~11 / 16 ms, SwiGLU over every
receive-capacity row ~0.8 / 3.1, torch._grouped_mm ~3 / 8, combine ~0.6 / 2.2). This runs the same calls as
tandem.ops.moe_layer._impl, with a CUDA event between steps, so each step's device time is measured in the
layer as it runs (every rank at once), plus the whole op for comparison, and reports the caching allocator's
retries (an allocator that frees and retries inside the timed loop would show here, not in a profile of kernels).

Per rank, medians over --reps calls, ms: dispatch (the dispatch and GEMM 1: moe_layer.gemm1 where it exists),
swiglu, gemm2 (torch._grouped_mm), combine (moe.run_combine), sum of steps, the op (torch.ops.tandem.moe_ffn), and
the same with a host barrier before each call (the ranks started together: how much of a step is waiting for
the other rank).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="deepseek,small")
    ap.add_argument("--tokens", default="1024,4096")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)

    import torch

    from tandem import ops  # noqa: F401
    from tandem.bench import common
    from tandem.bench.moe import _communicator, _configs
    from tandem.ops import moe, moe_layer

    comm = _communicator()
    world, rank = comm.world_size, comm.rank
    results = []
    for name, hidden, inter, experts, k, epr in _configs(a.configs.split(","), world):
        torch.manual_seed(1234 + rank)
        w1 = torch.randn(epr, hidden, 2 * inter, device="cuda", dtype=torch.bfloat16) / hidden ** 0.5
        w2 = torch.randn(epr, inter, hidden, device="cuda", dtype=torch.bfloat16) / inter ** 0.5
        for tokens in [int(t) for t in a.tokens.split(",")]:
            x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
            ids = torch.rand(tokens, experts, device="cuda").topk(k, dim=1).indices.to(torch.int32)
            wts = torch.softmax(torch.randn(tokens, k, device="cuda"), dim=1).to(torch.bfloat16)

            def steps(stamp):
                if hasattr(moe_layer, "gemm1"):  # the op's GEMM 1 (TANDEM_MOE_GEMM1: tandem's or torch's)
                    y, layout = moe_layer.gemm1(comm, x, ids, w1, tokens, "unfused", 0)
                else:
                    y, layout = moe.run_dispatch_gemm(comm, x, ids, w1, tokens, "unfused", 0, 0)
                stamp()
                # the op's SwiGLU (branch moe-speed: tandem's kernel over the received rows, unless
                # TANDEM_MOE_SWIGLU=torch); before it, torch's over every receive-capacity row
                act = (moe_layer.swiglu_received(y, layout, inter) if hasattr(moe_layer, "swiglu_received")
                       else moe_layer.swiglu(y, inter))
                stamp()
                lv = moe.layout_view(comm, layout, epr, tokens, k)
                # the op's GEMM 2: torch._grouped_mm, or tandem's grouped GEMM (moe_layer._gemm2_plan: by the rows
                # an expert expects; TANDEM_MOE_GEMM2 / TANDEM_MOE_GEMM_CLUSTER force them)
                if hasattr(moe_layer, "_gemm2_plan"):
                    kind, cluster = moe_layer._gemm2_plan(moe_layer.expected_rows_per_expert(tokens, k, epr))
                else:
                    kind, cluster = getattr(moe_layer, "_gemm2_kind", lambda: "torch")(), 0
                if kind == "tandem":
                    z = moe_layer.grouped_gemm_rows(comm, act, w2, lv, 0, cluster)
                else:
                    z = torch._grouped_mm(act, w2, offs=lv["expert_offset"][1:])
                stamp()
                out = moe.run_combine(comm, z, layout, ids, wts, tokens, 0, check_ids=False)
                stamp()
                return out

            names = ("dispatch", "swiglu", "gemm2", "combine")
            per_step = {n: [] for n in names}
            for it in range(3 + a.reps):
                events = [torch.cuda.Event(enable_timing=True)]
                comm.barrier()
                events[0].record()
                steps(lambda: (events.append(torch.cuda.Event(enable_timing=True)), events[-1].record()))
                torch.cuda.synchronize()
                if it >= 3:
                    for i, n in enumerate(names):
                        per_step[n].append(events[i].elapsed_time(events[i + 1]))
            retries0 = torch.cuda.memory_stats().get("num_alloc_retries", 0)

            def op():
                return moe_layer.moe_ffn(comm, x, ids, wts, w1, w2, max_tokens=tokens, mode="unfused")

            comm.barrier()
            op_s = common.time_launches(op, warmup=3, reps=a.reps)
            retries = torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries0
            comm.check()
            lv = moe.layout_view(comm, moe.run_dispatch_gemm(comm, x, ids, w1, tokens, "unfused", 0, 0)[1], epr, tokens, k)
            received = int(lv["expert_offset"][-1].item())
            row = dict(config=name, hidden=hidden, inter=inter, experts=experts, k=k, tokens=tokens, world=world,
                       rank=rank, received=received, capacity=world * tokens * min(k, epr),
                       **{f"{n}_ms": statistics.median(v) for n, v in per_step.items()},
                       op_ms=op_s * 1e3, alloc_retries=int(retries))
            row["steps_ms"] = sum(row[f"{n}_ms"] for n in names)
            results.append(row)
            print(f"rank {rank} {name} T={tokens} received={received}: " +
                  " ".join(f"{n} {row[f'{n}_ms']:.2f}" for n in names) +
                  f" | steps {row['steps_ms']:.2f} op {row['op_ms']:.2f} ms, alloc retries {retries}", flush=True)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, f"moe_layer_steps_w{world}_r{rank}.json"), "w") as f:
            json.dump(results, f, indent=1)
    comm.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
