"""The ops' agreement step (tandem.ops._runtime.agree_on_key: ranks agree on an op's key before its workspace is made, or it is
an error on every rank), over a torch.distributed HashStore with one thread a rank; the MoE id checks. No GPU."""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import torch
import torch.distributed as dist

from tandem.errors import TandemError
from tandem.ops import _runtime as rt
from tandem.ops import tp
from tandem.ops.moe import id_problems


class FakeComm:
    """What the agreement step reads of a tandem.transport.Communicator."""

    def __init__(self, store, rank, world, timeout_s=5.0):
        self._op_store = dist.PrefixStore("tandem/ops0", store)
        self._op_seq = itertools.count()
        self.rank, self.world_size, self.timeout_s = rank, world, timeout_s
        self.aborted = False

    def abort(self):
        self.aborted = True


def _run(comms, keys, op="ag_gemm"):
    """Every rank's _agree in its own thread: [None or the TandemError, ...]."""
    out = [None] * len(comms)

    def body(r):
        try:
            rt.agree_on_key(comms[r], op, keys[r])
        except TandemError as e:
            out[r] = e

    threads = [threading.Thread(target=body, args=(r,)) for r in range(len(comms))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def _ag_key(k, n=512):
    return tp.op_key("ag_gemm", m_local=512, n=n, k=k, dtype=torch.bfloat16, mode="fused", comm_blocks=0)


def _comms(world, timeout_s=5.0):
    store = dist.HashStore()
    return [FakeComm(store, r, world, timeout_s) for r in range(world)]


def test_key_format():
    assert tp.format_key(_ag_key(1024)) == "(op=ag_gemm, m_local=512, n=512, k=1024, dtype=bf16, mode=fused, comm_blocks=0)"
    assert tp.op_key("x", dtype=torch.float16) == (("op", "x"), ("dtype", "fp16"))


def test_same_keys_agree_step_after_step():
    comms = _comms(2)
    for k in (1024, 2048, 1024):
        assert _run(comms, [_ag_key(k)] * 2) == [None, None]
    assert [next(c._op_seq) for c in comms] == [3, 3]


def test_k_mismatch_raises_on_every_rank_naming_both_keys():
    comms = _comms(2)
    errs = _run(comms, [_ag_key(1024), _ag_key(2048)])
    k0, k1 = tp.format_key(_ag_key(1024)), tp.format_key(_ag_key(2048))
    for r, e in enumerate(errs):
        assert isinstance(e, TandemError), errs
        assert e.status == 3 and e.rank == r and e.peer == 1 - r and e.op == "ag_gemm"
        assert str(e) == (f"tandem: rank {r}: ag_gemm: ranks disagree: rank 0 has {k0}, rank 1 has {k1} (every rank "
                          "must call the op with the same shapes and options; nothing was allocated or launched)")
    # nothing is out of step afterwards: the next step agrees, and the communicator is not aborted
    assert _run(comms, [_ag_key(1024)] * 2) == [None, None]
    assert not any(c.aborted for c in comms)


def test_n_mismatch_and_ranks_grouped_by_key():
    comms = _comms(4)
    keys = [_ag_key(1024, n=512)] * 4
    keys[2] = _ag_key(1024, n=1024)
    errs = _run(comms, keys)
    assert all(isinstance(e, TandemError) and e.status == 3 for e in errs), errs
    msg = str(errs[3])
    assert msg.startswith("tandem: rank 3: ag_gemm: ranks disagree: ranks 0, 1, 3 have (op=ag_gemm, m_local=512, "
                          "n=512, ") and ", rank 2 has (op=ag_gemm, m_local=512, n=1024, " in msg, msg
    assert errs[2].peer == 0 and errs[0].peer == 2


def test_a_rank_that_skips_the_step_is_a_timeout_not_a_hang():
    # rank 0 has the key already (skips the step), rank 1 waits: a TandemError (timeout) after timeout_s, the
    # communicator aborted, and later steps refused at once
    comms = _comms(2, timeout_s=0.5)
    t0 = time.monotonic()
    with pytest.raises(TandemError) as ei:
        rt.agree_on_key(comms[1], "gemm_rs", tp.op_key("gemm_rs", m=512, n=512, k=512))
    assert 0.4 < time.monotonic() - t0 < 5
    e = ei.value
    assert e.status == 1 and e.rank == 1 and e.peer == 0
    assert str(e).startswith("tandem: rank 1: gemm_rs: ranks out of step: rank 0 did not take agreement step 0 within "
                             "0.5 s (this rank has (op=gemm_rs, m=512, n=512, k=512)).")
    assert comms[1].aborted
    with pytest.raises(TandemError, match="an earlier agreement step of this communicator failed") as ei:
        rt.agree_on_key(comms[1], "gemm_rs", tp.op_key("gemm_rs", m=512, n=512, k=512))
    assert ei.value.status == 2
    # rank 0 reaching step 0 late reads that rank 1 gave up instead of a key it would agree with
    with pytest.raises(TandemError) as ei:
        rt.agree_on_key(comms[0], "gemm_rs", tp.op_key("gemm_rs", m=512, n=512, k=512))
    assert ei.value.status == 3 and "rank 1 has <rank 1 gave up waiting after 0.5 s>" in str(ei.value)


def test_world_one_takes_no_step():
    c = FakeComm(dist.HashStore(), 0, 1)
    rt.agree_on_key(c, "ag_gemm", _ag_key(1024))
    assert next(c._op_seq) == 0


class _WsComm(FakeComm):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.allocs = 0

    def zeros(self, n, dtype):
        self.allocs += 1
        return torch.zeros(n, dtype=dtype)

    def barrier(self):
        pass


def test_workspace_agrees_once_per_key_before_allocating(monkeypatch):
    steps = []
    monkeypatch.setattr(rt, "agree_on_key", lambda comm, op, key: steps.append(key))
    monkeypatch.setattr(rt, "preload", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    comm = _WsComm(dist.HashStore(), 0, 2)
    key = ("ag_gemm", "cpu-test", 512, 1024, torch.bfloat16)
    try:
        a, b = _ag_key(1024, n=512), _ag_key(1024, n=1024)
        ws = rt.workspace(comm, key, 4096, agree=a)
        assert comm.allocs == 1 and steps == [a + (("workspace_bytes", 4096),)]
        assert rt.workspace(comm, key, 4096, agree=a) is ws and len(steps) == 1  # known: no step, no allocation
        assert rt.workspace(comm, key, 4096, agree=b) is ws and len(steps) == 2  # new key, same workspace
        assert comm.allocs == 1
        assert rt.workspace(comm, key, 4096, agree=b) is ws and len(steps) == 2
    finally:
        rt._WORKSPACES.pop(key, None)


def test_workspace_is_not_made_when_the_ranks_disagree(monkeypatch):
    def refuse(comm, op, key):
        raise TandemError("disagree", 3, op, comm.rank)

    monkeypatch.setattr(rt, "agree_on_key", refuse)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    comm = _WsComm(dist.HashStore(), 0, 2)
    key = ("ag_gemm", "cpu-test-2", 512, 1024, torch.bfloat16)
    with pytest.raises(TandemError):
        rt.workspace(comm, key, 4096, agree=_ag_key(1024))
    assert comm.allocs == 0 and key not in rt._WORKSPACES


def test_moe_id_problems():
    ids = torch.tensor([[0, 1], [1, 1], [2, 0], [3, 3]], dtype=torch.int32)
    assert id_problems(ids, 4) == (0, 2, 1)
    assert id_problems(torch.tensor([[0, 1], [1, 4]]), 4) == (1, 0, -1)
    assert id_problems(torch.tensor([[2, 0, 2]]), 4) == (0, 1, 0)
    assert id_problems(torch.tensor([[0], [0]]), 4) == (0, 0, -1)  # k = 1: tokens may share an expert
    assert id_problems(torch.zeros(0, 2, dtype=torch.int32), 4) == (0, 0, -1)


def test_a_local_peer_failure_ends_the_wait_at_once():
    # the communicator's check() raises (the peer monitor saw a local peer exit): the step raises that error at the
    # next slice of its wait, not after timeout_s, and later steps are refused
    comms = _comms(2, timeout_s=30.0)
    t0 = time.monotonic()

    def check():
        if time.monotonic() - t0 > 0.3:
            raise TandemError("tandem: rank 1: peer_exit: peer 0 exited", 11, "peer_exit", 1, 0)

    comms[1].check = check
    with pytest.raises(TandemError) as ei:
        rt.agree_on_key(comms[1], "ag_gemm", _ag_key(1024))
    assert ei.value.status == 11 and time.monotonic() - t0 < 5
    with pytest.raises(TandemError, match="an earlier agreement step of this communicator failed"):
        rt.agree_on_key(comms[1], "ag_gemm", _ag_key(1024))


def test_over_a_tcp_store():
    # the store tandem.launch and torchrun give: a TCPStore server and a client
    import datetime

    server = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=30), wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, 2, False, timeout=datetime.timedelta(seconds=30))
    comms = [FakeComm(server, 0, 2, timeout_s=1.0), FakeComm(client, 1, 2, timeout_s=1.0)]
    assert _run(comms, [_ag_key(1024)] * 2) == [None, None]
    errs = _run(comms, [_ag_key(1024), _ag_key(2048)])
    assert all(isinstance(e, TandemError) and e.status == 3 and "k=2048" in str(e) for e in errs), errs
    t0 = time.monotonic()
    with pytest.raises(TandemError) as ei:
        rt.agree_on_key(comms[0], "ag_gemm", _ag_key(1024))
    assert ei.value.status == 1 and 0.9 < time.monotonic() - t0 < 5


def test_fused_protocol_knobs_are_part_of_the_key_for_fused_calls_only(monkeypatch):
    # a rank with TANDEM_RS_RING=1 and one without would run two protocols against one workspace: their keys
    # must differ (an error on every rank, naming the knob), but only where a fused kernel may run
    for name in tp.FUSED_PROTOCOL_KNOBS:
        monkeypatch.delenv(name, raising=False)
    assert tp.fused_knobs("fused", None) == {}
    monkeypatch.setenv("TANDEM_RS_RING", "1")
    monkeypatch.setenv("TANDEM_TP_TRACE", "1")  # a diagnostic: not part of the key
    assert tp.fused_knobs("fused", None) == {"knobs": (("TANDEM_RS_RING", "1"),)}
    assert tp.fused_knobs("auto", ("fused", 4)) == {"knobs": (("TANDEM_RS_RING", "1"),)}
    assert tp.fused_knobs("auto", ("unfused", 0)) == {}
    assert tp.fused_knobs("unfused", None) == {}
    assert tp.fused_knobs("pipelined", None) == {}
    ring = tp.op_key("gemm_rs", m=4096, n=512, k=256, dtype=torch.bfloat16, mode="fused", comm_blocks=4,
                     **tp.fused_knobs("fused", None))
    monkeypatch.delenv("TANDEM_RS_RING")
    plain = tp.op_key("gemm_rs", m=4096, n=512, k=256, dtype=torch.bfloat16, mode="fused", comm_blocks=4,
                      **tp.fused_knobs("fused", None))
    errs = _run(_comms(2), [ring, plain], op="gemm_rs")
    assert all(isinstance(e, TandemError) for e in errs), errs
    assert all("TANDEM_RS_RING" in str(e) and "ranks disagree" in str(e) for e in errs), errs
