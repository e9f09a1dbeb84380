"""Timing and reporting helpers shared by the benchmarks."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys


def time_launches(fn, *, warmup: int = 3, reps: int = 10, inner: int = 1) -> float:
    """Median seconds of one `fn()` (which enqueues GPU work on the current stream), timed with CUDA events
    around `inner` back-to-back calls (for small ops, so that event and sync overhead is spread out)."""
    return statistics.median(launch_samples(fn, warmup=warmup, reps=reps, inner=inner))


def launch_samples(fn, *, warmup: int = 3, reps: int = 10, inner: int = 1) -> list:
    """Seconds of one `fn()` in each of `reps` timings (CUDA events around `inner` back-to-back calls), after
    `warmup` untimed calls."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e-3 / inner)
    return times


class _Single:
    """time_columns_ms's communicator for one process (no other rank to start with)."""
    rank = 0

    @staticmethod
    def barrier():
        return None


SINGLE = _Single()


def _with_inner(fn, n: int):
    """fn, marked with the back-to-back calls a timing of it makes (time_columns_ms's `inner`)."""
    if n == 1:
        return fn

    def call():
        return fn()
    call._tandem_inner = n
    return call


def time_columns_ms(comm, columns: dict, *, warmup: int, reps: int, rounds: int, sampler=None, log=print,
                    inner: dict | None = None):
    """ms of one call of each column {name: fn} with every rank starting each timing together, the columns
    interleaved: `rounds` rounds, each timing every column (reps / rounds timings each, at least one; `warmup`
    untimed calls before a column's first round, one before each later round), the column order rotated by one
    every round. A column's time is the median of all its timings; its spread is max / min of its per-round
    medians (1.0 with one round).

    Why: columns timed one after the other, each in one block, also measure the GPU's drift between the blocks
    (clocks, power, the MPS ranks' relative pace). On 2026-12-07 (H100, world 2) the same mode timed in two
    consecutive columns differed by up to 24 %, as much as the differences the columns are read for. Interleaving
    spreads the drift over every column; the spread says how large it was.

    A column whose fn raises is reported once (rank 0; the first line of the error) and is None from then on. The
    ranks must fail alike (a mode refusing a shape does: the checks run before any launch, on the same arguments);
    a failure on some ranks only (an out-of-memory error) leaves the others in a collective until the
    communicator's timeout raises there, as with time_ranks_ms.
    Returns ({name: ms or None}, {name: spread or None}), ms of one call. `inner` {name: n}: that column's timings
    are n back-to-back calls between the events, divided (launch_samples). `sampler(fn, warmup, reps) -> [s, ...]`
    replaces the CUDA-event timing (tests). comm: anything with .rank and .barrier() (a single process may pass
    SINGLE)."""
    inner = inner or {}
    if sampler is None:
        def sampler(fn, warmup, reps):
            return launch_samples(fn, warmup=warmup, reps=reps, inner=getattr(fn, "_tandem_inner", 1))
        columns = {n: _with_inner(fn, inner.get(n, 1)) for n, fn in columns.items()}
    names = list(columns)
    rounds = max(1, int(rounds))
    per_round = max(1, -(-int(reps) // rounds))
    samples = {n: [] for n in names}
    round_medians = {n: [] for n in names}
    failed = set()
    for rnd in range(rounds):
        shift = rnd % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            if name in failed:
                continue
            comm.barrier()
            try:
                t = sampler(columns[name], warmup if rnd == 0 else 1, per_round)
            except Exception as e:  # noqa: BLE001 - a mode that refuses the shape is reported, not fatal
                failed.add(name)
                if comm.rank == 0:
                    log(f"  skipped {name}: {str(e).splitlines()[0][:160] if str(e) else type(e).__name__}")
                continue
            samples[name].extend(t)
            round_medians[name].append(statistics.median(t))
    ms = {n: (statistics.median(samples[n]) * 1e3 if samples[n] and n not in failed else None) for n in names}
    spread = {n: (max(round_medians[n]) / min(round_medians[n])
                  if round_medians[n] and n not in failed and min(round_medians[n]) > 0 else None) for n in names}
    return ms, spread


def host_launch_us(fn, n: int, *, warmup: bool = False, before=None) -> float:
    """Host wall time of enqueuing one fn() in us: perf_counter around n calls with no sync inside, divided (the
    device work drains after the clock stops). warmup: one call first; before: run after the device is idle and
    just before the clock starts (e.g. a host barrier so that every rank starts together)."""
    import time

    import torch

    if warmup:
        fn()
    torch.cuda.synchronize()
    if before is not None:
        before()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def time_ranks_ms(comm, fn, *, warmup: int, reps: int):
    """ms of one fn() with every rank starting together (a host barrier, then time_launches), or None when fn
    raises: a mode that refuses the shape is reported (rank 0 prints the first line), not fatal."""
    comm.barrier()
    try:
        return time_launches(fn, warmup=warmup, reps=reps) * 1e3
    except Exception as e:  # noqa: BLE001 - see the docstring
        if comm.rank == 0:
            print(f"  skipped: {str(e).splitlines()[0][:160]}")
        return None


def heap_bytes_for(wanted: int) -> int:
    """The symmetric heap a bench asks for: `wanted`, but at most 45 % of the GPU's memory over the ranks that share
    that GPU (MPS ranks under tandem.launch all share one), so a bench sized on a 141 GB H200 still starts on an
    80 GB H100 instead of failing one rank's cuMem reservation (its tensors, outside the heap, need the rest)."""
    cap = int(0.45 * gpu_bytes_per_rank()) >> 30 << 30  # whole GiB
    return max(1 << 30, min(wanted, cap))


def gpu_bytes_per_rank() -> float:
    """This GPU's memory over the ranks that share it (MPS ranks under tandem.launch all share one)."""
    import torch

    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    per_gpu = max(1, -(-local // max(1, torch.cuda.device_count())))
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / per_gpu


def git_commit() -> str:
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name()


def header(command: str) -> dict:
    return dict(date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                device=device_name(), commit=os.environ.get("TANDEM_COMMIT", git_commit()), command=command,
                host=platform.node())


def fmt_bytes(n: int) -> str:
    for unit, s in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << s and n % (1 << s) == 0:
            return f"{n >> s} {unit}"
    return f"{n} B"


def markdown_table(columns: list, rows: list) -> str:
    out = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def write_json(out_dir: str | None, filename: str, obj) -> None:
    """`obj` as indented JSON in out_dir/filename (out_dir made if missing); nothing without an out_dir."""
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, filename), "w") as f:
        json.dump(obj, f, indent=1)


def write_outputs(out_dir: str | None, name: str, meta: dict, table_md: str, data):
    """<name>.json and <name>.md in out_dir. data: a dict (written as {"meta": meta, "data": data}) or a list of
    row dicts (written as that list, each row with the run's meta under "run": the form the issues ask for, a list
    of rows that a reader can filter without knowing a wrapper)."""
    if not out_dir:
        return
    if isinstance(data, list):
        write_json(out_dir, f"{name}.json", [dict(r, run=meta) for r in data])
    else:
        write_json(out_dir, f"{name}.json", dict(meta=meta, data=data))
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(f"{name}: {meta['date']}, {meta['device']}, commit {meta['commit']}\n\n`{meta['command']}`\n\n")
        f.write(table_md + "\n")


def bench_argv(argv) -> list:
    """A benchmark's own arguments: argv when given, else those after `python -m tandem bench <name>`."""
    return list(argv if argv is not None else sys.argv[3:])


def command_line(name: str, argv) -> str:
    """The command that reproduces this run, for the results' headers."""
    return " ".join(["python -m tandem bench", name] + bench_argv(argv))


def parser(name: str, doc: str, reps: int, ranks: bool = True) -> argparse.ArgumentParser:
    """The arguments every benchmark takes: -n (ranks; not for single-GPU-only ones), --reps, --out."""
    ap = argparse.ArgumentParser(prog=f"tandem bench {name}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    if ranks:
        ap.add_argument("-n", "--nprocs", type=int, default=None,
                        help="launch this many ranks (MPS on one GPU); default: run as the current rank")
    ap.add_argument("--reps", type=int, default=reps)
    ap.add_argument("--out", type=str, default=None, help="folder for .json/.md/.png results")
    return ap


def relaunch(name: str, nprocs: int | None, argv, **launch_kw) -> int | None:
    """Run `python -m tandem bench <name> <argv>` as `nprocs` ranks (MPS on one GPU) when asked for and not already
    a rank; returns the exit code then, None when the caller is to run the benchmark itself."""
    import os
    import sys

    if nprocs is None or "RANK" in os.environ:
        return None
    from ..errors import TandemError
    from ..launch import launch

    cmd = [sys.executable, "-m", "tandem", "bench", name] + bench_argv(argv)
    try:
        res = launch(cmd, nprocs, **launch_kw)
    except TandemError as e:
        print(str(e), file=sys.stderr)
        return 2
    return 0 if res.ok else 1


def grouped_bars(path: str, labels: list, series: list, ylabel: str, title: str, hlines=()):
    """Grouped bar chart: series = [(name, values)] (None: no bar), one group per label; hlines: [(y, label)]
    dashed reference lines. Skipped without matplotlib."""
    import sys

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no plot", file=sys.stderr)
        return
    xs = range(len(labels))
    width = 0.8 / max(len(series), 1)
    many = len(labels) > 12  # long sweeps: narrower groups, slanted labels
    fig, ax = plt.subplots(figsize=(min(16, max(6, (0.6 if many else 1.3) * len(labels))), 4.5 if many else 4))
    for i, (name, values) in enumerate(series):
        at = [(x + (i - (len(series) - 1) / 2) * width, v) for x, v in zip(xs, values) if v is not None]
        ax.bar([x for x, _ in at], [v for _, v in at], width=width, label=name)
    for y, name in hlines:
        ax.axhline(y, linestyle="--", linewidth=0.8, color="gray")
        ax.text(-0.5, y, f" {name}", va="bottom", ha="left", fontsize=7, color="gray")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=7, rotation=55 if many else 0, ha="right" if many else "center")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")
