"""torch.ops.tandem.moe_ffn on the CPU: its input checks (before any launch) and its fake implementation (one
node under tracing). The GPU run against the torch reference is tests/gpu/test_moe.py."""

import types

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import tandem.ops  # noqa: F401
from tandem.errors import TandemError
from tandem.ops import moe_layer as mf


def _comm(world=2, rank=0):
    return types.SimpleNamespace(world_size=world, rank=rank, device=0, destroyed=False)


def _args(tokens=8, hidden=64, inter=32, epr=2, k=2, dtype=torch.bfloat16):
    with FakeTensorMode():
        dev = torch.device("cuda", 0)
        return (torch.empty(tokens, hidden, dtype=dtype, device=dev),
                torch.empty(tokens, k, dtype=torch.int32, device=dev),
                torch.empty(tokens, k, dtype=torch.float32, device=dev),
                torch.empty(epr, hidden, 2 * inter, dtype=dtype, device=dev),
                torch.empty(epr, inter, hidden, dtype=dtype, device=dev))


@pytest.mark.parametrize("change, message", [
    (dict(mode="fused"), "not built yet"),
    (dict(mode="nope"), "mode"),
    (dict(activation="gelu"), "activation must be one of"),
    (dict(dtype=torch.float16), "must be bfloat16"),
    (dict(w2_shape=(2, 16, 64)), r"w2 must be \(2, 32, 64\)"),
    (dict(w1_shape=(2, 64, 33)), "gate and up side by side"),
    (dict(weights_shape=(8, 3)), "topk_weights"),
])
def test_bad_input_is_refused_before_any_launch(change, message):
    x, ids, wts, w1, w2 = _args(dtype=change.get("dtype", torch.bfloat16))
    with FakeTensorMode():
        if "w2_shape" in change:
            w2 = torch.empty(*change["w2_shape"], dtype=w2.dtype, device=w2.device)
        if "w1_shape" in change:
            w1 = torch.empty(*change["w1_shape"], dtype=w1.dtype, device=w1.device)
        if "weights_shape" in change:
            wts = torch.empty(*change["weights_shape"], dtype=torch.float32, device=wts.device)
        with pytest.raises(TandemError, match=message) as e:
            mf.check(_comm(), x, ids, wts, w1, w2, change.get("activation", "swiglu"), change.get("mode", "auto"))
    assert e.value.status == 3


def test_the_op_traces_as_one_node_with_the_token_shape():
    from torch.fx.experimental.proxy_tensor import make_fx

    h = tandem.ops.tp.register(_comm())

    def step(x, ids, wts, w1, w2):
        return torch.ops.tandem.moe_ffn(x, ids, wts, w1, w2, h)

    gm = make_fx(step, tracing_mode="fake")(*[torch.empty(t.shape, dtype=t.dtype) for t in _args()])
    calls = [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]
    assert calls == ["tandem.moe_ffn.default"], calls
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    assert tuple(out[0].meta["val"].shape if isinstance(out, (list, tuple)) else out.meta["val"].shape) == (8, 64)


def test_the_reference_is_the_layer_on_one_device():
    torch.manual_seed(0)
    t, h, i, e, k = 6, 8, 4, 3, 2
    x = torch.randn(t, h)
    ids = torch.stack([torch.randperm(e)[:k] for _ in range(t)])
    wts = torch.rand(t, k)
    w1, w2 = torch.randn(e, h, 2 * i), torch.randn(e, i, h)
    want = torch.zeros(t, h)
    for a in range(t):
        for s in range(k):
            y = x[a] @ w1[ids[a, s]]
            want[a] += wts[a, s] * ((torch.nn.functional.silu(y[:i]) * y[i:]) @ w2[ids[a, s]])
    assert torch.allclose(mf.reference(x, ids, wts, w1, w2), want, atol=1e-5)


@pytest.mark.parametrize("gemm1", ["tandem", "torch"])
def test_gemm1_takes_the_dispatch_it_names(monkeypatch, gemm1):
    # moe_layer.gemm1 (TANDEM_MOE_GEMM1): "tandem" is moe_dispatch_gemm (mode unfused asks the unfused dispatch,
    # auto lets it choose); "torch" is the dispatch alone, then torch._grouped_mm of the received rows with the
    # local experts' w1 over the layout's expert offsets (ends: offsets[1:]). Recorded with stand-ins.
    calls = []
    x, w1 = torch.randn(8, 16), torch.randn(2, 16, 12)
    ids = torch.zeros(8, 2, dtype=torch.int32)
    offsets = torch.tensor([0, 5, 16], dtype=torch.int32)
    rows, layout, y = torch.randn(32, 16), torch.zeros(40, dtype=torch.int32), torch.randn(32, 12)
    monkeypatch.setattr(mf, "_GEMM1", gemm1)
    monkeypatch.setattr(mf.moe, "run_dispatch_gemm", lambda *a: calls.append(("dispatch",) + a[1:]) or (y, layout))
    monkeypatch.setattr(mf.moe, "dispatch_rows", lambda *a: calls.append(("rows",) + a[1:]) or (rows, layout))
    monkeypatch.setattr(mf.moe, "layout_view", lambda c, lay, epr, mt, k: {"expert_offset": offsets})

    def grouped_mm(a, b, offs):
        calls.append(("grouped_mm", a, b, offs))
        return y
    monkeypatch.setattr(torch, "_grouped_mm", grouped_mm)
    for mode in ("unfused", "auto"):
        got, got_layout = mf.gemm1("c", x, ids, w1, 9, mode, 3)
        assert got is y and got_layout is layout
    if gemm1 == "tandem":
        assert [c[0] for c in calls] == ["dispatch", "dispatch"]
        assert calls[0][1:] == (x, ids, w1, 9, "unfused", 0, 3) and calls[1][5] == "auto"
    else:
        assert [c[0] for c in calls] == ["rows", "grouped_mm"] * 2
        assert calls[0][1:] == (x, ids, 2, 9, 0, 3)  # experts_per_rank from w1, max_tokens, comm_blocks, sm_count
        _, a, b, offs = calls[1]
        assert a is rows and b is w1 and torch.equal(offs, offsets[1:])


def test_the_gemm2_plan_follows_the_rows_an_expert_expects(monkeypatch):
    # even routing: max_tokens x k over the experts a rank holds (world cancels); the DeepSeek config (256 experts,
    # k = 8) at world 2 and 1,024 tokens a rank expects 64 rows an expert, at 4,096 tokens 256
    assert mf.expected_rows_per_expert(1024, 8, 128) == 64
    assert mf.expected_rows_per_expert(4096, 8, 128) == 256
    assert mf.expected_rows_per_expert(129, 3, 4) == 97  # rounded up
    monkeypatch.delenv("TANDEM_MOE_GEMM2", raising=False)
    monkeypatch.delenv("TANDEM_MOE_GEMM_CLUSTER", raising=False)
    assert mf._gemm2_plan(64) == ("tandem", 1)
    assert mf._gemm2_plan(mf.ONE_ROW_TILE_ROWS) == ("tandem", 1)
    assert mf._gemm2_plan(mf.ONE_ROW_TILE_ROWS + 1) == ("torch", 2)
    monkeypatch.setenv("TANDEM_MOE_GEMM2", "torch")  # forced, at any rows
    assert mf._gemm2_plan(64)[0] == "torch"
    monkeypatch.setenv("TANDEM_MOE_GEMM2", "tandem")
    monkeypatch.setenv("TANDEM_MOE_GEMM_CLUSTER", "2")
    assert mf._gemm2_plan(64) == ("tandem", 2)
    assert mf._gemm2_plan(1000) == ("tandem", 2)
    monkeypatch.setenv("TANDEM_MOE_GEMM_CLUSTER", "1")
    assert mf._gemm2_plan(1000) == ("tandem", 1)
