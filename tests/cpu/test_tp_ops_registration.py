"""The TP ops as torch ops, on the CPU: their schemas (defined by schema through tandem.ops._runtime.define_op, no
longer by torch.library.custom_op: the same schemas, a third of the dispatch time), their fake implementations
(meta tensors, FakeTensorMode, torch.compile's tracing without graph breaks), and the prepared-call cache of
tandem.ops._runtime (what a call with a known signature skips, and what it still checks)."""

import types

import pytest
import torch

import tandem.ops  # noqa: F401 - registers the ops
from tandem.errors import INVALID_ARGUMENT, TandemError
from tandem.ops import _runtime as rt
from tandem.ops import tp

SCHEMAS = {
    "ag_gemm": 'tandem::ag_gemm(Tensor a_local, Tensor b, SymInt comm, str mode="auto", SymInt comm_blocks=0, '
               'SymInt sm_count=0) -> Tensor',
    "gemm_rs": 'tandem::gemm_rs(Tensor a, Tensor b, SymInt comm, str mode="auto", SymInt comm_blocks=0, '
               'SymInt sm_count=0) -> Tensor',
    "gemm_ar": 'tandem::gemm_ar(Tensor a, Tensor b, SymInt comm, str mode="auto", SymInt comm_blocks=0, '
               'SymInt sm_count=0, str algo="auto") -> Tensor',
}


@pytest.mark.parametrize("op", sorted(SCHEMAS))
def test_schema_is_unchanged(op):
    assert str(getattr(torch.ops.tandem, op).default._schema) == SCHEMAS[op]


def _stand_in(world=4, rank=1):
    return types.SimpleNamespace(world_size=world, rank=rank, device=0, destroyed=False)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_fake_shapes(world):
    h = tp.register(_stand_in(world))
    m, k, n = 12 * world, 32, 16
    for make in (lambda *s: torch.empty(*s, dtype=torch.bfloat16, device="meta"),):
        a, b = make(m, k), make(k, n)
        assert torch.ops.tandem.ag_gemm(a, b, h).shape == (m * world, n)
        assert torch.ops.tandem.gemm_rs(a, b, h).shape == (m // world, n)
        assert torch.ops.tandem.gemm_ar(a, b, h).shape == (m, n)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a, b = torch.empty(m, k, dtype=torch.float16), torch.empty(k, n, dtype=torch.float16)
        out = torch.ops.tandem.gemm_rs(a, b, h)
        assert out.shape == (m // world, n) and out.dtype == torch.float16


def test_traced_without_graph_breaks():
    import torch._dynamo

    h = tp.register(_stand_in(2))

    def block(x, w_up, w_down):
        y = torch.ops.tandem.ag_gemm(x, w_up, h)
        return torch.ops.tandem.gemm_rs(torch.relu(y), w_down, h, "auto", 0, 0)

    meta = dict(dtype=torch.bfloat16, device="meta")
    explained = torch._dynamo.explain(block)(torch.empty(64, 32, **meta), torch.empty(32, 48, **meta),
                                             torch.empty(48, 32, **meta))
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def _key(op, h, a, b, mode="auto", comm_blocks=0, sm_count=0, algo="auto"):
    # the signature tandem.ops.tp.run_tp_op computes
    return (op, h, mode, comm_blocks, sm_count, algo, a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(),
            b.dtype, b.device, tp.fused_knob_values())


def test_a_known_signature_launches_without_the_full_path_but_checks_addresses():
    comm = _stand_in(2)
    h = tp.register(comm)
    buf = torch.zeros(64 * 32 + 8, dtype=torch.bfloat16)
    a, b = buf[:64 * 32].view(64, 32), torch.zeros(32, 16, dtype=torch.bfloat16)
    calls = []

    def launcher(cm, x, w):
        calls.append(x.data_ptr())
        return torch.full((32, 16), 7.0)

    key = _key("gemm_rs", h, a, b)
    rt.remember(key, launcher)
    try:
        # a prepared signature: the launcher runs (CPU tensors would fail the full checks: they were skipped)
        assert torch.equal(torch.ops.tandem.gemm_rs(a, b, h), torch.full((32, 16), 7.0))
        assert calls == [a.data_ptr()]
        # the same shape, strides and dtype 2 bytes further on: not 16-byte aligned -> the full checks, an error
        # before any launch
        shifted = buf[1:1 + 64 * 32].view(64, 32)
        assert _key("gemm_rs", h, shifted, b) == key
        with pytest.raises(TandemError) as ei:
            torch.ops.tandem.gemm_rs(shifted, b, h)
        assert ei.value.status == INVALID_ARGUMENT and len(calls) == 1
        # another option is another signature: the full path (here: CPU tensors are refused)
        with pytest.raises(TandemError, match="CUDA tensor"):
            torch.ops.tandem.gemm_rs(a, b, h, "unfused")
        assert len(calls) == 1
    finally:
        rt._PREPARED.pop(key, None)


def test_prepared_calls_go_with_their_communicators_workspaces():
    c1, c2 = _stand_in(2), _stand_in(2)
    h1, h2 = tp.register(c1), tp.register(c2)
    a = torch.zeros(8, 8)
    k1, k2 = _key("gemm_rs", h1, a, a), _key("gemm_rs", h2, a, a)
    rt.remember(k1, lambda *x: None)
    rt.remember(k2, lambda *x: None)
    tp.release_workspaces(c1)
    assert k1 not in rt._PREPARED and k2 in rt._PREPARED
    tp.release_workspaces()
    assert k2 not in rt._PREPARED


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(rt, "PREPARED_LIMIT", 3)
    saved = dict(rt._PREPARED)
    try:
        for i in range(7):
            rt.remember(("gemm_rs", -1, i), lambda *x: None)
            assert len(rt._PREPARED) <= 3
    finally:
        rt._PREPARED.clear()
        rt._PREPARED.update(saved)


def test_a_changed_protocol_knob_is_another_signature(monkeypatch):
    # TANDEM_RS_RING set after a call was prepared: the call takes the full path again (and with it the ranks'
    # agreement on the knob), not the launcher prepared without it
    comm = _stand_in(2)
    h = tp.register(comm)
    a, b = torch.zeros(64, 32, dtype=torch.bfloat16), torch.zeros(32, 16, dtype=torch.bfloat16)
    monkeypatch.delenv("TANDEM_RS_RING", raising=False)
    key = _key("gemm_rs", h, a, b)
    rt.remember(key, lambda *x: torch.full((32, 16), 7.0))
    try:
        assert torch.equal(torch.ops.tandem.gemm_rs(a, b, h), torch.full((32, 16), 7.0))
        monkeypatch.setenv("TANDEM_RS_RING", "1")
        assert _key("gemm_rs", h, a, b) != key
        with pytest.raises(TandemError, match="CUDA tensor"):  # the full path: CPU tensors are refused
            torch.ops.tandem.gemm_rs(a, b, h)
    finally:
        rt._PREPARED.pop(key, None)
