"""Diagnostic: where does a fused TP kernel's time go? Per-block timelines of the fused ops, and variants.

bench tp (2026-12-04) had the fused GEMM+RS / GEMM+AR 2-4x slower than their unfused mode and the fused AG+GEMM
1.5x slower than cuBLAS, with the collective a small part. The kernels write, with TANDEM_TP_TRACE=1, the global
timer at each block's phase boundaries (kernels/include/tandem/kernels/runtime/trace.cuh; slots in
gemm_rs_sm90.cu and ag_gemm_sm90.cu). Per op, shape, comm_blocks and variant (environment knobs of
tp_common.cuh: swizzle, raster, chunk order, one-pass reduction), every rank at once, this reports:

* fused_ms (CUDA events, median), and for reference the GEMM core alone on the GEMM role's SMs and cuBLAS on
  the rank's share (the same per-rank GEMM, all ranks at once);
* from one traced launch: the kernel's span, the spread of the blocks' start times (a block that starts late
  had no SM: the grid was not resident at once), the GEMM blocks' per-chunk compute and wait times (median over
  blocks), and the reduce blocks' per-source wait and add times.

    python -m tandem.launch -n 4 -- python tools/diag/tp_trace.py [--shapes MxNxK,...] [--ops gemm_rs,...]
        [--comm-blocks 6,2] [--variants "base;TANDEM_RS_REDUCE=onepass"] [--out DIR]

Writes tp_trace_r{rank}.json (summaries and the raw stamps) into --out; rank 0 prints its table, then (with --out,
read back from every rank's file) every rank's fused time and late blocks: an op takes its slowest rank's time.
"""

import argparse
import json
import os
import statistics

import torch

import tandem._native as n
from tandem import ops  # noqa: F401  (registers the ops)
from tandem.bench import common
from tandem.bench.tp import gemm_alone_operands, rank_problem
from tandem.ops import tp
from tandem.ops.gemm import gemm_args
from tandem.transport import Communicator

ap = argparse.ArgumentParser()
ap.add_argument("--shapes", default="16384x8192x4096")
ap.add_argument("--ops", default="gemm_rs,ag_gemm,gemm_ar")
ap.add_argument("--comm-blocks", default="6,2")
ap.add_argument("--variants", default="base")
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--sm-counts", default="0",
                help="the SMs the fused kernels may use (0: the rank's share), e.g. 0,30,28: does a grid smaller than "
                     "the share make every rank's clusters resident at once? (docs/fused-kernels.md, Residency)")
ap.add_argument("--controls", action="store_true",
                help="GEMM+RS/AR: also time the core writing into a heap tensor, and in W launches of M/W rows")
ap.add_argument("--out", default=os.environ.get("OUT"))
args = ap.parse_args()

K = n.native().kernels
SLOTS = K.tp_timeline_slots()
KNOBS = ("TANDEM_TP_SWIZZLE", "TANDEM_TP_RASTER", "TANDEM_RS_ORDER", "TANDEM_RS_REDUCE", "TANDEM_RS_PIECES",
         "TANDEM_TP_TRACE", "TANDEM_TP_CLAIM", "TANDEM_TP_LATE", "TANDEM_RS_JOIN", "TANDEM_TP_GEMM_TILE",
         "TANDEM_RS_RING", "TANDEM_RS_TICKET", "TANDEM_RS_TICKET_END_WAITERS",
         "TANDEM_RS_TICKET_DIRECT", "TANDEM_RS_TICKET_ROUNDS")
comm = Communicator(heap_bytes=4 << 30, timeout_s=60)
rank, world, sms = comm.rank, comm.world_size, comm.sm_count
stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731


def set_variant(v):
    for k in KNOBS:
        os.environ.pop(k, None)
    if v != "base":
        for kv in v.split(","):
            k, _, val = kv.partition("=")
            os.environ[k] = val


def timed(fn):
    comm.barrier()
    return common.time_launches(fn, warmup=2, reps=args.reps) * 1e3


def timeline(call):
    """One traced launch: {block: (sm, {slot: ns})} for the blocks that stamped."""
    os.environ["TANDEM_TP_TRACE"] = "1"
    comm.barrier()
    call()
    raw = K.tp_timeline_snapshot()
    os.environ.pop("TANDEM_TP_TRACE", None)
    rows = {}
    for b in range(len(raw) // SLOTS):
        row = raw[b * SLOTS:(b + 1) * SLOTS]
        if row[-1]:
            rows[b] = (row[-1] - 1, {s: row[s] for s in range(SLOTS - 1) if row[s]})
    return rows


def med(xs):
    return statistics.median(xs) if xs else None


def summarize(op, rows, c, pieces):
    """Per-role medians in microseconds (blocks below c are the comm role: the role rows come first)."""
    if not rows:
        return {}
    t0 = min(s[0] for _, s in rows.values() if 0 in s)
    starts = [(s[0] - t0) / 1e3 for _, s in rows.values() if 0 in s]
    ends = [(s[46] - t0) / 1e3 for _, s in rows.values() if 46 in s]
    out = dict(span_us=max(ends) if ends else None, start_spread_us=max(starts),
               late_blocks=sum(1 for x in starts if x > 20.0), blocks=len(rows),
               distinct_sms=len({sm for sm, _ in rows.values()}))
    gemm = [s for b, (_, s) in rows.items() if b >= c]
    comm_rows = [s for b, (_, s) in rows.items() if b < c]
    if op == "ag_gemm":
        out["gemm_us"] = med([(s[1] - s[0]) / 1e3 for s in gemm if 1 in s and 0 in s])
        out["copy_steps_us"] = [med([(s[i] - s[0]) / 1e3 for s in comm_rows if i in s and 0 in s])
                                for i in range(1, world + 1)]
        return out
    if pieces > 1:  # GEMM blocks stamp slot 1 + s when step s (piece s // W of chunk s % W) is stored
        out["gemm_done_at_us"] = [med([(s[i] - t0) / 1e3 for s in gemm if i in s]) for i in range(1, 40)
                                  if any(i in s for s in gemm)]
        out["reduce_pieces"] = [dict(acquired_at_us=med([(s[1 + 2 * j] - t0) / 1e3 for s in comm_rows if 1 + 2 * j in s]),
                                     add_us=med([(s[2 + 2 * j] - s[1 + 2 * j]) / 1e3 for s in comm_rows
                                                 if 1 + 2 * j in s and 2 + 2 * j in s]))
                                for j in range(19) if any(1 + 2 * j in s for s in comm_rows)]
        out["gather_us"] = med([(s[41] - s[40]) / 1e3 for s in comm_rows if 40 in s and 41 in s])
        out["reduce_end_us"] = med([(s[46] - t0) / 1e3 for s in comm_rows if 46 in s])
        if any(42 in s for s in gemm):  # the joined reduction (TANDEM_RS_JOIN=1): slots 42 joined, 43 left
            out["join"] = {f"{who}_{what}_us": med([(s[slot] - t0) / 1e3 for s in blocks if slot in s])
                           for who, blocks in (("gemm", gemm), ("reduce", comm_rows))
                           for what, slot in (("joined_at", 42), ("left_at", 43))}
        return out
    steps = []
    for st in range(world):
        a, b_, d = 1 + 3 * st, 2 + 3 * st, 3 + 3 * st
        prev = [s.get(3 * st, s.get(0)) for s in gemm]
        steps.append(dict(
            wait_us=med([(s[a] - p) / 1e3 for s, p in zip(gemm, prev) if a in s and p]),
            compute_us=med([(s[b_] - s[a]) / 1e3 for s in gemm if a in s and b_ in s]),
            stores_us=med([(s[d] - s[b_]) / 1e3 for s in gemm if b_ in s and d in s]),
            done_at_us=med([(s[d] - t0) / 1e3 for s in gemm if d in s])))
    out["gemm_steps"] = steps
    red = []
    for st in range(world):
        a, b_ = 1 + 2 * st, 2 + 2 * st
        red.append(dict(acquired_at_us=med([(s[a] - t0) / 1e3 for s in comm_rows if a in s]),
                        add_us=med([(s[b_] - s[a]) / 1e3 for s in comm_rows if a in s and b_ in s])))
    out["reduce_steps"] = red
    out["gather_us"] = med([(s[41] - s[40]) / 1e3 for s in comm_rows if 40 in s and 41 in s])
    out["reduce_end_us"] = med([(s[46] - t0) / 1e3 for s in comm_rows if 46 in s])
    return out


results = []
for shape in args.shapes.split(","):
    m, nn, k = (int(x) for x in shape.split("x"))
    for op in args.ops.split(","):
        if m % world:
            continue
        fn, a, b = rank_problem(op, m, nn, k, world)
        ga, d = gemm_alone_operands(op, m, nn, k, a)
        cublas_ms = timed(lambda: torch.matmul(ga, b, out=d))
        for c, use in ((int(x), int(u) or sms) for x in args.comm_blocks.split(",")
                       for u in args.sm_counts.split(",")):
            x = gemm_args(ga, b, d, use - c)
            core_ms = timed(lambda: K.gemm_variant("coop_128x256_c2", x, stream()))
            # Controls for the fused GEMM role's slowdown (GEMM+RS/AR: its stores go to the symmetric heap, and it
            # computes the partial chunk by chunk): the same core writing into a heap tensor, and in W launches
            # of M/W rows each (the chunks' shape), all ranks at once as above.
            extra = {}
            if op != "ag_gemm" and args.controls:
                dh = comm.empty((ga.shape[0], nn), torch.bfloat16)
                xh = gemm_args(ga, b, dh, use - c)
                extra["core_heap_ms"] = timed(lambda: K.gemm_variant("coop_128x256_c2", xh, stream()))
                mr = ga.shape[0] // world
                xs = [gemm_args(ga[i * mr:(i + 1) * mr], b, d[i * mr:(i + 1) * mr], use - c) for i in range(world)]
                extra["core_chunks_ms"] = timed(lambda: [K.gemm_variant("coop_128x256_c2", xi, stream()) for xi in xs])
                # the scheduler's swizzle: does the core read B (or A) from HBM again per cluster row when the
                # ranks share one L2?
                for sw in (2, 4, 8):
                    xw = gemm_args(ga, b, d, use - c, swizzle=sw)
                    extra[f"core_swizzle{sw}_ms"] = timed(lambda: K.gemm_variant("coop_128x256_c2", xw, stream()))
                del dh
            base_out = None
            for v in args.variants.split(";"):
                set_variant(v)
                call = lambda: fn(comm, a, b, mode="fused", comm_blocks=c, sm_count=use)  # noqa: E731
                r = dict(op=op, m=m, n=nn, k=k, world=world, sm_count=use, comm_blocks=c, variant=v,
                         cublas_ms=cublas_ms, core_ms=core_ms, **extra)
                try:
                    # every variant computes the same bits as the kernels' own choices (the first variant)
                    got = call().clone()
                    if base_out is None:
                        base_out = got
                    r["differs_from_first"] = int((got != base_out).sum())
                    r["fused_ms"] = timed(call)
                    r["claims"] = bool(K.tp_last_fused_claims())
                    r["pieces"] = K.tp_last_fused_rs_pieces() if op != "ag_gemm" else 1
                    # the GEMM+RS/AR ring (TANDEM_RS_RING=1) has no comm role: every block is a GEMM block
                    r["ring"] = op != "ag_gemm" and hasattr(K, "tp_last_fused_rs_ring") and bool(K.tp_last_fused_rs_ring())
                    rows = timeline(call)
                    r.update(summarize(op, rows, 0 if r["ring"] else c, r["pieces"]))
                    r["raw"] = {str(blk): [sm, {str(s): t for s, t in st.items()}] for blk, (sm, st) in rows.items()}
                except Exception as e:  # noqa: BLE001 - report, go on
                    r["error"] = str(e).splitlines()[0][:200]
                comm.check()
                results.append(r)
                set_variant("base")
        tp.release_workspaces(comm)

common.write_json(args.out, f"tp_trace_r{rank}.json", dict(meta=common.header("tools/diag/tp_trace.py"), rows=results))
comm.barrier()  # every rank's file is written
if rank == 0:
    # Every rank, not only this one: an op takes as long as its slowest rank, and under MPS the rank whose grid
    # starts late differs from launch to launch (rank 0's lines below hid it on 2026-12-06).
    every = []
    for q in range(world):
        path = os.path.join(args.out, f"tp_trace_r{q}.json") if args.out else None
        if path and os.path.exists(path):
            with open(path) as fh:
                every.append(json.load(fh)["rows"])
    if len(every) != world:
        print(f"# every rank's summary skipped: {len(every)} of {world} ranks' files in --out "
              f"({args.out or 'not set'})")
    else:
        print("# every rank: fused ms (min-max, slowest rank), blocks > 20 us late per rank")
        for i, r in enumerate(results):
            fused = [rows[i].get("fused_ms") for rows in every]
            late = [rows[i].get("late_blocks", "-") for rows in every]
            if None in fused:
                continue
            slow = max(range(world), key=lambda q: fused[q])
            print(f"{r['op']} {r['m']}x{r['n']}x{r['k']} c={r['comm_blocks']} SMs={r['sm_count']} [{r['variant']}]: "
                  f"{min(fused):.3f}-{max(fused):.3f} ms (rank {slow}), late {'/'.join(str(x) for x in late)}")

    f = lambda x: "-" if x is None else f"{x:.0f}"  # noqa: E731
    print(f"# fused TP kernels, world {world} ({sms} SMs a rank); times in us unless ms")
    for r in results:
        print(f"\n{r['op']} {r['m']}x{r['n']}x{r['k']} c={r['comm_blocks']} SMs={r['sm_count']} [{r['variant']}]"
              f"{' (ring: no comm blocks)' if r.get('ring') else ''}: fused {r.get('fused_ms', 0):.3f} ms, core on {r['sm_count'] - r['comm_blocks']} SMs {r['core_ms']:.3f} ms, "
              f"cuBLAS {r['cublas_ms']:.3f} ms"
              + (f", core into the heap {r['core_heap_ms']:.3f} ms, core in {r['world']} chunk launches "
                 f"{r['core_chunks_ms']:.3f} ms, core with swizzle 2/4/8 {r['core_swizzle2_ms']:.3f} / "
                 f"{r['core_swizzle4_ms']:.3f} / {r['core_swizzle8_ms']:.3f} ms" if "core_heap_ms" in r else "")
              + f"; {r.get('differs_from_first', '-')} elements differ from the first "
              f"variant{' (tile claims)' if r.get('claims') else ''} {r.get('error', '')}")
        if "span_us" not in r:
            continue
        print(f"  span {f(r['span_us'])}, start spread {f(r['start_spread_us'])} ({r['late_blocks']} of "
              f"{r['blocks']} blocks > 20 us late, {r['distinct_sms']} SMs)")
        if r["op"] == "ag_gemm":
            print(f"  GEMM blocks {f(r['gemm_us'])}; copy steps done at {[f(x) for x in r['copy_steps_us']]}")
            continue
        if "gemm_done_at_us" in r:
            print("  GEMM steps done at: " + ", ".join(f(x) for x in r["gemm_done_at_us"]))
            print("  reduce pieces (acquired at, add): " + "; ".join(
                f"@{f(s['acquired_at_us'])} +{f(s['add_us'])}" for s in r["reduce_pieces"])
                  + f"; gather {f(r['gather_us'])}; reduce blocks end @{f(r['reduce_end_us'])}")
            if "join" in r:
                print("  joined reduction: " + ", ".join(f"{k} {f(v)}" for k, v in r["join"].items()))
            continue
        print("  GEMM steps (wait/compute/stores, done at): " + "; ".join(
            f"{f(s['wait_us'])}/{f(s['compute_us'])}/{f(s['stores_us'])} @{f(s['done_at_us'])}" for s in r["gemm_steps"]))
        print("  reduce steps (acquired at, add): " + "; ".join(
            f"@{f(s['acquired_at_us'])} +{f(s['add_us'])}" for s in r["reduce_steps"])
              + f"; gather {f(r['gather_us'])}; reduce blocks end @{f(r['reduce_end_us'])}")
comm.barrier()
comm.destroy()
