"""AG+GEMM, GEMM+RS and GEMM+AR against what a user would run instead, N ranks (MPS on one GPU), same run.

Per op and shape (ms per rank, CUDA events, warm-ups, median of --reps, random bf16 data; the columns below but the
variants, the sweep and fp8 timed interleaved in --rounds rounds, so that the GPU's drift during the run falls on
every column alike; the JSON's "spread" is each column's max / min round median):
  fused         tandem's one persistent kernel (mode="fused"; the SM split of the plan or --comm-blocks)
  unfused       tandem's collective kernel and the GEMM one after the other (mode="unfused")
  pipelined     cuBLAS per chunk, the copy engines moving the chunks (mode="pipelined"; one node)
  auto          mode="auto": what the op picks by itself
  gemm_alone    cuBLAS (torch.matmul) on the rank's GEMM: the compute floor
  collective    the collective alone at its best: the faster of tandem's collective kernel alone and the plain
                torch collective over peer views (copies of the peers' rows for AG; an fp32 sum of the peers'
                partials for RS; that sum plus copies of the owners' reduced rows for AR)
  naive         cuBLAS, then the torch peer-view collective, one after the other: the simplest pipeline a user
                writes without tandem (NCCL and torch symmetric memory refuse two ranks on one GPU; on a
                multi-GPU machine the naive baseline is torch + NCCL, --naive nccl)
  naive synced  the same with a stream barrier of every rank before and after the collective, and for AR one
                between the owners' reduced rows and their gather (a correct program: the peers' buffers are
                written before they are read, and read before rewritten)
  fp8           (--fp8) the FP8 op at the same shape: tp.scaled_ag_gemm / scaled_gemm_rs / scaled_gemm_ar, e4m3
                operands with row-wise float32 scales (as torch._scaled_mm takes them), bf16 out; against the bf16
                op's auto (issue 23: FP8 faster than bf16)
Targets (issue 21): fused <= naive and fused <= 1.15 x max(gemm_alone, collective).

Shapes: M x N x K of the rank's problem as the op sees it. AG: A_local = M/W x K, B = K x N (N is the rank's
column shard). RS/AR: A = M x K/W, B = K/W x N (K is sharded). Default: the three earlier bench shapes for all
three ops, the Llama-3-70B MLP (hidden 8192, FFN 28672: AG+GEMM M x 28672/W x 8192, GEMM+RS/AR M x 8192 x 28672)
at M 2048 / 8192 / 16384, and M 256.

    python -m tandem bench tp -n 2 [--out DIR] [--shapes MxNxK,...] [--sweep] [--fp8]
"""

from __future__ import annotations

import os

# (M, N, K) for every op: the shapes of the earlier runs (docs/results.md).
SHAPES = [(8192, 4096, 8192), (16384, 8192, 4096), (1024, 4096, 8192)]
LLAMA_HIDDEN, LLAMA_FFN = 8192, 28672
LLAMA_M = (256, 2048, 8192, 16384)
OPS = ("ag_gemm", "gemm_rs", "gemm_ar")


# The table's columns, in the order of each row (plot() finds its series by name).
COLUMNS = ["shape (M x N x K)", "op", "fused ms", "unfused ms", "pipelined ms", "auto ms", "cuBLAS alone ms",
           "collective alone ms", "tandem collective ms", "torch collective ms", "naive ms", "naive synced ms",
           "fused/naive", "fused/max(GEMM, coll)", "auto/naive", "auto/naive synced", "max spread"]
# "max spread": the largest of the row's column spreads (max / min of a column's round medians, --rounds): how far
# one column's timings moved during the row; differences between columns smaller than it are noise
# bench tp --ring: the fused GEMM+RS / GEMM+AR as a ring (TANDEM_RS_RING=1), beside the default fused kernel
RING_COLUMNS = ["fused ring ms", "ring/naive", "ring/max(GEMM, coll)"]
# bench tp --ticket: the fused GEMM+RS / GEMM+AR by tickets (TANDEM_RS_TICKET=1), beside the default fused kernel
TICKET_COLUMNS = ["fused ticket ms", "ticket/naive", "ticket/unfused", "ticket/max(GEMM, coll)"]
# knobs that change what the ticket column runs, recorded in its rows (tandem tune --from-bench tables the column
# only when none but the rounds was set)
TICKET_RUN_KNOBS = ("TANDEM_RS_TICKET_ROUNDS", "TANDEM_RS_TICKET_DIRECT", "TANDEM_RS_TICKET_END_WAITERS",
                    "TANDEM_RS_ORDER", "TANDEM_TP_FUSED_SMS", "TANDEM_TP_CLAIM", "TANDEM_TP_LATE")


def cases(world: int, shapes=None) -> list:
    """[(op, m, n, k, label)]: every op at every shape, then the Llama-3-70B layers."""
    out = []
    for m, n, k in shapes or SHAPES:
        for op in OPS:
            out.append((op, m, n, k, f"{m}x{n}x{k}"))
    if shapes is None:
        for m in LLAMA_M:
            out.append(("ag_gemm", m, LLAMA_FFN // world, LLAMA_HIDDEN, f"llama70b up M{m}"))
            out.append(("gemm_rs", m, LLAMA_HIDDEN, LLAMA_FFN, f"llama70b down M{m}"))
            out.append(("gemm_ar", m, LLAMA_HIDDEN, LLAMA_FFN, f"llama70b down M{m}"))
    return out


def rank_problem(op, m, n, k, world):
    """(fn, a, b): the op and this rank's random bf16 operands for the layer M x N x K (AG: A_local = M/W x K,
    B = K x N; RS/AR: A = M x K/W, B = K/W x N). Shared with `tandem tune`."""
    import torch

    from ..ops import tp

    if op == "ag_gemm":
        rows, inner, fn = m // world, k, tp.ag_gemm
    else:
        rows, inner, fn = m, k // world, (tp.gemm_rs if op == "gemm_rs" else tp.gemm_ar)
    a = torch.randn(rows, inner, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(inner, n, device="cuda", dtype=torch.bfloat16)
    return fn, a, b


def gemm_alone_operands(op, m, n, k, a):
    """(A, out) of the rank's GEMM alone (bench tp's "cuBLAS alone", beside rank_problem's A): AG+GEMM multiplies
    the gathered M x K (random here), GEMM+RS/AR the rank's own A; out is its bf16 product, uninitialized."""
    import torch

    a_gemm = torch.randn(m, k, device="cuda", dtype=torch.bfloat16) if op == "ag_gemm" else a
    return a_gemm, torch.empty(a_gemm.shape[0], n, device="cuda", dtype=torch.bfloat16)


def rank_problem_fp8(op, m, n, k, world):
    """(fn, a, b, scale_a, scale_b): the FP8 op and this rank's random operands for the same layer as rank_problem:
    a e4m3 row-major, b e4m3 column-major (the transpose of a row-major N x K), row-wise float32 scales."""
    import torch

    from ..ops import tp

    if op == "ag_gemm":
        rows, inner, fn = m // world, k, tp.scaled_ag_gemm
    else:
        rows, inner, fn = m, k // world, (tp.scaled_gemm_rs if op == "gemm_rs" else tp.scaled_gemm_ar)
    a = (torch.randn(rows, inner, device="cuda") * 2).to(torch.float8_e4m3fn)
    b = (torch.randn(n, inner, device="cuda") * 2).to(torch.float8_e4m3fn).t()
    scale_a = torch.rand(rows, 1, device="cuda") + 0.5
    scale_b = torch.rand(1, n, device="cuda") + 0.5
    return fn, a, b, scale_a, scale_b


def _torch_collective(comm, op, m, n, k):
    """The plain torch collective over peer views (and its buffers): returns fn() -> output."""
    import torch

    world, rank = comm.world_size, comm.rank
    if op == "ag_gemm":
        ml = m // world
        a_sym = comm.empty((ml, k), torch.bfloat16)
        a_sym.copy_(torch.randn(ml, k, device="cuda", dtype=torch.bfloat16))
        views = [comm.peer_view(a_sym, q) for q in range(world)]
        gathered = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)

        def run():
            for q in range(world):
                gathered[q * ml:(q + 1) * ml].copy_(views[q])
            return gathered
        return run, a_sym
    mr = m // world
    partial = comm.empty((m, n), torch.bfloat16)
    partial.copy_(torch.randn(m, n, device="cuda", dtype=torch.bfloat16))
    views = [comm.peer_view(partial, q)[rank * mr:(rank + 1) * mr] for q in range(world)]
    reduced = comm.empty((mr, n), torch.bfloat16)
    red_views = [comm.peer_view(reduced, q) for q in range(world)]
    full = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

    def run(mid_barrier=None):
        acc = views[0].float()
        for q in range(1, world):
            acc += views[q].float()
        if op == "gemm_rs":
            return acc.to(torch.bfloat16)
        reduced.copy_(acc)
        if mid_barrier is not None:  # the synchronized pipeline: every owner wrote its reduced rows before any read
            mid_barrier()
        for q in range(world):
            full[q * mr:(q + 1) * mr].copy_(red_views[q])
        return full
    return run, (partial, reduced)


def stream_barrier(comm):
    """(fn, workspace): fn() enqueues a barrier of every rank on the current stream -- tandem's stream-ordered
    flags (kernels/stream_sync.h: advance, signal every peer, bounded wait for every peer). The naive peer-view
    pipeline needs one before it reads the peers' buffers (their GEMMs must have written them) and one after (a
    peer must not overwrite a buffer this rank still reads); without them it is not a correct program, only a
    lower bound on the pipeline's GPU time."""
    import torch

    from .._native import native

    K = native().kernels
    world, rank = comm.world_size, comm.rank
    ws = comm.zeros(8 * (1 + world), torch.uint8)  # a counter, then one flag per rank (written by that rank)
    torch.cuda.synchronize()
    comm.barrier()
    base = ws.data_ptr()
    others = [q for q in range(world) if q != rank]
    flags = [base + 8 * (1 + q) for q in others]

    def run():
        s = torch.cuda.current_stream().cuda_stream
        K.stream_advance(base, s)  # each raises TandemError if it does not run
        K.stream_signal(comm.native, base + 8 * (1 + rank), others, base, 0, s)
        K.stream_wait(comm.native, flags, others, base, 0, s)
    return run, ws


def _nccl_group(comm):
    """torch.distributed with the NCCL backend over the communicator's store (--naive nccl): the baseline of a
    multi-GPU machine. NCCL refuses two ranks on one GPU (MPS), hence the check. Not run yet: no multi-GPU machine
    was lent to this project so far."""
    import torch
    import torch.distributed as dist

    if torch.cuda.device_count() < comm.world_size and comm.native.num_nodes == 1:
        raise SystemExit(f"tandem bench tp --naive nccl: {comm.world_size} ranks but {torch.cuda.device_count()} "
                         "GPU(s) here: NCCL needs one GPU per rank (it refuses two ranks on one GPU); use --naive "
                         "peer-view on one GPU")
    if not dist.is_initialized():
        store = dist.PrefixStore("tandem/bench-nccl", comm._op_store)
        dist.init_process_group("nccl", store=store, rank=comm.rank, world_size=comm.world_size,
                                device_id=torch.device("cuda", torch.cuda.current_device()))
    return dist


def _nccl_collective(comm, op, m, n, k):
    """The NCCL collective a user pairs with cuBLAS: all_gather_into_tensor (AG), reduce_scatter_tensor (RS),
    all_reduce (AR), bf16 sums inside NCCL. Returns (fn() -> output, buffers to keep)."""
    import torch

    dist = _nccl_group(comm)
    world = comm.world_size
    if op == "ag_gemm":
        a_local = torch.randn(m // world, k, device="cuda", dtype=torch.bfloat16)
        gathered = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
        return (lambda: dist.all_gather_into_tensor(gathered, a_local)), (a_local, gathered)
    partial = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    if op == "gemm_rs":
        out = torch.empty(m // world, n, device="cuda", dtype=torch.bfloat16)
        return (lambda: dist.reduce_scatter_tensor(out, partial)), (partial, out)
    return (lambda: dist.all_reduce(partial)), partial


def run(case_list, reps, out_dir, command, comm_blocks=0, sweep=False, naive="peer-view", fp8=False, ring=False,
        ticket=False, rounds=3):
    import torch

    from .. import ops  # noqa: F401
    from ..ops import tp
    from ..transport import Communicator
    from . import common

    comm = Communicator(heap_bytes=12 << 30, timeout_s=60)
    world, rank = comm.world_size, comm.rank
    rows, data = [], []
    columns = COLUMNS + (["fp8 ms", "fp8/auto"] if fp8 else []) + (RING_COLUMNS if ring else []) + \
        (TICKET_COLUMNS if ticket else [])
    # the fused GEMM+RS / GEMM+AR variants timed beside the default fused kernel: (result key, the knob that selects
    # it, the kernels' record that it ran)
    variants = []
    if ring or ticket:
        from .._native import native

        K = native().kernels  # noqa: N806
        variants = ([("ring", "TANDEM_RS_RING", K.tp_last_fused_rs_ring)] if ring else []) + \
            ([("ticket", "TANDEM_RS_TICKET", K.tp_last_fused_rs_ticket)] if ticket else [])

    def timed(fn):
        return common.time_ranks_ms(comm, fn, warmup=3, reps=reps)

    for op, m, n, k, label in case_list:
        if m % world:
            continue
        fn, a, b = rank_problem(op, m, n, k, world)
        # the rank's GEMM for cuBLAS alone: AG multiplies the gathered M x K
        a_gemm, gemm_out = gemm_alone_operands(op, m, n, k, a)
        b_gemm = b
        coll_torch, keep = (_nccl_collective if naive == "nccl" else _torch_collective)(comm, op, m, n, k)
        r = dict(op=op, m=m, n=n, k=k, world=world, label=label, sm_count=comm.sm_count, naive_collective=naive)
        # what auto and fused (comm_blocks=0) run at this shape: the rank's problem (RS/AR: K / world)
        k_rank = k if op == "ag_gemm" else k // world
        r["auto_mode"], r["auto_comm_blocks"] = tp.auto_plan(comm, op, m, n, k_rank)
        r["fused_comm_blocks"] = comm_blocks or tp.fused_split(comm, op, m, n, k_rank, 0)
        # the main columns, interleaved in rounds (common.time_columns_ms: drift between columns timed in blocks was
        # as large as the differences between them); the variants, the sweep and FP8 are timed after, as before
        barrier, barrier_ws = (None, None) if naive == "nccl" else stream_barrier(comm)
        columns = {
            "fused": lambda: fn(comm, a, b, mode="fused", comm_blocks=comm_blocks),
            "unfused": lambda: fn(comm, a, b, mode="unfused"),
            "auto": lambda: fn(comm, a, b, mode="auto"),
            "gemm_alone": lambda: torch.matmul(a_gemm, b_gemm, out=gemm_out),
            "torch_collective": coll_torch,
            "naive": lambda: (torch.matmul(a_gemm, b_gemm, out=gemm_out), coll_torch()),
        }
        if comm.native.num_nodes == 1:
            columns["pipelined"] = lambda: fn(comm, a, b, mode="pipelined")
        if hasattr(tp, "collective_alone"):
            columns["tandem_collective"] = lambda: tp.collective_alone(comm, op, a, b)
        if barrier is not None:
            # AR: a third barrier inside the collective, between the owners' reduced rows and their gather
            columns["naive_synced"] = lambda: (torch.matmul(a_gemm, b_gemm, out=gemm_out), barrier(),
                                               coll_torch(barrier) if op == "gemm_ar" else coll_torch(), barrier())
        ms, spread = common.time_columns_ms(comm, columns, warmup=3, reps=reps, rounds=rounds)
        for name in ("fused", "unfused", "auto", "pipelined", "gemm_alone", "torch_collective", "tandem_collective",
                     "naive", "naive_synced"):
            r[f"{name}_ms"] = ms.get(name)
        r["spread"] = {name: v for name, v in spread.items() if v is not None}
        r["rounds"] = rounds
        if naive == "nccl":  # NCCL synchronizes the ranks itself
            r["naive_synced_ms"] = r["naive_ms"]
        r["collective_alone_ms"] = min((x for x in (r["torch_collective_ms"], r["tandem_collective_ms"]) if x),
                                       default=None)
        del barrier_ws
        for key, knob, ran in variants if op != "ag_gemm" else ():
            # the ring (TANDEM_RS_RING=1) or the tickets (TANDEM_RS_TICKET=1), read by the kernels' host side at every
            # launch; every rank sets it for the same calls, in the same run as the default fused kernel
            os.environ[knob] = "1"
            try:
                r[f"{key}_ms"] = timed(lambda: fn(comm, a, b, mode="fused", comm_blocks=comm_blocks))
                r[f"{key}_ran"] = bool(ran())
                if key == "ticket":  # what the column ran: its rounds (as pieces) and the knobs set beside it
                    r["ticket_rounds"] = int(K.tp_last_fused_rs_pieces()) if r["ticket_ran"] else None
                    r["ticket_knobs"] = {v: os.environ[v] for v in TICKET_RUN_KNOBS if os.environ.get(v)}
            finally:
                os.environ.pop(knob, None)
        if sweep:
            r["sweep"] = {}
            c = 2
            while c <= max(2, comm.sm_count // 4):
                r["sweep"][c] = timed(lambda: fn(comm, a, b, mode="fused", comm_blocks=c))
                c = c + 2 if c < 8 else c + 4
        if fp8:
            f8, fa, fb, fsa, fsb = rank_problem_fp8(op, m, n, k, world)
            r["fp8_ms"] = timed(lambda: f8(comm, fa, fb, fsa, fsb))
            r["fp8_over_bf16_auto"] = r["fp8_ms"] / r["auto_ms"] if r["fp8_ms"] and r["auto_ms"] else None
            del fa, fb, fsa, fsb
        bar = max(r["gemm_alone_ms"], r["collective_alone_ms"])
        if r.get("ring_ms"):
            r["ring_over_naive"] = r["ring_ms"] / r["naive_ms"]
            r["ring_over_bar"] = r["ring_ms"] / bar
        if r.get("ticket_ms"):
            r["ticket_over_naive"] = r["ticket_ms"] / r["naive_ms"]
            r["ticket_over_unfused"] = r["ticket_ms"] / r["unfused_ms"] if r["unfused_ms"] else None
            r["ticket_over_bar"] = r["ticket_ms"] / bar
        r["fused_over_naive"] = r["fused_ms"] / r["naive_ms"] if r["fused_ms"] else None
        r["fused_over_bar"] = r["fused_ms"] / bar if r["fused_ms"] else None
        r["auto_over_naive"] = r["auto_ms"] / r["naive_ms"] if r["auto_ms"] else None
        r["auto_over_naive_synced"] = r["auto_ms"] / r["naive_synced_ms"] if r["auto_ms"] and r["naive_synced_ms"] \
            else None
        comm.check()
        del keep
        tp.release_workspaces(comm)
        data.append(r)
        f = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
        g = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
        rows.append([label, op, f(r["fused_ms"]), f(r["unfused_ms"]), f(r["pipelined_ms"]), f(r["auto_ms"]),
                     f(r["gemm_alone_ms"]),
                     f(r["collective_alone_ms"]), f(r["tandem_collective_ms"]), f(r["torch_collective_ms"]),
                     f(r["naive_ms"]), f(r["naive_synced_ms"]), g(r["fused_over_naive"]), g(r["fused_over_bar"]),
                     g(r["auto_over_naive"]), g(r["auto_over_naive_synced"]),
                     g(max(r["spread"].values(), default=None))]
                    + ([f(r["fp8_ms"]), g(r["fp8_over_bf16_auto"])] if fp8 else [])
                    + ([f(r.get("ring_ms")), g(r.get("ring_over_naive")), g(r.get("ring_over_bar"))] if ring else [])
                    + ([f(r.get("ticket_ms")), g(r.get("ticket_over_naive")), g(r.get("ticket_over_unfused")),
                        g(r.get("ticket_over_bar"))] if ticket else []))
        if rank == 0:
            print(" | ".join(rows[-1]), flush=True)
            # the rows so far, after every case: a run stopped by a timeout still leaves what it measured
            part_meta = dict(common.header(command), partial=f"{len(data)} of {len(case_list)} cases")
            common.write_outputs(out_dir, f"tp_w{world}", part_meta, common.markdown_table(columns, rows), data)
    if rank == 0:
        meta = common.header(command)
        table = common.markdown_table(columns, rows)
        print(f"# tandem TP ops, world {world} ({comm.sm_count} SMs a rank) — {meta['device']}, commit "
              f"{meta['commit']}, {meta['date']}")
        print(table)
        common.write_outputs(out_dir, f"tp_w{world}", meta, table, data)
        if out_dir:
            plot(rows, world, os.path.join(out_dir, f"tp_w{world}.png"))
    comm.destroy()


def plot(rows, world, path):
    """Grouped bars per case: fused / unfused / auto / naive / cuBLAS alone (ms)."""
    from . import common

    def num(x):
        return float(x) if x != "-" else 0.0

    common.grouped_bars(path, [f"{r[1]}\n{r[0]}" for r in rows],
                        [(name, [num(r[col]) for r in rows])
                         for name, col in ((n, COLUMNS.index(f"{n} ms")) for n in
                                           ("fused", "unfused", "pipelined", "auto", "naive", "cuBLAS alone"))],
                        "ms per rank", f"tandem TP ops vs cuBLAS + torch peer-view collective, world {world}")


def main(argv=None) -> int:
    from . import common

    ap = common.parser("tp", __doc__, reps=10)
    ap.add_argument("--shapes", default=None, help="MxNxK,... (every op at each; default: the issue's set)")
    ap.add_argument("--comm-blocks", type=int, default=0, help="fused SM split (0: the op's plan)")
    ap.add_argument("--sweep", action="store_true", help="also time fused at comm_blocks 2 .. SMs/4")
    ap.add_argument("--fp8", action="store_true", help="also time the FP8 op (row-wise scales) at each case")
    ap.add_argument("--ring", action="store_true",
                    help="also time the fused GEMM+RS / GEMM+AR as a ring (TANDEM_RS_RING=1: the reduction in the "
                         "GEMM epilogues)")
    ap.add_argument("--ticket", action="store_true",
                    help="also time the fused GEMM+RS / GEMM+AR by tickets (TANDEM_RS_TICKET=1: each tile reduced "
                         "by the last rank to finish it, no waits in the GEMM)")
    ap.add_argument("--naive", choices=("peer-view", "nccl"), default="peer-view",
                    help="the naive baseline's collective: torch over peer views (one GPU, MPS) or NCCL (one GPU a "
                         "rank)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="the main columns are timed interleaved in this many rounds (each column reps / rounds "
                         "timings a round, the order rotated every round; 1: each column in one block, as before "
                         "2026-12-07); the JSON's spread is each column's max / min round median")
    a = ap.parse_args(argv)
    rc = common.relaunch("tp", a.nprocs, argv)
    if rc is not None:
        return rc
    world = int(os.environ.get("WORLD_SIZE", "1"))
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")] if a.shapes else None
    run(cases(world, shapes), a.reps, a.out, common.command_line("tp", argv), a.comm_blocks, a.sweep, a.naive,
        fp8=a.fp8, ring=a.ring, ticket=a.ticket, rounds=a.rounds)
    return 0
