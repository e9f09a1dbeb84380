"""Rank-side bodies of the ring-attention tests (run in every rank by tests/conftest.py:run_ranks).

Every rank builds the whole global Q, K, V from a seed (the same on every rank), so it can compute the reference
of its own rows without any communication: torch SDPA in fp32 on the gathered, un-zigzagged sequence, and the
log-sum-exp of the scaled, masked scores. The inputs carry terms that make misplacement visible: V's first
channels hold the global row, the KV head and the batch, so every output row carries the softmax-weighted mean
position, head and batch it read; Q and K share a positional term, so the attention pattern depends on where the
rows are."""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

import tandem.ops  # noqa: F401
from tandem.ops import attention, tp
from tandem.ops import attention_backward as bwd
from tandem.transport import Communicator

from .worker_common import capture, reject_statuses

O_ABS, O_REL = 2e-2, 2e-2  # |o - ref| <= O_ABS + O_REL |ref| (bf16/fp16 output of an fp32 accumulation)
LSE_ABS = 1e-2


def _global_qkv(seed, batch, seq, heads_q, heads_kv, head_dim, dtype):
    """Global (B, S, H, d) Q, K, V on the GPU, from a CPU generator (bit-identical on every rank)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, seq, heads_q, head_dim, generator=g)
    k = torch.randn(batch, seq, heads_kv, head_dim, generator=g)
    v = torch.randn(batch, seq, heads_kv, head_dim, generator=g)
    rows = torch.arange(seq, dtype=torch.float32).view(1, seq, 1)
    q[..., 0] += torch.cos(rows * 0.11)
    k[..., 0] += torch.cos(rows * 0.11)
    v[..., 0] = rows / seq
    v[..., 1] = (torch.arange(heads_kv, dtype=torch.float32).view(1, 1, -1) + 1) / heads_kv
    v[..., 2] = (torch.arange(batch, dtype=torch.float32).view(-1, 1, 1) + 1) / batch
    return [t.to(dtype).cuda() for t in (q, k, v)]


def _reference(q, k, v, pos, causal, scale):
    """fp32 attention of the query rows at global positions `pos` against the whole sequence:
    (o (B, S_l, Hq, d), lse (B, Hq, S_l))."""
    seq, group = k.shape[1], q.shape[2] // k.shape[2]
    mask = torch.arange(seq, device=q.device).view(1, -1) <= pos.view(-1, 1) if causal else None  # S_l x S
    outs, lses = [], []
    for b in range(q.shape[0]):  # one sequence at a time: the S_l x S scores of every head stay small
        qf = q[b, pos].float().transpose(0, 1)  # Hq x S_l x d
        kf = k[b].float().repeat_interleave(group, dim=1).transpose(0, 1)  # Hq x S x d (head h reads h // group)
        vf = v[b].float().repeat_interleave(group, dim=1).transpose(0, 1)
        outs.append(F.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask, scale=scale).transpose(0, 1))
        scores = (qf @ kf.transpose(1, 2)) * scale
        if causal:
            scores = scores.masked_fill(~mask, float("-inf"))
        lses.append(torch.logsumexp(scores, dim=-1))
    return torch.stack(outs), torch.stack(lses)


def _errors(o, lse, o_ref, lse_ref):
    """Elements outside tolerance (NaN counts as wrong) and the largest errors."""
    eo = (o.float() - o_ref).abs()
    el = (lse - lse_ref).abs()
    return dict(wrong_o=int((~(eo <= O_ABS + O_REL * o_ref.abs())).sum()), wrong_lse=int((~(el <= LSE_ABS)).sum()),
                max_err_o=float(eo.max()), max_err_lse=float(el.max()))


def _shards(comm, tensors, causal):
    return [attention.shard_sequence(t, comm.rank, comm.world_size, causal=causal) for t in tensors]


def _check_against_reference(comm, o, lse, qkv, causal, scale):
    seq_local = o.shape[1]
    pos = attention.local_positions(seq_local, comm.world_size, comm.rank, causal=causal, device="cuda")
    o_ref, lse_ref = _reference(*qkv, pos, causal, scale)
    return _errors(o, lse, o_ref, lse_ref)


def _case(comm, batch, seq_local, heads_q, heads_kv, head_dim, causal, dtype, softmax_scale, seed, kv_slots=0,
          sm_count=0):
    qkv = _global_qkv(seed, batch, seq_local * comm.world_size, heads_q, heads_kv, head_dim, dtype)
    o, lse = attention.ring_attention(comm, *_shards(comm, qkv, causal), causal=causal, softmax_scale=softmax_scale,
                                      kv_slots=kv_slots, sm_count=sm_count)
    torch.cuda.synchronize()
    comm.check()
    scale = softmax_scale if softmax_scale is not None else head_dim ** -0.5
    return dict(shape=[batch, seq_local, heads_q, heads_kv, head_dim], causal=causal, dtype=str(dtype),
                softmax_scale=softmax_scale, **_check_against_reference(comm, o, lse, qkv, causal, scale))


def correctness(cases, seed=1, kv_slots=0, grid_per_sm=0):
    """cases: [B, S_l, Hq, Hkv, d, causal, dtype name, softmax_scale or None] each; kv_slots for every case;
    grid_per_sm > 0 launches grid_per_sm blocks per SM of this rank (more than can be resident at once)."""
    comm = Communicator(heap_bytes=2 << 30, timeout_s=30)
    out = dict(has_proxy=comm.has_proxy, num_nodes=comm.num_nodes, sm_count=comm.sm_count, cases=[])
    sm_count = grid_per_sm * comm.sm_count
    for i, (b, s_l, hq, hkv, d, causal, dtype, scale) in enumerate(cases):
        out["cases"].append(_case(comm, b, s_l, hq, hkv, d, causal, getattr(torch, dtype), scale, seed + i,
                                  kv_slots, sm_count))
    tp.release_workspaces(comm)
    comm.destroy()
    return out


def _graph_replays(comm, shape, causal, static, seeds):
    """Capture the op on static inputs, then for each seed copy new global values' shards into them and replay:
    per replay, whether the graph's outputs equal an eager launch on the same inputs bit for bit, and the
    elements outside tolerance against the reference."""
    b, s_l, hq, hkv, d = shape
    qs, ks, vs = static
    g, (og, lg) = capture(lambda: attention.ring_attention(comm, qs, ks, vs, causal=causal))
    same, wrong = [], []
    for seed in seeds:
        qkv = _global_qkv(seed, b, s_l * comm.world_size, hq, hkv, d, qs.dtype)
        for dst, src in zip(static, _shards(comm, qkv, causal)):
            dst.copy_(src)
        comm.barrier()
        g.replay()
        torch.cuda.synchronize()
        oe, le = attention.ring_attention(comm, qs, ks, vs, causal=causal)
        torch.cuda.synchronize()
        same.append(bool(torch.equal(og, oe) and torch.equal(lg, le)))
        e = _check_against_reference(comm, og, lg, qkv, causal, d ** -0.5)
        wrong.append(e["wrong_o"] + e["wrong_lse"])
    return same, wrong


def repeat_and_graph(shape, launches, seed=7):
    """Per causal flag: `launches` launches on the same inputs give the first one's bits (o and lse), the first is
    right, and CUDA-graph replays with new values copied into the captured inputs are right."""
    comm = Communicator(heap_bytes=2 << 30, timeout_s=30)
    b, s_l, hq, hkv, d = shape
    out = {}
    for causal in (False, True):
        qkv = _global_qkv(seed, b, s_l * comm.world_size, hq, hkv, d, torch.bfloat16)
        q, k, v = _shards(comm, qkv, causal)
        o0, l0 = attention.ring_attention(comm, q, k, v, causal=causal)
        same = 0
        for _ in range(launches):
            o, lse = attention.ring_attention(comm, q, k, v, causal=causal)
            same += int(torch.equal(o, o0) and torch.equal(lse, l0))
        torch.cuda.synchronize()
        comm.check()
        first = _check_against_reference(comm, o0, l0, qkv, causal, d ** -0.5)
        graph_same, graph_wrong = _graph_replays(comm, shape, causal, [q.clone(), k.clone(), v.clone()],
                                                 [seed + 1, seed + 2, seed + 3])
        comm.check()
        out["causal" if causal else "full"] = dict(same=same, first_wrong=first["wrong_o"] + first["wrong_lse"],
                                                   graph_same=graph_same, graph_wrong=graph_wrong)
    tp.release_workspaces(comm)
    comm.destroy()
    return out


def rejects(seed=3):
    """Each bad input raises the op's TandemError before any launch: {case: status}; then a valid call is right."""
    comm = Communicator(heap_bytes=256 << 20, timeout_s=10)
    b, s_l, hq, hkv, d = 2, 64, 8, 2, 64
    bf16 = torch.bfloat16

    def t(*shape, dtype=bf16):
        return torch.randn(shape, device="cuda", dtype=dtype)

    q, k, v = t(b, s_l, hq, d), t(b, s_l, hkv, d), t(b, s_l, hkv, d)
    misaligned = torch.empty(q.numel() + 8, device="cuda", dtype=bf16)[1:1 + q.numel()].view(q.shape)
    ra = attention.ring_attention
    cases = {
        "float32": lambda: ra(comm, q.float(), k.float(), v.float()),
        "mixed_dtype": lambda: ra(comm, q, k.half(), v),
        "kv_seq_differs": lambda: ra(comm, q, k[:, :32].contiguous(), v[:, :32].contiguous()),
        "kv_batch_differs": lambda: ra(comm, q, k[:1].contiguous(), v[:1].contiguous()),
        "k_v_shapes_differ": lambda: ra(comm, q, k, t(b, s_l, 2 * hkv, d)),
        "odd_seq_causal": lambda: ra(comm, t(b, 63, hq, d), t(b, 63, hkv, d), t(b, 63, hkv, d), causal=True),
        "head_dim_96": lambda: ra(comm, t(b, s_l, hq, 96), t(b, s_l, hkv, 96), t(b, s_l, hkv, 96)),
        "hkv_not_dividing_hq": lambda: ra(comm, q, t(b, s_l, 3, d), t(b, s_l, 3, d)),
        "cpu": lambda: ra(comm, q.cpu(), k.cpu(), v.cpu()),
        "non_contiguous": lambda: ra(comm, t(b, hq, s_l, d).transpose(1, 2), k, v),
        "misaligned": lambda: ra(comm, misaligned, k, v),
        "three_d": lambda: ra(comm, q[0], k[0], v[0]),
        "empty_seq": lambda: ra(comm, q[:, :0], k[:, :0], v[:, :0]),
        "scale_zero": lambda: ra(comm, q, k, v, softmax_scale=0.0),
        "scale_negative": lambda: ra(comm, q, k, v, softmax_scale=-1.0),
        "comm_blocks_negative": lambda: ra(comm, q, k, v, comm_blocks=-2),
    }
    out = reject_statuses(cases)
    comm.check()
    after = _case(comm, b, s_l, hq, hkv, d, True, bf16, None, seed)
    tp.release_workspaces(comm)
    comm.destroy()
    return dict(status=out, after=after)


# ---- the backward (tandem.ops.attention_backward, torch.ops.tandem.ring_attention's autograd) --------------------

def _reference_grads(q, k, v, do, causal, scale):
    """fp32 autograd of the whole sequence (un-zigzagged): dq, dk, dv (B, S, H, d)."""
    qf, kf, vf = (t.float().requires_grad_(True) for t in (q, k, v))
    group = q.shape[2] // k.shape[2]
    o = F.scaled_dot_product_attention(qf.transpose(1, 2), kf.repeat_interleave(group, 2).transpose(1, 2),
                                       vf.repeat_interleave(group, 2).transpose(1, 2), is_causal=causal,
                                       scale=scale).transpose(1, 2)
    (o * do.float()).sum().backward()
    return qf.grad, kf.grad, vf.grad


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def gradients(cases, seed=11):
    """cases: [B, S_l, Hq, Hkv, d, causal, dtype name] each. This rank's dq, dk, dv from autograd through
    tandem.ops.ring_attention against its rows of the fp32 reference's gradients (relative Frobenius errors);
    the same backward twice under torch.use_deterministic_algorithms(True) (bits compared); torch.compile
    (fullgraph) and activation checkpointing of the same step against eager (errors)."""
    comm = Communicator(heap_bytes=2 << 30, timeout_s=30)
    world, rank = comm.world_size, comm.rank
    out = dict(cases=[])
    for i, (b, s_l, hq, hkv, d, causal, dtype) in enumerate(cases):
        dt = getattr(torch, dtype)
        q, k, v = _global_qkv(seed + i, b, s_l * world, hq, hkv, d, dt)
        g = torch.Generator().manual_seed(seed + 1000 + i)
        do = torch.randn(b, s_l * world, hq, d, generator=g).to(dt).cuda()
        scale = d ** -0.5
        ref = _reference_grads(q, k, v, do, causal, scale)
        mine = _shards(comm, (q, k, v), causal)
        do_l = attention.shard_sequence(do, rank, world, causal=causal)

        def step(ql, kl, vl):
            o, _lse = attention.ring_attention(comm, ql, kl, vl, causal=causal)
            return o

        def grads(fn):
            leaves = [t.clone().requires_grad_(True) for t in mine]
            o = fn(*leaves)
            (o.float() * do_l.float()).sum().backward()
            torch.cuda.synchronize()
            return [t.grad for t in leaves]

        def counted(fn):  # the gradients and which block kernels ran for them
            before = dict(bwd.block_kernel_counts)
            res = fn()
            return res, {k: bwd.block_kernel_counts[k] - before[k] for k in before}

        refused_before = set(bwd.cudnn_refused)
        gqa_refused_before = set(bwd.cudnn_gqa_refused)
        # the block kernel's knobs as the caller left them, restored at the end; every run below sets its own
        saved = {n: os.environ.pop(n, None) for n in ("TANDEM_RING_BWD_BLOCK", "TANDEM_RING_BWD_GQA")}
        try:
            eager, eager_blocks = counted(lambda: grads(step))
            os.environ["TANDEM_RING_BWD_BLOCK"] = "flash"  # the other block kernel, against the same reference
            flash, flash_blocks = counted(lambda: grads(step))
            os.environ.pop("TANDEM_RING_BWD_BLOCK")
            if hkv != hq:
                # the GQA/MQA blocks again with K/V repeated to q's heads (the path before native GQA): both stay
                # tested against the same reference
                os.environ["TANDEM_RING_BWD_GQA"] = "repeat"
                repeated, repeated_blocks = counted(lambda: grads(step))
                os.environ.pop("TANDEM_RING_BWD_GQA")
        finally:
            for n, val in saved.items():
                os.environ.pop(n, None)
                if val is not None:
                    os.environ[n] = val
        ref_l = [attention.shard_sequence(r, rank, world, causal=causal) for r in ref]
        c = dict(case=[b, s_l, hq, hkv, d, causal, dtype],
                 rel=[_rel(x, y) for x, y in zip(eager, ref_l)],
                 rel_flash=[_rel(x, y) for x, y in zip(flash, ref_l)],
                 finite=all(bool(torch.isfinite(x.float()).all()) for x in eager + flash),
                 eager_blocks=eager_blocks, flash_blocks=flash_blocks,
                 cudnn_refused=sorted({bwd.cudnn_refused[k] for k in set(bwd.cudnn_refused) - refused_before}),
                 cudnn_gqa_refused=sorted({bwd.cudnn_gqa_refused[k]
                                           for k in set(bwd.cudnn_gqa_refused) - gqa_refused_before}))
        if hkv != hq:
            c["rel_repeat"] = [_rel(x, y) for x, y in zip(repeated, ref_l)]
            c["repeat_blocks"] = repeated_blocks
        torch.use_deterministic_algorithms(True)  # not warn-only: FlashAttention-2 keeps its atomics then
        try:
            (first, second), det_blocks = counted(lambda: (grads(step), grads(step)))
        finally:
            torch.use_deterministic_algorithms(False)
        c["deterministic"] = all(torch.equal(x, y) for x, y in zip(first, second))
        c["deterministic_blocks"] = det_blocks
        if i == 0:  # compile and checkpoint once (each compiles or recomputes the whole step)
            compiled = grads(torch.compile(step, fullgraph=True))
            c["compile_rel"] = [_rel(x, y) for x, y in zip(compiled, eager)]
            ck = grads(lambda *x: torch.utils.checkpoint.checkpoint(step, *x, use_reentrant=False))
            c["checkpoint_rel"] = [_rel(x, y) for x, y in zip(ck, eager)]
        out["cases"].append(c)
    comm.check()
    tp.release_workspaces(comm)
    comm.destroy()
    return out


def backward_refused_across_nodes():
    """The backward's one-node limit is a clear error (status 3) before anything runs."""
    from tandem.errors import TandemError

    comm = Communicator(heap_bytes=1 << 30, timeout_s=30)
    q, k, v = _shards(comm, _global_qkv(5, 1, 8 * comm.world_size, 2, 2, 64, torch.bfloat16), True)
    q.requires_grad_(True)
    o, _lse = attention.ring_attention(comm, q, k, v, causal=True)
    status = None
    try:
        o.float().sum().backward()
    except TandemError as e:
        status = e.status
    torch.cuda.synchronize()
    num_nodes = comm.num_nodes
    comm.destroy()
    return dict(num_nodes=num_nodes, status=status)
