"""Rank-side bodies of the AG+GEMM / GEMM+RS tests (run in every rank by tests/conftest.py:run_ranks)."""

from __future__ import annotations

import hashlib
import os
import time

import torch

import tandem.ops  # noqa: F401
from tandem.errors import TandemError
from tandem.ops import tp
from tandem.transport import Communicator

from .worker_common import reject_statuses


def _ints(rows, cols, salt, dtype, row0=0):
    # Small multiples of 1/8 derived from (global row, column, salt): products and fp32 partial sums are exact,
    # so the only rounding is the final one, shared with the reference; a misplaced row/column/rank shows.
    i = torch.arange(row0, row0 + rows, device="cuda").view(-1, 1)
    j = torch.arange(cols, device="cuda").view(1, -1)
    return ((((i * 7 + j * 3 + salt * 5) % 17) - 8).to(dtype) / 8).contiguous()


def _b(k, n, salt, dtype):
    i = torch.arange(k, device="cuda").view(-1, 1)
    j = torch.arange(n, device="cuda").view(1, -1)
    return ((((i * 5 + j * 11 + salt * 3) % 13) - 6).to(dtype) / 8).contiguous()


def _ag_case(comm, m_local, n, k, dtype, mode, in_place):
    rank, world = comm.rank, comm.world_size
    a_full = _ints(world * m_local, k, 0, dtype)
    b = _b(k, n, 1, dtype)
    ref = (a_full.float() @ b.float()).to(dtype)
    if in_place:
        a_local = tp.gathered_buffer(comm, m_local, k, dtype, mode="pipelined" if mode == "pipelined" else "fused")
        a_local.copy_(a_full[rank * m_local:(rank + 1) * m_local])
    else:
        a_local = a_full[rank * m_local:(rank + 1) * m_local].clone()
    c, gathered = tp.ag_gemm(comm, a_local, b, mode=mode, return_gathered=True)
    torch.cuda.synchronize()
    comm.check()
    rows = lambda t, q: t[q * m_local:(q + 1) * m_local]  # noqa: E731
    return dict(shape=[m_local, n, k], dtype=str(dtype), mode=mode, in_place=in_place,
                wrong=int((c != ref).sum()), gathered_wrong=int((gathered != a_full).sum()),
                # per source rank's rows: which slice went wrong (a late copy, a misplaced one, our own rows)
                wrong_by_source=[int((rows(c, q) != rows(ref, q)).sum()) for q in range(world)],
                gathered_wrong_by_source=[int((rows(gathered, q) != rows(a_full, q)).sum()) for q in range(world)])


def _rs_partials(world, m, n, k, dtype):
    return [(_ints(m, k, q + 2, dtype), _b(k, n, q + 7, dtype)) for q in range(world)]


def _rs_reference(rank, world, parts, mr, dtype):
    # The kernel's order: acc = p[r-1]; acc += p[r-2]; ...; out = acc + p[r] (fp32, partials rounded to dtype).
    acc = None
    for s in range(world):
        q = (rank - 1 - s) % world
        a, b = parts[q]
        p = (a.float() @ b.float()).to(dtype).float()[rank * mr:(rank + 1) * mr]
        acc = p if acc is None else acc + p
    return acc.to(dtype)


def _rs_case(comm, mr, n, k, dtype, mode):
    rank, world = comm.rank, comm.world_size
    m = mr * world
    parts = _rs_partials(world, m, n, k, dtype)
    a, b = parts[rank]
    out = tp.gemm_rs(comm, a, b, mode=mode)
    torch.cuda.synchronize()
    comm.check()
    ref = _rs_reference(rank, world, parts, mr, dtype)
    exact_sum = sum((pa.float() @ pb.float()) for pa, pb in parts)[rank * mr:(rank + 1) * mr]
    rel = float((out.float() - exact_sum).norm() / exact_sum.norm().clamp_min(1e-6))
    return dict(shape=[m, n, k], dtype=str(dtype), mode=mode, wrong=int((out != ref).sum()), rel=rel)


def _ar_reference(world, parts, mr, dtype):
    # Rows of chunk c are owner c's reduction (its fixed order), gathered: the same bytes on every rank.
    return torch.cat([_rs_reference(c, world, parts, mr, dtype) for c in range(world)])


def _digest(t):
    return hashlib.sha256(t.contiguous().view(torch.uint8).cpu().numpy().tobytes()).hexdigest()


def _ar_case(comm, mr, n, k, dtype, mode, algo):
    world = comm.world_size
    m = mr * world
    parts = _rs_partials(world, m, n, k, dtype)
    a, b = parts[comm.rank]
    out = tp.gemm_ar(comm, a, b, mode=mode, algo=algo)
    torch.cuda.synchronize()
    comm.check()
    ref = _ar_reference(world, parts, mr, dtype)
    exact_sum = sum((pa.float() @ pb.float()) for pa, pb in parts)
    rel = float((out.float() - exact_sum).norm() / exact_sum.norm().clamp_min(1e-6))
    return dict(shape=[m, n, k], dtype=str(dtype), mode=mode, algo=algo, wrong=int((out != ref).sum()), rel=rel,
                rows=out.shape[0], digest=_digest(out))


def rs_pieces(rs_shapes, dtypes, pieces, repeats, swizzle=None, env=None, algos=("two_shot",)):
    """The fused GEMM+RS and two-shot GEMM+AR computed in pieces (TANDEM_RS_PIECES, read by the kernels' host side
    at every launch), each case `repeats` times in a row (the piece flags of consecutive epochs), against the same
    bit-exact references as the whole-chunk kernel. swizzle: the GEMM scheduler's (TANDEM_TP_SWIZZLE; pieces of
    whole swizzle groups). env: more knobs set for the run (e.g. TANDEM_RS_LOADS); algos: the AR algorithms."""
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    from tandem._native import native

    K = native().kernels
    os.environ["TANDEM_RS_PIECES"] = str(pieces)
    if swizzle is not None:
        os.environ["TANDEM_TP_SWIZZLE"] = str(swizzle)
    for name, value in (env or {}).items():
        os.environ[name] = str(value)
    comm = Communicator(heap_bytes=1 << 30, timeout_s=30)
    out = dict(rs=[], ar=[])
    try:
        for name in dtypes:
            dtype = getattr(torch, name)
            for (mr, n, k) in rs_shapes:
                for _ in range(repeats):
                    out["rs"].append(_rs_case(comm, mr, n, k, dtype, "fused"))
                    out["rs"][-1]["pieces"] = K.tp_last_fused_rs_pieces()  # the pieces kernel ran, not a fallback
                    for algo in algos:
                        out["ar"].append(_ar_case(comm, mr, n, k, dtype, "fused", algo))
                        out["ar"][-1]["pieces"] = K.tp_last_fused_rs_pieces()
                        out["ar"][-1]["algo"] = algo
    finally:
        os.environ.pop("TANDEM_RS_PIECES", None)
        os.environ.pop("TANDEM_TP_SWIZZLE", None)
        for name in env or {}:
            os.environ.pop(name, None)
    tp.release_workspaces(comm)
    comm.destroy()
    return out


def correctness(ag_shapes, rs_shapes, dtypes, modes):
    # bit-exact references: the unfused path's GEMM is cuBLAS, whose reduced-precision split-K would round
    # partial sums to the dtype
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    comm = Communicator(heap_bytes=1 << 30, timeout_s=30)
    out = dict(ag=[], rs=[], ar=[], sm_count=comm.sm_count)
    for name in dtypes:
        dtype = getattr(torch, name)
        for (m_local, n, k) in ag_shapes:
            for mode in modes:
                for in_place in (False, True):
                    if mode == "fused" and m_local % 8:
                        continue
                    out["ag"].append(_ag_case(comm, m_local, n, k, dtype, mode, in_place))
        for (mr, n, k) in rs_shapes:
            for mode in modes:
                out["rs"].append(_rs_case(comm, mr, n, k, dtype, mode))
                for algo in ("one_shot", "two_shot"):
                    out["ar"].append(_ar_case(comm, mr, n, k, dtype, mode, algo))
    # M_local not a multiple of 8 is refused by the fused kernel with a clear error (auto takes the unfused path)
    try:
        tp.ag_gemm(comm, _ints(100, 64, 0, torch.bfloat16), _b(64, 64, 1, torch.bfloat16), mode="fused")
        out["fused_ragged"] = None if comm.world_size > 1 else "world1"
    except TandemError as e:
        out["fused_ragged"] = e.status
    tp.release_workspaces(comm)
    comm.destroy()
    return out


def repeat_and_graph(launches, m_local, n, k):
    comm = Communicator(heap_bytes=1 << 30, timeout_s=30)
    rank, world = comm.rank, comm.world_size
    dtype = torch.bfloat16
    a_full = _ints(world * m_local, k, 0, dtype)
    b = _b(k, n, 1, dtype)
    a_local = a_full[rank * m_local:(rank + 1) * m_local].clone()
    parts = _rs_partials(world, m_local * world, n, k, dtype)
    ra, rb = parts[rank]
    first_ag = tp.ag_gemm(comm, a_local, b, mode="fused")
    first_rs = tp.gemm_rs(comm, ra, rb, mode="fused")
    first_ar = tp.gemm_ar(comm, ra, rb, mode="fused", algo="two_shot")
    first_ar1 = tp.gemm_ar(comm, ra, rb, mode="fused", algo="one_shot")
    same_ag = same_rs = same_ar = same_ar1 = 0
    for _ in range(launches):
        same_ag += int(torch.equal(tp.ag_gemm(comm, a_local, b, mode="fused"), first_ag))
        same_rs += int(torch.equal(tp.gemm_rs(comm, ra, rb, mode="fused"), first_rs))
        same_ar += int(torch.equal(tp.gemm_ar(comm, ra, rb, mode="fused", algo="two_shot"), first_ar))
        same_ar1 += int(torch.equal(tp.gemm_ar(comm, ra, rb, mode="fused", algo="one_shot"), first_ar1))
    ag_ok = bool(torch.equal(first_ag, (a_full.float() @ b.float()).to(dtype)))
    rs_ok = bool(torch.equal(first_rs, _rs_reference(rank, world, parts, m_local, dtype)))
    ar_ok = bool(torch.equal(first_ar, _ar_reference(world, parts, m_local, dtype))) and bool(
        torch.equal(first_ar1, first_ar))
    # CUDA graph: capture both ops once (workspaces exist), replay with new inputs
    sa, sra = a_local.clone(), ra.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        tp.ag_gemm(comm, sa, b, mode="fused")
        tp.gemm_rs(comm, sra, rb, mode="fused")
        tp.gemm_ar(comm, sra, rb, mode="fused", algo="two_shot")
        tp.gemm_ar(comm, sra, rb, mode="fused", algo="one_shot")
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gc = tp.ag_gemm(comm, sa, b, mode="fused")
        go = tp.gemm_rs(comm, sra, rb, mode="fused")
        gar = tp.gemm_ar(comm, sra, rb, mode="fused", algo="two_shot")
        gar1 = tp.gemm_ar(comm, sra, rb, mode="fused", algo="one_shot")
    graph_ok = []
    for rep in range(3):
        scale = float(rep + 2)  # 3 is not a power of two: the reference must be recomputed, not scaled
        sa.copy_(a_local * scale)
        sra.copy_(ra * scale)
        comm.barrier()
        g.replay()
        torch.cuda.synchronize()
        ref_ag = ((a_full * scale).float() @ b.float()).to(dtype)
        scaled = [(pa * scale, pb) for pa, pb in parts]
        ref_rs = _rs_reference(rank, world, scaled, m_local, dtype)
        ref_ar = _ar_reference(world, scaled, m_local, dtype)
        graph_ok.append(bool(torch.equal(gc, ref_ag)) and bool(torch.equal(go, ref_rs))
                        and bool(torch.equal(gar, ref_ar)) and bool(torch.equal(gar1, ref_ar)))
    comm.check()
    del g
    tp.release_workspaces(comm)
    comm.destroy()
    return dict(launches=launches, same_ag=same_ag, same_rs=same_rs, same_ar=same_ar, same_ar1=same_ar1, ag_ok=ag_ok, rs_ok=rs_ok,
                ar_ok=ar_ok, graph_ok=graph_ok, ar_digest=_digest(first_ar))


def _set_env(**values):
    # TANDEM_* variables that the kernels' host side reads at every launch; None removes one
    for name, v in values.items():
        if v is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(v)


def _random(shape, seed, dtype):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def tile_claims(ag_shapes, rs_shapes, dtypes, repeats, late=None):
    """The fused ops with tile claims (TANDEM_TP_CLAIM=1): against the bit-exact references (structured data), and
    bit for bit against the static persistent stride on random data (a tile's arithmetic does not depend on
    which cluster computes it), GEMM+RS/AR whole-chunk and in pieces, each case `repeats` launches in a row (the
    claim counters' reset and the ring tags of consecutive epochs). `late` ("c:us", set by the test in one rank's
    environment as TANDEM_TP_LATE) starts that rank's GEMM clusters from row c late: claims give their tiles to
    the resident clusters, and the chunks complete by tile counts, without the blocks that computed none. The
    pieces cases run once more with the joined reduction (TANDEM_RS_JOIN=1), the same bits."""
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    from tandem._native import native

    K = native().kernels
    comm = Communicator(heap_bytes=1 << 30, timeout_s=30)
    rank, world = comm.rank, comm.world_size
    out = dict(ag=[], rs=[], ar=[], static_vs_claims=[], late=os.environ.get("TANDEM_TP_LATE"))
    try:
        for name in dtypes:
            dtype = getattr(torch, name)
            # whole chunks; pieces; pieces with the joined reduction (GEMM blocks join it: TANDEM_RS_JOIN)
            for pieces, join in ((None, None), (3, None), (3, 1)):
                _set_env(TANDEM_TP_CLAIM=1, TANDEM_RS_PIECES=pieces, TANDEM_RS_JOIN=join)
                for _ in range(repeats):
                    if pieces is None:
                        for (m_local, n, k) in ag_shapes:
                            out["ag"].append(_ag_case(comm, m_local, n, k, dtype, "fused", False))
                            out["ag"][-1]["claims"] = bool(K.tp_last_fused_claims())
                    for (mr, n, k) in rs_shapes:
                        for case in (lambda: _rs_case(comm, mr, n, k, dtype, "fused"),
                                     lambda: _ar_case(comm, mr, n, k, dtype, "fused", "two_shot")):
                            c = case()
                            c.update(claims=bool(K.tp_last_fused_claims()), pieces=K.tp_last_fused_rs_pieces(),
                                     join=bool(join), joined=bool(K.tp_last_fused_rs_joined()))
                            out["ar" if "algo" in c else "rs"].append(c)
                # random data: claims against the static stride, bit for bit
                for (m_local, n, k) in ag_shapes[:2]:
                    a = _random((m_local, k), 10 + rank, dtype)
                    b = _random((k, n), 20, dtype)
                    ra = _random((m_local * world, k), 30 + rank, dtype)
                    outs = {}  # TANDEM_TP_CLAIM=0: the static stride
                    for claim in (0, 1):
                        _set_env(TANDEM_TP_CLAIM=claim)
                        outs[claim] = (tp.ag_gemm(comm, a, b, mode="fused").clone(),
                                       tp.gemm_rs(comm, ra, b, mode="fused").clone(),
                                       tp.gemm_ar(comm, ra, b, mode="fused", algo="two_shot").clone(),
                                       bool(K.tp_last_fused_claims()))
                    torch.cuda.synchronize()
                    comm.check()
                    out["static_vs_claims"].append(dict(
                        shape=[m_local, n, k], dtype=name, pieces=pieces, join=join,
                        claims_ran=[outs[0][3], outs[1][3]],
                        differing=[int((x != y).sum()) for x, y in zip(outs[0][:3], outs[1][:3])],
                        finite=bool(all(torch.isfinite(x.float()).all() for x in outs[1][:3]))))
    finally:
        _set_env(TANDEM_TP_CLAIM=None, TANDEM_RS_PIECES=None, TANDEM_RS_JOIN=None)
    tp.release_workspaces(comm)
    comm.destroy()
    return out


def _exact_rs_and_ar(comm, parts, mr, reference, flags):
    """One launch each of the fused GEMM+RS and two-shot GEMM+AR on structured data (`parts`: every rank's A and
    B), bit for bit against `reference(owner, world, parts, mr, dtype)`, the kernel's summation order, for this
    rank's rows and (AR) every owner's; `flags()`: the host's record of what the launch ran, read after each (the
    AR's keys get an "ar_" prefix)."""
    rank, world = comm.rank, comm.world_size
    a, b = parts[rank]
    dtype = a.dtype
    ref = reference(rank, world, parts, mr, dtype)
    exact_sum = sum((pa.float() @ pb.float()) for pa, pb in parts)[rank * mr:(rank + 1) * mr]
    got = tp.gemm_rs(comm, a, b, mode="fused")
    torch.cuda.synchronize()
    comm.check()
    rs_flags = flags()
    got_ar = tp.gemm_ar(comm, a, b, mode="fused", algo="two_shot")
    torch.cuda.synchronize()
    comm.check()
    ar_flags = {f"ar_{key}": v for key, v in flags().items()}
    ref_ar = torch.cat([reference(q, world, parts, mr, dtype) for q in range(world)])
    return dict(**rs_flags, **ar_flags, wrong=int((got != ref).sum()), ar_wrong=int((got_ar != ref_ar).sum()),
                ar_digest=_digest(got_ar),
                rel=float((got.float() - exact_sum).norm() / exact_sum.norm().clamp_min(1e-6)))


def rs_ring(rs_shapes, dtypes, repeats):
    """The fused GEMM+RS as a ring (TANDEM_RS_RING=1: no reduce role; each step's GEMM epilogue adds the right
    neighbour's running sum): structured data bit-exact against the ring's summation order (the pipelined mode's,
    _ring_reference), `repeats` launches in a row (the step flags of consecutive epochs), the host's record that
    the ring ran; random data against the fp32 sum and against the default kernel (within bf16 rounding: the ring
    rounds after every add); two-shot GEMM+AR through the ring (every chunk its owner's ring sum, the same bytes on
    every rank); the default path back once the knob is gone, and with the knob but without tile claims
    (TANDEM_TP_CLAIM=0: the ring runs with claims only)."""
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    from tandem._native import native

    K = native().kernels
    comm = Communicator(heap_bytes=1 << 30, timeout_s=30)
    rank, world = comm.rank, comm.world_size
    out = dict(exact=[], random=[], ar_ring=[], off_ring=None, no_claims=None)
    try:
        for name in dtypes:
            dtype = getattr(torch, name)
            for (mr, n, k) in rs_shapes:
                m = mr * world
                for rep in range(repeats):
                    _set_env(TANDEM_RS_RING=1)
                    # new values every launch (A scaled by rep + 1: still exact), so that a slot read before its
                    # step was stored, or left from the previous launch, shows as wrong elements
                    parts = [(pa * (rep + 1), pb) for pa, pb in _rs_partials(world, m, n, k, dtype)]
                    # two-shot AR: every chunk is its owner's ring sum, on every rank
                    out["exact"].append(dict(shape=[m, n, k], dtype=name, rep=rep, **_exact_rs_and_ar(
                        comm, parts, mr, _ring_reference,
                        lambda: dict(ring=bool(K.tp_last_fused_rs_ring()), claims=bool(K.tp_last_fused_claims())))))
                # random data: the ring against the fp32 sum and against the default kernel (reduce role)
                _set_env(TANDEM_TP_CLAIM=None)
                # default, ring, ring (new values), default again on the RS workspace, and default, ring,
                # default two-shot AR on the AR workspace (the ops keep a workspace each): the buffer hand-over
                # between the kernels both ways
                ra = _random((m, k), 40 + rank, dtype)
                rb = _random((k, n), 50, dtype)
                _set_env(TANDEM_RS_RING=None)
                default_first = tp.gemm_rs(comm, ra, rb, mode="fused").clone()
                ar_default_first = tp.gemm_ar(comm, ra, rb, mode="fused", algo="two_shot")
                ar_default_ring = [bool(K.tp_last_fused_rs_ring())]
                _set_env(TANDEM_RS_RING=1)
                ring = tp.gemm_rs(comm, ra, rb, mode="fused").clone()
                ran = bool(K.tp_last_fused_rs_ring())
                ar = tp.gemm_ar(comm, ra, rb, mode="fused", algo="two_shot")
                out["ar_ring"].append(bool(K.tp_last_fused_rs_ring()))
                ring_again = tp.gemm_rs(comm, ra * 2, rb, mode="fused").clone()  # the next ring launch, new values
                _set_env(TANDEM_RS_RING=None)
                default = tp.gemm_rs(comm, ra, rb, mode="fused").clone()
                off = bool(K.tp_last_fused_rs_ring())
                ar_default = tp.gemm_ar(comm, ra, rb, mode="fused", algo="two_shot")
                ar_default_ring.append(bool(K.tp_last_fused_rs_ring()))
                torch.cuda.synchronize()
                comm.check()
                # the fp32 sum of every rank's partial (each rank's A from its own seed, as the ranks made them)
                full_all = sum(_random((m, k), 40 + q, dtype).float() @ rb.float() for q in range(world))
                full = full_all[rank * mr:(rank + 1) * mr]
                norm = full.norm().clamp_min(1e-6)
                out["random"].append(dict(
                    shape=[m, n, k], dtype=name, ring=ran, default_ring=off,
                    rel_ring=float((ring.float() - full).norm() / norm),
                    rel_default=float((default.float() - full).norm() / norm),
                    rel_ring_vs_default=float((ring.float() - default.float()).norm() / norm),
                    # x 2 is exact in every rounding step: the same bits doubled
                    ring_again_wrong=int((ring_again != ring * 2).sum()),
                    default_again_differs=int((default != default_first).sum()),
                    ar_default_ring=ar_default_ring, ar_default_again_differs=int((ar_default != ar_default_first).sum()),
                    rel_ar=float((ar.float() - full_all).norm() / full_all.norm().clamp_min(1e-6)),
                    ar_rows_ok=bool(torch.isfinite(ar.float()).all()), finite=bool(torch.isfinite(ring.float()).all())))
        _set_env(TANDEM_RS_RING=None)
        mr, n, k = rs_shapes[0]
        parts = _rs_partials(world, mr * world, n, k, torch.bfloat16)
        got = tp.gemm_rs(comm, parts[rank][0], parts[rank][1], mode="fused")
        torch.cuda.synchronize()
        out["off_ring"] = dict(ring=bool(K.tp_last_fused_rs_ring()),
                               wrong=int((got != _rs_reference(rank, world, parts, mr, torch.bfloat16)).sum()))
        # the knob without tile claims: the default kernel (static stride), its own summation order
        _set_env(TANDEM_RS_RING=1, TANDEM_TP_CLAIM=0)
        got = tp.gemm_rs(comm, parts[rank][0], parts[rank][1], mode="fused")
        torch.cuda.synchronize()
        comm.check()
        out["no_claims"] = dict(ring=bool(K.tp_last_fused_rs_ring()), claims=bool(K.tp_last_fused_claims()),
                                wrong=int((got != _rs_reference(rank, world, parts, mr, torch.bfloat16)).sum()))
    finally:
        _set_env(TANDEM_RS_RING=None, TANDEM_TP_CLAIM=None)
    tp.release_workspaces(comm)
    comm.destroy()
    return out


def _ticket_reference(owner, world, parts, mr, dtype):
    """The ticket reduction's order for chunk `owner`: every rank's partial rounded to dtype, added in rank order
    0, 1, ..., W-1 in fp32, rounded once (whichever rank reduces the tile)."""
    rows = slice(owner * mr, (owner + 1) * mr)
    acc = None
    for q in range(world):
        a, b = parts[q]
        p = (a.float()[rows] @ b.float()).to(dtype).float()
        acc = p if acc is None else acc + p
    return acc.to(dtype)


def rs_ticket(rs_shapes, dtypes, repeats):
    """The fused GEMM+RS / two-shot GEMM+AR by tickets (TANDEM_RS_TICKET=1: no reduce role, no waits in the GEMM;
    each tile's last rank to finish it adds every rank's partial): structured data bit-exact against the ticket
    order (_ticket_reference), `repeats` launches in a row with new values each (a ticket, count or staged flag
    left from the previous launch, or a slot read before it was stored, shows as wrong elements or a timeout); the
    host's record
    that the ticket kernel ran; AR: every chunk the owner's sum, the same bytes on every rank; random data against
    the fp32 sum and against the default kernel, and the ticket kernel again on doubled inputs (exact: x 2 commutes
    with every rounding); the default kernel once the knob is gone (its own workspace)."""
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    from tandem._native import native

    K = native().kernels
    comm = Communicator(heap_bytes=1 << 30, timeout_s=30)
    rank, world = comm.rank, comm.world_size
    out = dict(exact=[], random=[], off_ticket=None)
    late0 = os.environ.get("TANDEM_TP_LATE")  # the test's late clusters (rank_env), restored after each late-rank pass
    try:
        for name in dtypes:
            dtype = getattr(torch, name)
            for (mr, n, k) in rs_shapes:
                m = mr * world
                for rep in range(repeats):
                    _set_env(TANDEM_RS_TICKET=1)
                    parts = [(pa * (rep + 1), pb) for pa, pb in _rs_partials(world, m, n, k, dtype)]
                    # (rounds: the ticket kernel's, TANDEM_RS_TICKET_ROUNDS, as the host records them)
                    out["exact"].append(dict(shape=[m, n, k], dtype=name, rep=rep, **_exact_rs_and_ar(
                        comm, parts, mr, _ticket_reference,
                        lambda: dict(ticket=bool(K.tp_last_fused_rs_ticket()),
                                     rounds=int(K.tp_last_fused_rs_pieces())))))
                ra = _random((m, k), 40 + rank, dtype)
                rb = _random((k, n), 50, dtype)
                _set_env(TANDEM_RS_TICKET=None)
                default = tp.gemm_rs(comm, ra, rb, mode="fused").clone()
                _set_env(TANDEM_RS_TICKET=1)
                ticket = tp.gemm_rs(comm, ra, rb, mode="fused").clone()
                ran = bool(K.tp_last_fused_rs_ticket())
                ar = tp.gemm_ar(comm, ra, rb, mode="fused", algo="two_shot")
                ticket_again = tp.gemm_rs(comm, ra * 2, rb, mode="fused").clone()
                torch.cuda.synchronize()
                comm.check()
                full_all = sum(_random((m, k), 40 + q, dtype).float() @ rb.float() for q in range(world))
                full = full_all[rank * mr:(rank + 1) * mr]
                norm = full.norm().clamp_min(1e-6)
                out["random"].append(dict(
                    shape=[m, n, k], dtype=name, ticket=ran,
                    rel_ticket=float((ticket.float() - full).norm() / norm),
                    rel_default=float((default.float() - full).norm() / norm),
                    rel_ticket_vs_default=float((ticket.float() - default.float()).norm() / norm),
                    ticket_again_wrong=int((ticket_again != ticket * 2).sum()),
                    rel_ar=float((ar.float() - full_all).norm() / full_all.norm().clamp_min(1e-6)),
                    finite=bool(torch.isfinite(ticket.float()).all()) and bool(torch.isfinite(ar.float()).all()),
                    # AR's chunk of this rank: the RS sum's bits (one order for both)
                    ar_rows_differ=int((ar[rank * mr:(rank + 1) * mr] != ticket).sum())))
                # Who reduces a tile must not change its bits: the same random inputs with each rank in turn
                # starting its clusters from grid row 0 late (TANDEM_TP_LATE, read at every launch: the other
                # ranks then draw the last tickets of the tiles it computes last), bit for bit against none late.
                # With random data a sum in arrival order would differ in many elements. The inputs alternate
                # between x 4 and x 2 (exact: powers of two commute with every rounding), so that a staged tile
                # left flagged by a launch whose reducers differed (its owner would copy the old sum over the new)
                # shows as wrong elements.
                differ = []
                for late_rank in range(world):
                    _set_env(TANDEM_TP_LATE="0:2000" if rank == late_rank else None)
                    scale = 4 if late_rank % 2 == 0 else 2  # (the launch before: ra * 2)
                    again = tp.gemm_rs(comm, ra * scale, rb, mode="fused")
                    torch.cuda.synchronize()
                    comm.check()
                    differ.append(int((again != ticket * scale).sum()))
                _set_env(TANDEM_TP_LATE=late0)
                out["random"][-1]["late_rank_differs"] = differ
                tp.release_workspaces(comm)  # (three workspaces a shape: the heap holds one shape's)
        _set_env(TANDEM_RS_TICKET=None)
        mr, n, k = rs_shapes[0]
        parts = _rs_partials(world, mr * world, n, k, torch.bfloat16)
        got = tp.gemm_rs(comm, parts[rank][0], parts[rank][1], mode="fused")
        torch.cuda.synchronize()
        comm.check()
        out["off_ticket"] = dict(ticket=bool(K.tp_last_fused_rs_ticket()),
                                 wrong=int((got != _rs_reference(rank, world, parts, mr, torch.bfloat16)).sum()))
    finally:
        _set_env(TANDEM_RS_TICKET=None)
    tp.release_workspaces(comm)
    comm.destroy()
    return out


def gemm_tile256(ag_shapes, rs_shapes, dtypes, repeats):
    """The fused GEMM roles in 256x128 tiles (TANDEM_TP_GEMM_TILE=256x128, tile claims). AG+GEMM: exact on
    structured data, in place and out of place, `repeats` launches in a row; GEMM+RS and GEMM+AR (two-shot): the
    exact fixed-order references, whole chunks and in pieces (TANDEM_RS_PIECES=3), with the pieces count and tile
    the launch reports; each op against its 128x256 kernel on
    random data (within bf16 rounding: both sum K in the same 64-wide steps, but nothing promises the tensor
    core's order inside a step across tile shapes; the count of differing elements is reported). A rank whose
    GEMM rows start late (TANDEM_TP_LATE, set by the test) gives its tiles away."""
    from tandem._native import native

    K = native().kernels
    comm = Communicator(heap_bytes=1 << 30, timeout_s=30)
    rank, world = comm.rank, comm.world_size
    out = dict(ag=[], rs=[], ar=[], tile256_vs_128=[], late=os.environ.get("TANDEM_TP_LATE"))
    try:
        for name in dtypes:
            dtype = getattr(torch, name)
            _set_env(TANDEM_TP_CLAIM=1, TANDEM_TP_GEMM_TILE="256x128")
            for _ in range(repeats):
                for (m_local, n, k) in ag_shapes:
                    for in_place in (False, True):
                        out["ag"].append(_ag_case(comm, m_local, n, k, dtype, "fused", in_place))
                        out["ag"][-1]["tile_m"] = int(K.tp_last_fused_gemm_tile_m())
                for pieces in (0, 3):
                    _set_env(TANDEM_RS_PIECES=pieces)
                    for (mr, n, k) in rs_shapes:
                        for case in (lambda: _rs_case(comm, mr, n, k, dtype, "fused"),
                                     lambda: _ar_case(comm, mr, n, k, dtype, "fused", "two_shot")):
                            c = case()
                            c.update(tile_m=int(K.tp_last_fused_gemm_tile_m()), pieces=K.tp_last_fused_rs_pieces(),
                                     asked_pieces=pieces)
                            out["ar" if "algo" in c else "rs"].append(c)
                _set_env(TANDEM_RS_PIECES=None)
            random_cases = [("ag", (m_local, n, k)) for (m_local, n, k) in ag_shapes] + \
                [(op, (mr, n, k)) for (mr, n, k) in rs_shapes for op in ("rs", "ar")]
            for op, (rows, n, k) in random_cases:
                b = _random((k, n), 20, dtype)
                a = _random((rows, k), 10 + rank, dtype) if op == "ag" else _random((rows * world, k), 30 + rank, dtype)
                run = {"ag": lambda: tp.ag_gemm(comm, a, b, mode="fused"),
                       "rs": lambda: tp.gemm_rs(comm, a, b, mode="fused"),
                       "ar": lambda: tp.gemm_ar(comm, a, b, mode="fused", algo="two_shot")}[op]
                outs, ran = {}, {}
                for tile in ("128x256", "256x128"):
                    _set_env(TANDEM_TP_GEMM_TILE=tile)
                    outs[tile] = run().clone()
                    ran[tile] = int(K.tp_last_fused_gemm_tile_m())
                torch.cuda.synchronize()
                comm.check()
                out["tile256_vs_128"].append(dict(
                    op=op, shape=[rows, n, k], dtype=name, ran=[ran["128x256"], ran["256x128"]],
                    differing=int((outs["256x128"] != outs["128x256"]).sum()),
                    rel=float((outs["256x128"].float() - outs["128x256"].float()).norm()
                              / outs["128x256"].float().norm()),
                    finite=bool(torch.isfinite(outs["256x128"].float()).all())))
    finally:
        _set_env(TANDEM_TP_CLAIM=None, TANDEM_TP_GEMM_TILE=None, TANDEM_RS_PIECES=None)
    tp.release_workspaces(comm)
    comm.destroy()
    return out


def gathered_view_outlives_peer_launches(m_local, n, k, mode, sleep_ms=50):
    """ag_gemm(return_gathered=True)'s view stays this rank's until this rank's next launch: each rank in turn
    reads its gathered view only ~sleep_ms after its launch, while its peers launch the op again with other data
    (a release at the end of the fused kernel let them overwrite it)."""
    comm = Communicator(heap_bytes=1 << 30, timeout_s=30)
    rank, world = comm.rank, comm.world_size
    dtype = torch.bfloat16
    b = _b(k, n, 1, dtype)
    first = _ints(world * m_local, k, 0, dtype)
    second = _ints(world * m_local, k, 3, dtype)
    cycles = (sleep_ms * 1_000_000) * 2  # torch.cuda._sleep counts clock cycles (~2 GHz)
    wrong = []
    for slow in range(world):
        comm.barrier()
        _, gathered = tp.ag_gemm(comm, first[rank * m_local:(rank + 1) * m_local].clone(), b, mode=mode,
                                 return_gathered=True)
        if rank == slow:
            torch.cuda._sleep(cycles)  # this rank's stream reads the view late
            snapshot = gathered.clone()
        else:
            # the peers go on with the next launch (other data); it may not overwrite the slow rank's view
            tp.ag_gemm(comm, second[rank * m_local:(rank + 1) * m_local].clone(), b, mode=mode)
        if rank == slow:
            torch.cuda.synchronize()
            wrong.append(int((snapshot != first).sum()))
            # the slow rank's own second launch, which its peers' second launches wait for
            tp.ag_gemm(comm, second[rank * m_local:(rank + 1) * m_local].clone(), b, mode=mode)
        torch.cuda.synchronize()
        comm.check()
    tp.release_workspaces(comm)
    comm.destroy()
    return dict(wrong=wrong, mode=mode)


def rejects():
    comm = Communicator(heap_bytes=64 << 20, timeout_s=10)
    a = _ints(256, 64, 0, torch.bfloat16)
    b = _b(64, 64, 1, torch.bfloat16)
    cases = {
        "dtype": lambda: tp.ag_gemm(comm, a.float(), b),
        "mixed_dtype": lambda: tp.gemm_rs(comm, a, b.half()),
        "inner": lambda: tp.ag_gemm(comm, a, _b(72, 64, 1, torch.bfloat16)),
        "cpu": lambda: tp.gemm_rs(comm, a.cpu(), b.cpu()),
        "stride": lambda: tp.ag_gemm(comm, a.t(), b),
        "k_not_8": lambda: tp.ag_gemm(comm, _ints(256, 60, 0, torch.bfloat16), _b(60, 64, 1, torch.bfloat16)),
        "mode": lambda: tp.gemm_rs(comm, a, b, mode="fast"),
        "ar_dtype": lambda: tp.gemm_ar(comm, a.float(), b),
        "ar_inner": lambda: tp.gemm_ar(comm, a, _b(72, 64, 1, torch.bfloat16)),
        "ar_blocks": lambda: tp.gemm_ar(comm, a, b, comm_blocks=5),
        "ar_algo": lambda: tp.gemm_ar(comm, a, b, algo="three_shot"),
        "odd_blocks": lambda: tp.ag_gemm(comm, a, b, comm_blocks=3),
        "m_not_world": lambda: tp.gemm_rs(comm, _ints(257, 64, 0, torch.bfloat16), b) if comm.world_size > 1
        else (_ for _ in ()).throw(TandemError("w1", 3)),
        "ar_m_not_world": lambda: tp.gemm_ar(comm, _ints(257, 64, 0, torch.bfloat16), b) if comm.world_size > 1
        else (_ for _ in ()).throw(TandemError("w1", 3)),
    }
    out = reject_statuses(cases)
    comm.destroy()
    return out


def rs_ticket_auto(rs_shapes, rounds):
    """Auto's plan "ticket" (a tuned table row of mode "ticket", TANDEM_RS_TICKET unset): mode="auto" runs the
    ticket kernel in `rounds` rounds (the host's record: ticket, pieces), bit-exact against the ticket order and bit
    for bit as the knob's ticket kernel; mode="fused" beside it runs the default kernel (its own order) on its own
    workspace; GEMM+AR two-shot likewise. The table is this rank's own file (every rank writes the same rows)."""
    import json
    import tempfile

    from tandem._native import native
    from tandem.ops import tp_plan

    K = native().kernels
    comm = Communicator(heap_bytes=1 << 30, timeout_s=30)
    rank, world, sms = comm.rank, comm.world_size, comm.sm_count
    table = os.path.join(tempfile.mkdtemp(prefix=f"tandem_auto_ticket_r{rank}_"), "tp_tune.json")
    # (k: the rank's K, what the op sees and auto_plan keys on)
    rows = [dict(op=op, world=world, sms=sms, m=mr * world, n=n, k=k, mode="ticket", comm_blocks=rounds,
                 ms=1.0) for (mr, n, k) in rs_shapes for op in ("gemm_rs", "gemm_ar")]
    # through the tuner's own writer (it adds the M/N/K buckets the lookup keys on); the rows it wrote are checked
    # so that a table the lookup cannot read fails here, not as "auto picked unfused" below
    tp_plan.write_table(rows, table)
    with open(table) as f:
        assert all(r["mode"] == "ticket" and "mb" in r for r in json.load(f))
    _set_env(TANDEM_TP_TUNE_FILE=table, TANDEM_RS_TICKET=None, TANDEM_RS_TICKET_ROUNDS=None)
    out = []
    try:
        for (mr, n, k) in rs_shapes:
            m = mr * world
            dtype = torch.bfloat16
            parts = _rs_partials(world, m, n, k, dtype)
            a, b = parts[rank]
            plan = tp.auto_plan(comm, "gemm_rs", m, n, a.shape[1])
            got = tp.gemm_rs(comm, a, b, mode="auto")
            torch.cuda.synchronize()
            comm.check()
            ran = (bool(K.tp_last_fused_rs_ticket()), int(K.tp_last_fused_rs_pieces()))
            got_ar = tp.gemm_ar(comm, a, b, mode="auto", algo="two_shot")
            torch.cuda.synchronize()
            comm.check()
            ran_ar = (bool(K.tp_last_fused_rs_ticket()), int(K.tp_last_fused_rs_pieces()))
            default = tp.gemm_rs(comm, a, b, mode="fused")
            torch.cuda.synchronize()
            comm.check()
            default_ticket = bool(K.tp_last_fused_rs_ticket())
            _set_env(TANDEM_RS_TICKET=1, TANDEM_RS_TICKET_ROUNDS=rounds)
            knob = tp.gemm_rs(comm, a, b, mode="fused")
            torch.cuda.synchronize()
            comm.check()
            _set_env(TANDEM_RS_TICKET=None, TANDEM_RS_TICKET_ROUNDS=None)
            again = tp.gemm_rs(comm, a * 2, b, mode="auto")  # the auto ticket's workspace again, after the others
            torch.cuda.synchronize()
            comm.check()
            ref = _ticket_reference(rank, world, parts, mr, dtype)
            ref_ar = torch.cat([_ticket_reference(q, world, parts, mr, dtype) for q in range(world)])
            out.append(dict(shape=[m, n, k], plan=list(plan), ran=list(ran), ran_ar=list(ran_ar),
                            wrong=int((got != ref).sum()), ar_wrong=int((got_ar != ref_ar).sum()),
                            default_ticket=default_ticket,
                            default_wrong=int((default != _rs_reference(rank, world, parts, mr, dtype)).sum()),
                            knob_differs=int((knob != got).sum()), again_wrong=int((again != got * 2).sum())))
            tp.release_workspaces(comm)
    finally:
        _set_env(TANDEM_TP_TUNE_FILE=None, TANDEM_RS_TICKET=None, TANDEM_RS_TICKET_ROUNDS=None)
    tp.release_workspaces(comm)
    comm.destroy()
    return out


def _rs_reference_nodes(owner, world, L, parts, mr, dtype):
    """The cross-node order (gemm_rs_sm90.cu): the other nodes' partials (n-1, n-2, ...), each the fp32 sum of its
    ranks j = 0 .. L-1 rounded once, then the owner's node's partials (l-1, l-2, ..., l); one final rounding."""
    nodes = world // L
    n, l = divmod(owner, L)

    def p(q):
        a, b = parts[q]
        return (a.float() @ b.float()).to(dtype).float()[owner * mr:(owner + 1) * mr]

    terms = []
    for s in range(nodes - 1):
        n2 = (n - 1 - s) % nodes
        node_sum = p(n2 * L)
        for j in range(1, L):
            node_sum = node_sum + p(n2 * L + j)
        terms.append(node_sum.to(dtype).float())
    terms += [p(n * L + (l - 1 - s) % L) for s in range(L)]
    acc = terms[0]
    for t in terms[1:]:
        acc = acc + t
    return acc.to(dtype)


def emulated_nodes(ag_shapes, rs_shapes, launches=20, claim=None):
    """The TP ops with peers on other emulated nodes (their traffic goes through the CPU proxy, TCP): AG+GEMM,
    GEMM+RS and GEMM+AR (two-shot), fused and unfused, against torch references in the cross-node order; AR
    outputs bit-identical across ranks; `launches` back-to-back launches identical (cross-epoch reuse of the
    buffers the proxy reads and writes); the one-shot AR refused (one node only). `claim` sets TANDEM_TP_CLAIM
    (None: the default, tile claims on); out["claims"] records whether each fused launch took claims."""
    from tandem._native import native

    K = native().kernels
    _set_env(TANDEM_TP_CLAIM=claim)
    comm = Communicator(heap_bytes=1 << 30, timeout_s=60)
    rank, world = comm.rank, comm.world_size
    L = comm.native.uniform_ranks_per_node
    out = dict(has_proxy=comm.has_proxy, num_nodes=comm.native.num_nodes, ranks_per_node=L, ag=[], rs=[], ar=[],
               claims=[])
    for (m_local, n, k) in ag_shapes:
        for mode in ("fused", "unfused"):
            out["ag"].append(_ag_case(comm, m_local, n, k, torch.bfloat16, mode, in_place=False))
            if mode == "fused":
                out["claims"].append(bool(K.tp_last_fused_claims()))
    for (mr, n, k) in rs_shapes:
        m = mr * world
        parts = _rs_partials(world, m, n, k, torch.bfloat16)
        a, b = parts[rank]
        ref_rs = _rs_reference_nodes(rank, world, L, parts, mr, torch.bfloat16)
        ref_ar = torch.cat([_rs_reference_nodes(c, world, L, parts, mr, torch.bfloat16) for c in range(world)])
        exact = sum((pa.float() @ pb.float()) for pa, pb in parts)
        for mode in ("fused", "unfused"):
            rs = tp.gemm_rs(comm, a, b, mode=mode)
            if mode == "fused":
                out["claims"].append(bool(K.tp_last_fused_claims()))
            ar = tp.gemm_ar(comm, a, b, mode=mode, algo="two_shot")
            torch.cuda.synchronize()
            comm.check()
            mine = exact[rank * mr:(rank + 1) * mr]
            out["rs"].append(dict(shape=[m, n, k], mode=mode, wrong=int((rs != ref_rs).sum()),
                                  rel=float((rs.float() - mine).norm() / mine.norm().clamp_min(1e-6))))
            out["ar"].append(dict(shape=[m, n, k], mode=mode, wrong=int((ar != ref_ar).sum()), digest=_digest(ar),
                                  rel=float((ar.float() - exact).norm() / exact.norm().clamp_min(1e-6))))
    # back-to-back launches on one workspace: every buffer the proxy touches is reused across epochs
    mr, n, k = rs_shapes[0]
    parts = _rs_partials(world, mr * world, n, k, torch.bfloat16)
    a, b = parts[rank]
    rs0, ar0 = tp.gemm_rs(comm, a, b, mode="fused"), tp.gemm_ar(comm, a, b, mode="fused", algo="auto")
    m_local, n_ag, k_ag = ag_shapes[0]
    a_ag = _ints(world * m_local, k_ag, 0, torch.bfloat16)[rank * m_local:(rank + 1) * m_local].clone()
    b_ag = _b(k_ag, n_ag, 1, torch.bfloat16)
    ag0 = tp.ag_gemm(comm, a_ag, b_ag, mode="fused")
    same = dict(rs=0, ar=0, ag=0)
    for _ in range(launches):
        rs = tp.gemm_rs(comm, a, b, mode="fused")
        ar = tp.gemm_ar(comm, a, b, mode="fused", algo="auto")
        ag = tp.ag_gemm(comm, a_ag, b_ag, mode="fused")
        same["rs"] += bool(torch.equal(rs, rs0))
        same["ar"] += bool(torch.equal(ar, ar0))
        same["ag"] += bool(torch.equal(ag, ag0))
    torch.cuda.synchronize()
    comm.check()
    out["repeat_same"] = same
    try:
        tp.gemm_ar(comm, a, b, algo="one_shot")
        out["one_shot_refused"] = None
    except TandemError as e:
        out["one_shot_refused"] = e.status
    _set_env(TANDEM_TP_CLAIM=None)
    tp.release_workspaces(comm)
    comm.destroy()
    return out


def _attempt(comm, fn):
    """fn's outcome on this rank: dict(raised, status, message, seconds); a call that launched is synchronized and
    checked, so an error the device reports counts too."""
    t0 = time.monotonic()
    try:
        out = fn()
        torch.cuda.synchronize()
        comm.check()
        return dict(raised=False, shape=list(out.shape), seconds=time.monotonic() - t0)
    except TandemError as e:
        return dict(raised=True, status=e.status, peer=e.peer, message=str(e), seconds=time.monotonic() - t0)


def disagree(comm_timeout_s):
    """Ranks that call an op with different keys (rank 0 one value, the others another; every key new, so every
    rank takes the agreement step): a TandemError on every rank naming both keys, nothing launched; then a call the
    ranks agree on still runs and is right (the ranks stayed in step)."""
    comm = Communicator(heap_bytes=256 << 20, timeout_s=comm_timeout_s)
    rank, world = comm.rank, comm.world_size
    dtype = torch.bfloat16
    m_local = 256
    first = rank == 0

    def ag(k, n, mode):
        a_local = _ints(world * m_local, k, 0, dtype)[rank * m_local:(rank + 1) * m_local].clone()
        return tp.ag_gemm(comm, a_local, _b(k, n, 1, dtype), mode=mode)

    def rs(n, op="gemm_rs", algo="two_shot"):
        a, b = _ints(m_local * world, 512, 2, dtype), _b(512, n, 3, dtype)
        if op == "gemm_rs":
            return tp.gemm_rs(comm, a, b, mode="fused")
        return tp.gemm_ar(comm, a, b, mode="fused", algo=algo)

    out = {
        "ag_k_fused": _attempt(comm, lambda: ag(1024 if first else 2048, 512, "fused")),
        "ag_k_unfused": _attempt(comm, lambda: ag(1024 if first else 2048, 512, "unfused")),
        "ag_n_fused": _attempt(comm, lambda: ag(1024, 512 if first else 1024, "fused")),
        "ag_n_unfused": _attempt(comm, lambda: ag(1024, 512 if first else 1024, "unfused")),
        "ag_mode": _attempt(comm, lambda: ag(1024, 512, "fused" if first else "unfused")),
        "rs_n": _attempt(comm, lambda: rs(512 if first else 1024)),
        "ar_algo": _attempt(comm, lambda: rs(512, "gemm_ar", "one_shot" if first else "two_shot")),
    }
    # in step afterwards: an agreed call runs and is right
    k, n = 1024, 512
    a_full = _ints(world * m_local, k, 0, dtype)
    c = ag(k, n, "fused")
    torch.cuda.synchronize()
    comm.check()
    out["agreed_after_wrong"] = int((c != (a_full.float() @ _b(k, n, 1, dtype).float()).to(dtype)).sum())
    tp.release_workspaces(comm)
    comm.destroy()
    return out


def out_of_step(comm_timeout_s):
    """Rank 0 calls a key the ranks agreed on before (it skips the agreement step and launches), the others a new
    key (they take the step): every rank gets a TandemError within about timeout_s, none hangs and none returns a
    result (the others: the step times out; rank 0: its kernel's device wait times out)."""
    comm = Communicator(heap_bytes=256 << 20, timeout_s=comm_timeout_s)
    rank, world = comm.rank, comm.world_size
    dtype = torch.bfloat16
    m_local, k = 256, 1024
    a_local = _ints(world * m_local, k, 0, dtype)[rank * m_local:(rank + 1) * m_local].clone()
    b512, b1024 = _b(k, 512, 1, dtype), _b(k, 1024, 1, dtype)
    first = _attempt(comm, lambda: tp.ag_gemm(comm, a_local, b512, mode="fused"))
    second = _attempt(comm, lambda: tp.ag_gemm(comm, a_local, b512 if rank == 0 else b1024, mode="fused"))
    # the communicator of a rank that timed out is aborted: only free the workspaces and destroy it
    tp.release_workspaces(comm)
    comm.destroy()
    return dict(first=first, second=second)


def _ring_reference(owner, world, parts, mr, dtype):
    """The pipelined mode's order for chunk `owner`: rank owner-1 starts it (rounded to dtype), each rank to the
    left adds its partial in fp32 and rounds again (cuBLAS beta = 1), and the owner adds its own last."""
    rows = slice(owner * mr, (owner + 1) * mr)
    acc = None
    for s in range(world):
        q = (owner - 1 - s) % world
        a, b = parts[q]
        p = a.float()[rows] @ b.float()
        acc = p.to(dtype) if acc is None else (p + acc.float()).to(dtype)
    return acc


def pipelined(ag_shapes, rs_shapes, dtypes, launches):
    """mode="pipelined" (tandem.ops.tp_pipelined): structured data bit-exact against its summation order, random
    data against fp32, repeated launches identical, CUDA graph replays with new inputs."""
    # bit-exact references need cuBLAS to reduce in fp32 (its reduced-precision split-K would round partial sums)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    comm = Communicator(heap_bytes=1 << 30, timeout_s=30)
    rank, world = comm.rank, comm.world_size
    out = dict(ag=[], rs=[], ar=[])
    for name in dtypes:
        dtype = getattr(torch, name)
        for (m_local, n, k) in ag_shapes:
            for in_place in (False, True):
                out["ag"].append(_ag_case(comm, m_local, n, k, dtype, "pipelined", in_place))
        for (mr, n, k) in rs_shapes:
            m = mr * world
            parts = _rs_partials(world, m, n, k, dtype)
            a, b = parts[rank]
            rs = tp.gemm_rs(comm, a, b, mode="pipelined")
            ar = tp.gemm_ar(comm, a, b, mode="pipelined")
            torch.cuda.synchronize()
            comm.check()
            exact = sum((pa.float() @ pb.float()) for pa, pb in parts)
            ref_rs = _ring_reference(rank, world, parts, mr, dtype)
            ref_ar = torch.cat([_ring_reference(c, world, parts, mr, dtype) for c in range(world)])
            mine = exact[rank * mr:(rank + 1) * mr]
            out["rs"].append(dict(shape=[m, n, k], dtype=name, wrong=int((rs != ref_rs).sum()),
                                  rel=float((rs.float() - mine).norm() / mine.norm().clamp_min(1e-6))))
            out["ar"].append(dict(shape=[m, n, k], dtype=name, wrong=int((ar != ref_ar).sum()),
                                  rel=float((ar.float() - exact).norm() / exact.norm().clamp_min(1e-6)),
                                  digest=_digest(ar)))
    # random data against fp32, bf16, a shape with several pieces per chunk
    mr, n, k = 1000, 1024, 768
    g = torch.Generator(device="cuda").manual_seed(1234 + rank)
    ra = torch.randn(mr * world, k, device="cuda", dtype=torch.bfloat16, generator=g)
    rb = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g) / k ** 0.5
    rs = tp.gemm_rs(comm, ra, rb, mode="pipelined")
    full = torch.empty(world, mr * world, n, device="cuda")
    # every rank's partial, to build the exact sum here: each rank draws with its own seed, so recompute them
    for q in range(world):
        g = torch.Generator(device="cuda").manual_seed(1234 + q)
        qa = torch.randn(mr * world, k, device="cuda", dtype=torch.bfloat16, generator=g)
        qb = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g) / k ** 0.5
        full[q] = qa.float() @ qb.float()
    exact = full.sum(0)[rank * mr:(rank + 1) * mr]
    out["random_rs_rel"] = float((rs.float() - exact).norm() / exact.norm())
    # repeats: identical bytes
    m_local = 256
    a_full = _ints(world * m_local, 512, 0, torch.bfloat16)
    b = _b(512, 512, 1, torch.bfloat16)
    a_local = a_full[rank * m_local:(rank + 1) * m_local].clone()
    parts = _rs_partials(world, m_local * world, 512, 512, torch.bfloat16)
    pa, pb = parts[rank]
    first = (tp.ag_gemm(comm, a_local, b, mode="pipelined"), tp.gemm_rs(comm, pa, pb, mode="pipelined"),
             tp.gemm_ar(comm, pa, pb, mode="pipelined"))
    same = [0, 0, 0]
    for _ in range(launches):
        now = (tp.ag_gemm(comm, a_local, b, mode="pipelined"), tp.gemm_rs(comm, pa, pb, mode="pipelined"),
               tp.gemm_ar(comm, pa, pb, mode="pipelined"))
        for i in range(3):
            same[i] += int(torch.equal(now[i], first[i]))
    out["same"] = same
    # back to back with two input sets and no synchronization: a rank that overwrote a peer's buffer before the
    # peer was done with it (this call's or the previous one's) shows as a wrong output or gathered copy
    # The reference of each set is a lone call of the same op on the same inputs, synchronized on every rank
    # before and after (the numerics are the ones under test above; here only the interleaving may differ).
    sets = [(a_local, pa), (a_local * 3, pa * 3)]
    refs = []
    for x, y in sets:
        for call in (lambda: tp.ag_gemm(comm, x, b, mode="pipelined", return_gathered=True),
                     lambda: tp.gemm_rs(comm, y, pb, mode="pipelined"),
                     lambda: tp.gemm_ar(comm, y, pb, mode="pipelined")):
            torch.cuda.synchronize()
            comm.barrier()
            r = call()
            refs.extend([r[0].clone(), r[1].clone()] if isinstance(r, tuple) else [r.clone()])
            torch.cuda.synchronize()
            comm.barrier()
    # the lone calls of set 0 are right: the AG against torch, RS/AR equal to the repeats' first call
    out["lone_ok"] = [torch.equal(refs[0], ((a_full.float() @ b.float()).to(torch.bfloat16))),
                      torch.equal(refs[1], a_full), torch.equal(refs[2], first[1]), torch.equal(refs[3], first[2])]
    results = []
    for i in range(2 * launches // 5):
        x, y = sets[i % 2]
        c, g = tp.ag_gemm(comm, x, b, mode="pipelined", return_gathered=True)
        results.append((i % 2, c, g.clone(), tp.gemm_rs(comm, y, pb, mode="pipelined"),
                        tp.gemm_ar(comm, y, pb, mode="pipelined")))
    torch.cuda.synchronize()
    comm.check()
    wrong, by_output, first_wrong = 0, dict(c=0, gathered=0, rs=0, ar=0), None
    for i, (which, c, g, rs, ar) in enumerate(results):
        r = refs[4 * which:4 * which + 4]
        for name, got, want in zip(by_output, (c, g, rs, ar), r):
            bad = int((got != want).sum())
            if bad:
                wrong += 1
                by_output[name] += 1
                if first_wrong is None:
                    first_wrong = dict(call=i, output=name, elements=bad, of=got.numel())
    out["alternating"] = dict(calls=len(results), wrong=wrong)
    out["alternating_detail"] = dict(by_output=by_output, first_wrong=first_wrong)
    # CUDA graph: capture the three ops (workspaces exist), replay with new inputs
    sa, spa = a_local.clone(), pa.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        tp.ag_gemm(comm, sa, b, mode="pipelined")
        tp.gemm_rs(comm, spa, pb, mode="pipelined")
        tp.gemm_ar(comm, spa, pb, mode="pipelined")
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        gc = tp.ag_gemm(comm, sa, b, mode="pipelined")
        gr = tp.gemm_rs(comm, spa, pb, mode="pipelined")
        ga = tp.gemm_ar(comm, spa, pb, mode="pipelined")
    graph_ok = []
    for rep in range(3):
        scale = float(rep + 2)
        # RS/AR references: lone eager calls on the same inputs (their numerics are tested above)
        torch.cuda.synchronize()
        comm.barrier()
        lone_rs = tp.gemm_rs(comm, pa * scale, pb, mode="pipelined")
        lone_ar = tp.gemm_ar(comm, pa * scale, pb, mode="pipelined")
        torch.cuda.synchronize()
        sa.copy_(a_local * scale)
        spa.copy_(pa * scale)
        comm.barrier()
        g.replay()
        torch.cuda.synchronize()
        graph_ok.append(bool(torch.equal(gc, ((a_full * scale).float() @ b.float()).to(torch.bfloat16)))
                        and bool(torch.equal(gr, lone_rs)) and bool(torch.equal(ga, lone_ar)))
    comm.check()
    out["graph_ok"] = graph_ok
    del g
    tp.release_workspaces(comm)
    comm.destroy()
    return out


# ---- FP8 GEMM+RS / GEMM+AR (tandem.ops.tp.scaled_gemm_rs / scaled_gemm_ar) -------------------------------------

def _fp8_rank_operands(m, n, k, q, scaling):
    """Rank q's e4m3 a (M x K row-major), b (K x N column-major) and scales: small integers / 4 (exact in e4m3) and
    power-of-two scales, so every rank's partial is exact in fp32 before its one rounding to bf16."""
    i = torch.arange(m, device="cuda").view(-1, 1)
    kk = torch.arange(k, device="cuda").view(1, -1)
    a = ((((i * 7 + kk * 3 + (i * kk) % 5 + q * 5) % 9) - 4).float() / 4).to(torch.float8_e4m3fn)
    j = torch.arange(n, device="cuda").view(-1, 1)
    b = ((((j * 5 + kk * 11 + q * 3) % 7) - 2).float() / 4).to(torch.float8_e4m3fn).t()
    if scaling == "tensor":
        return a, b, torch.tensor(2.0 ** (q % 3 - 1), device="cuda"), torch.tensor(2.0 ** (q % 2), device="cuda")
    sa = torch.pow(2.0, ((torch.arange(m, device="cuda") + q) % 5 - 2).float()).view(m, 1).contiguous()
    sb = torch.pow(2.0, ((torch.arange(n, device="cuda") + 2 * q) % 3 - 1).float()).view(1, n).contiguous()
    return a, b, sa, sb


_FP8_GEMMS = ("cublas", "tandem")  # tp._UNFUSED_GEMM's values
_DEFAULT_GEMM = tp._UNFUSED_GEMM  # restored after each case


def _count_scaled_mm(fn):
    """fn() and how many times it called torch._scaled_mm (the FP8 unfused path's cuBLASLt GEMM)."""
    real, calls = torch._scaled_mm, [0]

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    torch._scaled_mm = counting
    try:
        return fn(), calls[0]
    finally:
        torch._scaled_mm = real


def _fp8_partial(a, b, sa, sb):
    return ((a.float() @ b.float()) * sb * sa).to(torch.bfloat16).float()


def scaled_rs_ar(rs_shapes):
    """scaled_gemm_rs / scaled_gemm_ar against the kernels' fixed order over bf16-rounded partials, exact."""
    comm = Communicator(heap_bytes=1 << 30, timeout_s=30)
    rank, world = comm.rank, comm.world_size
    out = dict(rs=[], ar=[])
    for (mr, n, k) in rs_shapes:
        m = mr * world
        for scaling in ("tensor", "row"):
            ops_in = [_fp8_rank_operands(m, n, k, q, scaling) for q in range(world)]
            parts = [_fp8_partial(*x) for x in ops_in]

            def owner_rows(o):
                acc = None
                for s in range(world):
                    p = parts[(o - 1 - s) % world][o * mr:(o + 1) * mr]
                    acc = p if acc is None else acc + p
                return acc.to(torch.bfloat16)

            for gemm in _FP8_GEMMS:  # the unfused path's GEMM: cuBLASLt (where it takes the shape) or tandem's
                tp._UNFUSED_GEMM = gemm
                try:
                    got, cublas_calls = _count_scaled_mm(lambda: tp.scaled_gemm_rs(comm, *ops_in[rank]))
                    torch.cuda.synchronize()
                    comm.check()
                    out["rs"].append(dict(shape=[m, n, k], scaling=scaling, gemm=gemm, cublas_calls=cublas_calls,
                                          wrong=int((got != owner_rows(rank)).sum())))
                    for algo in ("one_shot", "two_shot"):
                        got, cublas_calls = _count_scaled_mm(
                            lambda: tp.scaled_gemm_ar(comm, *ops_in[rank], algo=algo))
                        torch.cuda.synchronize()
                        comm.check()
                        ref = torch.cat([owner_rows(o) for o in range(world)])
                        out["ar"].append(dict(shape=[m, n, k], scaling=scaling, algo=algo, gemm=gemm,
                                              cublas_calls=cublas_calls, wrong=int((got != ref).sum()),
                                              digest=_digest(got)))
                finally:
                    tp._UNFUSED_GEMM = _DEFAULT_GEMM
    # bad input is refused before any launch
    a, b, sa, sb = _fp8_rank_operands(8 * world, 64, 64, 0, "row")
    out["refused"] = reject_statuses({
        name: (lambda args=args: tp.scaled_gemm_rs(comm, *args))
        for name, args in (("bf16 a", (a.to(torch.bfloat16), b, sa, sb)), ("mixed scales", (a, b, sa, sb[0, 0])),
                           ("M not a multiple of the world", (a[:8 * world - 1], b, sa[:8 * world - 1], sb)))})
    tp.release_workspaces(comm)
    comm.destroy()
    return out


def scaled_ag(ag_shapes):
    """scaled_ag_gemm: the gathered e4m3 rows and row scales bit for bit, and the product exact against the
    concatenated shards (small integers / 4 and power-of-two scales: every product and sum exact in fp32, one
    rounding to bf16); torch._scaled_mm on the concatenation, row-wise, as the baseline's cross-check. Each case
    twice in a row (the gather workspaces' next epoch)."""
    comm = Communicator(heap_bytes=1 << 30, timeout_s=30)
    rank, world = comm.rank, comm.world_size
    out = dict(cases=[])
    for (ml, n, k) in ag_shapes:
        for scaling in ("tensor", "row"):
            shards = [_fp8_rank_operands(ml, n, k, q, scaling) for q in range(world)]
            a, b, sa, sb = shards[rank]  # b and sb: this rank's own N shard's
            full = torch.cat([x[0] for x in shards])
            rows = torch.cat([x[2].reshape(1).expand(ml).reshape(ml, 1) if scaling == "tensor" else x[2]
                              for x in shards]).contiguous()
            cols = sb.reshape(1, 1).expand(1, n).contiguous() if scaling == "tensor" else sb
            ref = ((full.float() @ b.float()) * cols * rows).to(torch.bfloat16)
            try:
                smm = torch._scaled_mm(full, b, scale_a=rows, scale_b=cols, out_dtype=torch.bfloat16)
            except RuntimeError:  # a shape _scaled_mm does not take: no cross-check
                smm = None
            for rep, gemm in ((0, "cublas"), (1, "cublas"), (0, "tandem"), (1, "tandem")):
                tp._UNFUSED_GEMM = gemm
                try:
                    (c, ga, srow), cublas_calls = _count_scaled_mm(lambda: tp.scaled_ag_gemm(comm, a, b, sa, sb))
                finally:
                    tp._UNFUSED_GEMM = _DEFAULT_GEMM
                torch.cuda.synchronize()
                comm.check()
                out["cases"].append(dict(
                    shape=[ml, n, k], scaling=scaling, rep=rep, gemm=gemm, cublas_calls=cublas_calls,
                    gathered_wrong=int((ga.view(torch.uint8) != full.view(torch.uint8)).sum()),
                    scales_wrong=int((srow != rows).sum()), wrong=int((c != ref).sum()),
                    wrong_vs_scaled_mm=None if smm is None else int((c != smm).sum())))
    # bad input is refused before any launch
    a, b, sa, sb = _fp8_rank_operands(64, 64, 64, rank, "row")
    at, bt, sat, sbt = _fp8_rank_operands(64, 64, 64, rank, "tensor")
    out["refused"] = reject_statuses({
        name: (lambda args=args: tp.scaled_ag_gemm(comm, *args))
        for name, args in (("bf16 a", (a.to(torch.bfloat16), b, sa, sb)), ("mixed scales", (a, b, sa, sb[0, 0])),
                           ("a_local not contiguous", (at[::2], bt, sat, sbt)))})
    tp.release_workspaces(comm)
    comm.destroy()
    return out
