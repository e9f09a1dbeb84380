"""moe_ffn's backward on the CPU (issue 26 item 4): the op's whole schedule for a simulated world
(tandem.ops.moe_backward.simulate_backward: the dispatch of [x | dOut | weight bits] and the combine by indexing, the
expert-side math exactly as the op runs it) against torch autograd of moe_layer.reference on the gathered problem,
in float64 (tight) and in bf16 through torch._grouped_mm's CPU path (loose); plus checks that the comparison
fails on a wrong slot index or a missing weight factor, and the autograd registration traced with fake tensors.
The GPU run is tests/gpu/test_moe.py::test_moe_ffn_backward_matches_autograd."""

import types

import pytest
import torch

import tandem.ops  # noqa: F401
from tandem.ops import moe_backward as mb
from tandem.ops import moe_layer


def _routing(gen, t, world, epr, k, kind):
    experts = world * epr
    scores = torch.rand(t, experts, generator=gen)
    if kind == "skewed":  # expert 0 in every token, rank 0's experts preferred
        scores[:, :epr] += 1.0
        scores[:, 0] += 10.0
    elif kind == "empty":  # odd experts never chosen
        scores[:, 1::2] -= 100.0
    return scores.argsort(dim=1, descending=True)[:, :k].to(torch.int32)


def _problem(world, epr, k, counts, hidden, inter, kind, seed=0):
    gen = torch.Generator().manual_seed(seed)
    experts = world * epr
    xs = [torch.randn(t, hidden, generator=gen, dtype=torch.float64) for t in counts]
    ids = [_routing(gen, t, world, epr, k, kind) for t in counts]
    wts = [torch.rand(t, k, generator=gen, dtype=torch.float64) + 0.1 for t in counts]
    gs = [torch.randn(t, hidden, generator=gen, dtype=torch.float64) for t in counts]
    w1 = torch.randn(experts, hidden, 2 * inter, generator=gen, dtype=torch.float64) / hidden ** 0.5
    w2 = torch.randn(experts, inter, hidden, generator=gen, dtype=torch.float64) / inter ** 0.5
    return xs, ids, wts, gs, w1, w2


def _autograd(xs, ids, wts, gs, w1, w2):
    """Gradients of sum(out * g) by torch autograd of the reference on the gathered problem (float64)."""
    x = torch.cat(xs).double().requires_grad_()
    w = torch.cat(wts).double().requires_grad_()
    a1, a2 = w1.double().requires_grad_(), w2.double().requires_grad_()
    out = moe_layer.reference(x, torch.cat(ids).long(), w, a1, a2)
    (out * torch.cat(gs).double()).sum().backward()
    return x.grad, w.grad, a1.grad, a2.grad


def _rel(got, want):
    return ((got.double() - want).norm() / want.norm().clamp_min(1e-30)).item()


def _errors(world, epr, k, counts, hidden, inter, kind, dtype, seed=0):
    xs, ids, wts, gs, w1, w2 = _problem(world, epr, k, counts, hidden, inter, kind, seed)
    if dtype != torch.float64:  # the reference sees the rounded inputs (the weights stay fp32, as routers give)
        xs, gs = [v.to(dtype) for v in xs], [v.to(dtype) for v in gs]
        w1, w2 = w1.to(dtype), w2.to(dtype)
        wts = [v.float() for v in wts]
    want = _autograd(xs, ids, wts, gs, w1, w2)
    dxs, dws, dw1, dw2 = mb.simulate_backward(xs, ids, wts, gs, w1, w2, world, max(max(counts), 1) + 2)
    got = (torch.cat(dxs), torch.cat(dws), dw1, dw2)
    for g_, w_ in zip(got, want):
        assert g_.shape == w_.shape
    return [_rel(g_, w_) for g_, w_ in zip(got, want)], got


# (world, experts per rank, k, token counts per rank, routing): worlds 1-4, skewed routing, experts without tokens,
# a rank without tokens, k = 1 and k = 8
CASES = [
    (1, 4, 2, [13], "uniform"),
    (1, 8, 8, [5], "uniform"),
    (2, 3, 3, [11, 0], "skewed"),
    (2, 8, 8, [10, 6], "uniform"),
    (3, 2, 2, [5, 9, 7], "empty"),
    (4, 2, 1, [6, 0, 3, 8], "uniform"),
    (4, 3, 8, [9, 4, 0, 7], "skewed"),
    (4, 4, 3, [7, 5, 6, 2], "empty"),
]


@pytest.mark.parametrize("world, epr, k, counts, kind", CASES)
def test_backward_schedule_matches_autograd_float64(world, epr, k, counts, kind):
    errs, got = _errors(world, epr, k, counts, 16, 8, kind, torch.float64)
    assert all(torch.isfinite(g).all() for g in got)
    assert max(errs) < 1e-10, errs
    if kind == "empty":  # the odd experts received nothing: their weight gradients are exactly zero
        assert got[2][1::2].abs().max() == 0 and got[3][1::2].abs().max() == 0


# bf16 through torch._grouped_mm's CPU path (the op's calls, strides and offsets included). Bound, relative
# Frobenius against float64 autograd of the rounded inputs: the chain rounds y, a, dz, dy, dxr and the combined dx
# to bf16 (a few x 2^-8 each); a wrong row or slot is of order one.
@pytest.mark.parametrize("world, epr, k, counts, kind", CASES)
def test_backward_schedule_in_bf16_through_grouped_mm(world, epr, k, counts, kind):
    errs, got = _errors(world, epr, k, counts, 32, 16, kind, torch.bfloat16)
    assert all(torch.isfinite(g.float()).all() for g in got)
    assert max(errs) < 3e-2, errs


@pytest.mark.parametrize("mutation", ["slot", "weight", "dw_lo_hi"])
def test_the_comparison_fails_on_a_wrong_schedule(monkeypatch, mutation):
    case = (2, 3, 3, [11, 5], 16, 8, "uniform", torch.float64)
    assert max(_errors(*case)[0]) < 1e-10
    if mutation == "slot":  # the slot from the token instead of row_source % k
        monkeypatch.setattr(mb, "slot_of", lambda rs, k: (rs // k).remainder(k))
    elif mutation == "weight":  # the row's weight factor left out
        monkeypatch.setattr(mb, "row_weights", lambda w_all, slot: torch.ones_like(w_all[:, :1]))
    else:  # d weights read from the wrong column pair
        real = mb.unpack_combined

        def shifted(res, hidden, k):
            dx, dw = real(res, hidden, k)
            return dx, dw.roll(1, dims=1)
        monkeypatch.setattr(mb, "unpack_combined", shifted)
    errs = _errors(*case)[0]
    assert max(errs) > 1e-2, errs


def test_dweights_keep_more_than_bf16_precision():
    # the combine carries d w as a (hi, lo) bf16 pair: the error is far below bf16's 2^-9
    s = torch.randn(1000, dtype=torch.float32) * 100
    hi = s.to(torch.bfloat16)
    lo = (s - hi.float()).to(torch.bfloat16)
    assert ((hi.float() + lo.float() - s).abs() / s.abs()).max() < 2 ** -15


def test_weight_bits_travel_exactly():
    w = torch.rand(7, 3) * 3 - 1
    rows = mb.pack_rows(torch.zeros(7, 8, dtype=torch.bfloat16), torch.zeros(7, 8, dtype=torch.bfloat16), w)
    assert rows.shape == (7, 8 + 8 + 8)
    _, _, w_all = mb.unpack_rows(rows, 8, 3)
    assert torch.equal(w_all, w)


def test_autograd_is_registered_and_traces_to_the_backward_op():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    h = tandem.ops.tp.register(types.SimpleNamespace(world_size=2, rank=0, device=0, destroyed=False))
    with FakeTensorMode():
        dev = torch.device("cuda", 0)
        args = (torch.empty(8, 64, dtype=torch.bfloat16, device=dev), torch.empty(8, 2, dtype=torch.int32, device=dev),
                torch.empty(8, 2, dtype=torch.float32, device=dev),
                torch.empty(2, 64, 64, dtype=torch.bfloat16, device=dev),
                torch.empty(2, 32, 64, dtype=torch.bfloat16, device=dev))

    def step(x, ids, wts, w1, w2):
        x, wts, w1, w2 = (t.detach().requires_grad_() for t in (x, wts, w1, w2))
        out = torch.ops.tandem.moe_ffn(x, ids, wts, w1, w2, h)
        return torch.autograd.grad(out.float().sum(), (x, wts, w1, w2))

    gm = make_fx(step, tracing_mode="fake")(*[torch.empty(t.shape, dtype=t.dtype) for t in args])
    calls = [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "tandem" in str(n.target)]
    assert calls == ["tandem.moe_ffn.default", "tandem.moe_ffn_backward.default"], calls
    outs = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    assert [tuple(o.meta["val"].shape) for o in outs] == [(8, 64), (8, 2), (2, 64, 64), (2, 32, 64)]


@pytest.mark.parametrize("need_w1, need_w2", [(False, True), (True, False), (False, False)])
def test_frozen_weights_skip_their_gemms_and_change_nothing_else(need_w1, need_w2):
    # moe_ffn's backward asks for dW1 / dW2 only where the weights need a gradient (autograd's needs_input_grad):
    # the gradients it still returns are the same bits as the full backward's, the skipped ones None here (the op
    # returns empty tensors for them)
    world, epr, k, counts, kind = 2, 3, 3, [11, 4], "skewed"
    xs, ids, wts, gs, w1, w2 = _problem(world, epr, k, counts, 32, 24, kind, 5)
    full = mb.simulate_backward(xs, ids, wts, gs, w1, w2, world, max(counts) + 2)
    part = mb.simulate_backward(xs, ids, wts, gs, w1, w2, world, max(counts) + 2, need_w1=need_w1, need_w2=need_w2)
    for a, b in zip(full[0] + full[1], part[0] + part[1]):  # dx and d topk_weights of every rank
        assert torch.equal(a, b)
    assert (part[2] is None) != need_w1 and (part[3] is None) != need_w2
    if need_w1:
        assert torch.equal(part[2], full[2])
    if need_w2:
        assert torch.equal(part[3], full[3])


def test_the_op_returns_empty_gradients_for_frozen_weights_under_tracing():
    # the fake (and the real op) give an empty tensor for a weight whose gradient is not asked for
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, g = torch.empty(8, 64, dtype=torch.bfloat16), torch.empty(8, 64, dtype=torch.bfloat16)
        ids, wts = torch.empty(8, 2, dtype=torch.int32), torch.empty(8, 2)
        w1, w2 = torch.empty(2, 64, 48, dtype=torch.bfloat16), torch.empty(2, 24, 64, dtype=torch.bfloat16)
        for n1, n2 in ((True, True), (False, True), (True, False)):
            _, _, d1, d2 = mb._fake(g, x, ids, wts, w1, w2, 0, need_w1=n1, need_w2=n2)
            assert tuple(d1.shape) == (tuple(w1.shape) if n1 else (0,))
            assert tuple(d2.shape) == (tuple(w2.shape) if n2 else (0,))
