"""Closing a proxy endpoint while a peer still waits in quiet(): over loopback TCP (no root needed).

The receiver applies a frame, then owes an ack; a receiver that closes right after it saw the last flag used to
lose those acks (its ack thread stopped before sending them), and the sender's quiet() timed out with
"retired 59992 of 60000" (CI, tests/cpu/test_proxy_tcp.py mesh test on 2 busy cores)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest

from tests.cpu.rank_procs import finish
from tandem._native import available

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(not available(), reason="tandem._C not built")


def _run(mode, args, timeout=240, env=None):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {}))
    with tempfile.TemporaryDirectory() as d:
        ps = [subprocess.Popen([sys.executable, "-m", "tests.cpu.proxy_worker", mode, d, str(r), "127.0.0.1",
                                json.dumps(args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=env, cwd=ROOT) for r in range(2)]
        return [finish(p, timeout, f"{mode}: ", kill_on_hang=ps)[0] for p in ps]


@pytest.mark.parametrize("late_acks", [False, True], ids=["acks_on_time", "acks_late"])
def test_a_receiver_that_closes_at_once_still_acknowledges_everything_it_applied(late_acks):
    # acks_late: the receiver's ack thread sleeps 200 ms before each round (TANDEM_TEST_LATE_ACKS), so the
    # receiver always closes before its ack thread has sent the last acks: only shutdown() can send them.
    rounds = 8 if late_acks else 25
    # (a ring larger than the stream when late: the sender never waits for an ack before its quiet())
    send, recv = _run("close_race", dict(count=2000, rounds=rounds, capacity=4096 if late_acks else 64,
                                         timeout_s=10.0),
                      env={"TANDEM_TEST_LATE_ACKS": "1"} if late_acks else None)
    assert "raised" not in send, send
    assert send["rounds"] == rounds, send
    assert recv["violations"] == 0, recv


def test_a_receiver_that_closes_early_fails_the_sender_at_once_naming_it():
    timeout_s = 20.0
    send, recv = _run("close_early", dict(count=200_000, rounds=1, capacity=64, timeout_s=timeout_s))
    assert send.get("raised"), f"the sender never noticed its peer had gone: {send}"
    assert send["peer"] == 1, send
    # from the receiver's close to the sender's error: far less than the link timeout. (Timed from the close, not
    # from the sender's start: on 2 busy CI cores, setup and streaming the first half took 11.7 s once.)
    detect_s = send["raised_at"] - recv["closed_at"]
    assert detect_s < timeout_s / 2, (detect_s, send, recv)
