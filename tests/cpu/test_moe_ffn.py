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
