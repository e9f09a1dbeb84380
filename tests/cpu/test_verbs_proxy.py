"""The verbs proxy loop end to end on CPU: host command queue -> Python proxy -> C++ planner -> a loopback
driver with RC semantics. No NIC is involved (none exists here); PyverbsDriver itself is not run."""

from __future__ import annotations

import random
import threading
import time

import pytest

from tandem._native import available, native
from tandem.errors import TandemError
from tandem.transport import verbs
from tandem.transport.verbs_proxy import LoopbackDriver, PyverbsDriver, VerbsProxy

pytestmark = pytest.mark.skipif(not available(), reason="tandem._C not built")

HEAP = 1 << 20
LOCAL_BASE = 0x7F00_0000_0000
REMOTE_BASE = {1: 0x7E00_0000_0000, 2: 0x7D00_0000_0000}
SCRATCH = HEAP - 64  # the scratch word sits at the end of the local heap


def _setup(capacity=1024, qps=4, timeout_s=5.0, **driver_kw):
    local = bytearray(HEAP)
    remotes = {p: (bytearray(HEAP), REMOTE_BASE[p]) for p in REMOTE_BASE}
    planner = verbs.planner(
        dict(base=LOCAL_BASE, lkey=1, bytes=HEAP - 4096, scratch_addr=LOCAL_BASE + SCRATCH, scratch_lkey=2),
        {p: dict(base=REMOTE_BASE[p], rkey=10 + p, bytes=HEAP) for p in REMOTE_BASE},
        qps_per_peer=qps, max_batch=8, signal_every=16, sq_depth=256)
    driver = LoopbackDriver(local, LOCAL_BASE, remotes, **driver_kw)
    queue = native().CommandQueue(capacity, 0)
    errors = []
    proxy = VerbsProxy(queue, planner, driver, rank=0, timeout_s=timeout_s, on_error=errors.append).start()
    return local, remotes, queue, proxy, driver, errors


def test_put_signals_arrive_bit_exact_and_in_order_per_channel():
    local, remotes, queue, proxy, driver, errors = _setup(delay_polls=2, reorder_qps=True)
    rng = random.Random(7)
    expected = {p: bytearray(HEAP) for p in remotes}
    n = 3000
    sent_adds = {1: 0, 2: 0}
    try:
        for i in range(n):
            peer = 1 + (i % 2)
            size = rng.choice([1, 8, 13, 256, 4099])
            off = rng.randrange(0, 512 * 1024 - size)
            payload = rng.randbytes(size)
            local[off:off + size] = payload  # staged before the command, as a GPU producer would
            # the source bytes are read when the WR executes: the next command may overwrite them only after
            # this one retired, hence the quiet at the end of every round
            channel = i % 3
            if i % 5 == 0:
                queue.push("put_signal", peer, src=off, dst=off, nbytes=size, sig=600 * 1024 + 8 * peer,
                           value=1, signal_op="add", channel=channel)
                sent_adds[peer] += 1
            else:
                queue.push("put_signal", peer, src=off, dst=off, nbytes=size, sig=700 * 1024 + 128 * channel,
                           value=i + 1, channel=channel)
            expected[peer][off:off + size] = payload
            queue.wait_retired(queue.tail, 10.0)
        proxy.check()
    finally:
        proxy.stop()
    assert not errors
    assert queue.retired == queue.tail == n
    for p, (buf, _) in remotes.items():
        assert buf[:512 * 1024] == expected[p][:512 * 1024], f"payload to peer {p} differs"
        assert int.from_bytes(buf[600 * 1024 + 8 * p:600 * 1024 + 8 * p + 8], "little") == sent_adds[p]
    # every set-flag holds the last value sent on its channel to that peer
    last = {}
    for i in range(n):
        if i % 5:
            last[(1 + i % 2, i % 3)] = i + 1
    for (p, ch), v in last.items():
        assert int.from_bytes(remotes[p][0][700 * 1024 + 128 * ch:700 * 1024 + 128 * ch + 8], "little") == v
    # on every QP each flag WR follows the data WR of its command (same QP: RC keeps them in order)
    per_qp = {}
    for peer, qp, opcode in driver.log:
        per_qp.setdefault((peer, qp), []).append(opcode)
    for ops in per_qp.values():
        assert ops[0::2] == ["write"] * (len(ops) // 2)
        assert all(o in ("write_inline", "atomic_fetch_add") for o in ops[1::2])


def test_streamed_commands_batch_and_retire_out_of_order_across_qps():
    local, remotes, queue, proxy, driver, errors = _setup(capacity=64, delay_polls=3, reorder_qps=True)
    n = 20_000
    try:
        for i in range(n):  # no quiet in between: the ring (64 slots) applies back-pressure, nothing is lost
            peer = 1 + (i % 2)
            queue.push("put_signal", peer, src=8 * (i % 4096), dst=8 * (i % 4096), nbytes=8,
                       sig=900 * 1024 + 8 * (i % 8), value=1, signal_op="add", channel=i % 4)
        queue.wait_retired(n, 30.0)
        proxy.check()
    finally:
        proxy.stop()
    assert not errors and queue.retired == n
    total = sum(int.from_bytes(remotes[p][0][900 * 1024 + 8 * k:900 * 1024 + 8 * k + 8], "little")
                for p in remotes for k in range(8))
    assert total == n
    assert proxy.posted_wrs == 2 * n  # one data WRITE + one FETCH_ADD each
    assert proxy.posts < proxy.posted_wrs // 2  # batched posts


def test_error_completion_stops_the_proxy_and_names_the_peer():
    local, remotes, queue, proxy, driver, errors = _setup(fail_after=5)
    try:
        for i in range(4):
            queue.push("put", 2, src=0, dst=64 * i, nbytes=64)
        with pytest.raises(TandemError) as ei:
            for i in range(100):
                queue.push("put_signal", 2, src=0, dst=0, nbytes=64, sig=4096, value=i + 1, timeout_s=2.0)
            queue.wait_retired(queue.tail, 5.0)
        assert ei.value.status == 2 and ei.value.peer == 2  # aborted, naming the peer
        deadline = time.monotonic() + 5
        while proxy.error is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proxy.error is not None and proxy.error.op == "verbs.completion" and proxy.error.peer == 2
        assert errors and errors[0] is proxy.error
    finally:
        proxy.stop()


def test_silent_peer_is_a_timeout_within_the_bound():
    local, remotes, queue, proxy, driver, errors = _setup(timeout_s=1.0, drop_peer=1)
    try:
        queue.push("put_signal", 2, src=0, dst=0, nbytes=8, sig=4096, value=1)
        queue.wait_retired(1, 5.0)  # peer 2 still answers
        queue.push("put_signal", 1, src=0, dst=0, nbytes=8, sig=4096, value=1)
        t0 = time.monotonic()
        with pytest.raises(TandemError) as ei:
            queue.wait_retired(2, 10.0)
        assert time.monotonic() - t0 < 1.0 + 1.5
        assert ei.value.peer == 1
        assert proxy.error.op == "verbs.progress" and proxy.error.status == 1 and proxy.error.peer == 1
    finally:
        proxy.stop()


def test_pyverbs_driver_without_pyverbs_or_nic_is_a_clear_error():
    try:
        import pyverbs.device  # noqa: F401
        have = True
    except ImportError:
        have = False
    with pytest.raises(TandemError) as ei:
        PyverbsDriver(store=None, rank=0, peers=[1], heap_ptr=0, heap_bytes=1 << 20, dmabuf_fd=None)
    assert ei.value.status == 9
    assert ("pyverbs" in str(ei.value)) if not have else ("RDMA" in str(ei.value))
