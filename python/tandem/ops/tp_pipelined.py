"""The TP ops' "pipelined" mode: cuBLAS computes, the copy engines move the data, and tandem's stream-ordered
flags (kernels/include/tandem/kernels/stream_sync.h) order the two across ranks. No SM is taken from the GEMM
for communication, which is what the SM-role kernels ("fused") cannot avoid.

Why it exists: on the H200 under MPS, with every rank's GEMM on its share of the SMs, each comm SM the fused
kernels take costs the GEMM more than the copy engines need to move the bytes (docs/results.md, issue 21).
TransformerEngine's ring-exchange overlap and torch's micro-pipelined async TP are the same idea; this one keeps
tandem's contracts (bounded waits that name the peer, ranks that agree, epochs on the device, so CUDA graphs
replay it).

One node only (every peer reachable through load/store mappings: the copy engines write into them, by raw
address: cudaMemcpyAsync with cudaMemcpyDefault, not through torch tensors, which would place a mapping of
another GPU's memory on that GPU). The GEMMs run on all of the rank's SMs (cuBLAS): sm_count and comm_blocks do
not apply. Every rank must call the op on one stream per shape (the epoch counter is per workspace).

AG+GEMM (a_local M/W x K per rank):
    main stream   signal free[r] = e-1 on every peer: this rank's call e-1 (its GEMMs, and whatever its caller
                  read from the returned gathered view before this call) is done with `gathered`
    side stream   for q = r-1, r-2, ...: wait free[q] >= e-1 (q alone: a slow peer does not hold up the pushes
                  to the others), copy a_local into q's gathered rows of r, signal arrived[r] on q
    main stream   C[r] = a_local @ B (no wait), then for src = r+1, r+2, ...: wait arrived[src] >= e, C[src] =
                  gathered[src] @ B
GEMM+RS (a M x K/W per rank), a ring to the left (r sends to r-1), step s = 0 .. W-1 on chunk c = r+s+1:
    s = 0         acc = A[c] @ B;                       push acc -> left's recv[0], signal recvd[0] there
    0 < s < W-1   wait recvd[s-1]; recv[s-1] += A[c] @ B (cuBLAS beta = 1, in place); push it -> left's recv[s]
    s = W-1       wait recvd[W-2]; out = recv[W-2] + A[r] @ B   (c = r: this rank's rows, summed over all ranks)
    (each chunk in `splits` row pieces, so a piece moves while the next one multiplies; before its first push a
    rank waits until its left neighbour is done with its receive buffers of the previous call: free)
GEMM+AR: the RS above into this rank's `own` rows (workspace), then every rank copies every owner's rows into
    its output (ready / pulled flags): the same bits on every rank.

The partial sums are rounded to the op's dtype at every ring step (cuBLAS's beta = 1 epilogue), as a ring
reduce-scatter in bf16 does; the fused and unfused modes keep an fp32 accumulator instead. cuBLAS's bf16 beta = 1
epilogue is not always one fp32 add and one rounding: on the H200 it differed from (A @ B + C in fp32, rounded
once) in 1.5 to 2.4 % of the elements at world 2 (six shapes, data three times larger than the tests'; fp16
matched exactly; tools/diag/cublas_mps_check.py, column "beta=1, 3a"). The tests hold the mode to fp32 accuracy
and to identical bits between back-to-back and lone calls, not to a hand-written rounding order at every
magnitude.
"""

from __future__ import annotations

import os

import torch

from .._native import native
from ..errors import invalid
from . import _runtime as rt

CTL_BYTES = 8192
_FLAG_KIND_BYTES = 1024  # counter at 0; flag arrays of 128 entries at 1024 + 1024 * kind
_RECVD, _FREE, _READY, _PULLED, _ARRIVED = 0, 1, 2, 3, 4
_MAX_FLAGS = 128
# Row pieces per ring chunk (GEMM+RS/AR): each piece is pushed while the next one multiplies.
SPLITS = int(os.environ.get("TANDEM_PIPELINE_SPLITS", "2"))
# Diagnostic: "sm" moves the chunks with a copy kernel (16 blocks) instead of the copy engines.
_COPY = os.environ.get("TANDEM_PIPELINE_COPY", "engine")

def _flag(kind: int, i: int) -> int:
    assert 0 <= i < _MAX_FLAGS
    return _FLAG_KIND_BYTES * (1 + kind) + 8 * i


def check(comm, op: str, splits: int = 1, sm_count: int = 0, comm_blocks: int = 0):
    """Errors before anything is allocated or launched: the mode's limits."""
    if int(sm_count) or int(comm_blocks):
        raise invalid("mode 'pipelined' runs cuBLAS on all of the rank's SMs and moves data with the copy engines: "
                      "sm_count and comm_blocks do not apply (leave them 0)", op, comm.rank)
    n = comm.native
    if n.num_nodes > 1:
        raise invalid("mode 'pipelined' moves data with the copy engines through peer mappings: one node only "
                      "(use 'fused' or 'unfused' across nodes)", op, comm.rank)
    if comm.world_size > 64:
        raise invalid("mode 'pipelined' takes at most 64 ranks", op, comm.rank)
    if (comm.world_size - 1) * splits > _MAX_FLAGS:
        raise invalid(f"mode 'pipelined': (world - 1) x splits must be at most {_MAX_FLAGS}", op, comm.rank)


def _peer_bases(comm, ws) -> list:
    """Each rank's address of workspace `ws` as mapped here (tandem.ops._runtime.peer_bases)."""
    return rt.peer_bases(comm, ws, "pipelined")


def _copy(K, dst: int, src: int, nbytes: int, stream):
    if _COPY == "sm":
        K.stream_copy_sm(dst, src, nbytes, 16, stream.cuda_stream)
    else:
        K.stream_copy(dst, src, nbytes, stream.cuda_stream)


def ag_workspace_bytes(world: int, m_local: int, k: int, esize: int) -> int:
    return CTL_BYTES + world * m_local * k * esize


def gathered_view(ws, world: int, m_local: int, k: int, dtype) -> torch.Tensor:
    """The gathered A (world m_local x k) inside an AG workspace."""
    esize = torch.empty((), dtype=dtype).element_size()
    return ws[CTL_BYTES:CTL_BYTES + world * m_local * k * esize].view(dtype).view(world * m_local, k)


def ag_gemm(comm, ws, a_local, b):
    """(C, gathered) of all_gather(a_local) @ b; `ws` is this shape's workspace (ag_workspace_bytes, zeroed)."""
    K = native().kernels
    world, rank = comm.world_size, comm.rank
    m_local, k = a_local.shape
    n = b.shape[1]
    dev = a_local.device
    esize = a_local.element_size()
    bases = _peer_bases(comm, ws)
    base = bases[rank]
    counter = base
    gathered = gathered_view(ws, world, m_local, k, a_local.dtype)
    slice_bytes = m_local * k * esize
    c = torch.empty((world * m_local, n), dtype=a_local.dtype, device=dev)
    s = torch.cuda.current_stream(dev)
    side = rt.side_stream(dev, "pipelined")
    rows = lambda q: slice(q * m_local, (q + 1) * m_local)  # noqa: E731
    to = [(rank - i) % world for i in range(1, world)]  # r-1 first: its GEMM takes our rows second
    K.stream_advance(counter, s.cuda_stream)
    # Call e-1 of this rank, and its caller's reads of the gathered view it returned, are behind us on this stream:
    # the sources may write their rows of call e into our `gathered` now.
    K.stream_signal(comm.native, base + _flag(_FREE, rank), to, counter, -1, s.cuda_stream)
    side.wait_stream(s)
    with torch.cuda.stream(side):
        src = a_local.data_ptr()
        for q in to:
            # only q's own "free" guards q's gathered buffer: the push to q need not wait for the other peers
            K.stream_wait(comm.native, [base + _flag(_FREE, q)], [q], counter, -1, side.cuda_stream)
            _copy(K, bases[q] + CTL_BYTES + rank * slice_bytes, src, slice_bytes, side)
            K.stream_signal(comm.native, base + _flag(_ARRIVED, rank), [q], counter, 0, side.cuda_stream)
        if base + CTL_BYTES + rank * slice_bytes != src:  # not already in place (gathered_buffer)
            _copy(K, base + CTL_BYTES + rank * slice_bytes, src, slice_bytes, side)
    torch.matmul(a_local, b, out=c[rows(rank)])
    for i in range(1, world):
        src_rank = (rank + i) % world
        K.stream_wait(comm.native, [base + _flag(_ARRIVED, src_rank)], [src_rank], counter, 0, s.cuda_stream)
        torch.matmul(gathered[rows(src_rank)], b, out=c[rows(src_rank)])
    s.wait_stream(side)  # the op ends when its copies have: a_local may be reused after it
    return c, gathered


def rs_workspace_bytes(world: int, m: int, n: int, esize: int, all_reduce: bool) -> int:
    chunk = m // world * n * esize
    return CTL_BYTES + chunk * (1 + (world - 1) + (1 if all_reduce else 0))


def _pieces(rows: int, splits: int) -> list:
    splits = max(1, min(splits, rows))
    step = -(-rows // splits)
    return [(r0, min(rows, r0 + step)) for r0 in range(0, rows, step)]


def gemm_rs(comm, ws, a, b, out, all_reduce: bool, splits: int):
    """reduce_scatter(a @ b) into `out` (M/W x N), or all_reduce into `out` (M x N) when all_reduce."""
    K = native().kernels
    world, rank = comm.world_size, comm.rank
    m, _ = a.shape
    n = b.shape[1]
    mr = m // world
    dev = a.device
    esize = a.element_size()
    base = ws.data_ptr()
    counter = base
    chunk = mr * n * esize

    def buf(i):  # 0: acc, 1 .. W-1: recv[0 .. W-2], W: own (AR)
        o = CTL_BYTES + i * chunk
        return ws[o:o + chunk].view(a.dtype).view(mr, n)

    acc, own = buf(0), (buf(world) if all_reduce else None)
    recv = [buf(1 + i) for i in range(world - 1)]
    bases = _peer_bases(comm, ws)
    row_bytes = n * esize

    def at(q, t, r0=0):  # address of row r0 of workspace view `t` in rank q's workspace, as mapped here
        return bases[q] + (t.data_ptr() - base) + r0 * row_bytes
    left, right = (rank - 1) % world, (rank + 1) % world
    others = [q for q in range(world) if q != rank]
    pieces = _pieces(mr, splits)
    s = torch.cuda.current_stream(dev)
    side = rt.side_stream(dev, "pipelined")
    K.stream_advance(counter, s.cuda_stream)
    side.wait_stream(s)
    with torch.cuda.stream(side):  # left no longer uses its receive buffers of the previous call
        K.stream_wait(comm.native, [base + _flag(_FREE, 0)], [left], counter, -1, side.cuda_stream)
    for step in range(world):
        c = (rank + step + 1) % world
        a_c = a[c * mr:(c + 1) * mr]
        last = step == world - 1
        if last and all_reduce:  # the peers have copied our rows of the previous call
            K.stream_wait(comm.native, [base + _flag(_PULLED, q) for q in others], others, counter, -1,
                              s.cuda_stream)
        for j, (r0, r1) in enumerate(pieces):
            if step == 0:
                dst = acc[r0:r1]
                torch.matmul(a_c[r0:r1], b, out=dst)
            else:
                flag = (step - 1) * len(pieces) + j
                K.stream_wait(comm.native, [base + _flag(_RECVD, flag)], [right], counter, 0, s.cuda_stream)
                src = recv[step - 1][r0:r1]
                if last:
                    torch.addmm(src, a_c[r0:r1], b, out=(own if all_reduce else out)[r0:r1])
                    continue
                src.addmm_(a_c[r0:r1], b)
                dst = src
            side.wait_stream(s)
            with torch.cuda.stream(side):
                _copy(K, at(left, recv[step], r0), dst.data_ptr(), (r1 - r0) * row_bytes, side)
                K.stream_signal(comm.native, base + _flag(_RECVD, step * len(pieces) + j), [left], counter, 0,
                                    side.cuda_stream)
    s.wait_stream(side)
    # our receive buffers (written by right) and acc are free again: right may push into them next call
    K.stream_signal(comm.native, base + _flag(_FREE, 0), [right], counter, 0, s.cuda_stream)
    if all_reduce:
        K.stream_signal(comm.native, base + _flag(_READY, rank), others, counter, 0, s.cuda_stream)
        out[rank * mr:(rank + 1) * mr].copy_(own)
        for q in others:
            K.stream_wait(comm.native, [base + _flag(_READY, q)], [q], counter, 0, s.cuda_stream)
            _copy(K, out[q * mr:(q + 1) * mr].data_ptr(), at(q, own), mr * row_bytes, s)
        K.stream_signal(comm.native, base + _flag(_PULLED, rank), others, counter, 0, s.cuda_stream)
    return out
