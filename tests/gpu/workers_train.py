"""Rank workers for tests/gpu/test_tp_train.py: a column-then-row TP MLP (tandem.nn) against the same model on
one rank with the full weights, forward and gradients."""

from __future__ import annotations

import os

import torch

import tandem.nn as tnn
from tandem.ops import tp
from tandem.transport import Communicator

from .worker_common import reject_statuses


def _rel(a, b):
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def _reference(d, f, seed1, seed2, bias2):
    """The single-GPU model with the seeds' torch.nn.Linear weights (fp32, as tandem.nn builds its shards)."""
    from tandem.nn import _full_linear

    return (_full_linear(d, f, True, seed1).cuda(), _full_linear(f, d, bias2, seed2).cuda())


def mlp_grads(cases):
    """Each case (tokens_local, d, f, dtype, sequence_parallel, variant): the TP block (both layers with a bias: the
    row layer's replicated, its gradient summed over the ranks in the sequence-parallel case)
    z = Row(gelu(Column(x))) on this rank's rows of X, loss = sum(z * G) over this rank's output rows (sequence
    parallel) or over every row once (not: every rank computes the whole z, so each rank's loss is the whole
    loss), and the reference on X in fp32. variant: "eager", "compile" (torch.compile fullgraph), "checkpoint"
    (torch.utils.checkpoint around the block) or "graph" (forward + backward captured in a CUDA graph, replayed). Relative errors of the output and every gradient
    (this rank's shard against the reference's slice)."""
    comm = Communicator(heap_bytes=1 << 30, timeout_s=30)
    rank, world = comm.rank, comm.world_size
    out = []
    for (tl, d, f, dtype_name, sp, variant) in cases:
        dtype = getattr(torch, dtype_name)
        tokens = tl * world
        g = torch.Generator(device="cuda").manual_seed(1234)
        X = torch.randn(tokens, d, device="cuda", generator=g)
        G = torch.randn(tokens, d, device="cuda", generator=g)
        col = tnn.ColumnParallelLinear(comm, d, f, bias=True, seed=1, dtype=dtype)
        row = tnn.RowParallelLinear(comm, f, d, bias=True, sequence_parallel=sp, seed=2, dtype=dtype)
        rows = slice(rank * tl, (rank + 1) * tl)
        x = X[rows].to(dtype).requires_grad_(True)

        def block(x_):
            return row(torch.nn.functional.gelu(col(x_)))

        gz = G[rows] if sp else G
        params = [col.weight, col.bias, row.weight] + ([row.bias] if row.bias is not None else [])
        if variant == "graph":
            # forward + backward captured in one CUDA graph (after two warm-up steps on a side stream: workspaces,
            # agreement, prepared calls), then replayed with this rank's real rows copied into the static input
            xs = torch.zeros_like(x).requires_grad_(True)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    for p_ in params + [xs]:
                        p_.grad = None
                    (block(xs).float() * gz).sum().backward()
            torch.cuda.current_stream().wait_stream(side)
            for p_ in params + [xs]:
                p_.grad = None
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                zs = block(xs)
                (zs.float() * gz).sum().backward()
            with torch.no_grad():
                xs.copy_(x)
            graph.replay()
            torch.cuda.synchronize()
            z, x = zs, xs
        else:
            if variant == "compile":
                run = torch.compile(block, fullgraph=True)
            elif variant == "checkpoint":
                def run(x_):
                    return torch.utils.checkpoint.checkpoint(block, x_, use_reentrant=False)
            else:
                run = block
            z = run(x)
            (z.float() * gz).sum().backward()
        torch.cuda.synchronize()
        comm.check()
        # the reference, fp32 on the full sequence
        l1, l2 = _reference(d, f, 1, 2, True)
        Xr = X.clone().requires_grad_(True)
        zr = l2(torch.nn.functional.gelu(l1(Xr)))
        (zr * G).sum().backward()
        cols = slice(rank * col.out_local, (rank + 1) * col.out_local)
        ins = slice(rank * row.in_local, (rank + 1) * row.in_local)
        c = dict(case=[tl, d, f, dtype_name, sp, variant],
                 z=_rel(z, zr[rows] if sp else zr),
                 dx=_rel(x.grad, Xr.grad[rows]),
                 dw_col=_rel(col.weight.grad, l1.weight.grad[cols].t()),
                 db_col=_rel(col.bias.grad, l1.bias.grad[cols]),
                 dw_row=_rel(row.weight.grad, l2.weight.grad[:, ins].t()))
        if row.bias is not None:
            c["db_row"] = _rel(row.bias.grad, l2.bias.grad)
        out.append(c)
    # the wgrad GEMM beside the dgrad's RS (TANDEM_WGRAD_OVERLAP, read at each call) against one after the other:
    # the same inputs give the same gradients bit for bit (count of differing elements per gradient)
    overlap_diff = {}
    col = tnn.ColumnParallelLinear(comm, 256, 768, bias=True, seed=1)
    row = tnn.RowParallelLinear(comm, 768, 256, bias=True, sequence_parallel=True, seed=2)
    g = torch.Generator(device="cuda").manual_seed(99 + rank)
    x0 = torch.randn(256, 256, device="cuda", generator=g).to(torch.bfloat16)
    gz = torch.randn(256, 256, device="cuda", generator=g)
    grads = {}
    for flag in ("1", "0"):
        os.environ["TANDEM_WGRAD_OVERLAP"] = flag
        try:
            for p_ in (col.weight, col.bias, row.weight, row.bias):
                p_.grad = None
            x = x0.clone().requires_grad_(True)
            (row(torch.nn.functional.gelu(col(x))).float() * gz).sum().backward()
            torch.cuda.synchronize()
            grads[flag] = [t.grad.clone() for t in (x, col.weight, col.bias, row.weight, row.bias)]
        finally:
            os.environ.pop("TANDEM_WGRAD_OVERLAP", None)
    for name, a, b in zip(("dx", "dw_col", "db_col", "dw_row", "db_row"), grads["1"], grads["0"]):
        overlap_diff[name] = int((a != b).sum())
    comm.check()
    # sharding round trip: the layers give back the torch.nn.Linear they were sharded from, bit for bit
    lin = torch.nn.Linear(64, 32 * world, dtype=torch.bfloat16, device="cuda")
    lin2 = torch.nn.Linear(32 * world, 64, bias=False, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():  # every rank the same weights
        for p_ in (lin.weight, lin.bias, lin2.weight):
            p_.copy_(torch.arange(p_.numel(), device="cuda").reshape(p_.shape).float().remainder(61).sub(30).div(8))
    back = tnn.ColumnParallelLinear.from_linear(comm, lin).to_linear()
    back2 = tnn.RowParallelLinear.from_linear(comm, lin2).to_linear()
    roundtrip = dict(col_weight=bool(torch.equal(back.weight, lin.weight)),
                     col_bias=bool(torch.equal(back.bias, lin.bias)),
                     row_weight=bool(torch.equal(back2.weight, lin2.weight)))
    # bad input is a clear error before any launch (the shard checks only where there are shards)
    bad = [("x without the sequence shard's width", lambda: tnn.ColumnParallelLinear(comm, 64, 8 * world)(
               torch.zeros(8, 32, dtype=torch.bfloat16, device="cuda"))),
           ("row input of the wrong width", lambda: tnn.RowParallelLinear(comm, 16 * world, 64, bias=False)(
               torch.zeros(8, 16 * world + 16, dtype=torch.bfloat16, device="cuda")))]
    def replaced_weight():
        layer = tnn.ColumnParallelLinear(comm, 64, 8 * world)
        layer.weight = torch.nn.Parameter(torch.zeros(64, 16, dtype=torch.bfloat16, device="cuda"))
        return layer(torch.zeros(8, 64, dtype=torch.bfloat16, device="cuda"))

    bad.append(("a weight of another shard shape", replaced_weight))
    if world > 1:
        bad += [("out_features not a multiple of the world", lambda: tnn.ColumnParallelLinear(comm, 64, 8 * world + 1))]
    refused = reject_statuses(dict(bad))
    tp.release_workspaces(comm)
    comm.destroy()
    return dict(cases=out, roundtrip=roundtrip, refused=refused, overlap_diff=overlap_diff)
