"""Diagnostic (issue 21): how fast can a TP op be on this machine if its GEMM and its collective overlapped perfectly?

Issue 21's target is fused <= 1.15 x max(cuBLAS alone, collective alone). With several MPS ranks on one GPU the
GEMM and the collective share one GPU's SMs, L2 and HBM, so "perfect overlap" is bounded by what the two kernels do
when they run at the same time with no dependency between them. This script measures that bound, every rank at once
(as the ops run), per op and shape:

* gemm: cuBLAS (torch.matmul) of the rank's GEMM alone (bench tp's "cuBLAS alone");
* coll[s]: tandem's collective alone (tp.collective_alone: the RS reduction, the AR reduction + gather, the AG
  gather) on s SMs (0: all of the rank's; bench tp's "tandem collective" is s = 0);
* both[s]: the two launched together, the collective on a side stream, neither waiting for the other (the data are
  independent: the collective reduces whatever the op's partial buffer holds). No overlapped kernel can beat this
  with these two kernels' work; it is the ceiling of any fused or pipelined design that keeps them;
* seq: the GEMM then the collective on one stream (the unfused path without its flag wait).

It prints ceiling = min(seq, min_s both[s]) / max(gemm, coll[0]): the best ratio to issue 21's bar that any
arrangement of these two kernels' work reaches here (1.00: the shorter of the two hides completely). "seq" counts
because at world 4 launching the two together ran slower than one after the other at every row measured
(2026-12-07, docs/results.md): there the best arrangement is no overlap.

    python -m tandem.launch -n 4 -- python tools/diag/tp_overlap_ceiling.py [--shapes MxNxK,...] [--ops ...]
        [--coll-sms 0,8,16] [--reps 10] [--out DIR]

Each rank writes tp_overlap_ceiling_r{rank}.json into --out (default $OUT when set); rank 0 prints its rows.
"""

import argparse
import json
import os
import statistics

import torch

from tandem.bench import common
from tandem.bench.tp import gemm_alone_operands, rank_problem
from tandem.ops import tp
from tandem.transport import Communicator

ap = argparse.ArgumentParser()
ap.add_argument("--shapes", default="16384x8192x4096,8192x4096x8192,2048x8192x28672")
ap.add_argument("--ops", default="gemm_rs,gemm_ar,ag_gemm")
ap.add_argument("--coll-sms", default="0,8,16", help="the collective's SMs in the concurrent runs (0: all)")
ap.add_argument("--reps", type=int, default=10)
ap.add_argument("--out", default=os.environ.get("OUT"))
args = ap.parse_args()

comm = Communicator(heap_bytes=common.heap_bytes_for(12 << 30), timeout_s=60)
world, rank = comm.world_size, comm.rank
side = torch.cuda.Stream()
rows = []


def timed(fn):
    # the median of several time_ranks_ms (each itself a median over reps, ranks started together)
    t = [common.time_ranks_ms(comm, fn, warmup=3, reps=args.reps) for _ in range(3)]
    return None if None in t else statistics.median(t)


for shape in args.shapes.split(","):
    m, n, k = (int(v) for v in shape.split("x"))
    for op in args.ops.split(","):
        if m % world:
            continue
        _, a, b = rank_problem(op, m, n, k, world)
        a_gemm, out = gemm_alone_operands(op, m, n, k, a)
        tp.collective_alone(comm, op, a, b)  # the workspace, once
        torch.cuda.synchronize()

        def gemm():
            torch.matmul(a_gemm, b, out=out)

        def coll(sms):
            return lambda: tp.collective_alone(comm, op, a, b, sm_count=sms)

        def both(sms):
            def fn():
                cur = torch.cuda.current_stream()
                side.wait_stream(cur)
                with torch.cuda.stream(side):
                    tp.collective_alone(comm, op, a, b, sm_count=sms)
                torch.matmul(a_gemm, b, out=out)
                cur.wait_stream(side)
            return fn

        r = dict(op=op, m=m, n=n, k=k, world=world, rank=rank, sm_count=comm.sm_count, gemm_ms=timed(gemm))
        r["seq_ms"] = timed(lambda: (gemm(), coll(0)()))
        for s in (int(v) for v in args.coll_sms.split(",")):
            if s > comm.sm_count:
                continue
            r[f"coll_{s}_ms"] = timed(coll(s))
            r[f"both_{s}_ms"] = timed(both(s))
        both_ms = [v for key, v in r.items() if key.startswith("both_") and v]
        bar = max(r["gemm_ms"], r["coll_0_ms"]) if r["gemm_ms"] and r["coll_0_ms"] else None
        best = min(both_ms + ([r["seq_ms"]] if r["seq_ms"] else [])) if both_ms or r["seq_ms"] else None
        r["bar_ms"], r["best_ms"], r["ceiling"] = bar, best, best / bar if bar and best else None
        comm.check()
        rows.append(r)
        if rank == 0:
            def f(v):
                return "-" if v is None else f"{v:.3f}"
            extra = " ".join(f"{key[:-3]} {f(v)}" for key, v in r.items() if key.startswith(("coll_", "both_")))
            print(f"{op} {shape} w{world}: gemm {f(r['gemm_ms'])} seq {f(r['seq_ms'])} {extra} | "
                  f"ceiling {f(r['ceiling'])} of max(gemm, coll)", flush=True)
        del a, b, a_gemm, out

if args.out:
    os.makedirs(args.out, exist_ok=True)
    meta = common.header("tools/diag/tp_overlap_ceiling.py " + " ".join(
        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"))
    with open(os.path.join(args.out, f"tp_overlap_ceiling_r{rank}.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
comm.destroy()
