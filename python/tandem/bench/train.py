"""`tandem bench train -n N`: forward + backward of a Llama-style MLP block with tensor and sequence parallelism
(issue 24), ms per rank (CUDA events, medians, random bf16; every rank at once):

  block    x (tokens / W, hidden) -> h = AG(x) W_gate_up (tokens, 2 ffn / W) -> a = silu(h_gate) * h_up
           -> y = RS(a W_down) (tokens / W, hidden), then the backward of all of it for a given dy
  fused    tandem.nn.ColumnParallelLinear / RowParallelLinear with mode="fused" (the backward's ops fused too)
  unfused  the same layers with mode="unfused"
  auto     mode="auto"
  auto serial wgrad   mode="auto" with TANDEM_WGRAD_OVERLAP=0: the column layer's wgrad GEMM after its dgrad
           GEMM+RS on one stream instead of beside it on a side stream (what the overlap buys)
  naive    cuBLAS GEMMs and torch collectives over peer views with the same math, autograd by hand, and
           tandem's stream barrier around every exchange (a correct program: a rank reads a peer's buffer only
           after the peer wrote it, and overwrites its own only after every peer read it)
  naive compute only   naive's GEMMs and elementwise work with its exchanges left out (no copy, no sum, no
           barrier; the results are wrong, the time is what no communication costs). naive / this is the most any
           overlap of naive's communication can gain while the GEMMs run at cuBLAS's speed: "overlap ceiling".
           Where it is below 1.15, the target can only be met by GEMMs faster than cuBLAS's (on one GPU under
           MPS the "network" is the GPU's own memory, so communication is a small part of the step).

Target (issue 24): fused >= 1.15x naive at world 4, tokens 16384, and never slower than unfused.

    python -m tandem bench train -n 4 [--tokens 8192,16384] [--hidden 8192] [--ffn 28672] [--reps 5] [--out DIR]
"""

from __future__ import annotations

import os

COLUMNS = ["tokens", "hidden", "ffn", "fused ms", "unfused ms", "auto ms", "auto serial wgrad ms", "naive ms",
           "naive compute only ms", "naive/fused", "unfused/fused", "naive/auto", "overlap ceiling"]


def naive_block(x, dy, w_gu, w_down, ffn_local, all_gather, write_partial, reduce_scatter):
    """The block's forward and backward by hand: (y, dx, dW_gate_up, dW_down). all_gather(rows, which) -> every
    rank's rows; write_partial(fn) runs fn(out) with the partial buffer; reduce_scatter() -> this rank's rows of
    the sum of the ranks' partials. (At world 1 all three are the identity: tests/cpu checks this against torch's
    autograd.)"""
    import torch

    X = all_gather(x, "x").clone()  # kept for dW_gate_up
    h = X @ w_gu
    g, u = h[:, :ffn_local], h[:, ffn_local:]
    sg = torch.nn.functional.silu(g)
    a = sg * u
    write_partial(lambda out: torch.matmul(a, w_down, out=out))
    y = reduce_scatter()
    DY = all_gather(dy, "dy")
    da = DY @ w_down.t()
    dw_down = a.t() @ DY
    wide = torch.promote_types(g.dtype, torch.float32)  # bf16 in the bench: the derivative in fp32
    g32, sig = g.to(wide), torch.sigmoid(g.to(wide))
    dg = (da.to(wide) * u.to(wide) * sig * (1 + g32 * (1 - sig))).to(da.dtype)  # silu'(g) = s (1 + g (1 - s))
    du = da * sg
    dh = torch.cat([dg, du], dim=1)
    dw_gu = X.t() @ dh
    write_partial(lambda out: torch.matmul(dh, w_gu.t(), out=out))
    dx = reduce_scatter()
    return y, dx, dw_gu, dw_down


def _naive_step(comm, tl, hidden, ffn_local, w_gu, w_down, barrier, compute_only=False):
    """fn(x, dy) -> naive_block's outputs, its exchanges over peer views between tandem's stream barriers.
    compute_only: the exchanges left out (all_gather returns the gathered buffer as it is, reduce_scatter this
    rank's rows of its own partial, no barrier): the same GEMMs and elementwise work, wrong results, for timing."""
    import torch

    world, rank = comm.world_size, comm.rank
    tokens = tl * world
    rows = slice(rank * tl, (rank + 1) * tl)
    syms = {"x": comm.empty((tl, hidden), torch.bfloat16), "dy": comm.empty((tl, hidden), torch.bfloat16)}
    views = {k: [comm.peer_view(t, q) for q in range(world)] for k, t in syms.items()}
    part = comm.empty((tokens, hidden), torch.bfloat16)
    part_views = [comm.peer_view(part, q)[rows] for q in range(world)]
    gathered = torch.empty(tokens, hidden, dtype=torch.bfloat16, device="cuda")

    def all_gather(t, which):
        if compute_only:
            return gathered
        syms[which].copy_(t)
        barrier()  # every rank wrote its rows
        for q in range(world):
            gathered[q * tl:(q + 1) * tl].copy_(views[which][q])
        barrier()  # every rank read them: the buffer may be written again
        return gathered

    def write_partial(fn):
        fn(part)

    def reduce_scatter():
        if compute_only:
            return part[rows].clone()
        barrier()  # every rank wrote its partial
        acc = part_views[0].float()
        for q in range(1, world):
            acc += part_views[q].float()
        out = acc.to(torch.bfloat16)
        barrier()  # every rank read its rows of every partial
        return out

    def step(x, dy):
        return naive_block(x, dy, w_gu, w_down, ffn_local, all_gather, write_partial, reduce_scatter)
    return step, (syms, part)


def run(tokens_list, hidden, ffn, reps, out_dir, command):
    import torch

    import tandem.nn as tnn

    from ..ops import tp
    from ..transport import Communicator
    from . import common
    from .tp import stream_barrier

    comm = Communicator(heap_bytes=8 << 30, timeout_s=120)
    world, rank = comm.world_size, comm.rank
    if ffn % world or (ffn // world) % 8:
        raise SystemExit(f"ffn ({ffn}) must be a multiple of 8 x the world size ({world}): 16-byte rows per rank")
    ffn_local = ffn // world
    barrier, _keep = stream_barrier(comm)
    rows, data = [], []

    def timed(fn):
        return common.time_ranks_ms(comm, fn, warmup=2, reps=reps)

    for tokens in tokens_list:
        if tokens % world:
            continue
        tl = tokens // world
        x = torch.randn(tl, hidden, device="cuda", dtype=torch.bfloat16).requires_grad_(True)
        dy = torch.randn(tl, hidden, device="cuda", dtype=torch.bfloat16)
        r = dict(tokens=tokens, hidden=hidden, ffn=ffn, world=world)
        w_gu = w_down = None
        for name in ("fused", "unfused", "auto", "auto_serial_wgrad"):
            mode = name.split("_")[0]
            # gate and up as one column layer: this rank's 2 ffn / W columns, gate first
            col = tnn.ColumnParallelLinear(comm, hidden, 2 * ffn, bias=False, seed=None, mode=mode)
            row = tnn.RowParallelLinear(comm, ffn, hidden, bias=False, seed=None, mode=mode)
            w_gu, w_down = col.weight, row.weight

            def step(col=col, row=row):
                for p_ in (x, col.weight, row.weight):
                    p_.grad = None
                h = col(x)
                y = row(torch.nn.functional.silu(h[:, :ffn_local]) * h[:, ffn_local:])
                y.backward(dy)

            if name == "auto_serial_wgrad":
                os.environ["TANDEM_WGRAD_OVERLAP"] = "0"  # read at each call of the backward's op
            try:
                r[f"{name}_ms"] = timed(step)
            finally:
                os.environ.pop("TANDEM_WGRAD_OVERLAP", None)
            del col, row
        naive, _bufs = _naive_step(comm, tl, hidden, ffn_local, w_gu.detach(), w_down.detach(), barrier)
        r["naive_ms"] = timed(lambda: naive(x.detach(), dy))
        del naive, _bufs
        compute, _bufs = _naive_step(comm, tl, hidden, ffn_local, w_gu.detach(), w_down.detach(), barrier,
                                     compute_only=True)
        r["naive_compute_only_ms"] = timed(lambda: compute(x.detach(), dy))
        del compute, _bufs
        c = r["naive_compute_only_ms"]
        r["overlap_ceiling"] = r["naive_ms"] / c if c and r["naive_ms"] else None
        f = r["fused_ms"]
        r["naive_over_fused"] = r["naive_ms"] / f if f and r["naive_ms"] else None
        r["unfused_over_fused"] = r["unfused_ms"] / f if f and r["unfused_ms"] else None
        a = r["auto_ms"]
        r["naive_over_auto"] = r["naive_ms"] / a if a and r["naive_ms"] else None
        data.append(r)
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        g = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
        rows.append([str(tokens), str(hidden), str(ffn), fmt(r["fused_ms"]), fmt(r["unfused_ms"]), fmt(r["auto_ms"]),
                     fmt(r["auto_serial_wgrad_ms"]), fmt(r["naive_ms"]), fmt(r["naive_compute_only_ms"]),
                     g(r["naive_over_fused"]), g(r["unfused_over_fused"]), g(r["naive_over_auto"]),
                     g(r["overlap_ceiling"])])
        if rank == 0:
            print(" | ".join(rows[-1]), flush=True)
            part_meta = dict(common.header(command), partial=f"{len(data)} of {len(tokens_list)} cases")
            common.write_outputs(out_dir, f"train_w{world}", part_meta, common.markdown_table(COLUMNS, rows), data)
        tp.release_workspaces(comm)
    if rank == 0:
        meta = common.header(command)
        table = common.markdown_table(COLUMNS, rows)
        print(f"# tandem TP MLP block fwd+bwd, world {world} ({comm.sm_count} SMs a rank) — {meta['device']}, "
              f"commit {meta['commit']}, {meta['date']}")
        print(table)
        common.write_outputs(out_dir, f"train_w{world}", meta, table, data)
        if out_dir:
            plot(data, world, os.path.join(out_dir, f"train_w{world}.png"))
    comm.destroy()


def plot(data, world, path):
    """Grouped bars per token count: every mode and the naive baseline (ms per rank)."""
    from . import common

    names = ("fused", "unfused", "auto", "auto_serial_wgrad", "naive")
    common.grouped_bars(path, [f"{r['tokens']} tokens" for r in data],
                        [(n.replace("_", " "), [r.get(f"{n}_ms") or 0.0 for r in data]) for n in names],
                        "ms per rank (forward + backward)",
                        f"tandem TP MLP block (hidden {data[0]['hidden'] if data else '-'}, FFN "
                        f"{data[0]['ffn'] if data else '-'}), world {world}")


def main(argv=None) -> int:
    from . import common

    ap = common.parser("train", __doc__, reps=5)
    ap.add_argument("--tokens", default="8192,16384", help="tokens of the whole sequence, comma-separated")
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--ffn", type=int, default=28672)
    a = ap.parse_args(argv)
    rc = common.relaunch("train", a.nprocs, argv)
    if rc is not None:
        return rc
    run([int(t) for t in a.tokens.split(",")], a.hidden, a.ffn, a.reps, a.out, common.command_line("train", argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
