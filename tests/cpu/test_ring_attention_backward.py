"""Ring attention's backward (tandem.ops.attention_backward) on the CPU: the ring's schedule and sums, run for
every rank of a simulated world with the block kernel's contract written in float64 torch, against autograd on
the whole sequence; which block pairs the causal (zigzag) mask leaves; the fake implementation. The GPU run
(cuDNN's and FlashAttention-2's block kernels, the copy engines, the flags) is tests/gpu/test_ring_attention.py."""

import math
import types

import pytest
import torch

import tandem.ops  # noqa: F401 - registers the ops and their autograd
from tandem.ops import attention as att
from tandem.ops import attention_backward as bwd
from tandem.ops import tp


def _global_attention(q, k, v, causal, scale):
    """o and lse (B, Hq, S) of softmax(q k^T scale [+ causal]) v on the whole sequence, float64, differentiable."""
    group = q.shape[2] // k.shape[2]
    kk, vv = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    s = torch.einsum("bshd,bthd->bhst", q, kk) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = torch.einsum("bhst,bthd->bshd", torch.softmax(s, -1), vv)
    return o, lse


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads", [(4, 4), (4, 2), (4, 1)])
def test_the_ring_schedule_sums_to_the_gradients_of_the_whole_sequence(world, causal, heads):
    torch.manual_seed(world * 10 + causal)
    b, s_l, d = 2, 6, 8
    hq, hkv = heads
    seq = world * s_l
    scale = 1 / math.sqrt(d)
    q = torch.randn(b, seq, hq, d, dtype=torch.float64, requires_grad=True)
    k = torch.randn(b, seq, hkv, d, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, seq, hkv, d, dtype=torch.float64, requires_grad=True)
    do = torch.randn(b, seq, hq, d, dtype=torch.float64)
    o, lse = _global_attention(q, k, v, causal, scale)
    (o * do).sum().backward()

    shard = lambda x, r, dim=1: att.shard_sequence(x.detach(), r, world, causal=causal, dim=dim)  # noqa: E731
    kv = {r: (shard(k, r), shard(v, r)) for r in range(world)}
    dq_shards, dk_parts, dv_parts = [], {r: [] for r in range(world)}, {r: [] for r in range(world)}
    for r in range(world):
        dq, partials = bwd.ring_backward_math(r, world, shard(do, r), shard(q, r), shard(o, r), shard(lse, r, 2),
                                              kv.__getitem__, causal, scale, block=bwd.reference_block_backward)
        dq_shards.append(dq)
        assert sorted(partials) == list(range(world))
        for src, (dk, dv) in partials.items():
            dk_parts[src].append(dk)
            dv_parts[src].append(dv)
    unshard = (lambda xs: att.zigzag_unshard(xs, world)) if causal else (lambda xs: torch.cat(xs, 1))
    dk = unshard([sum(dk_parts[r]) for r in range(world)])
    dv = unshard([sum(dv_parts[r]) for r in range(world)])
    for name, got, want in (("dq", unshard(dq_shards), q.grad), ("dk", dk, k.grad), ("dv", dv, v.grad)):
        err = float((got - want).abs().max())
        assert err < 1e-10, (name, err)


@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
def test_causal_block_pairs_cover_each_visible_key_once(world):
    s_l = 8
    for r in range(world):
        q_pos = att.local_positions(s_l, world, r, causal=True)
        seen = torch.zeros(s_l, world * s_l, dtype=torch.int64)
        for src in range(world):
            k_pos = att.local_positions(s_l, world, src, causal=True)
            pairs = bwd.block_pairs(r, src, world, s_l, True)
            assert len(pairs) == 1, (r, src, pairs)  # one block kernel call a ring step
            for q_rows, k_rows, diag in pairs:
                qp, kp = q_pos[q_rows], k_pos[k_rows]
                visible = kp.view(1, -1) <= qp.view(-1, 1)
                if diag:  # the block's own causal mask: the same rows on both sides, in increasing global order,
                    # so the local top-left mask is the global one
                    assert torch.equal(qp, kp) and bool((qp[1:] > qp[:-1]).all())
                    assert torch.equal(visible, torch.ones_like(visible).tril())
                else:
                    assert bool(visible.all()), (r, src)
                seen[q_rows.start:q_rows.stop].index_add_(1, kp, visible.long())
        want = (torch.arange(world * s_l).view(1, -1) <= q_pos.view(-1, 1)).long()
        assert torch.equal(seen, want), r


def test_the_backward_op_traces_as_one_node():
    from torch.fx.experimental.proxy_tensor import make_fx

    h = tp.register(types.SimpleNamespace(world_size=2, rank=0, device=0, destroyed=False))

    def step(q, k, v):
        o, _lse = torch.ops.tandem.ring_attention(q, k, v, h, True, 0.0, 0, 0, 0)
        return torch.autograd.grad(o.float().sum(), (q, k, v))

    args = [torch.randn(1, 8, hq, 64, dtype=torch.bfloat16, requires_grad=True) for hq in (4, 2, 2)]
    gm = make_fx(step, tracing_mode="fake")(*args)
    ops = [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "tandem" in str(n.target)]
    assert ops == ["tandem.ring_attention.default", "tandem.ring_attention_backward.default"], ops
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    assert [tuple(x.meta["val"].shape) for x in out] == [(1, 8, 4, 64), (1, 8, 2, 64), (1, 8, 2, 64)]


def test_lse_is_not_differentiable():
    from torch._subclasses.fake_tensor import FakeTensorMode

    h = tp.register(types.SimpleNamespace(world_size=2, rank=1, device=0, destroyed=False))
    with FakeTensorMode():
        q, k, v = (torch.empty(1, 8, 2, 64, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        o, lse = torch.ops.tandem.ring_attention(q, k, v, h, True, 0.0, 0, 0, 0)
        assert o.requires_grad and not lse.requires_grad


def test_block_kernel_choice_cudnn_then_flash_where_refused_or_deterministic(monkeypatch):
    """block_backward takes cuDNN by default, FlashAttention-2 in the deterministic mode, when asked by
    TANDEM_RING_BWD_BLOCK=flash, and for a shape cuDNN refused once (remembered: cuDNN is not asked again)."""
    calls = []

    def fake(name, refuse=False):
        def run(do, q, *_a, **_kw):
            calls.append((name, q.shape[1]))
            if refuse and q.shape[1] == 3:
                raise RuntimeError("cuDNN Frontend error: no valid engine configs\nmore")
            return q, q, q
        return run

    monkeypatch.setattr(bwd, "cudnn_block_backward", fake("cudnn", refuse=True))
    monkeypatch.setattr(bwd, "flash_block_backward", fake("flash"))
    monkeypatch.setattr(bwd, "cudnn_refused", {})
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "enabled", True)
    monkeypatch.delenv("TANDEM_RING_BWD_BLOCK", raising=False)

    def call(s_l, dtype=torch.bfloat16):
        t = torch.zeros(1, s_l, 2, 8, dtype=dtype)
        bwd.block_backward(t, t, t, t, t, torch.zeros(1, 2, s_l), False, 1.0)
        return calls[-1][0]

    assert call(4) == "cudnn"
    assert call(3) == "flash" and calls[-2] == ("cudnn", 3)  # refused, then flash
    n = len(calls)
    assert call(3) == "flash" and len(calls) == n + 1  # remembered: cuDNN not asked again
    assert list(bwd.cudnn_refused.values()) == ["cuDNN Frontend error: no valid engine configs"]
    n = len(calls)
    assert call(1) == "flash" and len(calls) == n + 1  # a sequence length of 1: cuDNN not asked, reason named
    assert list(bwd.cudnn_refused.values())[-1].startswith("a sequence length of 1")
    assert call(4, torch.float32) == "flash"  # cuDNN's SDPA takes bf16 / fp16 only
    torch.use_deterministic_algorithms(True)
    try:
        assert call(4) == "flash"
    finally:
        torch.use_deterministic_algorithms(False)
    monkeypatch.setenv("TANDEM_RING_BWD_BLOCK", "flash")
    assert call(4) == "flash"
    monkeypatch.setenv("TANDEM_RING_BWD_BLOCK", "cudnn2")
    with pytest.raises(Exception, match="TANDEM_RING_BWD_BLOCK must be auto or flash"):
        bwd._block_choice(0)


def test_gqa_blocks_take_cudnn_natively_then_repeated_where_refused_and_only_planned_paths_under_capture(monkeypatch):
    """GQA/MQA blocks: cuDNN with K/V in their own heads first; a native refusal is remembered per shape and the
    repeated heads run instead; TANDEM_RING_BWD_GQA=repeat starts there (other values are an error); inside a CUDA
    graph capture only a (shape, path) that ran eagerly is called, else FlashAttention-2."""
    calls = []

    def cudnn(do, q, k, v, o, lse, causal, scale, native_gqa=False):
        calls.append(("native" if native_gqa else "heads", q.shape[1]))
        if native_gqa and q.shape[1] == 3:
            raise RuntimeError("cuDNN Frontend error: GRAPH_NOT_SUPPORTED\nmore")
        return q, k, v

    def flash(do, q, *_a):
        calls.append(("flash", q.shape[1]))
        return q, q, q

    monkeypatch.setattr(bwd, "cudnn_block_backward", cudnn)
    monkeypatch.setattr(bwd, "flash_block_backward", flash)
    for name in ("cudnn_refused", "cudnn_gqa_refused"):
        monkeypatch.setattr(bwd, name, {})
    monkeypatch.setattr(bwd, "_cudnn_ran", set())
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "enabled", True)
    monkeypatch.delenv("TANDEM_RING_BWD_BLOCK", raising=False)
    monkeypatch.delenv("TANDEM_RING_BWD_GQA", raising=False)
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])

    def call(s_l, hkv=1, cuda=False):
        q = torch.zeros(1, s_l, 4, 8, dtype=torch.bfloat16)
        kv = torch.zeros(1, s_l, hkv, 8, dtype=torch.bfloat16)
        if cuda:  # is_cuda is what the capture check reads; the fakes never touch the data
            q = types.SimpleNamespace(shape=q.shape, stride=q.stride, dtype=q.dtype, is_cuda=True)
        before = len(calls)
        bwd.block_backward(q, q, kv, kv, q, torch.zeros(1, 4, s_l), False, 1.0)
        return calls[before:]

    assert call(4) == [("native", 4)]
    assert call(4, hkv=4) == [("heads", 4)]  # not GQA: the one path
    assert call(3) == [("native", 3), ("heads", 3)]  # refused natively, then the repeated heads
    assert call(3) == [("heads", 3)]  # remembered
    assert list(bwd.cudnn_gqa_refused.values()) == ["cuDNN Frontend error: GRAPH_NOT_SUPPORTED"]
    monkeypatch.setenv("TANDEM_RING_BWD_GQA", "repeat")
    assert call(4) == [("heads", 4)]
    monkeypatch.setenv("TANDEM_RING_BWD_GQA", "Repeat")
    with pytest.raises(Exception, match="TANDEM_RING_BWD_GQA must be one of"):
        bwd._block_choice(0)
    monkeypatch.delenv("TANDEM_RING_BWD_GQA")
    # under capture: (S 4, native) and (S 4, heads) ran eagerly, (S 5, anything) did not
    capturing[0] = True
    assert call(4, cuda=True) == [("native", 4)]
    assert call(5, cuda=True) == [("flash", 5)]
    monkeypatch.setenv("TANDEM_RING_BWD_GQA", "repeat")
    assert call(4, cuda=True) == [("heads", 4)]
    capturing[0] = False
    assert bwd.block_kernel_counts["cudnn_gqa"] >= 2
