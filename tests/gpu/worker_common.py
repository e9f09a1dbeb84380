"""Shared by the rank-side test bodies (workers_*.py): bad-input statuses and CUDA-graph capture."""

from __future__ import annotations

import os
import signal
import time

import torch

from tandem.errors import TandemError


def reject_statuses(cases: dict) -> dict:
    """{name: status of the TandemError the call raised, or None if it raised none}. A call that launched is
    synchronized, so that an error the device reports surfaces here rather than in the next case."""
    out = {}
    for name, fn in cases.items():
        try:
            fn()
            torch.cuda.synchronize()
            out[name] = None
        except TandemError as e:
            out[name] = e.status
    return out


def capture(fn):
    """(graph, fn's outputs): fn captured on a side stream (a capture must not run on the legacy default stream),
    the current stream ordered after it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=side):
            out = fn()
    torch.cuda.current_stream().wait_stream(side)
    return g, out


def kill_self(stamp_dir: str):
    """Write the time to stamp_dir/killed_at (the tests measure the survivors' detection from it), then SIGKILL
    this rank: no destroy, no goodbye to the peer monitor, kernels possibly in flight."""
    with open(os.path.join(stamp_dir, "killed_at"), "w") as f:
        f.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)
