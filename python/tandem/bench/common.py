"""Timing and reporting helpers shared by the benchmarks."""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import subprocess


def time_launches(fn, *, warmup: int = 3, reps: int = 10, inner: int = 1) -> float:
    """Median seconds of one `fn()` (which enqueues GPU work on the current stream), timed with CUDA events
    around `inner` back-to-back calls (for small ops, so that event and sync overhead is spread out)."""
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
    return statistics.median(times)


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


def write_outputs(out_dir: str | None, name: str, meta: dict, table_md: str, data: dict):
    if not out_dir:
        return
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(dict(meta=meta, data=data), f, indent=1)
    with open(os.path.join(out_dir, f"{name}.md"), "w") as f:
        f.write(f"{name}: {meta['date']}, {meta['device']}, commit {meta['commit']}\n\n`{meta['command']}`\n\n")
        f.write(table_md + "\n")
