"""Tensor-parallel fused ops: torch.ops.tandem.ag_gemm, torch.ops.tandem.gemm_rs and torch.ops.tandem.gemm_ar.

    ag_gemm(a_local, b):  all_gather(a_local) @ b      a_local (M/W x K) per rank, b (K x N)  -> (M x N)
    gemm_rs(a, b):        reduce_scatter(a @ b)         a (M x K), b (K x N)                  -> (M/W x N)
    gemm_ar(a, b):        all_reduce(a @ b)             a (M x K), b (K x N)                  -> (M x N), the
                          same bytes on every rank (fixed reduction order, owners' rows gathered)

Every rank of the communicator calls the op with the same shapes, in the same order (it is a collective); the first
call of a key (shapes, dtype, mode, ...) checks that the ranks agree and raises a TandemError on every rank if
they do not (tandem.ops._runtime.agree_on_key).
The communicator reaches the op as an integer handle (`register(comm)`), because torch.library ops take
tensors and scalars only. Modes: "fused" (one role-specialized kernel), "unfused" (tandem's all-gather or
reduction kernel next to the plain GEMM, one after the other), "pipelined" (cuBLAS GEMMs per chunk, the copy
engines moving the chunks, stream-ordered flags between ranks: tandem.ops.tp_pipelined; one node), "auto" (mode
and SM split per shape: the tuned table of `python -m tandem tune`, else the cost model of tandem.ops.tp_plan;
world 1 is the plain GEMM). The workspace (symmetric heap) is made on the first call for
a shape and reused: make that first call before capturing a CUDA graph (allocation is collective and not
capturable); replays are safe (epochs live on the device).
"""

from __future__ import annotations

import os

import torch

from .._native import native
from ..errors import TandemError, invalid
from . import _runtime as rt
from . import tp_pipelined, tp_plan
# the public part of the shared runtime, where users have always found it (tandem.ops.tp.register, ...)
from ._runtime import disagreement, format_key, op_key, register, release_workspaces  # noqa: F401
from .gemm import gemm as _plain_gemm

def auto_plan(comm, op: str, m: int, n: int, k: int, sm_count: int = 0) -> tuple:
    """(mode, comm_blocks) that mode="auto" runs for the rank's problem M x N x K (AG: M the gathered rows; RS/AR:
    K the rank's): the tuned table of `python -m tandem tune`, else the cost model (tandem.ops.tp_plan). The same
    on every rank that reads the same table; the choice is part of what the ranks agree on."""
    # pipelined runs cuBLAS on all of the rank's SMs: not a candidate when the caller restricts them
    return tp_plan.choose(op, comm.world_size, int(sm_count) or comm.sm_count, m, n, k,
                          nodes=getattr(getattr(comm, "native", None), "num_nodes", 1), pipelined=not int(sm_count))


def fused_sms(comm, op, sm_count) -> int:
    """The fused kernel's grid: the caller's sm_count, else tp_plan.fused_grid_sms of the rank's share."""
    if int(sm_count):
        return int(sm_count)
    return tp_plan.fused_grid_sms(op, comm.sm_count, getattr(comm, "ranks_on_device", 1))


def fused_split(comm, op, m, n, k, sm_count) -> int:
    """comm_blocks of mode="fused" called with comm_blocks=0 (tandem.ops.tp_plan.fused_split): part of the key the
    ranks agree on, as auto's plan is."""
    return tp_plan.fused_split(op, comm.world_size, int(sm_count) or comm.sm_count, m, n, k)


# The fused kernels' environment knobs (kernels/src/fused/tp_common.cuh, read by the kernels' host side at every
# launch) that can change what a rank writes into its peers' memory or waits for from them: the ring instead of
# the reduce role, pieces and their boundaries (tile shape, swizzle groups), the chunk order, the reduction's
# form, tile claims (with the ring, TANDEM_TP_CLAIM=0 runs the default kernel instead), the joined reduction and
# the raster. Ranks that set them differently would run different protocols against one workspace: a timeout at
# best, wrong sums at worst. So they are part of what the ranks agree on whenever a fused kernel may run. Left
# out: diagnostics and per-rank timing (TANDEM_TP_TRACE, TANDEM_TP_LATE, TANDEM_TP_POLL_NS,
# TANDEM_RS_STREAM_LOADS, TANDEM_TP_FUSED_SMS, TANDEM_RS_TICKET_END_WAITERS: which of a rank's own blocks wait at
# the ticket kernel's end, TANDEM_RS_TICKET_DIRECT: whether a rank's own sums go through its staging,
# TANDEM_RS_TICKET_ROUNDS: the order of a rank's own ticket calls), which change no cross-rank protocol.
_ENV = os.environ
FUSED_PROTOCOL_KNOBS = ("TANDEM_RS_TICKET", "TANDEM_RS_RING", "TANDEM_RS_PIECES", "TANDEM_RS_ORDER", "TANDEM_RS_REDUCE",
                        "TANDEM_RS_JOIN", "TANDEM_TP_CLAIM", "TANDEM_TP_GEMM_TILE", "TANDEM_TP_SWIZZLE",
                        "TANDEM_TP_RASTER")


def fused_knob_values() -> tuple:
    """FUSED_PROTOCOL_KNOBS' values in this process now (None where unset): part of a prepared call's signature."""
    return tuple(map(_ENV.get, FUSED_PROTOCOL_KNOBS))


# auto's plans that run the fused kernel: "fused" (comm_blocks = the reduce role's SMs) and, for GEMM+RS/AR on one
# node, "ticket" (the ticket kernel: no reduce role; the plan's number is its rounds, 0 or 1 = none).
_FUSED_PLANS = ("fused", "ticket")


def plan_launch_fields(plan, comm_blocks: int) -> tuple:
    """(fused, comm_blocks, ticket fields) of auto's plan for the GEMM+RS/AR launch: whether it runs the fused
    kernel, the reduce role's SMs (the caller's comm_blocks first; none for "ticket", which has no reduce role, so a
    caller's comm_blocks does not apply to it), and the GemmRsArgs fields that choose the ticket kernel ({} leaves
    it to TANDEM_RS_TICKET; a ticket plan overrides TANDEM_RS_TICKET=0)."""
    if plan is None:
        return None, int(comm_blocks), {}
    if plan[0] == "ticket":
        return True, 0, {"ticket": 1, "ticket_rounds": max(1, int(plan[1]))}
    return plan[0] == "fused", int(comm_blocks) or int(plan[1]), {}


def fused_knobs(mode: str, plan) -> dict:
    """{"knobs": ((name, value), ...)} of the FUSED_PROTOCOL_KNOBS set in this process when the call may run a
    fused kernel (mode "fused", or "auto" with a fused plan), for the op key; {} otherwise (unset knobs and
    non-fused calls leave the key as it was)."""
    if mode not in ("fused", "auto") or (mode == "auto" and (plan is None or plan[0] not in _FUSED_PLANS)):
        return {}
    set_ = tuple((name, v) for name, v in zip(FUSED_PROTOCOL_KNOBS, fused_knob_values()) if v)
    return {"knobs": set_} if set_ else {}


def _validate(comm, a, b, op):
    rt.check_matmul(a, b, op, comm.rank, device=torch.device("cuda", comm.device))


def _check_mode(mode, op, rank):
    rt.check_mode(mode, ("auto", "fused", "unfused", "pipelined"), op, rank)


def _check_blocks(comm_blocks, op, rank):
    rt.check_comm_blocks(comm_blocks, op, rank)


def check_nodes(comm, op):
    # Across nodes the kernels route every chunk between ranks of one local index: nodes must be groups of
    # consecutive ranks of one size (emulated nodes always are; so are the usual launchers' layouts).
    n = comm.native
    if n.num_nodes > 1 and n.uniform_ranks_per_node == 0:
        raise TandemError(f"tandem: {op}: the nodes are not groups of consecutive ranks of one size (local ranks "
                          f"{list(n.local_ranks)} of world {comm.world_size}); relaunch with ranks grouped by node",
                          9, op, comm.rank)


def ag_workspace(comm, m_local: int, k: int, dtype, agree: tuple, tag: str = ""):
    """(workspace, gathered A view (world m_local x k)) of the AG op for this shape: made on first use (collective,
    after the ranks agree on `agree`), cached per communicator, shape and dtype (and `tag`: another op's gathers of
    the same shape get a workspace of their own, so that one op's gathered view is not the other's)."""
    K = native().kernels
    x = rt.kernel_args("AgGemmArgs", m_local=m_local, n=8, k=k, ldb=8, ldc=8)  # the workspace: world, m_local, k
    ws = rt.workspace(comm, ("ag_gemm", rt.token(comm), m_local, k, dtype) + ((tag,) if tag else ()),
                      K.workspace_size(comm.native, x), agree=agree)
    off = K.gathered_offset(comm.native, x)
    rows = comm.world_size * m_local
    esize = torch.empty((), dtype=dtype).element_size()
    return ws, ws[off:off + rows * k * esize].view(dtype).view(rows, k)


_PIPELINED_LOADERS = ("preload_kernels", "stream_sync_preload_kernels")


def _ag_pipelined_workspace(comm, m_local: int, k: int, dtype, agree: tuple) -> torch.Tensor:
    """The pipelined AG workspace (tandem.ops.tp_pipelined: flags, then the gathered A) for this shape."""
    esize = torch.empty((), dtype=dtype).element_size()
    return rt.workspace(comm, ("ag_gemm_pipelined", rt.token(comm), m_local, k, dtype),
                      tp_pipelined.ag_workspace_bytes(comm.world_size, m_local, k, esize),
                      loaders=_PIPELINED_LOADERS, agree=agree)


def _rs_workspace(comm, op: str, m: int, n: int, dtype, agree: tuple, ticket: bool = False) -> torch.Tensor:
    """The GEMM+RS/AR workspace (`op`) for this shape, as ag_workspace; `ticket`: the ticket kernel's layout
    whatever TANDEM_RS_TICKET says (auto's plan "ticket")."""
    return rt.workspace(comm, (op, rt.token(comm), m, n, dtype),
                        native().kernels.workspace_size(comm.native, _rs_shape_args(m, n, ticket=ticket)),
                        agree=agree)


def _rs_shape_args(m: int, n: int, k: int = 8, ticket: bool = False):
    """GemmRsArgs with the fields the workspace layout depends on (M, N, the ticket kernel's choice; the world and
    SMs are the communicator's)."""
    return rt.kernel_args("GemmRsArgs", m=m, n=n, k=k, lda=k, ldb=n, **({"ticket": 1} if ticket else {}))


def _prepare_ag(comm, a_local, b, mode, comm_blocks, sm_count):
    """Every check of an AG+GEMM call, its plan, agreement and workspace; returns its launcher
    (comm, a_local, b) -> (C, gathered A) for every later call of the same signature (run_tp_op)."""
    op = "ag_gemm"
    check_nodes(comm, op)
    _validate(comm, a_local, b, op)
    _check_mode(mode, op, comm.rank)
    _check_blocks(comm_blocks, op, comm.rank)
    if not a_local.is_contiguous():
        raise invalid(f"a_local must be contiguous (strides {a_local.stride()})", op, comm.rank)
    world = comm.world_size
    m_local, k = a_local.shape
    n = b.shape[1]
    dtype, device = a_local.dtype, a_local.device
    K = native().kernels
    plan = auto_plan(comm, op, world * m_local, n, k, sm_count) if mode == "auto" else None
    if mode == "fused" and not comm_blocks:
        plan = ("fused", fused_split(comm, op, world * m_local, n, k, sm_count))
    agree = op_key(op, m_local=m_local, n=n, k=k, dtype=dtype, mode=mode, comm_blocks=int(comm_blocks),
                   **({"plan": plan} if plan else {}), **fused_knobs(mode, plan))
    if mode == "pipelined" or (plan is not None and plan[0] == "pipelined"):
        tp_pipelined.check(comm, op, sm_count=sm_count, comm_blocks=comm_blocks if mode == "pipelined" else 0)
        pws = _ag_pipelined_workspace(comm, m_local, k, dtype, agree)
        return lambda c, a, bb: _in_op(op, c.rank, tp_pipelined.ag_gemm, c, pws, a, bb)
    ws, gathered = ag_workspace(comm, m_local, k, dtype, agree)
    if plan is not None:
        mode = ("fused" if mode == "fused" else "auto") if plan[0] == "fused" else "unfused"
        comm_blocks = comm_blocks or plan[1]
    sms, blocks = int(sm_count), int(comm_blocks)
    rows = world * m_local
    # the call's typed arguments, made once per signature; each call sets the addresses
    x = rt.kernel_args("AgGemmArgs", dtype=rt.DTYPES[dtype], m_local=m_local, n=n, k=k, ldb=b.stride(0), ldc=n,
                       workspace=ws.data_ptr(), plan=dict(sm_count=sms, comm_blocks=blocks))
    if mode in ("auto", "fused"):
        probe = torch.empty((1, n), dtype=dtype, device=device)  # can_implement reads addresses, writes nothing
        x.a_local, x.b, x.c = a_local.data_ptr(), b.data_ptr(), probe.data_ptr()
        why = K.can_implement(comm.native, x)
        if why and mode == "fused":
            raise invalid(f"the fused kernel cannot run this problem: {why}", op, comm.rank)
        if not why:
            fused_mode = rt.mode("FUSED")

            def fused(cm, a, bb):
                out = torch.empty((rows, n), dtype=dtype, device=device)
                x.a_local, x.b, x.c = a.data_ptr(), bb.data_ptr(), out.data_ptr()
                K.ag_gemm(cm.native, x, fused_mode, rt.stream_handle(device))  # raises if it does not run
                return out, gathered
            return fused
    # cuBLAS on the gathered A: under MPS it ran at about twice the rate of tandem's persistent GEMM core on a
    # rank's SMs (docs/results.md, issue 21); the stream orders it after the all-gather kernel. One node only:
    # across emulated nodes (H200, 2026-12-04, test_tp_ops_across_emulated_nodes[1]) the all-gather kernel's proxy
    # traffic stopped when cuBLAS was enqueued behind it (likely its first launch loading a module while the
    # proxy's CUDA copies wait, as with a pageable copy: docs/reliability.md), so the gather timed out. tandem's
    # GEMM kernels are loaded before the first launch (_runtime.preload).
    cublas = _UNFUSED_GEMM == "cublas" and not sms and comm.native.num_nodes == 1
    g = rt.kernel_args("GemmArgs", m=rows, n=n, k=k, dtype=rt.DTYPES[dtype], a=gathered.data_ptr(), lda=k,
                       ldb=b.stride(0), ldd=n, sm_count=sms or comm.sm_count)
    gws_bytes = max(K.workspace_size(g), 1)
    gather_mode = rt.mode("GATHER")

    def unfused(cm, a, bb):
        out = torch.empty((rows, n), dtype=dtype, device=device)
        # tandem's GEMM workspace is allocated before the all-gather runs: nothing on this thread should wait on
        # the device meanwhile
        gws = None if cublas else torch.empty(gws_bytes, dtype=torch.uint8, device=device)
        stream = rt.stream_handle(device)
        x.a_local, x.b, x.c = a.data_ptr(), bb.data_ptr(), out.data_ptr()
        K.ag_gemm(cm.native, x, gather_mode, stream)
        if cublas:
            torch.matmul(gathered, bb, out=out)
            return out, gathered
        g.b, g.d = bb.data_ptr(), out.data_ptr()
        K.gemm(g, gws.data_ptr(), stream)
        return out, gathered
    return unfused


_AR_ALGOS = {"auto": "AUTO", "one_shot": "ONE_SHOT", "two_shot": "TWO_SHOT"}  # -> tandem._C.kernels.ArAlgo
_MAX_ONE_NODE_RS_WORLD = 8

# The GEMM of the unfused path: "cublas" (torch.matmul, the default) or "tandem" (the CUTLASS core; also used
# whenever the caller restricts sm_count, which cuBLAS cannot honour). TANDEM_UNFUSED_GEMM overrides.
_UNFUSED_GEMM = os.environ.get("TANDEM_UNFUSED_GEMM", "cublas")


def _prepare_rs(comm, a, b, mode, comm_blocks, sm_count, op="gemm_rs", algo="auto"):
    """As _prepare_ag, for GEMM+RS and GEMM+AR: the launcher (comm, a, b) -> out."""
    _validate(comm, a, b, op)
    _check_mode(mode, op, comm.rank)
    _check_blocks(comm_blocks, op, comm.rank)
    world = comm.world_size
    m, k = a.shape
    n = b.shape[1]
    if m % world:
        raise invalid(f"M ({m}) must be a multiple of the world size ({world})", op, comm.rank)
    check_nodes(comm, op)
    if world > _MAX_ONE_NODE_RS_WORLD and comm.native.num_nodes == 1:
        # The one-node reduction holds one source pointer per rank in an 8-entry table (gemm_rs_sm90.cu,
        # kMaxFusedRsWorld); more ranks would write past it. Refused until the step-by-step fallback for more than
        # 8 ranks (branch next2) has run on a GPU.
        raise invalid(f"GEMM+RS/AR on one node take at most {_MAX_ONE_NODE_RS_WORLD} ranks, got {world}", op, comm.rank)
    if op == "gemm_ar" and algo == "one_shot" and comm.native.num_nodes > 1:
        raise invalid("the one-shot all-reduce reads every partial by load/store: one node only (use two_shot)",
                      op, comm.rank)
    dtype, device = a.dtype, a.device
    K = native().kernels
    plan = auto_plan(comm, op, m, n, k, sm_count) if mode == "auto" else None
    if mode == "fused" and not comm_blocks:
        plan = ("fused", fused_split(comm, op, m, n, k, fused_sms(comm, op, sm_count)))
    pipelined = mode == "pipelined" or (plan is not None and plan[0] == "pipelined")
    agree = op_key(op, m=m, n=n, k=k, dtype=dtype, mode=mode, comm_blocks=int(comm_blocks),
                   **({"algo": algo} if op == "gemm_ar" else {}), **({"plan": plan} if plan else {}),
                   **({"splits": tp_pipelined.SPLITS} if pipelined else {}), **fused_knobs(mode, plan))
    out_rows = m if op == "gemm_ar" else m // world
    all_reduce = op == "gemm_ar"
    if pipelined:
        tp_pipelined.check(comm, op, tp_pipelined.SPLITS, sm_count=sm_count,
                           comm_blocks=comm_blocks if mode == "pipelined" else 0)
        pws = rt.workspace(comm, (op + "_pipelined", rt.token(comm), m, n, dtype),
                           tp_pipelined.rs_workspace_bytes(world, m, n, a.element_size(), all_reduce),
                           loaders=_PIPELINED_LOADERS, agree=agree)
        splits = tp_pipelined.SPLITS

        def pipelined_launch(cm, x, bb):
            out = torch.empty((out_rows, n), dtype=dtype, device=device)
            return _in_op(op, cm.rank, tp_pipelined.gemm_rs, cm, pws, x, bb, out, all_reduce, splits)
        return pipelined_launch
    # The ticket mode (TANDEM_RS_TICKET=1) keeps per-tile tickets that only its own launches reset: a workspace of
    # its own, never shared with the other modes' launches (gemm_rs_sm90.cu).
    # Auto's plan "ticket" chooses it for this call (GemmRsArgs.ticket), the same workspace key.
    fused_plan, blocks, ticket_fields = plan_launch_fields(plan, comm_blocks)
    ticket = bool(ticket_fields) or (_ENV.get("TANDEM_RS_TICKET") == "1" and "knobs" in fused_knobs(mode, plan))
    ws = _rs_workspace(comm, op + ("_ticket" if ticket else ""), m, n, dtype, agree, ticket=bool(ticket_fields))
    run = K.gemm_ar if all_reduce else K.gemm_rs
    if plan is not None:
        mode = ("fused" if mode == "fused" else "auto") if fused_plan else "unfused"
    # mode is now "fused", "auto" (a fused plan) or "unfused": the fused kernel's grid is one every rank's clusters
    # fit in (MPS)
    sms = int(sm_count) if mode == "unfused" else fused_sms(comm, op, sm_count)
    # the call's typed arguments, made once per signature; each call sets the addresses
    x = rt.kernel_args("GemmArArgs" if all_reduce else "GemmRsArgs", dtype=rt.DTYPES[dtype], m=m, n=n, k=k,
                       lda=a.stride(0), ldb=b.stride(0), workspace=ws.data_ptr(),
                       plan=dict(sm_count=sms, comm_blocks=blocks), **ticket_fields)
    if all_reduce:  # algo was checked by the op
        x.algo = getattr(K.ArAlgo, _AR_ALGOS[algo])
    chosen = "UNFUSED" if mode == "unfused" else "FUSED"
    if mode in ("auto", "fused"):
        probe = torch.empty((1, 8), dtype=dtype, device=device)  # can_implement reads addresses, writes nothing
        x.a, x.b, x.out = a.data_ptr(), b.data_ptr(), probe.data_ptr()
        why = K.can_implement(comm.native, x)
        if why and mode == "fused":
            raise invalid(f"the fused kernel cannot run this problem: {why}", op, comm.rank)
        chosen = "UNFUSED" if why else "FUSED"
    if chosen == "UNFUSED" and sms != int(sm_count):  # auto fell back to unfused: not the fused kernel's grid
        sms = int(sm_count)
        x.plan.sm_count = sms
    if chosen == "UNFUSED" and _UNFUSED_GEMM == "cublas" and not sms and comm.native.num_nodes == 1:
        # The unfused path with cuBLAS for the GEMM (see _prepare_ag): wait until every rank read this rank's
        # partial of the previous launch, cuBLAS writes the partial buffer, then the reduction kernel alone.
        off = K.partial_offset(comm.native, x)
        partial = ws[off:off + m * n * a.element_size()].view(dtype).view(m, n)
        wait, reduce = rt.mode("WAIT"), rt.mode("REDUCE")

        def unfused_cublas(cm, aa, bb):
            out = torch.empty((out_rows, n), dtype=dtype, device=device)
            stream = rt.stream_handle(device)
            x.a, x.b, x.out = aa.data_ptr(), bb.data_ptr(), out.data_ptr()
            run(cm.native, x, wait, stream)  # each raises TandemError if it does not run
            torch.matmul(aa, bb, out=partial)
            run(cm.native, x, reduce, stream)
            return out
        return unfused_cublas
    launch_mode = rt.mode(chosen)

    def launch(cm, aa, bb):
        out = torch.empty((out_rows, n), dtype=dtype, device=device)
        x.a, x.b, x.out = aa.data_ptr(), bb.data_ptr(), out.data_ptr()
        run(cm.native, x, launch_mode, rt.stream_handle(device))
        return out
    return launch


def _world_of_one(comm, a, b, op, mode, comm_blocks):
    """Every TP op at world 1: the same checks as at any world; the launcher is the plain GEMM (nothing to
    exchange). AG's launcher returns (C, A) as at any world."""
    _validate(comm, a, b, op)
    _check_mode(mode, op, comm.rank)
    _check_blocks(comm_blocks, op, comm.rank)
    return rt.world_of_one_launcher(op, _plain_gemm)


def _in_op(op, rank, fn, *args):
    """fn(*args), its TandemError (a stream-sync launch names only itself) re-raised naming the op and rank."""
    try:
        return fn(*args)
    except TandemError as e:
        raise TandemError(f"tandem: rank {rank}: {op} (pipelined): {e}", e.status, op, rank, e.peer) from None


def run_tp_op(op, handle, a, b, mode, comm_blocks, sm_count, algo="auto"):
    """One call of a TP op: the launcher prepared for this call's signature (made on its first call: _prepare_*),
    after the checks the signature does not cover (the communicator is alive; the inputs' addresses). A launcher
    sets its addresses in one shared Args object and launches: calls of one communicator come from one thread at
    a time (as the collectives require anyway: every rank must call them in one order)."""
    comm = rt.comm_from_handle(handle, op)
    try:
        # the fused kernels' protocol knobs as set now: a change (on any rank) prepares the call again, and with it
        # the ranks' agreement on them (fused_knobs)
        key = (op, int(handle), mode, comm_blocks, sm_count, algo, a.shape, a.stride(), a.dtype, a.device, b.shape,
               b.stride(), b.dtype, b.device, fused_knob_values())
    except AttributeError:  # not tensors: the full checks say so
        key = None
    launch = rt.prepared(key) if key is not None else None
    if launch is None:
        if comm.world_size == 1:
            launch = _world_of_one(comm, a, b, op, mode, comm_blocks)
        elif op == "ag_gemm":
            launch = _prepare_ag(comm, a, b, mode, comm_blocks, sm_count)
        else:
            launch = _prepare_rs(comm, a, b, mode, comm_blocks, sm_count, op=op, algo=algo)
        if key is not None:
            rt.remember(key, launch)
    elif (a.data_ptr() | b.data_ptr()) & 15:
        _validate(comm, a, b, op)  # raises, naming the misaligned input
    return launch(comm, a, b)


def _ag_gemm_impl(a_local, b, comm, mode="auto", comm_blocks=0, sm_count=0):
    return run_tp_op("ag_gemm", comm, a_local, b, mode, comm_blocks, sm_count)[0]


def _ag_gemm_fake(a_local, b, comm, mode="auto", comm_blocks=0, sm_count=0):
    world = rt.comm_from_handle(comm, "ag_gemm").world_size
    return a_local.new_empty((a_local.shape[0] * world, b.shape[1]))


def _gemm_rs_impl(a, b, comm, mode="auto", comm_blocks=0, sm_count=0):
    return run_tp_op("gemm_rs", comm, a, b, mode, comm_blocks, sm_count)


def _gemm_rs_fake(a, b, comm, mode="auto", comm_blocks=0, sm_count=0):
    world = rt.comm_from_handle(comm, "gemm_rs").world_size
    return a.new_empty((a.shape[0] // world, b.shape[1]))


def _gemm_ar_impl(a, b, comm, mode="auto", comm_blocks=0, sm_count=0, algo="auto"):
    if algo not in _AR_ALGOS:
        raise invalid(f"algo must be one of {sorted(_AR_ALGOS)}, got {algo!r}", "gemm_ar",
                      rt.comm_from_handle(comm, "gemm_ar").rank)
    return run_tp_op("gemm_ar", comm, a, b, mode, comm_blocks, sm_count, algo)


def _gemm_ar_fake(a, b, comm, mode="auto", comm_blocks=0, sm_count=0, algo="auto"):
    return a.new_empty((a.shape[0], b.shape[1]))


_TP_ARGS = 'SymInt comm, str mode="auto", SymInt comm_blocks=0, SymInt sm_count=0'
ag_gemm_op = rt.define_op("ag_gemm", f"(Tensor a_local, Tensor b, {_TP_ARGS}) -> Tensor", _ag_gemm_impl,
                          _ag_gemm_fake)
gemm_rs_op = rt.define_op("gemm_rs", f"(Tensor a, Tensor b, {_TP_ARGS}) -> Tensor", _gemm_rs_impl, _gemm_rs_fake)
gemm_ar_op = rt.define_op("gemm_ar", f'(Tensor a, Tensor b, {_TP_ARGS}, str algo="auto") -> Tensor', _gemm_ar_impl,
                          _gemm_ar_fake)


def ag_gemm(comm, a_local, b, *, mode: str = "auto", comm_blocks: int = 0, sm_count: int = 0,
            return_gathered: bool = False):
    """all_gather(a_local) @ b. With return_gathered, also the gathered A: a view into the op's workspace,
    valid until the next ag_gemm call of the same shape on this communicator (clone it to keep it)."""
    if not return_gathered:
        return torch.ops.tandem.ag_gemm(a_local, b, register(comm), mode, comm_blocks, sm_count)
    return run_tp_op("ag_gemm", register(comm), a_local, b, mode, comm_blocks, sm_count)


def gemm_rs(comm, a, b, *, mode: str = "auto", comm_blocks: int = 0, sm_count: int = 0):
    """reduce_scatter(a @ b): this rank's M/W rows of the sum over ranks."""
    return torch.ops.tandem.gemm_rs(a, b, register(comm), mode, comm_blocks, sm_count)


def gathered_buffer(comm, m_local: int, k: int, dtype=torch.bfloat16, mode: str = "fused"):
    """This rank's slice of the AG workspace's gathered A (rows [rank m_local, ...)): write A_local there and pass
    it as a_local to run the all-gather in place (no local copy). The fused, unfused and auto modes share one
    workspace; mode="pipelined" has its own (pass the mode the op will run)."""
    key = op_key("ag_gemm", gathered_buffer=True, m_local=m_local, k=k, dtype=dtype,
                 **({"mode": "pipelined"} if mode == "pipelined" else {}))
    if mode == "pipelined":
        ws = _ag_pipelined_workspace(comm, m_local, k, dtype, key)
        g = tp_pipelined.gathered_view(ws, comm.world_size, m_local, k, dtype)
    else:
        _, g = ag_workspace(comm, m_local, k, dtype, key)
    return g[comm.rank * m_local:(comm.rank + 1) * m_local]


def gemm_ar(comm, a, b, *, mode: str = "auto", comm_blocks: int = 0, sm_count: int = 0, algo: str = "auto"):
    """all_reduce(a @ b): the M x N sum over ranks, bit-identical on every rank. algo: "one_shot" (every rank
    reduces every row: small outputs), "two_shot" (reduce-scatter then all-gather of the reduced rows) or
    "auto" (two-shot: one-shot lost at every measured size on the H200, see tp_gemm.h); both give the same
    bits."""
    return torch.ops.tandem.gemm_ar(a, b, register(comm), mode, comm_blocks, sm_count, algo)


def collective_alone(comm, op: str, a, b, *, sm_count: int = 0):
    """The op's collective without its GEMM, on `sm_count` SMs (0: all of the rank's): the all-gather of a
    (ag_gemm), or the reduction (and, for gemm_ar, the gather of the reduced rows) over whatever the op's partial
    buffer holds. For benchmarks: the collective's own time and per-SM rate (tandem bench roles / tp). Collective;
    same shapes on every rank. Returns nothing (the AG's gathered rows stay in the workspace)."""
    if op not in ("ag_gemm", "gemm_rs", "gemm_ar"):
        raise invalid(f"op must be ag_gemm, gemm_rs or gemm_ar, got {op!r}", "collective_alone", comm.rank)
    _validate(comm, a, b, op)
    K = native().kernels
    world = comm.world_size
    if op == "ag_gemm":
        m_local, k = a.shape
        n = b.shape[1]
        ws, _ = ag_workspace(comm, m_local, k, a.dtype, op_key(op, collective_alone=True, m_local=m_local, k=k,
                                                                 dtype=a.dtype))
        c = torch.empty((1, n), dtype=a.dtype, device=a.device)  # not written by the gather
        x = rt.kernel_args("AgGemmArgs", dtype=rt.DTYPES[a.dtype], m_local=m_local, n=n, k=k, a_local=a.data_ptr(),
                           b=b.data_ptr(), ldb=b.stride(0), c=c.data_ptr(), ldc=c.stride(0), workspace=ws.data_ptr(),
                           plan=dict(sm_count=int(sm_count)))
        K.ag_gemm(comm.native, x, rt.mode("GATHER"), rt.stream_handle(a.device))  # raises if it does not run
    else:
        m, k = a.shape
        n = b.shape[1]
        if m % world:
            raise invalid(f"M ({m}) must be a multiple of the world size ({world})", op, comm.rank)
        if world > _MAX_ONE_NODE_RS_WORLD and comm.native.num_nodes == 1:  # as _prepare_rs
            raise invalid(f"GEMM+RS/AR on one node take at most {_MAX_ONE_NODE_RS_WORLD} ranks, got {world}", op,
                          comm.rank)
        ws = _rs_workspace(comm, op, m, n, a.dtype, op_key(op, collective_alone=True, m=m, n=n, dtype=a.dtype))
        out = torch.empty((m if op == "gemm_ar" else m // world, n), dtype=a.dtype, device=a.device)
        x = rt.kernel_args("GemmArArgs" if op == "gemm_ar" else "GemmRsArgs", dtype=rt.DTYPES[a.dtype], m=m, n=n, k=k,
                           a=a.data_ptr(), lda=a.stride(0), b=b.data_ptr(), ldb=b.stride(0), out=out.data_ptr(),
                           workspace=ws.data_ptr(), plan=dict(sm_count=int(sm_count)))
        if op == "gemm_ar":
            x.algo = K.ArAlgo.TWO_SHOT
        (K.gemm_ar if op == "gemm_ar" else K.gemm_rs)(comm.native, x, rt.mode("REDUCE"), rt.stream_handle(a.device))


# ---- FP8: GEMM+RS and GEMM+AR with e4m3 operands and scales (issue 23, part 3: the unfused path) -----------------

def _fp8_gemm(a, b, scale_a, scale_b, out=None):
    """The FP8 unfused path's GEMM, bf16(scale_a * (scale_b * (a @ b))) (operands checked by _fp8_scaling):
    cuBLASLt through torch._scaled_mm by default (as the bf16 unfused path takes cuBLAS: under MPS tandem's FP8
    core on a rank's SMs made the FP8 ops slower than the bf16 ones, bench tp --fp8 on an H100 at 261225c),
    tandem's FP8 core (torch.ops.tandem.scaled_gemm) with TANDEM_UNFUSED_GEMM=tandem and for the shapes
    torch._scaled_mm refuses (N or K not a multiple of 16). Both accumulate in fp32 (no fast accumulation) and
    round once to bf16; the order in which they apply the scales and sum over K may differ, so with scales that are
    not powers of two their bits may differ in the last place (the reduction then sums whichever partials ran). `out`: a contiguous bf16 M x N tensor to write into (the op's partial buffer)."""
    from .gemm import scaled_gemm_with

    m, k = a.shape
    n = b.shape[1]
    tensors = (a, b, scale_a, scale_b) + (() if out is None else (out,))
    if (_UNFUSED_GEMM == "cublas" and k % 16 == 0 and n % 16 == 0 and a.stride(1) == 1 and b.stride(0) == 1
            and (out is None or out.is_contiguous()) and not any(t.data_ptr() % 16 for t in tensors)):
        # (a misaligned address goes to tandem's core, whose checks refuse it clearly)
        if out is None:
            return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16)
        return torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=torch.bfloat16, out=out)
    return scaled_gemm_with(a, b, scale_a, scale_b, out=out)


def _fp8_scaling(comm, op, a, b, scale_a, scale_b, a_name="a"):
    """The FP8 TP ops' input checks: every operand on the communicator's device, then scaled_gemm's (shapes,
    dtypes, layouts); returns the scaling ("tensor" or "row")."""
    from .gemm import scaling_of

    for name, t in ((a_name, a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b)):
        rt.check_on_device(comm, t, name, op)
    return scaling_of(a, b, scale_a, scale_b, op)


def _scaled_reduce(comm, op, a, b, scale_a, scale_b, algo="two_shot"):
    """Each rank's partial bf16(scale_a * (scale_b * (a @ b))) (torch.ops.tandem.scaled_gemm, written straight
    into the op's partial buffer), then the reduction kernel alone: the partials summed in fp32 in the owners' fixed
    order, bf16 out (RS: this rank's M/W rows; AR: all rows, the same bits on every rank). The same three steps as
    the bf16 ops' unfused path with cuBLAS (wait until every rank read this rank's partial of the previous launch,
    the GEMM, the reduction), so the bits equal a bf16 gemm_rs/gemm_ar over the same bf16 partials. The GEMM:
    _fp8_gemm's choice."""
    scaling = _fp8_scaling(comm, op, a, b, scale_a, scale_b)
    world, rank = comm.world_size, comm.rank
    m, k = a.shape
    n = b.shape[1]
    if m % world:
        raise invalid(f"M ({m}) must be a multiple of the world size ({world})", op, rank)
    if world == 1:
        return _fp8_gemm(a, b, scale_a, scale_b)
    check_nodes(comm, op)
    if world > _MAX_ONE_NODE_RS_WORLD:  # as _prepare_rs
        raise invalid(f"GEMM+RS/AR on one node take at most {_MAX_ONE_NODE_RS_WORLD} ranks, got {world}", op, rank)
    if comm.native.num_nodes > 1:
        raise invalid("the FP8 ops run on one node so far (the unfused path's partial buffer is read by load/store)",
                      op, rank)
    all_reduce = op == "scaled_gemm_ar"
    dtype = torch.bfloat16
    agree = op_key(op, m=m, n=n, k=k, scaling=scaling, **({"algo": algo} if all_reduce else {}))
    ws = _rs_workspace(comm, "gemm_ar" if all_reduce else "gemm_rs", m, n, dtype, agree)
    K = native().kernels
    # The reduction's Args check A and B too (addresses, leading dimensions), which the WAIT and REDUCE launches
    # never read: the FP8 operands' addresses stand in, as an M x 8 bf16 A and an 8 x N B.
    x = rt.kernel_args("GemmArArgs" if all_reduce else "GemmRsArgs", dtype=rt.DTYPES[dtype], m=m, n=n, k=8, lda=8,
                       ldb=n, a=a.data_ptr(), b=b.data_ptr(), workspace=ws.data_ptr())
    if all_reduce:
        x.algo = getattr(K.ArAlgo, _AR_ALGOS[algo])
    off = K.partial_offset(comm.native, x)
    partial = ws[off:off + m * n * 2].view(dtype).view(m, n)
    out = torch.empty((m if all_reduce else m // world, n), dtype=dtype, device=a.device)
    x.out = out.data_ptr()
    run = K.gemm_ar if all_reduce else K.gemm_rs
    stream = rt.stream_handle(a.device)
    run(comm.native, x, rt.mode("WAIT"), stream)  # each raises TandemError if it does not run
    _fp8_gemm(a, b, scale_a, scale_b, out=partial)
    run(comm.native, x, rt.mode("REDUCE"), stream)
    return out


def scaled_gemm_rs(comm, a, b, scale_a, scale_b):
    """reduce_scatter(scale_a * (scale_b * (a @ b))) with FP8 e4m3 operands (a row-major M x K_local, b
    column-major K_local x N) and float32 scales as torch._scaled_mm takes them (one each, or (M, 1) and (1, N)):
    every rank's partial rounded to bf16, summed in fp32 in the owners' fixed order, this rank's M/W rows in bf16.
    The unfused path (the FP8 GEMM, then the reduction kernel); not a fused kernel yet."""
    return _scaled_reduce(comm, "scaled_gemm_rs", a, b, scale_a, scale_b)


def scaled_gemm_ar(comm, a, b, scale_a, scale_b, *, algo: str = "two_shot"):
    """all_reduce of the FP8 product (as scaled_gemm_rs): the M x N sum, bit-identical on every rank. algo as
    gemm_ar's ("one_shot", "two_shot"; "auto" takes two-shot)."""
    if algo not in _AR_ALGOS:
        raise invalid(f"algo must be one of {sorted(_AR_ALGOS)}, got {algo!r}", "scaled_gemm_ar", comm.rank)
    return _scaled_reduce(comm, "scaled_gemm_ar", a, b, scale_a, scale_b, algo)


# ---- FP8: AG+GEMM with e4m3 operands and scales (issue 23, part 3: the unfused path) -------------------------------

def _gather_words(comm, t16, tag: str, agree: tuple):
    """All-gather the rows of `t16` (m_local x kk 16-bit words, contiguous, kk a multiple of 8) with the AG kernel's
    gather launch alone, into the AG workspace of this shape and `tag`; returns the gathered view (world m_local x
    kk), valid until this rank's next gather of that workspace (its next call). The words are moved, not read:
    any 2-byte-per-word payload (e4m3 pairs, float32 halves) arrives bit for bit."""
    m_local, kk = t16.shape
    ws, gathered = ag_workspace(comm, m_local, kk, torch.bfloat16, agree, tag=tag)
    K = native().kernels
    x = rt.kernel_args("AgGemmArgs", dtype=rt.DTYPES[torch.bfloat16], m_local=m_local, n=8, k=kk, ldb=8, ldc=8,
                       workspace=ws.data_ptr(), plan=dict(sm_count=0, comm_blocks=0))
    # the gather launch reads a_local and writes the gathered buffer only; B and C are checked (non-null, aligned)
    # but never read: a_local's address stands in for both
    x.a_local = x.b = x.c = t16.data_ptr()
    K.ag_gemm(comm.native, x, rt.mode("GATHER"), rt.stream_handle(t16.device))  # raises if it does not run
    return gathered


def scaled_ag_gemm(comm, a_local, b, scale_a, scale_b):
    """all_gather(a_local) @ b with FP8 e4m3 operands and float32 scales as torch._scaled_mm takes them for this
    rank's shard: scale_a one float32 (the shard's tensor-wise scale) or (M_local, 1); scale_b one float32 or
    (1, N); a_local row-major and contiguous (M_local x K), b column-major (K x N).

    The gathered rows keep their own shard's scales, so the product is row-wise: C = bf16(s_row * (s_col * (A @
    B))) with s_row the gathered (W M_local, 1) row scales (a tensor-wise scale_a repeated over its shard's rows)
    and s_col scale_b (repeated over the N columns if one float). Returns (C (W M_local x N, bf16), the gathered A
    (e4m3, valid until this rank's next call), s_row (W M_local x 1, float32)).

    The unfused path: the all-gather kernel moves the e4m3 rows (as 16-bit words) and the row scales, then the FP8
    GEMM (_fp8_gemm's: cuBLASLt or tandem's core) runs on the gathered rows. One node so far."""
    op = "scaled_ag_gemm"
    scaling = _fp8_scaling(comm, op, a_local, b, scale_a, scale_b, a_name="a_local")
    world, rank = comm.world_size, comm.rank
    m_local, k = a_local.shape
    n = b.shape[1]
    if not a_local.is_contiguous():
        raise invalid(f"a_local must be contiguous (strides {a_local.stride()})", op, rank)
    dev = a_local.device
    rows_scale = (scale_a.reshape(1).expand(m_local).reshape(m_local, 1) if scaling == "tensor" else scale_a)
    col_scale = scale_b.reshape(1, 1).expand(1, n).contiguous() if scaling == "tensor" else scale_b
    if world == 1:
        s_row = rows_scale.contiguous()
        return _fp8_gemm(a_local, b, s_row, col_scale), a_local, s_row
    check_nodes(comm, op)
    if comm.native.num_nodes > 1:
        raise invalid("the FP8 ops run on one node so far (the gathered rows go to tandem's FP8 GEMM, whose first "
                      "launch must not sit behind the proxy's copies)", op, rank)
    agree = op_key(op, m_local=m_local, n=n, k=k, scaling=scaling)
    # the e4m3 rows as 16-bit words (K is a multiple of 16), and the row scales padded to 16-byte rows (one float32
    # and three zeros: the gather moves whole 16-byte vectors)
    gathered_a = _gather_words(comm, a_local.view(torch.bfloat16), "e4m3", agree).view(a_local.dtype)
    padded = torch.zeros((m_local, 4), dtype=torch.float32, device=dev)
    padded[:, :1] = rows_scale
    gathered_s = _gather_words(comm, padded.view(torch.bfloat16), "scales", agree)
    s_row = gathered_s.view(torch.float32)[:, :1].contiguous()  # a copy: the gathered view is the workspace's
    return _fp8_gemm(gathered_a, b, s_row, col_scale), gathered_a, s_row

