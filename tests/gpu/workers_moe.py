"""Rank-side bodies of the MoE tests (run in every rank by tests/conftest.py:run_ranks).

Every rank regenerates every rank's tokens and routing from seeds, so it can build the torch reference of its own
experts (all_to_all of the routed rows, then per-expert matmul) and of its own tokens' combine without any
communication. Values are small multiples of 1/8, so the fp32 sums are exact and the comparisons bit-exact."""

from __future__ import annotations

import os
import time

import torch

import tandem.ops  # noqa: F401
from tandem.errors import TandemError
from tandem.ops import moe, tp
from tandem.transport import Communicator

from .worker_common import capture, reject_statuses


def _tokens(counts, rank):
    return counts[rank]


# Set by the dedup worker before each call (the same on every rank): 0 keeps every other test's data. Non-zero,
# every (rank, token) row is distinct (its first three columns: token % 64, token // 64 + 4 rank, the salt), so a
# row copied from the wrong token, rank or launch differs from the reference.
_X_SALT = 0


def _x(rank, tokens, hidden, dtype):
    i = torch.arange(tokens, device="cuda").view(-1, 1)
    j = torch.arange(hidden, device="cuda").view(1, -1)
    x = ((((i * 7 + j * 3 + rank * 5) % 17) - 8).to(dtype) / 8).contiguous()
    if _X_SALT and tokens and hidden >= 3:  # multiples of 1/64 in [-0.5, 0.5): exact in bf16 and fp16
        t = torch.arange(tokens, device="cuda")
        x[:, 0] = ((t % 64).float() / 64 - 0.5).to(dtype)
        x[:, 1] = (((t // 64) + 4 * rank).float() / 64 - 0.5).to(dtype)
        x[:, 2] = ((_X_SALT % 64) / 64 - 0.5)
    return x


def _w_expert(x, hidden, inter, dtype):
    i = torch.arange(hidden, device="cuda").view(-1, 1)
    j = torch.arange(inter, device="cuda").view(1, -1)
    return ((((i * 5 + j * 11 + x * 3) % 13) - 6).to(dtype) / 8).contiguous()


def _ids(kind, rank, tokens, k, experts):
    g = torch.Generator(device="cpu").manual_seed(1000 * rank + {"uniform": 1, "skewed": 2, "empty": 3,
                                                                  "empty_first": 4}[kind])
    if kind == "uniform":
        ids = torch.rand(tokens, experts, generator=g).topk(k, dim=1).indices
    elif kind == "skewed":  # expert 0 in every token's first slot
        rest = torch.rand(tokens, experts - 1, generator=g).topk(k - 1, dim=1).indices + 1
        ids = torch.cat([torch.zeros(tokens, 1, dtype=torch.long), rest], dim=1)
    elif kind == "empty":  # only even experts: every odd expert receives nothing
        ids = torch.rand(tokens, experts // 2, generator=g).topk(k, dim=1).indices * 2
    else:  # "empty_first": only odd experts, so every rank's first local expert (even) receives nothing
        ids = torch.rand(tokens, experts // 2, generator=g).topk(k, dim=1).indices * 2 + 1
    return ids.to(torch.int32).cuda()


def _weights(rank, tokens, k):
    t = torch.arange(tokens, device="cuda").view(-1, 1)
    s = torch.arange(k, device="cuda").view(1, -1)
    return (((t + 2 * s + rank) % 5 + 1).float() / 8).contiguous()


def _reference(rank, world, counts, kind, k, epr, hidden, inter, dtype):
    experts = epr * world
    y, rows, source_off, row_source = [], [], [], []
    xs = [_x(s, counts[s], hidden, dtype) for s in range(world)]
    ids = [_ids(kind, s, counts[s], k, experts) for s in range(world)]
    for j in range(epr):
        e = rank * epr + j
        parts, srcs, offs, m = [], [], [], 0
        for s in range(world):
            flat = (ids[s].view(-1) == e).nonzero().view(-1)  # (token, slot) order
            offs.append(m)
            m += flat.numel()
            parts.append(xs[s][flat // k])
            srcs.append(flat.to(torch.int32))
        offs.append(m)
        a = torch.cat(parts)
        y.append((a.float() @ _w_expert(e, hidden, inter, dtype).float()).to(dtype))
        rows.append(m)
        source_off.append(offs)
        row_source.append(torch.cat(srcs))
    # this rank's combine with z = y: out[t] = sum_slot w * (x[t] @ W_id)
    mine = ids[rank].long()
    wts = _weights(rank, counts[rank], k)
    out = torch.zeros(counts[rank], inter, device="cuda")
    for slot in range(k):
        w_all = torch.stack([_w_expert(e, hidden, inter, dtype) for e in range(experts)])  # E x H x I
        z = torch.bmm(xs[rank].float().unsqueeze(1), w_all[mine[:, slot]].float()).squeeze(1).to(dtype).float()
        out = out + wts[:, slot:slot + 1] * z
    return y, rows, source_off, row_source, out.to(dtype), ids[rank], wts


def _case(comm, counts, kind, k, epr, hidden, inter, dtype, mode, combine=True):
    rank, world = comm.rank, comm.world_size
    max_tokens = max(counts)
    x = _x(rank, counts[rank], hidden, dtype)
    w = torch.stack([_w_expert(rank * epr + j, hidden, inter, dtype) for j in range(epr)])
    y_ref, rows_ref, so_ref, rs_ref, out_ref, ids, wts = _reference(rank, world, counts, kind, k, epr, hidden, inter,
                                                                    dtype)
    y, layout = moe.moe_dispatch_gemm(comm, x, ids, w, max_tokens=max_tokens, mode=mode)
    out = moe.moe_combine(comm, y, layout, ids, wts, max_tokens=max_tokens) if combine else out_ref
    torch.cuda.synchronize()
    comm.check()
    lv = moe.layout_view(comm, layout, epr, max_tokens, k)
    offs = lv["expert_offset"].tolist()
    wrong_y = wrong_layout = 0
    for j in range(epr):
        wrong_layout += int(lv["expert_rows"][j].item() != rows_ref[j])
        wrong_layout += int(lv["source_offset"][j].tolist() != so_ref[j])
        got = y[offs[j]:offs[j] + rows_ref[j]]
        wrong_y += int((got != y_ref[j]).sum()) if got.shape == y_ref[j].shape else got.numel() + 1
        src = lv["row_source"][offs[j]:offs[j] + rows_ref[j]]
        wrong_layout += int((src != rs_ref[j]).sum()) if src.shape == rs_ref[j].shape else 1
    wrong_layout += int(lv["received"].item() != sum(rows_ref))
    return dict(kind=kind, k=k, epr=epr, mode=mode, dtype=str(dtype), tokens=counts[rank], received=sum(rows_ref),
                max_expert_rows=max(rows_ref) if rows_ref else 0, expert0_rows=rows_ref[0] if rows_ref else 0,
                wrong_y=wrong_y, wrong_layout=wrong_layout, wrong_out=int((out != out_ref).sum()))


def correctness(counts, hidden, inter, epr, cases, dtypes=("bfloat16",)):
    comm = Communicator(heap_bytes=2 << 30, timeout_s=30)
    res = []
    for name in dtypes:
        for kind, k in cases:
            for mode in ("fused", "unfused"):
                res.append(_case(comm, counts, kind, k, epr, hidden, inter, getattr(torch, name), mode))
    from tandem.ops import tp
    tp.release_workspaces(comm)
    comm.destroy()
    return res


def repeat_and_graph(counts, hidden, inter, epr, k, launches):
    comm = Communicator(heap_bytes=2 << 30, timeout_s=30)
    rank, world = comm.rank, comm.world_size
    dtype = torch.bfloat16
    mt = max(counts)
    x = _x(rank, counts[rank], hidden, dtype)
    w = torch.stack([_w_expert(rank * epr + j, hidden, inter, dtype) for j in range(epr)])
    ids = _ids("uniform", rank, counts[rank], k, epr * world)
    wts = _weights(rank, counts[rank], k)
    y0, l0 = moe.moe_dispatch_gemm(comm, x, ids, w, max_tokens=mt)
    o0 = moe.moe_combine(comm, y0, l0, ids, wts, max_tokens=mt)
    n0 = int(l0[0].item())
    same = 0
    for i in range(launches):
        y, lay = moe.moe_dispatch_gemm(comm, x, ids, w, max_tokens=mt, mode="fused" if i % 2 else "unfused")
        o = moe.moe_combine(comm, y, lay, ids, wts, max_tokens=mt)
        same += int(torch.equal(y[:n0], y0[:n0]) and torch.equal(lay, l0) and torch.equal(o, o0))
    torch.cuda.synchronize()
    # CUDA graph: capture dispatch + combine, replay with new token values in the captured input
    xs = x.clone()

    def dispatch_and_combine():
        yg, lg = moe.moe_dispatch_gemm(comm, xs, ids, w, max_tokens=mt)
        return yg, lg, moe.moe_combine(comm, yg, lg, ids, wts, max_tokens=mt)

    g, (yg, lg, og) = capture(dispatch_and_combine)
    graph_ok = []
    for scale in (1.0, 0.5, -1.0):
        xs.copy_(x * scale)
        comm.barrier()
        g.replay()
        torch.cuda.synchronize()
        ye, le = moe.moe_dispatch_gemm(comm, xs, ids, w, max_tokens=mt)
        oe = moe.moe_combine(comm, ye, le, ids, wts, max_tokens=mt)
        torch.cuda.synchronize()
        graph_ok.append(bool(torch.equal(yg[:n0], ye[:n0]) and torch.equal(og, oe) and torch.equal(lg, le)))
    comm.check()
    from tandem.ops import tp
    tp.release_workspaces(comm)
    comm.destroy()
    return dict(same=same, graph_ok=graph_ok)


def rejects():
    comm = Communicator(heap_bytes=256 << 20, timeout_s=10)
    world = comm.world_size
    epr, hidden, inter, k = 2, 64, 64, 2
    x = _x(comm.rank, 16, hidden, torch.bfloat16)
    w = torch.stack([_w_expert(j, hidden, inter, torch.bfloat16) for j in range(epr)])
    ids = _ids("uniform", comm.rank, 16, k, epr * world)
    bad = ids.clone()
    bad[3, 1] = epr * world
    cases = {
        "id_out_of_range": lambda: moe.moe_dispatch_gemm(comm, x, bad, w),
        "negative_id": lambda: moe.moe_dispatch_gemm(comm, x, bad.neg(), w),
        "k_gt_experts": lambda: moe.moe_dispatch_gemm(comm, x, torch.zeros(16, epr * world + 1, dtype=torch.int32,
                                                                           device="cuda"), w),
        "dtype": lambda: moe.moe_dispatch_gemm(comm, x, ids, w.half()),
        "float_x": lambda: moe.moe_dispatch_gemm(comm, x.float(), ids, w.float()),
        "w_shape": lambda: moe.moe_dispatch_gemm(comm, x, ids, w[:, :32]),
        "cpu": lambda: moe.moe_dispatch_gemm(comm, x.cpu(), ids, w),
        "ids_rows": lambda: moe.moe_dispatch_gemm(comm, x, ids[:8], w),
        "max_tokens": lambda: moe.moe_dispatch_gemm(comm, x, ids, w, max_tokens=8),
        "mode": lambda: moe.moe_dispatch_gemm(comm, x, ids, w, mode="fast"),
        "h_not_8": lambda: moe.moe_dispatch_gemm(comm, _x(0, 16, 60, torch.bfloat16), ids,
                                                 torch.stack([_w_expert(j, 60, inter, torch.bfloat16)
                                                              for j in range(epr)])),
        "combine_layout": lambda: moe.moe_combine(comm, torch.zeros(8, inter, dtype=torch.bfloat16, device="cuda"),
                                                  torch.zeros(5, dtype=torch.int32, device="cuda"), ids,
                                                  _weights(0, 16, k)),
    }
    out = reject_statuses(cases)
    comm.check()
    comm.destroy()
    return out


def _outcome(comm, fn):
    """fn's outcome on this rank: dict(raised, status, message, seconds); a call that launched is synchronized and
    checked, so an error the device reports counts too."""
    t0 = time.monotonic()
    try:
        fn()
        torch.cuda.synchronize()
        comm.check()
        return dict(raised=False, seconds=time.monotonic() - t0)
    except TandemError as e:
        return dict(raised=True, status=e.status, message=str(e), seconds=time.monotonic() - t0)


def _distinct_ids(tokens, k, experts):
    t = torch.arange(tokens, device="cuda").view(-1, 1)
    s = torch.arange(k, device="cuda").view(1, -1)
    return ((t + s) % experts).to(torch.int32).contiguous()


def disagree(comm_timeout_s):
    """Issue 20 point 3 for MoE: the same expert twice in one token's top-k, refused before launch (on every rank:
    every rank's ids have one); max_tokens that differ between ranks (given, or the default, the token count),
    refused on every rank naming both keys; then an agreed dispatch + combine is still right."""
    comm = Communicator(heap_bytes=256 << 20, timeout_s=comm_timeout_s)
    rank, world = comm.rank, comm.world_size
    epr, hidden, inter, k, tokens = 1, 64, 64, 2, 16
    dtype = torch.bfloat16
    x = _x(rank, tokens, hidden, dtype)
    w = torch.stack([_w_expert(rank * epr + j, hidden, inter, dtype) for j in range(epr)])
    ids = _distinct_ids(tokens, k, epr * world)
    dup_all = torch.zeros(tokens, k, dtype=torch.int32, device="cuda")  # the brief's [[0, 0], ...]
    dup_one = ids.clone()
    dup_one[5, 1] = dup_one[5, 0]
    more = 16 + 8 * rank  # token counts that differ, with the default max_tokens (= the token count)
    x_more = _x(rank, more, hidden, dtype)
    ids_more = _distinct_ids(more, k, epr * world)
    out = {
        "duplicate_all": _outcome(comm, lambda: moe.moe_dispatch_gemm(comm, x, dup_all, w, max_tokens=tokens)),
        "duplicate_one": _outcome(comm, lambda: moe.moe_dispatch_gemm(comm, x, dup_one, w, max_tokens=tokens)),
        "duplicate_unfused": _outcome(comm, lambda: moe.moe_dispatch_gemm(comm, x, dup_all, w, max_tokens=tokens,
                                                                          mode="unfused")),
        "max_tokens": _outcome(comm, lambda: moe.moe_dispatch_gemm(comm, x, ids, w,
                                                                   max_tokens=32 if rank == 0 else 64)),
        "max_tokens_unfused": _outcome(comm, lambda: moe.moe_dispatch_gemm(comm, x, ids, w, mode="unfused",
                                                                           max_tokens=32 if rank == 0 else 64)),
        "default_max_tokens": _outcome(comm, lambda: moe.moe_dispatch_gemm(comm, x_more, ids_more, w)),
    }
    # in step afterwards: an agreed dispatch + combine runs and matches torch
    out["agreed_after"] = _case(comm, [tokens] * world, "uniform", k, epr, hidden, inter, dtype, "auto")
    tp.release_workspaces(comm)
    comm.destroy()
    return out


def capacity_guard(comm_timeout_s, mode):
    """The kernel's receive capacity guard, reached by skipping the host check (as a CUDA graph capture does): the
    same expert twice in every token's top-k (one expert a rank) would send rank 0 twice its capacity. Expected: no
    rank sends anything, every layout is empty, every rank reports INVALID_ARGUMENT, and nobody waits for a
    timeout."""
    comm = Communicator(heap_bytes=256 << 20, timeout_s=comm_timeout_s)
    rank, world = comm.rank, comm.world_size
    epr, hidden, inter, k, tokens = 1, 64, 64, 2, 16
    dtype = torch.bfloat16
    x = _x(rank, tokens, hidden, dtype)
    w = torch.stack([_w_expert(rank * epr + j, hidden, inter, dtype) for j in range(epr)])
    dup_all = torch.zeros(tokens, k, dtype=torch.int32, device="cuda")
    got = {}

    def run():
        got["y"], got["layout"] = moe.run_dispatch_gemm(comm, x, dup_all, w, tokens, mode, 0, 0, check_ids=False)

    res = _outcome(comm, run)
    res["received"] = int(got["layout"][0].item()) if "layout" in got else None
    res["capacity"] = int(got["y"].shape[0]) if "y" in got else None
    tp.release_workspaces(comm)
    comm.destroy()
    return res


def late_combine(counts, hidden, inter, epr, comm_timeout_s):
    """One dispatch + combine with the communicator timeout `comm_timeout_s`, while the environment may hold some of
    this rank's combine blocks back for longer (TANDEM_MOE_COMBINE_LATE, given per rank by the test): the blocks
    that run must send every row (claims), so that no rank's wait for done[] times out. Returns _case's counts of
    wrong elements, or the error; the seconds the case took; the knob as this rank saw it."""
    comm = Communicator(heap_bytes=512 << 20, timeout_s=comm_timeout_s)
    # a first case without the knob (the kernel reads it at each launch): the first calls' costs (agreement,
    # workspaces, the references) stay out of the timed one
    late = os.environ.pop("TANDEM_MOE_COMBINE_LATE", None)
    _case(comm, counts, "uniform", 2, epr, hidden, inter, torch.bfloat16, "unfused")
    if late is not None:
        os.environ["TANDEM_MOE_COMBINE_LATE"] = late
    t0 = time.monotonic()
    try:
        res = dict(_case(comm, counts, "uniform", 2, epr, hidden, inter, torch.bfloat16, "unfused"), raised=False)
    except TandemError as e:
        res = dict(raised=True, status=e.status, message=str(e))
    res["seconds"] = time.monotonic() - t0
    res["late"] = os.environ.get("TANDEM_MOE_COMBINE_LATE")
    tp.release_workspaces(comm)
    comm.destroy()
    return res


def late_dispatch(counts, hidden, inter, epr, comm_timeout_s, mode):
    """One dispatch + grouped GEMM (no combine: its rows come back only after the whole dispatch kernel of every rank,
    late blocks included) with the communicator timeout `comm_timeout_s`, while the environment may hold some of this
    rank's dispatch blocks back for longer (TANDEM_MOE_DISPATCH_LATE, per rank from the test): the blocks that run
    must exchange the counts, write the layout and send every row (claims), so that no peer's wait for this rank's
    rows times out. Returns _case's counts of wrong elements (y and the layout), or the error; the seconds; the knob
    as this rank saw it."""
    comm = Communicator(heap_bytes=512 << 20, timeout_s=comm_timeout_s)
    late = os.environ.pop("TANDEM_MOE_DISPATCH_LATE", None)
    _case(comm, counts, "uniform", 2, epr, hidden, inter, torch.bfloat16, mode)  # agreement, workspaces, references
    if late is not None:
        os.environ["TANDEM_MOE_DISPATCH_LATE"] = late
    t0 = time.monotonic()
    try:
        res = dict(_case(comm, counts, "uniform", 2, epr, hidden, inter, torch.bfloat16, mode, combine=False),
                   raised=False)
    except TandemError as e:
        res = dict(raised=True, status=e.status, message=str(e))
    res["seconds"] = time.monotonic() - t0
    res["late"] = os.environ.pop("TANDEM_MOE_DISPATCH_LATE", None)
    tp.release_workspaces(comm)
    comm.destroy()
    return res


# ---- the whole layer (torch.ops.tandem.moe_ffn, the unfused chain) ---------------------------------------------

def swiglu_kernel(cases):
    """The SwiGLU kernel (tandem.ops.moe_layer.swiglu_received, moe.h: SwigluArgs) against moe_layer.swiglu: for
    each (capacity, inter, received, dtype), rows below min(received, capacity) must have swiglu()'s bits, and the
    rows past them must keep what out held (a sentinel): the kernel stops at the count it reads on the device."""
    from tandem._native import native
    from tandem.ops import _runtime as rt
    from tandem.ops import moe_layer

    res = []
    for capacity, inter, received, dtype_name in cases:
        dtype = getattr(torch, dtype_name)
        g = torch.Generator().manual_seed(capacity * 31 + inter)
        y = (torch.randn(capacity, 2 * inter, generator=g) * 4).to(dtype).cuda()  # |x| up to ~16: exp's range
        layout = torch.tensor([received, 7, 7, 7], dtype=torch.int32, device="cuda")
        sentinel = torch.full((capacity, inter), -3.0, dtype=dtype, device="cuda")
        out = sentinel.clone()
        args = rt.kernel_args("SwigluArgs", dtype=rt.DTYPES[dtype], y=y.data_ptr(), received=layout.data_ptr(),
                              capacity=capacity, inter=inter, out=out.data_ptr())
        native().kernels.moe_swiglu(args, torch.cuda.current_stream().cuda_stream)
        want = moe_layer.swiglu(y, inter)
        via_op = moe_layer.swiglu_received(y, layout, inter)  # the op's path (its own output)
        torch.cuda.synchronize()
        n = max(0, min(received, capacity))
        res.append(dict(capacity=capacity, inter=inter, received=received, dtype=dtype_name,
                        differ=int((out[:n] != want[:n]).sum()), tail_written=int((out[n:] != sentinel[n:]).sum()),
                        op_differ=int((via_op[:n] != want[:n]).sum())))
    return res


def _ffn_weights(experts, hidden, inter):
    """Every expert's w1 (E, H, 2 I) and w2 (E, I, H), bf16, from a CPU generator (the same on every rank)."""
    g = torch.Generator().manual_seed(77)
    w1 = (torch.randn(experts, hidden, 2 * inter, generator=g) / hidden ** 0.5).to(torch.bfloat16).cuda()
    w2 = (torch.randn(experts, inter, hidden, generator=g) / inter ** 0.5).to(torch.bfloat16).cuda()
    return w1, w2


def ffn(counts, hidden, inter, epr, cases, gemm1="tandem", gemm2=None, cluster=None):
    """moe_ffn on this rank's tokens against the layer on one device with every expert (tandem.ops.moe_layer.
    reference, fp32): relative Frobenius error per case, and a CUDA graph replay of the op equal to eager. gemm1:
    the op's GEMM 1 (moe_layer._GEMM1: tandem's grouped GEMM after the dispatch, or the dispatch alone then
    torch._grouped_mm); gemm2 / cluster: TANDEM_MOE_GEMM2 / TANDEM_MOE_GEMM_CLUSTER for the op's calls (None:
    unset), and the cluster rows of the last GroupedGemmArgs launch (GEMM 2 by tandem; 0: none in this process)."""
    from tandem._native import native
    from tandem.ops import moe_layer

    moe_layer._GEMM1 = gemm1
    for name, v in (("TANDEM_MOE_GEMM2", gemm2), ("TANDEM_MOE_GEMM_CLUSTER", cluster)):
        if v is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(v)

    comm = Communicator(heap_bytes=2 << 30, timeout_s=30)
    rank, world = comm.rank, comm.world_size
    experts = epr * world
    w1_all, w2_all = _ffn_weights(experts, hidden, inter)
    w1, w2 = w1_all[rank * epr:(rank + 1) * epr].contiguous(), w2_all[rank * epr:(rank + 1) * epr].contiguous()
    max_tokens = max(max(counts), 1)
    out = []
    for kind, k in cases:
        x = torch.randn(counts[rank], hidden, generator=torch.Generator().manual_seed(rank)).to(torch.bfloat16).cuda()
        ids = _ids(kind, rank, counts[rank], k, experts)
        wts = _weights(rank, counts[rank], k)
        got = moe_layer.moe_ffn(comm, x, ids, wts, w1, w2, max_tokens=max_tokens)
        ref = moe_layer.reference(x, ids, wts, w1_all, w2_all)
        torch.cuda.synchronize()
        comm.check()
        rel = float((got.float() - ref).norm() / ref.norm().clamp_min(1e-30)) if counts[rank] else 0.0
        out.append(dict(kind=kind, k=k, tokens=counts[rank], rel=rel, shape=list(got.shape),
                        finite=bool(torch.isfinite(got.float()).all()),
                        last_cluster_rows=int(native().kernels.moe_last_grouped_gemm_cluster_rows()),
                        gemm1_cluster_rows=int(native().kernels.moe_last_gemm_cluster_rows())))
    # a CUDA graph of the op (warm-up on a side stream first: workspaces, agreement), then new tokens and another
    # routing copied into the captured inputs: the replay must equal eager on the new inputs (the expert offsets
    # are read on the device at replay, not baked into the graph). Its own result: a capture failure
    # (torch._grouped_mm on sm90, pytorch/pytorch#169970) must not hide the cases above.
    graph_same, graph_error = None, None
    try:
        kind, k = cases[0]
        gen = torch.Generator().manual_seed(50 + rank)
        x = torch.randn(counts[rank], hidden, generator=gen).to(torch.bfloat16).cuda()
        ids, wts = _ids(kind, rank, counts[rank], k, experts), _weights(rank, counts[rank], k)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            moe_layer.moe_ffn(comm, x, ids, wts, w1, w2, max_tokens=max_tokens)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = moe_layer.moe_ffn(comm, x, ids, wts, w1, w2, max_tokens=max_tokens)
        x.copy_(torch.randn(counts[rank], hidden, generator=gen).to(torch.bfloat16))
        ids.copy_(_ids("skewed", rank, counts[rank], k, experts))
        torch.cuda.synchronize()
        comm.barrier()  # every rank's new inputs in place before any replay reads a peer's
        graph.replay()
        torch.cuda.synchronize()
        comm.check()
        eager = moe_layer.moe_ffn(comm, x, ids, wts, w1, w2, max_tokens=max_tokens)
        torch.cuda.synchronize()
        graph_same = bool(torch.equal(static, eager))
    except Exception as e:  # noqa: BLE001 - reported, the test decides
        graph_error = f"{type(e).__name__}: {str(e)[:300]}"
    os.environ.pop("TANDEM_MOE_GEMM2", None)
    os.environ.pop("TANDEM_MOE_GEMM_CLUSTER", None)
    tp.release_workspaces(comm)
    comm.destroy()
    return dict(cases=out, graph_same=graph_same, graph_error=graph_error)


def grouped_rows(dtypes):
    """tandem.ops.moe_layer.grouped_gemm_rows (moe.h: GroupedGemmArgs) on hand-made layouts: experts of 0, 1, 65,
    128, 129 and 300 rows with gaps of unused rows between them, N = 520 (a partial column tile), K = 264, exact
    data (multiples of 1/8: fp32 sums exact, one rounding) against torch per expert, in 2x1 and 1x1 clusters; the
    bits must match torch's fp32 product rounded once, and the two cluster shapes each other."""
    from tandem._native import native
    from tandem.ops import moe_layer

    K = native().kernels
    comm = Communicator(heap_bytes=64 << 20, timeout_s=30)
    rows = [65, 0, 300, 1, 128, 129]
    gap = 5
    offs, at = [], 0
    for r in rows:
        offs.append(at)
        at += r + gap
    total, n, kk = at, 520, 264
    res = []
    for name in dtypes:
        dtype = getattr(torch, name)
        i = torch.arange(total, device="cuda").view(-1, 1)
        j = torch.arange(kk, device="cuda").view(1, -1)
        a = ((((i * 7 + j * 3) % 17) - 8).to(dtype) / 8).contiguous()
        w = torch.stack([_w_expert(e, kk, n, dtype) for e in range(len(rows))])
        lv = dict(expert_rows=torch.tensor(rows, dtype=torch.int32, device="cuda"),
                  expert_offset=torch.tensor(offs + [at], dtype=torch.int32, device="cuda"))
        got = {}
        for cluster in ("2", "1"):
            os.environ["TANDEM_MOE_GEMM_CLUSTER"] = cluster
            # the free block of z's size NaN-filled first: a row or tile the kernel misses is not finite
            junk = torch.full((total, n), float("nan"), dtype=dtype, device="cuda")
            del junk
            z = moe_layer.grouped_gemm_rows(comm, a, w, lv)
            torch.cuda.synchronize()
            got[cluster] = (z, int(K.moe_last_grouped_gemm_cluster_rows()))
        os.environ.pop("TANDEM_MOE_GEMM_CLUSTER", None)
        wrong, differ, nonfinite = 0, 0, 0
        for e, (r, o) in enumerate(zip(rows, offs)):
            ref = (a[o:o + r].float() @ w[e].float()).to(dtype)
            for cluster in ("2", "1"):
                part = got[cluster][0][o:o + r]
                wrong += int((part != ref).sum())
                nonfinite += int((~torch.isfinite(part.float())).sum())
            differ += int((got["2"][0][o:o + r] != got["1"][0][o:o + r]).sum())
        # the rows between experts (and after the last) are not written: still the NaN of the fill
        gaps_written = 0
        for r, o in zip(rows, offs):
            for cluster in ("2", "1"):
                gaps_written += int(torch.isfinite(got[cluster][0][o + r:o + r + gap].float()).sum())
        res.append(dict(dtype=name, wrong=wrong, differ=differ, nonfinite=nonfinite, gaps_written=gaps_written,
                        ran=[got["2"][1], got["1"][1]], rows=sum(rows)))
    comm.destroy()
    return res


# ---- the layer's backward (torch.ops.tandem.moe_ffn's autograd: tandem.ops.moe_backward) ---------------------------

def _ffn_rank_inputs(r, counts, hidden, kind, k, experts, seed):
    """Rank r's x, ids, weights and dOut, from CPU generators (every rank rebuilds every rank's)."""
    gen = torch.Generator().manual_seed(seed + 7 * r)
    x = torch.randn(counts[r], hidden, generator=gen).to(torch.bfloat16).cuda()
    g = torch.randn(counts[r], hidden, generator=gen).to(torch.bfloat16).cuda()
    return x, _ids(kind, r, counts[r], k, experts), _weights(r, counts[r], k), g


def ffn_backward(counts, hidden, inter, epr, cases, compile_check=True):
    """Gradients of sum(moe_ffn(...) * dOut) for x, topk_weights, w1 and w2 by the op's registered autograd
    against torch autograd of moe_layer.reference (fp32) on the gathered problem (every rank rebuilds it): relative
    Frobenius errors per case (dx and d weights of this rank's tokens; dW1 and dW2 of this rank's experts). Then
    the same through torch.compile(fullgraph=True), and through torch.utils.checkpoint (recompute of the forward)."""
    from tandem.ops import moe_layer

    comm = Communicator(heap_bytes=2 << 30, timeout_s=120)  # torch.compile of the first case may keep one rank a while
    rank, world = comm.rank, comm.world_size
    experts = epr * world
    w1_all, w2_all = _ffn_weights(experts, hidden, inter)
    lo, hi = rank * epr, (rank + 1) * epr
    max_tokens = max(max(counts), 1)

    def rel(got, want):
        if want.numel() == 0:
            return 0.0
        return float((got.float() - want).norm() / want.norm().clamp_min(1e-30))

    def reference_grads(kind, k, seed):
        every = [_ffn_rank_inputs(r, counts, hidden, kind, k, experts, seed) for r in range(world)]
        x = torch.cat([e[0] for e in every]).float().requires_grad_()
        ids = torch.cat([e[1] for e in every])
        wts = torch.cat([e[2] for e in every]).float().requires_grad_()
        g = torch.cat([e[3] for e in every]).float()
        a1, a2 = w1_all.float().requires_grad_(), w2_all.float().requires_grad_()
        (moe_layer.reference(x, ids, wts, a1, a2) * g).sum().backward()
        t0 = sum(counts[:rank])
        sl = slice(t0, t0 + counts[rank])
        return every[rank], (x.grad[sl], wts.grad[sl], a1.grad[lo:hi], a2.grad[lo:hi])

    def op_grads(inputs, fn, frozen=()):
        x, ids, wts, g = inputs
        x = x.clone().requires_grad_()
        wts = wts.clone().requires_grad_()
        w1 = w1_all[lo:hi].clone().requires_grad_("w1" not in frozen)
        w2 = w2_all[lo:hi].clone().requires_grad_("w2" not in frozen)
        out = fn(x, ids, wts, w1, w2)
        out.backward(g)
        torch.cuda.synchronize()
        comm.check()
        return (x.grad, wts.grad, w1.grad, w2.grad), out

    h = tp.register(comm)

    def eager(x, ids, wts, w1, w2):
        return torch.ops.tandem.moe_ffn(x, ids, wts, w1, w2, h, "swiglu", max_tokens)

    results = []
    for kind, k in cases:
        inputs, want = reference_grads(kind, k, 300)
        got, out = op_grads(inputs, eager)
        results.append(dict(kind=kind, k=k, tokens=counts[rank], rel=[rel(a, b) for a, b in zip(got, want)],
                            finite=[bool(torch.isfinite(a.float()).all()) for a in got],
                            dtypes=[str(a.dtype) for a in got]))
    # frozen experts: the weights' grouped GEMMs are skipped (needs_input_grad); dx and d topk_weights must be the
    # same bits as with every input requiring a gradient, and the frozen weights get none
    kind, k = cases[0]
    inputs, _ = reference_grads(kind, k, 300)
    full, _ = op_grads(inputs, eager)
    frozen = {}
    for which in (("w1",), ("w2",), ("w1", "w2")):
        got, _ = op_grads(inputs, eager, frozen=which)
        frozen["+".join(which)] = dict(
            same_dx=bool(torch.equal(got[0], full[0])), same_dw=bool(torch.equal(got[1], full[1])),
            none=[got[2] is None, got[3] is None],
            same_kept=all(torch.equal(got[i], full[i]) for i, w in ((2, "w1"), (3, "w2")) if w not in which))
    extra = dict(compile_rel=None, compile_error=None, checkpoint_rel=None, checkpoint_error=None, frozen=frozen)
    kind, k = cases[0]
    inputs, want = reference_grads(kind, k, 600)
    if compile_check:
        try:
            compiled = torch.compile(eager, fullgraph=True)
            got, _ = op_grads(inputs, compiled)
            extra["compile_rel"] = [rel(a, b) for a, b in zip(got, want)]
        except Exception as e:  # noqa: BLE001 - reported, the test decides
            extra["compile_error"] = f"{type(e).__name__}: {str(e)[:400]}"
    try:
        from torch.utils.checkpoint import checkpoint

        got, _ = op_grads(inputs, lambda *a: checkpoint(eager, *a, use_reentrant=False))
        extra["checkpoint_rel"] = [rel(a, b) for a, b in zip(got, want)]
    except Exception as e:  # noqa: BLE001
        extra["checkpoint_error"] = f"{type(e).__name__}: {str(e)[:400]}"
    tp.release_workspaces(comm)
    comm.destroy()
    return dict(cases=results, **extra)


def gemm_cluster1(counts, hidden, inter, epr, cases, dtypes=("bfloat16",)):
    """The unfused GEMM in 1x1 clusters (TANDEM_MOE_GEMM_CLUSTER=1): exact data against the torch reference
    (_case, mode "unfused") with the host's record that the 1x1 kernel ran, and random data bit for bit against the
    default 2x1 kernel (same tile, mainloop and K order: the same bits), over the received rows."""
    from tandem._native import native

    K = native().kernels
    comm = Communicator(heap_bytes=2 << 30, timeout_s=30)
    rank, world = comm.rank, comm.world_size
    mt = max(counts)
    res = []
    try:
        for name in dtypes:
            dtype = getattr(torch, name)
            for kind, k in cases:
                os.environ["TANDEM_MOE_GEMM_CLUSTER"] = "1"
                c = _case(comm, counts, kind, k, epr, hidden, inter, dtype, "unfused")
                c["ran_rows"] = int(K.moe_last_gemm_cluster_rows())
                # random data: the default kernel, then the 1x1 one, on the same inputs
                g = torch.Generator(device="cuda").manual_seed(77 + rank)
                x = torch.randn(counts[rank], hidden, device="cuda", dtype=dtype, generator=g)
                w = torch.randn(epr, hidden, inter, device="cuda", dtype=dtype, generator=g) / hidden ** 0.5
                ids = _ids(kind, rank, counts[rank], k, epr * world)
                os.environ["TANDEM_MOE_GEMM_CLUSTER"] = "2"  # forced: the default follows the expected rows
                y2, lay2 = moe.moe_dispatch_gemm(comm, x, ids, w, max_tokens=mt, mode="unfused")
                torch.cuda.synchronize()
                default_rows = int(K.moe_last_gemm_cluster_rows())
                # y2 stays alive, so the 1x1 call's output cannot be y2's block; the caching allocator's free
                # block of this size is filled with NaN first, so a tile the 1x1 kernel misses shows as NaN
                junk = torch.full_like(y2, float("nan"))
                del junk
                os.environ["TANDEM_MOE_GEMM_CLUSTER"] = "1"
                y1, lay1 = moe.moe_dispatch_gemm(comm, x, ids, w, max_tokens=mt, mode="unfused")
                torch.cuda.synchronize()
                comm.check()
                n = int(lay1[0].item())
                c.update(default_rows=default_rows, random_rows=int(K.moe_last_gemm_cluster_rows()),
                         random_received=n, layouts_equal=bool(torch.equal(lay1, lay2)),
                         random_differ=int((y1[:n] != y2[:n]).sum()), random_finite=bool(torch.isfinite(y1[:n]).all()))
                res.append(c)
    finally:
        os.environ.pop("TANDEM_MOE_GEMM_CLUSTER", None)
    tp.release_workspaces(comm)
    comm.destroy()
    return res


def dedup(counts, hidden, inter, epr, cases, dtypes=("bfloat16",)):
    """TANDEM_MOE_DEDUP=1 (moe.h: DispatchArgs::dedup): each token sent once per destination rank and copied into
    its experts' rows there. moe_dispatch_gemm unfused (dedup) and fused (which sends per expert either way) against
    the torch reference (_case: layout, y, combine bit-exact), the dispatch alone (its received rows bit-exact
    against the reference's routed rows), and the rows the launch put: the number of distinct (token, destination
    rank) pairs of this rank's routing, not the number of (token, slot) pairs."""
    from tandem._native import native

    global _X_SALT
    K = native().kernels
    comm = Communicator(heap_bytes=2 << 30, timeout_s=30)
    rank, world = comm.rank, comm.world_size
    mt = max(counts)
    res = []
    os.environ["TANDEM_MOE_DEDUP"] = "1"
    try:
        for name in dtypes:
            dtype = getattr(torch, name)
            for kind, k in cases:
                ids = _ids(kind, rank, counts[rank], k, epr * world)
                want_rows = sum(len(set((ids[t] // epr).tolist())) for t in range(counts[rank]))
                # unfused three times in a row (new data each time: a row left from the previous launch in the
                # token buffer differs), then fused (per expert) on the same workspace, then unfused again
                for mode in ("unfused", "unfused", "unfused", "fused", "unfused"):
                    _X_SALT += 1
                    c = _case(comm, counts, kind, k, epr, hidden, inter, dtype, mode)
                    c["sent"] = int(K.moe_dispatch_rows_sent(moe.last_dispatch_workspace[rank]))
                    c["want_sent"] = want_rows
                    c["pairs"] = counts[rank] * k
                    res.append(c)
                # the dispatch alone (moe_ffn's backward's launch) with dedup
                _X_SALT += 1
                x = _x(rank, counts[rank], hidden, dtype)
                rows, layout = moe.dispatch_rows(comm, x, ids, epr, mt)
                torch.cuda.synchronize()
                comm.check()
                xs = [_x(s_, counts[s_], hidden, dtype) for s_ in range(world)]
                all_ids = [_ids(kind, s_, counts[s_], k, epr * world) for s_ in range(world)]
                ref = torch.cat([xs[s_][(all_ids[s_].view(-1) == rank * epr + j).nonzero().view(-1) // k]
                                 for j in range(epr) for s_ in range(world)])
                n = int(layout[0].item())
                res.append(dict(kind=kind, k=k, mode="dispatch", dtype=name, received=n,
                                wrong_rows=int((rows[:n] != ref).sum()) if rows[:n].shape == ref.shape else -1,
                                sent=int(K.moe_dispatch_rows_sent(moe.last_dispatch_workspace[rank])),
                                want_sent=want_rows))
    finally:
        os.environ.pop("TANDEM_MOE_DEDUP", None)
        _X_SALT = 0
    tp.release_workspaces(comm)
    comm.destroy()
    return res
