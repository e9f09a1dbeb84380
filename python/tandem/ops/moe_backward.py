"""The backward of the MoE layer (issue 26 item 4), registered as torch.ops.tandem.moe_ffn's autograd: dx,
d topk_weights, dW1 and dW2 of this rank from the incoming dOut, as one op (torch.ops.tandem.moe_ffn_backward) so
that torch.compile (fullgraph) sees a single opaque node.

Forward (moe_layer.py): y = dispatch_gemm(x, ids, W1) (rows in the dispatch layout), a = silu(y_g) * y_u,
z = a W2 per expert, out[t] = sum_s w[t, s] z[row(t, s)]. Backward, with g = dOut (T, H) on each token's rank:

    rows, layout = dispatch_rows([x | g | bits of w (fp32) | 0])   ONE dispatch (the kernels layer's Mode DISPATCH:
                                      no GEMM), rows in the layout order; rows past `received` masked to zero
    xr, r, w_row = the row's x, g and w[t, slot] (slot = row_source % k: the weights' fp32 bits travel as
                   2 k bf16 columns, exact)
    y   = xr W1_j           (torch._grouped_mm, recomputed: nothing of the forward is kept but its inputs)
    a   = silu(y_g) * y_u   (moe_layer.swiglu, as the forward)
    q   = r W2_j^T          (grouped, unweighted)
    s   = rowsum(a * q)     (fp32) = r . z = d w[t, slot] of the row: no z is needed
    dW2 = a_j^T (w_row r)_j (grouped over the rows: torch._grouped_mm 2D x 2D, offsets along K)
    dy  = SwiGLU'(y) (w_row q)   (fp32 math, rounded once to bf16)
    dW1 = xr_j^T dy_j       (2D x 2D, offsets along K)
    dxr = dy W1_j^T         (grouped)
    [dx | dw] = combine([dxr | s as (hi, lo) bf16 pairs in columns 2 slot, 2 slot + 1 | 0], weights = 1)
                                      ONE combine: dx sums the token's k rows (fp32, one rounding to bf16); each
                                      weight column receives exactly one non-zero row, so hi and lo arrive exact
                                      and dw = hi + lo (about 16 significant bits of the fp32 s: not rounded to bf16)
    dW1, dW2 of an expert that received no rows are zero (torch.where on the expert's row count, not trusting
    _grouped_mm's output for an empty K group).

What is fused: nothing beyond the forward's kernels: one dispatch launch (prepare, sort, the dispatch kernel, a
copy of the received rows, the release) and one combine; the GEMMs are torch._grouped_mm (five of them) and the
elementwise work is torch's. Memory kept for the backward: the forward's inputs only (x, ids, weights, W1, W2;
no y, a or z): the backward recomputes y with one grouped GEMM (a third of the forward's FLOPs) instead of keeping
receive-capacity x (2 I + H) per layer. Temporaries of the backward: the packed rows (capacity x (2 H + 8 ceil(k/4)))
and the row-sized tensors y, a, q, dy, dxr.

Every rank calls the backward in the same order (a collective, like the forward). The dispatch's layout depends on
the ids only, so the backward's rows are in the forward's order; the backward never uses the forward's layout.
bf16 only (as the forward). Any k (the weight columns are padded to a multiple of 8).

The expert-side math (expert_backward) and the packing are plain torch, shared by the op and by
simulate_backward, the CPU reference of the whole schedule for a simulated world (tests/cpu/test_moe_ffn_backward.py
compares it with autograd of moe_layer.reference in float64, and runs it in bf16 through torch._grouped_mm's CPU
path).
"""

from __future__ import annotations

import os

import torch

from ..errors import invalid
from . import _runtime as rt
from . import moe
from .moe_layer import OP as FWD_OP, check, swiglu

OP = "moe_ffn_backward"


def pad8(n: int) -> int:
    return (n + 7) // 8 * 8


def _acc(dtype):
    return torch.float64 if dtype == torch.float64 else torch.float32


# ---- packing: what one dispatch and one combine carry ---------------------------------------------------------------

def pack_rows(x, g, topk_weights):
    """[x | g | the weights | 0] (T, 2 H + pad8(kw)) in x's dtype: for a 16-bit dtype the weights' fp32 bits as 2 k
    columns (a dispatch copies bytes: exact), else (the float64 reference) the k weights themselves."""
    tokens = x.shape[0]
    if x.element_size() == 2:
        k = topk_weights.shape[1]  # (T, 2 k); through 1-D: a (0, 1) tensor may have stride 0
        wc = topk_weights.to(torch.float32).contiguous().reshape(-1).view(x.dtype).reshape(tokens, 2 * k)
    else:
        wc = topk_weights.to(x.dtype)
    pad = pad8(wc.shape[1]) - wc.shape[1]
    parts = [x, g.to(x.dtype), wc]
    if pad:
        parts.append(x.new_zeros((tokens, pad)))
    return torch.cat(parts, dim=1)


def unpack_rows(rows, hidden: int, k: int):
    """(x rows, g rows, every slot's weight (rows, k) in fp32 / float64) of dispatched pack_rows rows (views)."""
    xr, r, wc = rows[:, :hidden], rows[:, hidden:2 * hidden], rows[:, 2 * hidden:]
    if rows.element_size() == 2:
        w_all = wc[:, :2 * k].contiguous().reshape(-1).view(torch.float32).reshape(rows.shape[0], k)
    else:
        w_all = wc[:, :k]
    return xr, r, w_all


def slot_of(row_source, k: int):
    """The slot of each row: row_source = t * k + slot at the row's source (moe.h). remainder: in [0, k) also for
    the unspecified entries past `received`."""
    return row_source.remainder(k)


def row_weights(w_all, slot):
    """(rows, 1): the weight of the row's own (token, slot)."""
    return w_all.gather(1, slot.unsqueeze(1))


def unpack_combined(res, hidden: int, k: int):
    """(dx (T, H), d topk_weights (T, k) fp32 / float64) of the combined [dxr | hi, lo pairs] rows."""
    acc = _acc(res.dtype)
    dx = res[:, :hidden].contiguous()
    dw = res[:, hidden:hidden + 2 * k].to(acc).reshape(res.shape[0], k, 2).sum(-1)
    return dx, dw


# ---- grouped products: torch._grouped_mm for bf16, a loop over the groups otherwise (the float64 reference) ---------

_CONTIGUOUS = os.environ.get("TANDEM_MOE_BWD_CONTIGUOUS", "0") == "1"  # diagnostic: dense operands for _grouped_mm


def grouped_rows(a, b, ends):
    """out[rows of group j] = a[rows of j] @ b[j]: a (R, K), b (G, K, N), ends (G,) int32 (each group's end row).
    Rows past ends[-1]: unspecified (torch._grouped_mm) / zero (loop)."""
    if a.dtype == torch.bfloat16:
        if _CONTIGUOUS:
            a, b = a.contiguous(), b.contiguous()
        return torch._grouped_mm(a, b, offs=ends)
    out = a.new_zeros((a.shape[0], b.shape[2]))
    start = 0
    for j, e in enumerate(ends.tolist()):
        out[start:e] = a[start:e] @ b[j]
        start = e
    return out


def grouped_k(at, b, ends):
    """out[j] = at[:, rows of j] @ b[rows of j]: at (M, R) (a transposed view), b (R, N) -> (G, M, N); rows past
    ends[-1] are not read."""
    if at.dtype == torch.bfloat16:
        if _CONTIGUOUS:
            at, b = at.t().contiguous().t(), b.contiguous()
        return torch._grouped_mm(at, b, offs=ends)
    out = at.new_zeros((ends.shape[0], at.shape[0], b.shape[1]))
    start = 0
    for j, e in enumerate(ends.tolist()):
        out[j] = at[:, start:e] @ b[start:e]
        start = e
    return out


def swiglu_backward(y, da, inter: int):
    """d[gate | up] of a = silu(gate) * up for da (fp32 / float64), math in da's precision, one rounding to y's
    dtype."""
    acc = da.dtype
    gate, up = y[:, :inter].to(acc), y[:, inter:].to(acc)
    sig = torch.sigmoid(gate)
    d_up = da * gate * sig
    d_gate = da * up * sig * (1 + gate * (1 - sig))
    return torch.cat([d_gate, d_up], dim=1).to(y.dtype)


def expert_backward(rows, received, expert_offset, row_source, w1, w2, k: int, need_w1: bool = True,
                    need_w2: bool = True):
    """The expert rank's part: rows (capacity, 2 H + pad) dispatched pack_rows rows in layout order, received (1,),
    expert_offset (E_l + 1,), row_source (capacity,) int32 (the layout's views, on the device: no host sync).
    Returns (rows to combine (capacity, H + pad8(2 k)): [dxr | hi, lo of d w in columns 2 slot, 2 slot + 1],
    dW1 (E_l, H, 2 I), dW2 (E_l, I, H)); dW1 / dW2 are None, and their grouped GEMMs skipped, when not needed
    (need_w1 / need_w2: frozen experts; the rows to combine do not depend on them)."""
    hidden, inter = w1.shape[1], w2.shape[1]
    cap = rows.shape[0]
    acc = _acc(rows.dtype)
    # rows past `received` are not written by the dispatch-only copy (uninitialized, possibly NaN / Inf bit
    # patterns): zero them once, so nothing below depends on _grouped_mm skipping them
    valid = torch.arange(cap, device=rows.device) < received.to(torch.int64)
    rows.masked_fill_(~valid.unsqueeze(1), 0)  # in place: rows is this call's own buffer (dispatch_rows)
    xr, r, w_all = unpack_rows(rows, hidden, k)
    slot = slot_of(row_source.to(torch.int64), k)
    w_row = row_weights(w_all.to(acc), slot)  # (cap, 1)
    ends = expert_offset[1:]
    y = grouped_rows(xr, w1, ends)
    a = swiglu(y, inter)
    q = grouped_rows(r, w2.transpose(-2, -1), ends)  # r W2^T, unweighted
    s = (a.to(acc) * q.to(acc)).sum(-1)  # r . (a W2) = r . z
    dw2 = grouped_k(a.t(), (r.to(acc) * w_row).to(rows.dtype), ends) if need_w2 else None
    dy = swiglu_backward(y, q.to(acc) * w_row, inter)
    dw1 = grouped_k(xr.t(), dy, ends) if need_w1 else None
    dxr = grouped_rows(dy, w1.transpose(-2, -1), ends)
    hi = s.to(rows.dtype)
    lo = (s - hi.to(acc)).to(rows.dtype)
    m = rows.new_zeros((cap, pad8(2 * k)))
    m.scatter_(1, (2 * slot).unsqueeze(1), hi.unsqueeze(1))
    m.scatter_(1, (2 * slot + 1).unsqueeze(1), lo.unsqueeze(1))
    nonempty = (expert_offset[1:] > expert_offset[:-1]).view(-1, 1, 1)
    if dw1 is not None:
        dw1 = torch.where(nonempty, dw1, torch.zeros((), dtype=dw1.dtype, device=dw1.device))
    if dw2 is not None:
        dw2 = torch.where(nonempty, dw2, torch.zeros((), dtype=dw2.dtype, device=dw2.device))
    return torch.cat([dxr, m], dim=1), dw1, dw2


# ---- the op ---------------------------------------------------------------------------------------------------------

def _impl(grad, x, topk_ids, topk_weights, w1, w2, comm, activation="swiglu", max_tokens=0, mode="auto",
          sm_count=0, need_w1=True, need_w2=True):
    c = rt.comm_from_handle(comm, OP)
    inter, epr = check(c, x, topk_ids, topk_weights, w1, w2, activation, mode, op=OP)
    tokens, hidden = x.shape
    if tuple(grad.shape) != (tokens, hidden):
        raise invalid(f"grad must be ({tokens}, {hidden}) like the output, got {tuple(grad.shape)}", OP, c.rank)
    rt.check_on_device(c, grad, "grad", OP)
    k = topk_ids.shape[1]
    max_tokens = int(max_tokens) or tokens
    packed = pack_rows(x, grad.to(x.dtype).contiguous(), topk_weights)
    # the forward checked the ids (one host sync); the backward does not sync
    rows, layout = moe.dispatch_rows(c, packed, topk_ids, epr, max_tokens, 0, sm_count, check_ids=False)
    lv = moe.layout_view(c, layout, epr, max_tokens, k)
    out_rows, dw1, dw2 = expert_backward(rows, lv["received"], lv["expert_offset"], lv["row_source"], w1, w2, k,
                                         bool(need_w1), bool(need_w2))
    # a weight whose gradient is not needed gets an empty tensor (the op's outputs are fixed in number)
    dw1 = dw1 if dw1 is not None else w1.new_empty(0)
    dw2 = dw2 if dw2 is not None else w2.new_empty(0)
    ones = torch.ones(topk_ids.shape, dtype=torch.float32, device=x.device)
    res = moe.run_combine(c, out_rows, layout, topk_ids, ones, max_tokens, sm_count, check_ids=False)
    dx, dw = unpack_combined(res, hidden, k)
    return dx, dw.to(topk_weights.dtype), dw1, dw2


def _fake(grad, x, topk_ids, topk_weights, w1, w2, comm, activation="swiglu", max_tokens=0, mode="auto",
          sm_count=0, need_w1=True, need_w2=True):
    # d topk_weights is contiguous whatever topk_weights' strides (the real op returns dw.to(dtype)); a weight's
    # gradient that is not needed is empty, as the real op returns it
    return (torch.empty_like(x), topk_weights.new_empty(topk_weights.shape),
            torch.empty_like(w1) if need_w1 else w1.new_empty(0), torch.empty_like(w2) if need_w2 else w2.new_empty(0))


moe_ffn_backward_op = rt.define_op(
    OP, '(Tensor grad, Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w1, Tensor w2, SymInt comm, '
    'str activation="swiglu", SymInt max_tokens=0, str mode="auto", SymInt sm_count=0, bool need_w1=True, '
    'bool need_w2=True) -> (Tensor, Tensor, Tensor, Tensor)', _impl, _fake)


def _setup(ctx, inputs, output):
    x, topk_ids, topk_weights, w1, w2, comm, activation, max_tokens, mode, sm_count = inputs
    ctx.save_for_backward(x, topk_ids, topk_weights, w1, w2)  # the inputs only: the backward recomputes y
    ctx.args = (comm, activation, max_tokens, mode, sm_count)


def _backward(ctx, grad):
    x, topk_ids, topk_weights, w1, w2 = ctx.saved_tensors
    need = ctx.needs_input_grad
    # the weights' grouped GEMMs (two of the five) run only for the weights that need a gradient; the dispatch and
    # the combine are collectives and run on every rank whatever this rank needs
    dx, dw, dw1, dw2 = torch.ops.tandem.moe_ffn_backward(grad, x, topk_ids, topk_weights, w1, w2, *ctx.args,
                                                         need[3], need[4])
    return (dx if need[0] else None, None, dw if need[2] else None, dw1 if need[3] else None,
            dw2 if need[4] else None, None, None, None, None, None)


torch.library.register_autograd("tandem::" + FWD_OP, _backward, setup_context=_setup)


# ---- the CPU reference of the whole schedule ------------------------------------------------------------------------

def simulate_layout(ids, world: int, experts_per_rank: int, rank: int):
    """(pairs, expert_offset) of rank's receive layout: pairs [(source, t, slot)] in row order (local expert, then
    source rank, then (token, slot)), as moe.h orders them."""
    pairs, offs = [], [0]
    k = ids[0].shape[1]
    for j in range(experts_per_rank):
        e = rank * experts_per_rank + j
        for s in range(world):
            for t, slot in (ids[s] == e).nonzero().tolist():
                pairs.append((s, t, slot))
        offs.append(len(pairs))
    assert all(0 <= sl < k for _, _, sl in pairs)
    return pairs, offs


def simulate_backward(xs, ids, wts, grads, w1_all, w2_all, world: int, max_tokens: int, garbage=float("nan"),
                      need_w1: bool = True, need_w2: bool = True):
    """The op's backward for every rank of a simulated world, on one device: the dispatch and the combine by
    indexing (rows past `received` filled with `garbage`, as stale receive buffers are), expert_backward as the op
    runs it. xs, ids, wts, grads: per rank; w1_all (E, H, 2 I), w2_all (E, I, H). Returns (dx per rank, d weights
    per rank, dW1 (E, H, 2 I), dW2 (E, I, H)); dW1 / dW2 None when not needed (need_w1 / need_w2)."""
    epr = w1_all.shape[0] // world
    hidden = xs[0].shape[1]
    k = ids[0].shape[1]
    dtype = xs[0].dtype
    acc = _acc(dtype)
    cap = world * max_tokens * min(k, epr)
    packed = [pack_rows(xs[s], grads[s], wts[s]) for s in range(world)]
    width = packed[0].shape[1]
    sums = [torch.zeros((xs[s].shape[0], hidden + pad8(2 * k)), dtype=acc) for s in range(world)]
    dw1s, dw2s = [], []
    for q in range(world):
        pairs, offs = simulate_layout(ids, world, epr, q)
        n = len(pairs)
        assert n <= cap
        rows = torch.full((cap, width), garbage, dtype=dtype)
        row_source = torch.zeros(cap, dtype=torch.int32)
        for i, (s, t, slot) in enumerate(pairs):
            rows[i] = packed[s][t]
            row_source[i] = t * k + slot
        out_rows, dw1, dw2 = expert_backward(rows, torch.tensor([n], dtype=torch.int32),
                                             torch.tensor(offs, dtype=torch.int32), row_source,
                                             w1_all[q * epr:(q + 1) * epr], w2_all[q * epr:(q + 1) * epr], k,
                                             need_w1, need_w2)
        dw1s.append(dw1)
        dw2s.append(dw2)
        for i, (s, t, slot) in enumerate(pairs):  # the combine with weights 1: fp32 sums, one rounding below
            sums[s][t] += out_rows[i].to(acc)
    dxs, dws = [], []
    for s in range(world):
        dx, dw = unpack_combined(sums[s].to(dtype), hidden, k)
        dxs.append(dx)
        dws.append(dw)
    return dxs, dws, torch.cat(dw1s) if need_w1 else None, torch.cat(dw2s) if need_w2 else None
