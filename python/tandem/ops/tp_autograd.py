"""Autograd for the TP ops (issue 24): each backward is built from tandem's own ops and registered with
torch.library.register_autograd, so torch.compile traces forward and backward without graph breaks.

    ag_gemm  Y = AG(X) W     dX = RS(dY W^T)   tandem::gemm_rs (the fused GEMM+RS)
                             dW = AG(X)^T dY   X gathered again (tandem::all_gather_rows), then cuBLAS
    gemm_rs  Y = RS(X W)     dX = AG(dY) W^T   tandem::ag_gemm_gathered (the fused AG+GEMM), which also returns
                             dW = X^T AG(dY)   the gathered dY for this cuBLAS product
    gemm_ar  Y = AR(X W)     dX = dY W^T, dW = X^T dY   (dY is the same on every rank: no communication)

X is gathered again in ag_gemm's backward rather than kept from the forward: the forward's gathered rows live
in the op's workspace only until its next call, and a copy would hold M x K per layer until the backward (the
memory a sequence-parallel layer saves). The backward runs "unfused" after an unfused forward, else "auto" (see
_bwd_mode), with the plan's own comm_blocks for its shapes. W^T is made contiguous once per backward (the ops
take row-major operands).

Overlap of the wgrad GEMM with the dgrad collective (ag_gemm's backward, the column layer's): X is gathered first,
then one op (tandem::gemm_rs_beside_wgrad) runs dX = RS(dY W^T) on the caller's stream and dW = AG(X)^T dY, a
plain cuBLAS GEMM, on a side stream forked from it and joined back before the op returns. The GEMM takes the SMs
the GEMM+RS's reduction leaves idle (its few comm blocks, or the unfused RS kernel after the dgrad GEMM). Only a
GEMM goes on the side stream, never a second communicating kernel: two kernels that each wait for their peers,
on two streams of every rank, can each hold SMs the other needs on some rank (a cross-rank deadlock, ended only
by the timeout). cuBLAS blocks always finish, so the fused kernel's blocks that wait for an SM get one. The fork
and join are inside one opaque op, so torch.compile and CUDA graph capture see a single node. gemm_rs's backward
(the row layer's) has no such pair: its wgrad needs the gathered dY that its dgrad (the fused AG+GEMM) produces.
`TANDEM_WGRAD_OVERLAP=0` runs the two one after the other on the caller's stream (read at each call).
"""

from __future__ import annotations

import os

import torch

from .._native import native
from ..errors import invalid
from . import _runtime as rt
from .tp import ag_workspace, check_nodes, run_tp_op

def _bwd_mode(mode: str) -> str:
    """The backward's mode: "unfused" after an unfused forward, else "auto". Not "fused" after a fused forward:
    the backward's shapes differ (gemm_rs's backward gathers M/W rows, which the fused AG+GEMM takes only in
    multiples of 8), and auto takes the fused kernel where it runs and is the faster."""
    return "unfused" if mode == "unfused" else "auto"


# ---- the two ops the backward passes need --------------------------------------------------------------------

def _all_gather_rows_impl(a_local, comm):
    """AG(a_local): every rank's rows, rank order (a new tensor). The AG kernel's gather launch alone, into a
    workspace of its own (its gathered view is copied out: the next gather overwrites it)."""
    op = "all_gather_rows"
    c = rt.comm_from_handle(comm, op)
    rt.check_tensor(a_local, "a_local", op, c.rank, dims=2, device=torch.device("cuda", c.device))
    if c.world_size == 1:
        return a_local.clone()
    check_nodes(c, op)
    if not a_local.is_contiguous():
        raise invalid(f"a_local must be contiguous (strides {a_local.stride()})", op, c.rank)
    m_local, k = a_local.shape
    if k % 8:
        raise invalid(f"K ({k}) must be a multiple of 8 (16-byte rows)", op, c.rank)
    agree = rt.op_key(op, m_local=m_local, k=k, dtype=a_local.dtype)
    ws, gathered = ag_workspace(c, m_local, k, a_local.dtype, agree, tag="rows")
    K = native().kernels
    x = rt.kernel_args("AgGemmArgs", dtype=rt.DTYPES[a_local.dtype], m_local=m_local, n=8, k=k, ldb=8, ldc=8,
                       workspace=ws.data_ptr(), plan=dict(sm_count=0, comm_blocks=0))
    # the gather launch reads a_local and writes the gathered buffer only; B and C are checked, never read
    x.a_local = x.b = x.c = a_local.data_ptr()
    K.ag_gemm(c.native, x, rt.mode("GATHER"), rt.stream_handle(a_local.device))  # raises if it does not run
    return gathered.clone()


def _all_gather_rows_fake(a_local, comm):
    world = rt.comm_from_handle(comm, "all_gather_rows").world_size
    return a_local.new_empty((a_local.shape[0] * world, a_local.shape[1]))


def _ag_gemm_gathered_impl(a_local, b, comm, mode="auto", comm_blocks=0, sm_count=0):
    """(AG(a_local) @ b, AG(a_local)): ag_gemm and a copy of its gathered rows (the op's gathered view lives in its
    workspace only until the next call)."""
    out, gathered = run_tp_op("ag_gemm", comm, a_local, b, mode, comm_blocks, sm_count)
    return out, gathered.clone()


def _ag_gemm_gathered_fake(a_local, b, comm, mode="auto", comm_blocks=0, sm_count=0):
    world = rt.comm_from_handle(comm, "ag_gemm_gathered").world_size
    m = a_local.shape[0] * world
    return a_local.new_empty((m, b.shape[1])), a_local.new_empty((m, a_local.shape[1]))


all_gather_rows_op = rt.define_op("all_gather_rows", "(Tensor a_local, SymInt comm) -> Tensor",
                                  _all_gather_rows_impl, _all_gather_rows_fake)
ag_gemm_gathered_op = rt.define_op(
    "ag_gemm_gathered",
    '(Tensor a_local, Tensor b, SymInt comm, str mode="auto", SymInt comm_blocks=0, SymInt sm_count=0) '
    "-> (Tensor, Tensor)", _ag_gemm_gathered_impl, _ag_gemm_gathered_fake)


def wgrad_overlap_enabled() -> bool:
    return os.environ.get("TANDEM_WGRAD_OVERLAP", "1") != "0"


def _gemm_rs_beside_wgrad_impl(dy, w_t, x_all, comm, mode="auto", sm_count=0):
    """(RS(dy @ w_t), x_all^T @ dy): ag_gemm's dgrad by tandem::gemm_rs on the caller's stream and its wgrad by
    cuBLAS on a side stream beside it (see the module docstring; TANDEM_WGRAD_OVERLAP=0: one after the other)."""
    op = "gemm_rs_beside_wgrad"
    c = rt.comm_from_handle(comm, op)
    rt.check_tensor(x_all, "x_all", op, c.rank, dims=2, device=dy.device)
    if x_all.shape[0] != dy.shape[0] or x_all.dtype != dy.dtype:
        raise invalid(f"x_all {tuple(x_all.shape)} {x_all.dtype} must have dy's rows and dtype "
                      f"({tuple(dy.shape)} {dy.dtype})", op, c.rank)
    if not wgrad_overlap_enabled():
        dx = torch.ops.tandem.gemm_rs(dy, w_t, comm, mode, 0, sm_count)
        return dx, x_all.t() @ dy
    main = torch.cuda.current_stream(dy.device)
    side = rt.side_stream(dy.device, "wgrad")
    # dw is allocated on the caller's stream, so its memory belongs to that stream; the side stream writes it only
    # after waiting for everything queued before this op, and the caller's stream waits for the side stream before
    # anything after this op, so no tensor the side stream touches is freed or reused under it (no record_stream)
    dw = torch.empty((x_all.shape[1], dy.shape[1]), device=dy.device, dtype=dy.dtype)
    side.wait_stream(main)
    dx = torch.ops.tandem.gemm_rs(dy, w_t, comm, mode, 0, sm_count)  # queued first: its kernel launches first
    with torch.cuda.stream(side):
        torch.mm(x_all.t(), dy, out=dw)
    main.wait_stream(side)
    return dx, dw


def _gemm_rs_beside_wgrad_fake(dy, w_t, x_all, comm, mode="auto", sm_count=0):
    world = rt.comm_from_handle(comm, "gemm_rs_beside_wgrad").world_size
    return dy.new_empty((dy.shape[0] // world, w_t.shape[1])), dy.new_empty((x_all.shape[1], dy.shape[1]))


gemm_rs_beside_wgrad_op = rt.define_op(
    "gemm_rs_beside_wgrad",
    '(Tensor dy, Tensor w_t, Tensor x_all, SymInt comm, str mode="auto", SymInt sm_count=0) -> (Tensor, Tensor)',
    _gemm_rs_beside_wgrad_impl, _gemm_rs_beside_wgrad_fake)


def _sp_bias_add_impl(y, bias, comm):
    """y + bias: the bias of a sequence-parallel row layer (its rows are this rank's rows of the sequence)."""
    return y + bias


def _sp_bias_add_fake(y, bias, comm):
    return torch.empty_like(y)


sp_bias_add_op = rt.define_op("sp_bias_add", "(Tensor y, Tensor bias, SymInt comm) -> Tensor", _sp_bias_add_impl,
                              _sp_bias_add_fake)


def _sp_bias_add_setup(ctx, inputs, output):
    ctx.comm = inputs[2]


def _sp_bias_add_backward(ctx, dy):
    """The bias is replicated and each rank holds only its rows' dY: its gradient is the sum over every rank's
    rows, taken as the gather of the ranks' fp32 row sums (one row each, moved as 16-bit words), then summed in
    fp32 in rank order (the same bits on every rank)."""
    partial = dy.float().sum(0, keepdim=True)  # (1, N) fp32, gathered as its bits: (1, 2N) 16-bit words
    every = torch.ops.tandem.all_gather_rows(partial.view(dy.dtype), ctx.comm).view(torch.float32)  # (W, N)
    return dy, every.sum(0).to(dy.dtype), None


torch.library.register_autograd("tandem::sp_bias_add", _sp_bias_add_backward, setup_context=_sp_bias_add_setup)


# ---- the backward passes ------------------------------------------------------------------------------------------

def _in_heap(comm, t) -> bool:
    """Whether `t` lies in the communicator's symmetric heap (False for tensors without storage: fake, meta)."""
    try:
        p = t.data_ptr()
    except (RuntimeError, NotImplementedError):
        return False
    n = rt.comm_from_handle(comm, "autograd").native
    return n.heap_base <= p < n.heap_base + n.heap_bytes


def _setup(ctx, inputs, output):
    a, b, comm, mode, _comm_blocks, sm_count = inputs[:6]
    # an input in the heap is an op's workspace (tp.gathered_buffer: the AG's in-place input), which a later launch
    # of that workspace rewrites before this backward runs: keep a copy
    if _in_heap(comm, a):
        a = a.clone()
    ctx.save_for_backward(a, b)
    ctx.comm, ctx.mode, ctx.sm_count = comm, mode, sm_count


def _ag_gemm_backward(ctx, dy):
    x, w = ctx.saved_tensors
    dx = dw = None
    dy = dy.contiguous()
    if ctx.needs_input_grad[0] and ctx.needs_input_grad[1]:  # both: the wgrad GEMM beside the dgrad's RS
        x_all = torch.ops.tandem.all_gather_rows(x, ctx.comm)
        dx, dw = torch.ops.tandem.gemm_rs_beside_wgrad(dy, w.t().contiguous(), x_all, ctx.comm,
                                                       _bwd_mode(ctx.mode), ctx.sm_count)
    elif ctx.needs_input_grad[0]:  # RS(dY W^T): this rank's rows of the sum over the ranks' column shards
        dx = torch.ops.tandem.gemm_rs(dy, w.t().contiguous(), ctx.comm, _bwd_mode(ctx.mode), 0, ctx.sm_count)
    elif ctx.needs_input_grad[1]:
        dw = torch.ops.tandem.all_gather_rows(x, ctx.comm).t() @ dy
    return dx, dw, None, None, None, None


def _gemm_rs_backward(ctx, dy):
    x, w = ctx.saved_tensors
    dx = dw = None
    dy = dy.contiguous()
    if ctx.needs_input_grad[0]:
        dx, dy_all = torch.ops.tandem.ag_gemm_gathered(dy, w.t().contiguous(), ctx.comm, _bwd_mode(ctx.mode), 0,
                                                       ctx.sm_count)
        if ctx.needs_input_grad[1]:
            dw = x.t() @ dy_all
    elif ctx.needs_input_grad[1]:
        dw = x.t() @ torch.ops.tandem.all_gather_rows(dy, ctx.comm)
    return dx, dw, None, None, None, None


def _gemm_ar_backward(ctx, dy):
    x, w = ctx.saved_tensors
    dx = dy @ w.t() if ctx.needs_input_grad[0] else None
    dw = x.t() @ dy if ctx.needs_input_grad[1] else None
    return dx, dw, None, None, None, None, None


torch.library.register_autograd("tandem::ag_gemm", _ag_gemm_backward, setup_context=_setup)
torch.library.register_autograd("tandem::gemm_rs", _gemm_rs_backward, setup_context=_setup)
torch.library.register_autograd("tandem::gemm_ar", _gemm_ar_backward, setup_context=_setup)
