"""MoE expert parallelism as torch.library ops: torch.ops.tandem.moe_dispatch_gemm and torch.ops.tandem.moe_combine.

    y, layout = tandem.ops.moe_dispatch_gemm(comm, x, topk_ids, w1)   # tokens to their experts, y_j = x_j @ W1_j
    z = per_expert(act(y))                       # any per-row work in the dispatch layout (e.g. the 2nd GEMM)
    out = tandem.ops.moe_combine(comm, z, layout, topk_ids, topk_weights)

E = world * experts_per_rank experts (w1 holds this rank's experts_per_rank); expert e lives on rank
e // experts_per_rank. The layout (kernels/include/tandem/kernels/moe/moe.h) says which rows of y belong to which
local expert and source: `layout_view(comm, layout, ...)` slices it. Every rank must pass the same max_tokens
(it sizes the symmetric buffers; ranks that differ get a TandemError on every rank before anything runs, see
tandem.ops._runtime.agree_on_key); token counts may differ between ranks. A token's top-k experts must be distinct (checked with the
same host sync as the id range; under graph capture the kernel drops a launch that would overrun the receive
capacity and reports it).
"""

from __future__ import annotations

import os

import torch

from .._native import native
from ..errors import invalid
from . import _runtime as rt
from ._runtime import DTYPES as _DTYPES, op_key, register


def _op_workspace(comm, key, nbytes, agree):
    # the MoE kernels and the GEMM core's (the unfused path's grouped GEMM beside them); `agree`: the op key every
    # rank must have (max_tokens included: it sizes the symmetric buffers), compared before anything is allocated
    return rt.workspace(comm, key, nbytes, loaders=("moe_preload_kernels", "preload_kernels"), agree=agree)


def id_problems(topk_ids, experts):
    """(ids outside [0, experts), tokens whose top-k names one expert twice, the first such token or -1), read
    with one device sync (any device; used by the ops' host check)."""
    out_of_range = ((topk_ids < 0) | (topk_ids >= experts)).sum()
    if topk_ids.shape[1] < 2 or topk_ids.shape[0] == 0:
        return int(out_of_range.item()), 0, -1
    dup_rows = (topk_ids.sort(dim=1).values.diff(dim=1) == 0).any(dim=1)
    first = torch.where(dup_rows.any(), dup_rows.int().argmax(), -1)
    vals = torch.stack([out_of_range, dup_rows.sum(), first])
    if vals.is_cuda:
        # Into pinned memory, as .item() does: .tolist() copies into pageable memory, and a pageable copy that
        # waits for a running kernel holds the driver's staging path, which the CPU proxy's own copies need. With
        # a dispatch kernel in flight that waits for proxy traffic (ranks on other nodes), that was a deadlock
        # until the device timeout (tests/gpu/test_moe.py::test_moe_across_emulated_nodes, H200, 2026-12-04;
        # tools/diag/moe_emulated_probe.py showed three ranks in this line). The old check synced with .item().
        host = torch.empty(vals.shape, dtype=vals.dtype, pin_memory=True)
        host.copy_(vals, non_blocking=True)
        torch.cuda.current_stream(vals.device).synchronize()
        vals = host
    bad, dups, first = (int(v) for v in vals.tolist())
    return bad, dups, first


def _ids(comm, topk_ids, tokens, experts, op, check_ids):
    rt.check_on_device(comm, topk_ids, "topk_ids", op)
    if topk_ids.dim() != 2 or topk_ids.shape[0] != tokens:
        raise invalid(f"topk_ids must be ({tokens}, k), got {tuple(topk_ids.shape)}", op, comm.rank)
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise invalid(f"topk_ids must be int32 or int64, got {topk_ids.dtype}", op, comm.rank)
    k = topk_ids.shape[1]
    if k < 1 or k > experts:
        raise invalid(f"k (topk_ids.shape[1] = {k}) must be in [1, {experts}] (the number of experts)", op, comm.rank)
    if check_ids and tokens > 0 and not torch.cuda.is_current_stream_capturing():
        # One sync for both checks (the kernel also reports both: ids out of range are dropped, and a receive
        # capacity overrun drops the whole launch). The same expert twice in one token's top-k is refused: the
        # receive capacity (world x max_tokens x min(k, E_local) rows) counts distinct experts per token.
        bad, dups, first = id_problems(topk_ids, experts)
        if bad:
            raise invalid(f"{bad} expert ids outside [0, {experts})", op, comm.rank)
        if dups:
            raise invalid(f"the same expert twice in one token's top-k, in {dups} of {tokens} tokens (token {first}: "
                          f"{topk_ids[first].tolist()}); a token's experts must be distinct (the receive capacity "
                          "counts distinct experts per token)", op, comm.rank)
    return topk_ids.to(torch.int32).contiguous(), k


def _check_rows(comm, t, name, op, dims=2):
    rt.check_tensor(t, name, op, comm.rank, dims=dims, device=torch.device("cuda", comm.device), layout="contiguous")


def _shape(tokens, max_tokens, hidden, inter, topk, experts_per_rank):
    """moe.h's MoeShape (tandem._C.kernels.MoeShape)."""
    s = native().kernels.MoeShape()
    s.tokens, s.max_tokens, s.hidden, s.inter, s.topk, s.experts_per_rank = (int(tokens), int(max_tokens), int(hidden),
                                                                            int(inter), int(topk),
                                                                            int(experts_per_rank))
    return s


def layout_index(world, max_tokens, topk, experts_per_rank):
    """(rows, offset, source, row_source, size): where each part of the layout array starts."""
    return tuple(native().kernels.moe_layout_index(_shape(0, max_tokens, 8, 8, topk, experts_per_rank), world))


def layout_view(comm, layout, experts_per_rank, max_tokens, topk):
    """The layout array's parts (views): received (1), expert_rows (E_l), expert_offset (E_l + 1), source_offset
    (E_l x (world + 1)), row_source (receive capacity)."""
    world = comm.world_size
    rows, off, src, rs, size = layout_index(world, max_tokens, topk, experts_per_rank)
    return dict(received=layout[0:1], expert_rows=layout[rows:rows + experts_per_rank],
                expert_offset=layout[off:off + experts_per_rank + 1],
                source_offset=layout[src:rs].view(experts_per_rank, world + 1), row_source=layout[rs:size])


def _dedup() -> int:
    """TANDEM_MOE_DEDUP=1: the dispatch-alone launches (unfused, dispatch only) send each token once per destination
    rank, which copies it into each of its experts' rows (moe.h: DispatchArgs::dedup; read at each call, part of the
    key every rank agrees on: the protocol and the workspace differ). Off by default until measured."""
    return 1 if os.environ.get("TANDEM_MOE_DEDUP") == "1" else 0


def _use_fused(mode, world):
    """mode "auto": the measured choice (docs/results.md, H200): the fused kernel beat the unfused path at world 1
    (0.629 vs 0.663 ms, 2048/1024/64/6 at 4096 tokens) and lost at world 2, where the MPS ranks' persistent
    kernels were not resident at the same time (one rank's GEMM blocks started only as the other's ended). Until a
    multi-GPU machine measures it, auto takes the unfused path when there are peers."""
    if mode == "auto":
        return world == 1
    return mode == "fused"


def run_dispatch_gemm(comm, x, topk_ids, w, max_tokens, mode, comm_blocks, sm_count, check_ids=True):
    op = "moe_dispatch_gemm"
    rt.check_mode(mode, ("auto", "fused", "unfused"), op, comm.rank)
    rt.check_comm_blocks(comm_blocks, op, comm.rank)
    _check_rows(comm, x, "x", op)
    _check_rows(comm, w, "w", op, dims=3)
    if w.dtype != x.dtype:
        raise invalid(f"x and w must have the same dtype, got {x.dtype} and {w.dtype}", op, comm.rank)
    tokens, hidden = x.shape
    epr, wh, inter = w.shape
    if wh != hidden:
        raise invalid(f"w must be (experts_per_rank, {hidden}, I), got {tuple(w.shape)}", op, comm.rank)
    if hidden % 8 or inter % 8:
        raise invalid(f"H ({hidden}) and I ({inter}) must be multiples of 8 (16-byte rows)", op, comm.rank)
    world = comm.world_size
    experts = epr * world
    ids, k = _ids(comm, topk_ids, tokens, experts, op, check_ids)
    max_tokens = _max_tokens(max_tokens, tokens, op, comm.rank)
    dedup = _dedup()
    key = (op, rt.token(comm), max_tokens, hidden, inter, k, epr, x.dtype, dedup)
    agree = op_key(op, max_tokens=max_tokens, hidden=hidden, inter=inter, k=k, experts_per_rank=epr, dtype=x.dtype,
                   mode=mode, comm_blocks=int(comm_blocks), dedup=dedup)
    return _launch_dispatch(comm, x, ids, _shape(tokens, max_tokens, hidden, inter, k, epr), key, agree,
                            "FUSED" if _use_fused(mode, world) else "UNFUSED", inter, comm_blocks, sm_count, op, w=w,
                            dedup=dedup)


def _max_tokens(max_tokens, tokens, op, rank):
    """The dispatch's T_max (0: this rank's token count), at least the token count and 1."""
    max_tokens = int(max_tokens) or tokens
    if max_tokens < max(tokens, 1):
        raise invalid(f"max_tokens ({max_tokens}) must be at least the token count ({tokens}) and 1", op, rank)
    return max_tokens


def _launch_dispatch(comm, x, ids, shape, key, agree, mode, out_cols, comm_blocks, sm_count, op, w=None, dedup=0):
    """One dispatch launch (moe_dispatch_gemm's, or the dispatch alone when w is None): its DispatchArgs, the op's
    workspace (cached by key, agreed by every rank as agree), the output it writes (receive capacity x out_cols in
    x's dtype: GEMM 1's y, or the received rows) and the layout; then the launch in
    `mode` (a TandemError with its status if it does not run). Returns (output, layout)."""
    K = native().kernels
    world = comm.world_size
    a = rt.kernel_args("DispatchArgs", dtype=_DTYPES[x.dtype], plan=dict(sm_count=int(sm_count),
                                                                        comm_blocks=int(comm_blocks)))
    a.shape = shape
    a.dedup = int(dedup)  # (before the size: the dedup buffers are part of the workspace)
    ws = _op_workspace(comm, key, K.workspace_size(comm.native, a), agree)
    out = torch.empty((K.moe_receive_capacity(shape, world), out_cols), dtype=x.dtype, device=x.device)
    layout = torch.zeros(layout_index(world, shape.max_tokens, shape.topk, shape.experts_per_rank)[4],
                         dtype=torch.int32, device=x.device)
    a.x, a.topk_ids, a.layout, a.workspace = x.data_ptr(), ids.data_ptr(), layout.data_ptr(), ws.data_ptr()
    if w is None:  # w and y null with rows set: the dispatch-only args (moe.h)
        a.rows = out.data_ptr()
    else:
        a.w, a.y = w.data_ptr(), out.data_ptr()
    # the adapter's can_implement is the last guard: a refusal is a TandemError with its status
    K.moe_dispatch_gemm(comm.native, a, rt.mode(mode), rt.stream_handle(x.device))
    last_dispatch_workspace[comm.rank] = ws.data_ptr()
    return out, layout


# Diagnostic (tests): the workspace address of each rank's last dispatch launch in this process, for
# tandem._C.kernels.moe_dispatch_rows_sent (the token rows it put with dedup).
last_dispatch_workspace: dict = {}


def dispatch_rows(comm, x, topk_ids, experts_per_rank, max_tokens, comm_blocks=0, sm_count=0, check_ids=True):
    """The dispatch alone (no GEMM; the kernels layer's Mode DISPATCH): every (token, slot) row of x to the rank
    owning expert topk_ids[t, slot] (E = world x experts_per_rank). Returns (rows, layout): rows (receive capacity,
    x's columns), the received rows in the dispatch layout's order (for the same ids the same order as
    moe_dispatch_gemm's y: the layout depends on the ids only); rows past layout_view(...)["received"] are
    unspecified (stale data: mask them); layout as moe_dispatch_gemm's. A collective, like the dispatch: every rank
    calls it with the same max_tokens, columns and experts_per_rank. x's columns (a multiple of 8) may carry any
    payload: moe_ffn's backward sends [x | dOut | the weights' bits] in one dispatch."""
    op = "moe_dispatch_gemm"
    rt.check_comm_blocks(comm_blocks, op, comm.rank)
    _check_rows(comm, x, "x", op)
    if x.dtype not in _DTYPES:
        raise invalid(f"x must be bfloat16 or float16, got {x.dtype}", op, comm.rank)
    tokens, hidden = x.shape
    if hidden % 8 or hidden == 0:
        raise invalid(f"x's columns ({hidden}) must be a positive multiple of 8 (16-byte rows)", op, comm.rank)
    epr = int(experts_per_rank)
    world = comm.world_size
    ids, k = _ids(comm, topk_ids, tokens, epr * world, op, check_ids)
    max_tokens = _max_tokens(max_tokens, tokens, op, comm.rank)
    dedup = _dedup()
    key = ("moe_dispatch_rows", rt.token(comm), max_tokens, hidden, k, epr, x.dtype, dedup)
    agree = op_key("moe_dispatch_rows", max_tokens=max_tokens, hidden=hidden, k=k, experts_per_rank=epr,
                   dtype=x.dtype, comm_blocks=int(comm_blocks), dedup=dedup)
    # inter 0: unused without the GEMM
    return _launch_dispatch(comm, x, ids, _shape(tokens, max_tokens, hidden, 0, k, epr), key, agree, "DISPATCH",
                            hidden, comm_blocks, sm_count, op, dedup=dedup)


def run_combine(comm, z, layout, topk_ids, topk_weights, max_tokens, sm_count, check_ids=True):
    op = "moe_combine"
    _check_rows(comm, z, "z", op)
    rt.check_on_device(comm, topk_weights, "topk_weights", op)
    rt.check_on_device(comm, layout, "layout", op)
    world = comm.world_size
    tokens = topk_ids.shape[0] if topk_ids.dim() == 2 else -1
    if topk_weights.shape != topk_ids.shape:
        raise invalid(f"topk_weights {tuple(topk_weights.shape)} and topk_ids {tuple(topk_ids.shape)} differ", op,
                      comm.rank)
    k = topk_ids.shape[1]
    max_tokens = int(max_tokens) or tokens
    K = native().kernels
    # the experts per rank follow from the layout's size (moe.h: 1 + E_l + E_l + 1 + E_l (W + 1) + capacity),
    # which grows with E_l
    epr = None
    for e in range(1, 4096 // max(world, 1) + 1):
        size = 2 + e * (world + 3) + world * max_tokens * min(k, e)
        if size >= layout.numel():
            epr = e if size == layout.numel() else None
            break
    if epr is None or layout.dtype != torch.int32:
        raise invalid("layout is not a dispatch layout of this communicator, max_tokens and k (pass the "
                      "dispatch's max_tokens)", op, comm.rank)
    ids, _ = _ids(comm, topk_ids, tokens, epr * world, op, check_ids)
    cap = K.moe_receive_capacity(_shape(tokens, max_tokens, 8, 8, k, epr), world)
    if z.shape[0] != cap:
        raise invalid(f"z must have the dispatch's {cap} rows (the receive capacity), got {z.shape[0]}", op, comm.rank)
    dim = z.shape[1]
    if dim % 8:
        raise invalid(f"z's columns ({dim}) must be a multiple of 8", op, comm.rank)
    weights = topk_weights.to(torch.float32).contiguous()
    key = (op, rt.token(comm), max_tokens, k, epr, dim, z.dtype)
    agree = op_key(op, max_tokens=max_tokens, k=k, experts_per_rank=epr, dim=dim, dtype=z.dtype)
    a = rt.kernel_args("CombineArgs", dtype=_DTYPES[z.dtype], dim=dim, plan=dict(sm_count=int(sm_count)))
    a.shape = _shape(tokens, max_tokens, 8, 8, k, epr)
    ws = _op_workspace(comm, key, K.workspace_size(comm.native, a), agree)
    out = torch.empty((tokens, dim), dtype=z.dtype, device=z.device)
    a.z, a.topk_weights, a.topk_ids, a.layout, a.out, a.workspace = (z.data_ptr(), weights.data_ptr(),
                                                                     ids.data_ptr(), layout.data_ptr(),
                                                                     out.data_ptr(), ws.data_ptr())
    K.moe_combine(comm.native, a, rt.stream_handle(z.device))  # raises TandemError (its status) if it does not run
    return out


def _dispatch_impl(x, topk_ids, w, comm, max_tokens=0, mode="auto", comm_blocks=0, sm_count=0):
    return run_dispatch_gemm(rt.comm_from_handle(comm, "moe_dispatch_gemm"), x, topk_ids, w, max_tokens, mode,
                             comm_blocks, sm_count)


def _dispatch_fake(x, topk_ids, w, comm, max_tokens=0, mode="auto", comm_blocks=0, sm_count=0):
    c = rt.comm_from_handle(comm, "moe_dispatch_gemm")
    mt = int(max_tokens) or x.shape[0]
    k, epr = topk_ids.shape[1], w.shape[0]
    cap = native().kernels.moe_receive_capacity(_shape(0, mt, 8, 8, k, epr), c.world_size)
    size = layout_index(c.world_size, mt, k, epr)[4]
    return x.new_empty((cap, w.shape[2])), x.new_empty((size,), dtype=torch.int32)


def _combine_impl(z, layout, topk_ids, topk_weights, comm, max_tokens=0, sm_count=0):
    return run_combine(rt.comm_from_handle(comm, "moe_combine"), z, layout, topk_ids, topk_weights, max_tokens,
                       sm_count)


def _combine_fake(z, layout, topk_ids, topk_weights, comm, max_tokens=0, sm_count=0):
    return z.new_empty((topk_ids.shape[0], z.shape[1]))


moe_dispatch_gemm_op = rt.define_op(
    "moe_dispatch_gemm", '(Tensor x, Tensor topk_ids, Tensor w, SymInt comm, SymInt max_tokens=0, str mode="auto", '
    'SymInt comm_blocks=0, SymInt sm_count=0) -> (Tensor, Tensor)', _dispatch_impl, _dispatch_fake)
moe_combine_op = rt.define_op(
    "moe_combine", "(Tensor z, Tensor layout, Tensor topk_ids, Tensor topk_weights, SymInt comm, SymInt max_tokens=0, "
    "SymInt sm_count=0) -> Tensor", _combine_impl, _combine_fake)


def moe_dispatch_gemm(comm, x, topk_ids, w, *, max_tokens: int = 0, mode: str = "auto", comm_blocks: int = 0,
                      sm_count: int = 0):
    """Send every (token, slot) of x to the rank owning expert topk_ids[t, slot] and compute each local expert's
    rows @ w[j] there, in one kernel (mode "fused"), or the dispatch kernel then the grouped GEMM ("unfused"); "auto" is
    the measured choice (_use_fused).
    Returns (y, layout): y has receive-capacity rows, of which layout_view(...)["expert_offset"] says where each
    local expert's begin. Ids outside [0, E) raise (checked with one host sync; under graph capture the kernel
    drops and reports them)."""
    return torch.ops.tandem.moe_dispatch_gemm(x, topk_ids, w, register(comm), max_tokens, mode, comm_blocks, sm_count)


def moe_combine(comm, z, layout, topk_ids, topk_weights, *, max_tokens: int = 0, sm_count: int = 0):
    """out[t] = sum over slots (in order) of topk_weights[t, slot] * z[row of (t, slot)], computed in fp32 on the
    token's rank: z follows the dispatch layout (receive-capacity rows)."""
    return torch.ops.tandem.moe_combine(z, layout, topk_ids, topk_weights, register(comm), max_tokens, sm_count)
