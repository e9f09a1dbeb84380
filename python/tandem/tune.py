"""`python -m tandem tune -n N`: measure the TP ops' modes and SM splits on this machine and write the table that
mode="auto" reads (tandem.ops.tp_plan). Every rank runs every candidate at once, as the ops run in a job: the
unfused path, the pipelined mode (one node), the fused kernel at comm_blocks 2, 4, 6, 8, 12, 16, ... up to a
quarter of the rank's SMs, and for GEMM+RS/AR on one node the fused kernel by tickets in 1, 2 and 4 rounds (mode
"ticket" in the table, comm_blocks its rounds).

    python -m tandem tune -n 4 [--shapes MxNxK,...] [--out FILE] [--reps 5]
    python -m tandem tune --from-bench docs/results/tp_w2.json docs/results/tp_w4.json [--out FILE]
    python -m tandem tune gemm --from-bench docs/results/gemm_w1.json [--out FILE]   (the GEMM's configurations)

--from-bench takes the modes' times from bench tp's JSON instead (the same run conditions: every rank at once,
CUDA events, medians); it has no fused split sweep, so its fused entries are at the op's default split.

Shapes are the rank's problems as tandem.bench.tp takes them (default: that benchmark's set).
"""

from __future__ import annotations

import argparse
import os
import sys


# The ticket kernel's rounds that tune times (1: none); TANDEM_RS_TICKET_ROUNDS's values
TICKET_ROUNDS = (1, 2, 4)


def candidates(sms: int) -> list:
    out, c = [], 2
    while c <= max(2, sms // 4):
        out.append(c)
        c = c + 2 if c < 8 else c + 4
    return out


def run(case_list, reps, path):
    from . import ops  # noqa: F401
    from .bench import common
    from .bench.tp import rank_problem
    from .ops import tp, tp_plan
    from .transport import Communicator

    comm = Communicator(heap_bytes=12 << 30, timeout_s=60)
    world, rank, sms = comm.world_size, comm.rank, comm.sm_count
    rows = []
    for op, m, n, k, label in case_list:
        if m % world:
            continue
        fn, a, b = rank_problem(op, m, n, k, world)
        kk = a.shape[1]  # the rank's K: the table is keyed by the problem the op sees
        results = {}
        one_node = comm.native.num_nodes == 1
        pipelined = [("pipelined", 0)] if one_node else []
        # GEMM+RS/AR by tickets (one node): timed through its knobs as mode="fused" (the knobs are part of a
        # prepared call's signature), tabled as mode "ticket" with its rounds
        tickets = [("ticket", r) for r in TICKET_ROUNDS] if one_node and op != "ag_gemm" else []
        for mode, c in [("unfused", 0)] + pipelined + [("fused", c) for c in candidates(sms)] + tickets:
            comm.barrier()
            saved = {v: os.environ.get(v) for v in ("TANDEM_RS_TICKET", "TANDEM_RS_TICKET_ROUNDS")}
            for v in saved:  # (a ticket knob of the caller's shell would turn the other candidates into tickets)
                os.environ.pop(v, None)
            if mode == "ticket":
                os.environ.update(TANDEM_RS_TICKET="1", TANDEM_RS_TICKET_ROUNDS=str(c))
            try:
                call_mode, blocks = ("fused", 0) if mode == "ticket" else (mode, c)
                results[(mode, c)] = common.time_launches(
                    lambda: fn(comm, a, b, mode=call_mode, comm_blocks=blocks), warmup=2, reps=reps) * 1e3
            except Exception as e:  # noqa: BLE001 - a mode that refuses the shape is not a candidate
                if rank == 0:
                    print(f"  {label} {op} {mode} {c}: {str(e).splitlines()[0][:120]}")
            finally:
                for v, old in saved.items():
                    if old is None:
                        os.environ.pop(v, None)
                    else:
                        os.environ[v] = old
        comm.check()
        tp.release_workspaces(comm)
        # every rank must pick the same: rank 0's timings decide (the ranks agree on keys, not on timings)
        (mode, c), ms = min(results.items(), key=lambda kv: kv[1])
        rows.append(dict(op=op, world=world, sms=sms, m=m, n=n, k=kk, mode=mode, comm_blocks=c, ms=ms,
                         candidates={f"{mo}:{cc}": t for (mo, cc), t in results.items()}))
        if rank == 0:
            print(f"{label:>24} {op:8} best {mode} comm_blocks={c} {ms:.3f} ms; "
                  + " ".join(f"{mo[0]}{cc}={t:.2f}" for (mo, cc), t in results.items()), flush=True)
    if rank == 0:
        print("tuned table:", tp_plan.write_table(rows, path))
    comm.destroy()


_BENCH_MODES = ("fused", "unfused", "pipelined", "ticket")  # ticket: bench tp --ticket's column (no rounds)


def _commit_of(data, row) -> str:
    """The commit a bench row was measured at: in the row (the list form) or in the file's meta (the older form)."""
    meta = row.get("run") if isinstance(data, list) else data.get("meta")
    return (meta or {}).get("commit", "?")


def rows_from_bench(paths) -> list:
    """Table rows from `python -m tandem bench tp` outputs (tp_w*.json): per shape, the fastest of the modes the
    benchmark timed in its run (fused at the op's default split, unfused, pipelined, and with --ticket the ticket
    kernel, tabled as mode "ticket" with the rounds it ran), every rank at once as here.
    The rank's K is the table's (RS/AR: K / world). Rows whose modes all failed are skipped.

    A shape timed in several runs (several files, or twice in one) gives one row: each mode's time is the median
    of its runs' times (with two, their mean), and the fastest of those is chosen. Why: one run's columns at one
    shape moved by up to 24 % between runs on one GPU under MPS (2026-12-07, docs/results.md), so the last run's
    choice alone would follow its noise."""
    import json
    import statistics

    groups = {}  # (op, world, sms, m, n, k_rank) -> {"mode:blocks": [ms, ...]}, in first-seen order
    sources = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        for r in data["data"]["rows"] if isinstance(data, dict) else data:
            times = {mode: r.get(f"{mode}_ms") for mode in _BENCH_MODES}
            # the ticket column counts only where the ticket kernel ran and no knob but its rounds changed it
            if r.get("ticket_ran") is False or set(r.get("ticket_knobs") or {}) - {"TANDEM_RS_TICKET_ROUNDS"}:
                times.pop("ticket", None)
            times = {mode: t for mode, t in times.items() if t}
            rounds = int(r.get("ticket_rounds") or 1)
            if not times:
                continue
            world = int(r["world"])
            k_rank = int(r["k"]) if r["op"] == "ag_gemm" else int(r["k"]) // world
            key = (r["op"], world, int(r["sm_count"]), int(r["m"]), int(r["n"]), k_rank)
            # (a ticket entry's number is the column's rounds: 1 where the bench did not record them)
            cand = groups.setdefault(key, {})
            for mo, t in times.items():
                cand.setdefault(f"{mo}:{rounds if mo == 'ticket' else 0}", []).append(t)
            src = f"bench {os.path.basename(path)} {_commit_of(data, r)}"
            if src not in sources.setdefault(key, []):
                sources[key].append(src)
    rows = []
    for key, cand in groups.items():
        op, world, sms, m, n, k_rank = key
        merged = {c: statistics.median(ts) for c, ts in cand.items()}
        best = min(merged, key=merged.get)
        mode, blocks = best.split(":")
        rows.append(dict(op=op, world=world, sms=sms, m=m, n=n, k=k_rank, mode=mode, comm_blocks=int(blocks),
                         ms=merged[best], candidates=merged, runs=max(len(ts) for ts in cand.values()),
                         source="; ".join(sources[key])))
    return rows


def main_gemm(argv) -> int:
    """`python -m tandem tune gemm --from-bench gemm_w1.json [--out FILE]`: the table of CUTLASS configurations
    that torch.ops.tandem.gemm and scaled_gemm read (tandem.ops.gemm_plan), from `bench gemm`'s per-configuration
    times (bf16 rows, and FP8 rows per scaling)."""
    ap = argparse.ArgumentParser(prog="python -m tandem tune gemm", description=main_gemm.__doc__)
    ap.add_argument("--from-bench", nargs="+", required=True, metavar="GEMM_JSON",
                    help="`tandem bench gemm` outputs (gemm_w1.json) with variants_ms (no GPU needed)")
    ap.add_argument("--out", default=None, help="table file (default: tandem.ops.gemm_plan.table_path())")
    a = ap.parse_args(argv)
    from .ops import gemm_plan

    rows = gemm_plan.rows_from_bench(a.from_bench)
    for r in rows:
        print(f"{r['kind']} {r['m']}x{r['n']}x{r['k']} on {r['sms']} SMs: {r['variant']} {r['ms']:.3f} ms")
    if not rows:
        print("no rows with per-configuration times (variants_ms) in", " ".join(a.from_bench))
        return 1
    print("tuned table:", gemm_plan.write_table(rows, a.out))
    return 0


def main(argv=None) -> int:
    argv = list(sys.argv[2:] if argv is None else argv)
    if argv[:1] == ["gemm"]:
        return main_gemm(argv[1:])
    ap = argparse.ArgumentParser(prog="python -m tandem tune", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--nprocs", type=int, default=None, help="ranks to launch (MPS on one GPU)")
    ap.add_argument("--shapes", default=None, help="MxNxK,... (default: tandem bench tp's set)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None, help="table file (default: tandem.ops.tp_plan.table_path())")
    ap.add_argument("--from-bench", nargs="+", default=None, metavar="TP_JSON",
                    help="build the table from `tandem bench tp` outputs (tp_w2.json ...) instead of measuring: the "
                         "fastest mode the benchmark timed at each shape (no GPU needed)")
    argv = list(sys.argv[2:] if argv is None else argv)
    a = ap.parse_args(argv)
    if a.from_bench:
        from .ops import tp_plan

        rows = rows_from_bench(a.from_bench)
        for r in rows:
            print(f"{r['op']:8} w{r['world']} {r['m']}x{r['n']}x{r['k']}: {r['mode']} {r['ms']:.3f} ms")
        print("tuned table:", tp_plan.write_table(rows, a.out))
        return 0
    if a.nprocs is not None and "RANK" not in os.environ:
        from .launch import launch

        res = launch([sys.executable, "-m", "tandem", "tune"] + argv, a.nprocs)
        return 0 if res.ok else 1
    from .bench.tp import cases

    world = int(os.environ.get("WORLD_SIZE", "1"))
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")] if a.shapes else None
    run(cases(world, shapes), a.reps, a.out)
    return 0
