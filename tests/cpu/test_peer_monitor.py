"""The node-local peer monitor: a killed process is seen at once, a clean close is not a failure."""

import multiprocessing as mp
import os
import signal
import tempfile
import time

import pytest

from tandem._native import available

pytestmark = pytest.mark.skipif(not available(), reason="tandem._C not built")


def _rank(d, rank, world, q, behaviour):
    from tandem._native import native

    m = native()._PeerMonitorForTest(d, rank, world, 20.0)
    q.put(("up", rank))
    if behaviour == "die":
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    if behaviour == "close":
        time.sleep(0.3)
        m.close()
        q.put(("closed", rank))
        time.sleep(3)
        return
    t0 = time.monotonic()
    while m.exited_peer < 0 and time.monotonic() - t0 < 10:
        time.sleep(0.01)
    q.put(("seen", rank, m.exited_peer, time.monotonic() - t0))
    time.sleep(0.5)


def test_killed_peer_is_seen_and_clean_close_is_not():
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory() as d:
        roles = ["watch", "close", "die"]
        ps = [ctx.Process(target=_rank, args=(d, r, 3, q, roles[r])) for r in range(3)]
        for p in ps:
            p.start()
        msgs = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(m[0] == "seen" for m in msgs):
            try:
                msgs.append(q.get(timeout=1))
            except Exception:
                pass
        for p in ps:
            p.join(20)
    seen = [m for m in msgs if m[0] == "seen"]
    assert seen, msgs
    _, rank, peer, after = seen[0]
    assert rank == 0 and peer == 2  # the killed one, not the one that closed cleanly
    assert after < 5.0
    assert ps[2].exitcode == -signal.SIGKILL
