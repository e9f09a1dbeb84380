"""Shared by the rank-side reject tests: run each bad call and record the status of the TandemError it raised."""

from __future__ import annotations

import torch

from tandem.errors import TandemError


def statuses(cases: dict) -> dict:
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
