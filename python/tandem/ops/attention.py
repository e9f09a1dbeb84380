"""Ring attention (sequence parallelism) as a torch.library op: torch.ops.tandem.ring_attention.

    o, lse = tandem.ops.ring_attention(comm, q, k, v, causal=True)

The global sequence of S = W * S_l rows is sharded over the W ranks of `comm`; each rank passes its S_l rows of
q (B, S_l, Hq, d), k and v (B, S_l, Hkv, d) and gets softmax(q K^T * scale [+ causal mask]) V for its rows
against the whole sequence: o like q, and lse (B, Hq, S_l) fp32, the natural log of each row's softmax
denominator. The K/V blocks travel around the ring inside one kernel (kernels/include/tandem/kernels/attention/
ring_attention.h). Query head h reads KV head h // (Hq // Hkv) (GQA; MQA when Hkv = 1).

Layouts of the sequence over ranks (shard with these helpers, the same way on every rank):
  causal=False  contiguous: rank r holds global rows [r S_l, (r + 1) S_l)            contiguous_shard
  causal=True   zigzag: 2W chunks of S_l / 2 rows; rank r holds chunk r, then chunk 2W - 1 - r, so that every
                rank does the same work under the mask                                zigzag_shard / zigzag_unshard
The causal mask is global (query row p sees key row p' <= p), as torch SDPA's is_causal on the gathered,
un-zigzagged sequence; local_positions gives each local row's global position.

Every rank calls the op with the same shapes, in the same order (a collective). The workspace (symmetric heap)
is made on the first call for a shape and reused: make that first call before capturing a CUDA graph.
"""

from __future__ import annotations

import math

import torch

from .._native import native
from ..errors import invalid
from . import _runtime as rt
from ._runtime import DTYPES as _DTYPES, op_key, register

OP = "ring_attention"
HEAD_DIMS = (64, 128)

def _op_workspace(comm, key, nbytes, agree):
    # agree: the op key every rank must have, compared before anything is allocated (tandem.ops._runtime.agree_on_key)
    return rt.workspace(comm, key, nbytes, loaders=("ring_attention_preload_kernels",), agree=agree)


def validate(q, k, v, *, causal: bool, softmax_scale: float, comm_blocks: int, sm_count: int, device: torch.device,
             rank: int = -1, op: str = OP) -> tuple[int, int, int, int, int]:
    """Check the op's inputs (device: where the tensors must be; softmax_scale 0 means 1/sqrt(d)); raise a
    TandemError (INVALID_ARGUMENT) naming the problem, or return (B, S_l, Hq, Hkv, d). Needs no GPU."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        rt.check_tensor(t, name, op, rank, dims=4, device=device, dims_doc=" (batch, seq_local, heads, head_dim)",
                        layout="contiguous")
    if not q.dtype == k.dtype == v.dtype:
        raise invalid(f"q, k and v must have the same dtype, got {q.dtype}, {k.dtype} and {v.dtype}", op, rank)
    batch, seq_local, heads_q, head_dim = q.shape
    heads_kv = k.shape[2]
    if k.shape != v.shape:
        raise invalid(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}", op, rank)
    if (k.shape[0], k.shape[1], k.shape[3]) != (batch, seq_local, head_dim):
        raise invalid(f"k and v must be ({batch}, {seq_local}, Hkv, {head_dim}) like q {tuple(q.shape)}, got "
                      f"{tuple(k.shape)}", op, rank)
    if min(batch, seq_local, heads_q, heads_kv) < 1:
        raise invalid(f"empty problem: q {tuple(q.shape)}, k {tuple(k.shape)}", op, rank)
    if heads_q % heads_kv:
        raise invalid(f"the KV heads ({heads_kv}) must divide the query heads ({heads_q})", op, rank)
    if head_dim not in HEAD_DIMS:
        raise invalid(f"head_dim must be one of {HEAD_DIMS}, got {head_dim}", op, rank)
    if causal and seq_local % 2:
        raise invalid(f"causal attention uses the zigzag layout (two chunks of S_l / 2 rows a rank): S_l must be "
                      f"even, got {seq_local}", op, rank)
    if not (math.isfinite(softmax_scale) and softmax_scale >= 0):
        raise invalid(f"softmax_scale must be a positive finite number (0: 1/sqrt(d)), got {softmax_scale}", op, rank)
    if comm_blocks < 0:
        raise invalid(f"comm_blocks must be 0 (heuristic) or positive, got {comm_blocks}", op, rank)
    if sm_count < 0:
        raise invalid(f"sm_count must be 0 (the communicator's) or positive, got {sm_count}", op, rank)
    return batch, seq_local, heads_q, heads_kv, head_dim


def _ring(comm, q, k, v, causal, softmax_scale, comm_blocks, sm_count, kv_slots):
    rank = comm.rank
    if kv_slots < 0 or kv_slots == 1 or kv_slots > max(comm.world_size, 2):
        raise invalid(f"kv_slots must be 0 (double buffering) or in [2, world = {comm.world_size}], got {kv_slots}",
                      OP, rank)
    b, s_l, hq, hkv, d = validate(q, k, v, causal=causal, softmax_scale=softmax_scale, comm_blocks=comm_blocks,
                                  sm_count=sm_count, device=torch.device("cuda", comm.device), rank=rank)
    K = native().kernels
    key = (OP, rt.token(comm), b, s_l, hq, hkv, d, bool(causal), int(kv_slots), q.dtype)
    agree = op_key(OP, batch=b, seq_local=s_l, heads_q=hq, heads_kv=hkv, head_dim=d, causal=bool(causal),
                   kv_slots=int(kv_slots), dtype=q.dtype, comm_blocks=int(comm_blocks))
    a = rt.kernel_args("RingArgs", dtype=_DTYPES[q.dtype],
                       shape=dict(batch=b, seq_local=s_l, heads_q=hq, heads_kv=hkv, head_dim=d, causal=bool(causal),
                                  softmax_scale=float(softmax_scale)),
                       plan=dict(sm_count=int(sm_count), comm_blocks=int(comm_blocks), kv_slots=int(kv_slots)))
    ws = _op_workspace(comm, key, K.workspace_size(comm.native, a), agree)
    o = torch.empty_like(q)
    lse = torch.empty((b, hq, s_l), dtype=torch.float32, device=q.device)
    a.q, a.k, a.v, a.o, a.lse, a.workspace = (q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(),
                                              ws.data_ptr())
    K.ring_attention(comm.native, a, rt.stream_handle(q.device))  # raises TandemError (its status) if it does not run
    return o, lse


def _ring_impl(q, k, v, comm, causal=False, softmax_scale=0.0, comm_blocks=0, sm_count=0, kv_slots=0):
    return _ring(rt.comm_from_handle(comm, OP), q, k, v, causal, softmax_scale, comm_blocks, sm_count, kv_slots)


def _ring_fake(q, k, v, comm, causal=False, softmax_scale=0.0, comm_blocks=0, sm_count=0, kv_slots=0):
    b, s_l, hq, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((b, hq, s_l), dtype=torch.float32)


ring_attention_op = rt.define_op(
    OP, "(Tensor q, Tensor k, Tensor v, SymInt comm, bool causal=False, float softmax_scale=0., SymInt comm_blocks=0, "
    "SymInt sm_count=0, SymInt kv_slots=0) -> (Tensor, Tensor)", _ring_impl, _ring_fake)


def ring_attention(comm, q, k, v, *, causal: bool = False, softmax_scale: float | None = None, comm_blocks: int = 0,
                   sm_count: int = 0, kv_slots: int = 0):
    """(o, lse) of this rank's rows of q against the whole sequence (module docstring). softmax_scale: None for
    1/sqrt(d). q, k, v must be sharded as the layout of `causal` says (contiguous_shard, or zigzag_shard when
    causal). kv_slots: K/V buffers per rank, 0 (two: double buffering) or up to the world size (no slot is
    rewritten within a launch: a rank never waits for its successor's compute)."""
    if softmax_scale is not None and not softmax_scale > 0:
        raise invalid(f"softmax_scale must be positive, got {softmax_scale}", OP, comm.rank)
    return torch.ops.tandem.ring_attention(q, k, v, register(comm), causal,
                                           0.0 if softmax_scale is None else float(softmax_scale), comm_blocks,
                                           sm_count, kv_slots)


# ---- sharding the sequence --------------------------------------------------------------------------------

def _seq_len(x, dim, parts, what):
    if not isinstance(x, torch.Tensor) or not -x.dim() <= dim < x.dim():
        raise invalid(f"expected a tensor with a dimension {dim}, got {type(x).__name__} "
                      f"{tuple(getattr(x, 'shape', ()))}", what)
    s = x.shape[dim]
    if s % parts:
        raise invalid(f"the sequence ({s} rows along dim {dim}) must split into {parts} equal chunks", what)
    return s // parts


def _check_rank(rank, world, what):
    if world < 1 or not 0 <= rank < world:
        raise invalid(f"rank {rank} is not in a world of {world}", what)


def contiguous_shard(x_global, rank: int, world: int, dim: int = 1):
    """Rank `rank`'s rows of the non-causal layout: global rows [rank S_l, (rank + 1) S_l) along `dim`
    (contiguous copy). The inverse is torch.cat(shards, dim)."""
    _check_rank(rank, world, "contiguous_shard")
    s_l = _seq_len(x_global, dim, world, "contiguous_shard")
    return x_global.narrow(dim, rank * s_l, s_l).contiguous()


def zigzag_shard(x_global, rank: int, world: int, dim: int = 1):
    """Rank `rank`'s rows of the causal (zigzag) layout: the sequence along `dim` cut into 2W chunks, chunk
    `rank` then chunk 2W - 1 - rank (contiguous copy)."""
    _check_rank(rank, world, "zigzag_shard")
    c = _seq_len(x_global, dim, 2 * world, "zigzag_shard")
    return torch.cat([x_global.narrow(dim, rank * c, c), x_global.narrow(dim, (2 * world - 1 - rank) * c, c)], dim)


def zigzag_unshard(shards, world: int, dim: int = 1):
    """The global sequence from every rank's zigzag shard (shards[r] from rank r): the inverse of zigzag_shard."""
    if len(shards) != world:
        raise invalid(f"expected {world} shards (one a rank), got {len(shards)}", "zigzag_unshard")
    chunks = [None] * (2 * world)
    for r, x in enumerate(shards):
        c = _seq_len(x, dim, 2, "zigzag_unshard")
        chunks[r], chunks[2 * world - 1 - r] = x.narrow(dim, 0, c), x.narrow(dim, c, c)
    return torch.cat(chunks, dim)


def shard_sequence(x_global, rank: int, world: int, *, causal: bool, dim: int = 1):
    """Rank `rank`'s rows in the layout the op expects for `causal` (zigzag if causal, else contiguous)."""
    return (zigzag_shard if causal else contiguous_shard)(x_global, rank, world, dim)


def local_positions(seq_local: int, world: int, rank: int, *, causal: bool, device=None):
    """Global row of each of rank `rank`'s S_l local rows (int64), as ring_attention.h's global_row."""
    j = torch.arange(seq_local, device=device)
    if not causal:
        return rank * seq_local + j
    c = seq_local // 2
    return torch.where(j < c, rank * c + j, (2 * world - 1 - rank) * c + j - c)
