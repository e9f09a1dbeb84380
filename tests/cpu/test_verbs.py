"""RDMA verbs: the work-request planner (C++), NIC selection, and clear errors without pyverbs or a NIC.
Nothing here touches a NIC: none exists on the machines this runs on."""

import pytest

from tandem._native import available
from tandem.errors import TandemError
from tandem.transport import verbs

needs_native = pytest.mark.skipif(not available(), reason="tandem._C not built")

LOCAL = dict(base=0x7F0000000000, lkey=11, bytes=1 << 30, scratch_addr=0x600000, scratch_lkey=12)
PEERS = {1: dict(base=0x7E0000000000, rkey=21, bytes=1 << 30), 2: dict(base=0x7D0000000000, rkey=22, bytes=1 << 30)}


def _all(batches):
    return [w for b in batches for w in b["wrs"]]


@needs_native
def test_put_signal_is_data_writes_then_ordered_inline_flag_write():
    p = verbs.planner(LOCAL, PEERS, max_wr_bytes=1 << 20)
    p.add(dict(op="put_signal", peer=1, src=4096, dst=8192, bytes=(3 << 20) + 5, sig=64, value=7), 0)
    b = p.take(flush=True)
    assert {x["peer"] for x in b} == {1} and len({x["qp"] for x in b}) == 1  # one QP: RC keeps them in order
    w = _all(b)
    assert [x["opcode"] for x in w] == ["write"] * 4 + ["write_inline"]
    assert [x["length"] for x in w[:4]] == [1 << 20] * 3 + [5]
    assert w[0]["local_addr"] == LOCAL["base"] + 4096 and w[0]["lkey"] == 11
    assert w[3]["remote_addr"] == PEERS[1]["base"] + 8192 + (3 << 20) and w[3]["rkey"] == 21
    assert w[4]["remote_addr"] == PEERS[1]["base"] + 64 and w[4]["value"] == 7 and w[4]["length"] == 8
    assert w[-1]["signaled"]  # the flush signals its last WR


@needs_native
def test_add_signal_is_a_fenced_atomic_into_the_scratch_word():
    p = verbs.planner(LOCAL, PEERS)
    p.add(dict(op="signal", peer=2, sig=128, value=3, signal_op="add"), 5)
    (w,) = _all(p.take(flush=True))
    assert w["opcode"] == "atomic_fetch_add" and w["fence"] and w["value"] == 3
    assert w["remote_addr"] == PEERS[2]["base"] + 128 and w["local_addr"] == LOCAL["scratch_addr"]


@needs_native
def test_batching_signaling_and_in_order_retirement():
    p = verbs.planner(LOCAL, PEERS, max_batch=8, signal_every=4, sq_depth=64, qps_per_peer=1)
    for t in range(20):
        p.add(dict(op="put", peer=1, src=t * 64, dst=t * 64, bytes=64), t)
    full = p.take(flush=False)
    assert [len(b["wrs"]) for b in full] == [8, 8]  # only full batches without a flush
    rest = p.take(flush=True)
    assert [len(b["wrs"]) for b in rest] == [4]
    w = _all(full + rest)
    signaled = [i for i, x in enumerate(w) if x["signaled"]]
    assert signaled == [3, 7, 11, 15, 19]
    assert p.outstanding(1, 0) == 20
    assert p.complete(w[7]["wr_id"]) == list(range(8))  # completion of WR 7 retires tickets 0..7
    assert p.complete(w[19]["wr_id"]) == list(range(8, 20))
    assert p.outstanding(1, 0) == 0


@needs_native
def test_channels_map_to_qps_and_keep_their_order():
    p = verbs.planner(LOCAL, PEERS, qps_per_peer=2)
    for t in range(6):
        p.add(dict(op="put", peer=1, channel=t % 2, src=0, dst=t * 8, bytes=8), t)
    b = p.take(flush=True)
    by_qp = {x["qp"]: [w["remote_addr"] - PEERS[1]["base"] for w in x["wrs"]] for x in b}
    assert by_qp == {0: [0, 16, 32], 1: [8, 24, 40]}


@needs_native
def test_send_queue_depth_holds_work_back():
    p = verbs.planner(LOCAL, PEERS, max_batch=4, signal_every=2, sq_depth=4, qps_per_peer=1)
    for t in range(10):
        p.add(dict(op="put", peer=1, src=0, dst=0, bytes=8), t)
    first = _all(p.take(flush=True))
    assert len(first) == 4 and first[-1]["signaled"]  # the queue is full: the rest waits
    assert p.take(flush=True) == []
    assert p.complete(first[-1]["wr_id"]) == [0, 1, 2, 3]
    assert len(_all(p.take(flush=True))) == 4


@needs_native
def test_bad_commands_are_rejected():
    p = verbs.planner(LOCAL, PEERS)
    with pytest.raises(TandemError, match="no registered memory"):
        p.add(dict(op="put", peer=9, bytes=8), 0)
    with pytest.raises(TandemError, match="outside"):
        p.add(dict(op="put", peer=1, src=(1 << 30) - 4, bytes=8), 0)
    with pytest.raises(TandemError, match="aligned"):
        p.add(dict(op="signal", peer=1, sig=12, value=1), 0)
    with pytest.raises(TandemError, match="out of range"):
        verbs.planner(LOCAL, PEERS, sq_depth=8, signal_every=16)


def test_nic_selection_prefers_the_nearest_active_roce_port():
    gpu = "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0"
    near = verbs.NicInfo("mlx5_1", "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:01.0",
                         ((1, True, "Ethernet", 3),))
    far = verbs.NicInfo("mlx5_0", "/sys/devices/pci0000:80/0000:80:01.0/0000:81:00.0", ((1, True, "Ethernet", 1),))
    down = verbs.NicInfo("mlx5_2", "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:02.0",
                         ((1, False, "Ethernet", 3),))
    no_gid = verbs.NicInfo("mlx5_3", "/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:03.0",
                           ((1, True, "Ethernet", None),))
    assert verbs.select_nic(gpu, [far, down, no_gid, near]) == (near, 1, 3)
    assert verbs.select_nic(None, [near, far])[0].name == "mlx5_0"  # no topology: by name
    ib = verbs.NicInfo("mlx5_4", "/x", ((1, True, "InfiniBand", None),))
    assert verbs.select_nic(gpu, [ib]) == (ib, 1, 0)
    with pytest.raises(TandemError, match="no RDMA device"):
        verbs.select_nic(gpu, [down, no_gid])
    assert verbs.pci_distance(gpu, near.pci_path) < verbs.pci_distance(gpu, far.pci_path)


def test_missing_pyverbs_or_nic_is_a_clear_error():
    try:
        import pyverbs  # noqa: F401
    except ImportError:
        with pytest.raises(TandemError, match="needs pyverbs") as e:
            verbs.choose_device(0)
        assert e.value.status == 9
        return
    with pytest.raises(TandemError, match="no RDMA device"):  # pyverbs present, but no NIC here
        verbs.choose_device(0)


@needs_native
def test_a_command_with_an_unknown_op_or_signal_op_is_refused():
    # (a misspelt signal_op once became a plain store; an unknown op an IndexError)
    p = verbs.planner(LOCAL, PEERS)
    with pytest.raises(TandemError, match="signal_op must be 'set' or 'add', got 'Add'") as e:
        p.add(dict(op="signal", peer=2, sig=128, value=3, signal_op="Add"), 0)
    assert e.value.status == 3  # INVALID_ARGUMENT
    with pytest.raises(TandemError, match="op must be 'put', 'put_signal' or 'signal', got 'putt'"):
        p.add(dict(op="putt", peer=1, src=0, dst=0, bytes=8), 0)
    p.add(dict(op="signal", peer=2, sig=128, value=3, signal_op="set"), 0)  # the planner is still usable
    (w,) = _all(p.take(flush=True))
    assert w["remote_addr"] == PEERS[2]["base"] + 128
