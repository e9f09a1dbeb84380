"""Waiting for the rank processes of the CPU tests (each prints one JSON line last)."""

from __future__ import annotations

import json
import subprocess


def finish(p: subprocess.Popen, timeout: float, label: str = "", kill_on_hang=()) -> tuple:
    """(the rank's last stdout line as JSON, its stderr). A rank still running after `timeout` s is killed, with
    every process in `kill_on_hang`, and an AssertionError shows the end of its stderr; so does a nonzero exit."""
    try:
        o, e = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for q in (p, *kill_on_hang):
            q.kill()
        _, e = p.communicate()
        raise AssertionError(f"{label}a rank hung\n{e[-3000:]}") from None
    assert p.returncode == 0, f"{label}rank exited {p.returncode}\n{e[-3000:]}"
    return json.loads(o.strip().splitlines()[-1]), e
