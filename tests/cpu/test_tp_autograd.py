"""The TP ops' autograd (tandem.ops.tp_autograd), on the CPU: traced forward + backward of a column-then-row
block through the fake implementations, with a stand-in communicator. What runs on a GPU is
tests/gpu/test_tp_train.py; this checks which ops the backward is made of and the gradients' shapes."""

import types

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tandem.ops  # noqa: F401 - registers the ops and their autograd
from tandem.ops import tp


def _stand_in(world=4, rank=1):
    return types.SimpleNamespace(world_size=world, rank=rank, device=0, destroyed=False)


def _ops_in(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and "tandem" in str(n.target)]


@pytest.mark.parametrize("world", [1, 2, 4])
def test_backward_of_a_column_then_row_block_uses_tandem_ops(world):
    h = tp.register(_stand_in(world))
    m_local, d, f_local = 16, 32, 64

    def step(x, w1, w2):
        y = torch.ops.tandem.ag_gemm(x, w1, h)                        # (W m_local, f_local)
        z = torch.ops.tandem.gemm_rs(torch.relu(y), w2, h, "auto", 0, 0)  # (m_local, d)
        return torch.autograd.grad(z.float().square().sum(), (x, w1, w2))

    args = [torch.randn(*s, dtype=torch.bfloat16, requires_grad=True)
            for s in ((m_local, d), (d, f_local), (f_local, d))]
    gm = make_fx(step, tracing_mode="fake")(*args)
    ops = _ops_in(gm)
    # forward: AG+GEMM, GEMM+RS; backward of gemm_rs: the fused AG+GEMM returning the gathered dY; backward of
    # ag_gemm: the gather of X, then the GEMM+RS for dX with the wgrad GEMM beside it (one op)
    assert ops == ["tandem.ag_gemm.default", "tandem.gemm_rs.default", "tandem.ag_gemm_gathered.default",
                   "tandem.all_gather_rows.default", "tandem.gemm_rs_beside_wgrad.default"], ops
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    shapes = [tuple(o.meta["val"].shape) for o in out]
    assert shapes == [(m_local, d), (d, f_local), (f_local, d)], shapes


def test_backward_of_gemm_ar_needs_no_communication():
    h = tp.register(_stand_in(4))

    def step(x, w):
        return torch.autograd.grad(torch.ops.tandem.gemm_ar(x, w, h).float().sum(), (x, w))

    gm = make_fx(step, tracing_mode="fake")(torch.randn(8, 32, dtype=torch.float16, requires_grad=True),
                                            torch.randn(32, 16, dtype=torch.float16, requires_grad=True))
    assert _ops_in(gm) == ["tandem.gemm_ar.default"]


def test_only_the_gradients_asked_for_are_computed():
    h = tp.register(_stand_in(4))

    def dx_only(x, w):  # the weight is frozen: no gather of X for dW
        return torch.autograd.grad(torch.ops.tandem.ag_gemm(x, w, h).float().sum(), (x,))

    x = torch.randn(8, 32, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(32, 16, dtype=torch.bfloat16)
    assert _ops_in(make_fx(dx_only, tracing_mode="fake")(x, w)) == ["tandem.ag_gemm.default",
                                                                    "tandem.gemm_rs.default"]

    def dw_only(x, w):  # gemm_rs with a frozen input: dW from the gathered dY alone
        return torch.autograd.grad(torch.ops.tandem.gemm_rs(x, w, h, "auto", 0, 0).float().sum(), (w,))

    x = torch.randn(16, 32, dtype=torch.bfloat16)
    w = torch.randn(32, 16, dtype=torch.bfloat16, requires_grad=True)
    assert _ops_in(make_fx(dw_only, tracing_mode="fake")(x, w)) == ["tandem.gemm_rs.default",
                                                                    "tandem.all_gather_rows.default"]


def test_nn_layers_hold_the_shards_of_the_seeded_linear():
    import tandem.nn as tnn
    from tandem.errors import TandemError
    from tandem.nn import _full_linear

    comm = _stand_in(world=4, rank=1)
    col = tnn.ColumnParallelLinear(comm, 64, 32, seed=3, dtype=torch.float32, device="cpu")
    full = _full_linear(64, 32, True, 3)
    assert col.weight.shape == (64, 8) and torch.equal(col.weight, full.weight[8:16].t())
    assert torch.equal(col.bias, full.bias[8:16])
    # the same seed on one GPU: torch.manual_seed(3) then torch.nn.Linear(64, 32)
    torch.manual_seed(3)
    assert torch.equal(torch.nn.Linear(64, 32).weight, full.weight)
    row = tnn.RowParallelLinear(comm, 32, 64, bias=False, seed=4, dtype=torch.float32, device="cpu")
    full2 = _full_linear(32, 64, False, 4)
    assert row.weight.shape == (8, 64) and torch.equal(row.weight, full2.weight[:, 8:16].t())
    row_ar = tnn.RowParallelLinear(comm, 32, 64, bias=True, sequence_parallel=False, seed=4, dtype=torch.float32,
                                   device="cpu")
    assert torch.equal(row_ar.bias, _full_linear(32, 64, True, 4).bias)
    with pytest.raises(TandemError, match=r"out_features \(30\) must be a multiple of the world size \(4\)"):
        tnn.ColumnParallelLinear(comm, 64, 30, device="cpu")
    sp = tnn.RowParallelLinear(comm, 32, 64, bias=True, seed=4, dtype=torch.float32, device="cpu")
    assert torch.equal(sp.bias, _full_linear(32, 64, True, 4).bias)  # replicated on every rank
    with pytest.raises(TandemError, match=r"x must be \(tokens / world, 64\)"):
        col(torch.zeros(4, 32))


def test_nn_layers_refuse_parameters_of_another_shard_before_any_launch():
    import tandem.nn as tnn
    from tandem.errors import TandemError

    comm = _stand_in(world=4, rank=1)
    col = tnn.ColumnParallelLinear(comm, 64, 32, seed=3, dtype=torch.float32, device="cpu")
    row = tnn.RowParallelLinear(comm, 32, 64, seed=4, dtype=torch.float32, device="cpu")
    # a checkpoint sharded over 2 ranks, loaded on 4: tandem's error names the world it was made for
    two = _stand_in(world=2, rank=1)
    col2 = tnn.ColumnParallelLinear(two, 64, 32, seed=3, dtype=torch.float32, device="cpu")
    row2 = tnn.RowParallelLinear(two, 32, 64, seed=4, dtype=torch.float32, device="cpu")
    with pytest.raises(TandemError, match=r"weight must be \(64, 8\).*got \(64, 16\): a shard for a world of 2, not 4") as e:
        col.load_state_dict(col2.state_dict())
    assert e.value.status == 3
    with pytest.raises(TandemError, match=r"weight must be \(8, 64\).*got \(16, 64\): a shard for a world of 2, not 4"):
        row.load_state_dict(row2.state_dict())
    row.load_state_dict(tnn.RowParallelLinear(comm, 32, 64, seed=9, dtype=torch.float32, device="cpu").state_dict())
    # a parameter replaced by hand: refused in forward, before the op (no launch on this stand-in could happen)
    calls = []
    col.weight = torch.nn.Parameter(torch.zeros(64, 9))
    with pytest.raises(TandemError, match=r"weight must be \(64, 8\)"):
        calls.append(col(torch.zeros(4, 64)))
    row.bias = torch.nn.Parameter(torch.zeros(32))
    with pytest.raises(TandemError, match=r"bias must be \(64,\)"):
        calls.append(row(torch.zeros(16, 8)))
    assert calls == []


def test_bench_trains_naive_baseline_has_the_right_gradients():
    # bench train's naive baseline writes the block's backward by hand; at world 1 (identity collectives) it must
    # equal torch's autograd of the same block
    from tandem.bench.train import naive_block

    torch.manual_seed(0)
    t, hdim, f = 12, 16, 8
    x, dy = torch.randn(t, hdim, dtype=torch.float64), torch.randn(t, hdim, dtype=torch.float64)
    w_gu = torch.randn(hdim, 2 * f, dtype=torch.float64)
    w_down = torch.randn(f, hdim, dtype=torch.float64)
    part = torch.empty(t, hdim, dtype=torch.float64)
    y, dx, dw_gu, dw_down = naive_block(x, dy, w_gu, w_down, f, lambda r, which: r, lambda fn: fn(part),
                                        lambda: part.clone())
    xr, gr, dr = (v.clone().requires_grad_(True) for v in (x, w_gu, w_down))
    h = xr @ gr
    yr = (torch.nn.functional.silu(h[:, :f]) * h[:, f:]) @ dr
    yr.backward(dy)
    for got, want in ((y, yr), (dx, xr.grad), (dw_gu, gr.grad), (dw_down, dr.grad)):
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-10)


def test_sequence_parallel_bias_gradient_is_summed_over_the_ranks():
    h = tp.register(_stand_in(4))

    def step(x, w, b):
        y = torch.ops.tandem.sp_bias_add(torch.ops.tandem.gemm_rs(x, w, h, "auto", 0, 0), b, h)
        return torch.autograd.grad(y.float().sum(), (b,))

    gm = make_fx(step, tracing_mode="fake")(torch.randn(16, 32, dtype=torch.bfloat16),
                                            torch.randn(32, 24, dtype=torch.bfloat16),
                                            torch.randn(24, dtype=torch.bfloat16, requires_grad=True))
    assert _ops_in(gm) == ["tandem.gemm_rs.default", "tandem.sp_bias_add.default",
                           "tandem.all_gather_rows.default"], _ops_in(gm)
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    assert tuple(out[0].meta["val"].shape) == (24,)


# ---- the backward formulas in exact arithmetic: a simulated world of threads ------------------------------------
#
# The collectives get CPU kernels for this test only (a test-local torch.library registration on the CPU key,
# which takes precedence over the ops' CompositeExplicitAutograd kernels): each rank is a thread, and a collective
# exchanges the ranks' tensors through a barrier. The registered autograd (tandem.ops.tp_autograd) runs on top
# unchanged, in float64, so a TP block's gradients must equal autograd on the whole model to rounding (1e-12),
# not to bf16's 1e-2: every transpose, shard and sum of the backward formulas is checked exactly.

import threading  # noqa: E402

from tandem.ops import _runtime as _rt  # noqa: E402


class _World:
    def __init__(self, n):
        self.n = n
        self.barrier = threading.Barrier(n, timeout=60)
        self.slots = [None] * n

    def exchange(self, rank, t):
        self.slots[rank] = t
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()  # every rank has read before any writes again
        return out


def _sim_kernels(world):
    lib = torch.library.Library("tandem", "IMPL")

    def me(comm):
        c = _rt.comm_from_handle(comm, "sim")
        return c.rank, c.world_size

    def gather(t, comm):
        r, _ = me(comm)
        return torch.cat(world.exchange(r, t), 0)

    def reduce(t, comm):
        r, _ = me(comm)
        return sum(world.exchange(r, t))

    def ag_gemm(a_local, b, comm, mode="auto", comm_blocks=0, sm_count=0):
        return gather(a_local, comm) @ b

    def gemm_rs(a, b, comm, mode="auto", comm_blocks=0, sm_count=0):
        r, w = me(comm)
        total = reduce(a @ b, comm)
        m = total.shape[0] // w
        return total[r * m:(r + 1) * m].clone()

    def gemm_ar(a, b, comm, mode="auto", comm_blocks=0, sm_count=0):
        return reduce(a @ b, comm)

    def all_gather_rows(a_local, comm):
        return gather(a_local, comm)

    def ag_gemm_gathered(a_local, b, comm, mode="auto", comm_blocks=0, sm_count=0):
        g = gather(a_local, comm)
        return g @ b, g

    def gemm_rs_beside_wgrad(dy, w_t, x_all, comm, mode="auto", sm_count=0):
        return torch.ops.tandem.gemm_rs(dy, w_t, comm, mode, 0, sm_count), x_all.t() @ dy

    for name, fn in (("ag_gemm", ag_gemm), ("gemm_rs", gemm_rs), ("gemm_ar", gemm_ar),
                     ("all_gather_rows", all_gather_rows), ("ag_gemm_gathered", ag_gemm_gathered),
                     ("gemm_rs_beside_wgrad", gemm_rs_beside_wgrad)):
        lib.impl(name, fn, "CPU")
    return lib


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("sequence_parallel", [True, False])
def test_tp_block_gradients_equal_the_whole_models_in_float64(world, sequence_parallel):
    import tandem.nn as tnn
    from tandem.nn import _full_linear

    tokens, d, f = 12 * world, 16, 8 * world
    torch.manual_seed(world)
    X = torch.randn(tokens, d, dtype=torch.float64)
    G = torch.randn(tokens, d, dtype=torch.float64)
    # the whole model
    l1 = _full_linear(d, f, True, 1).double()
    l2 = _full_linear(f, d, True, 2).double()
    Xr = X.clone().requires_grad_(True)
    (l2(torch.nn.functional.gelu(l1(Xr))) * G).sum().backward()

    sim = _World(world)
    lib = _sim_kernels(sim)
    results, errors = [None] * world, []

    # the layers are made here, one rank after the other: their seeded init draws from torch's global generator
    layers = []
    for r in range(world):
        comm = types.SimpleNamespace(world_size=world, rank=r, device=0, destroyed=False,
                                     native=types.SimpleNamespace(heap_base=0, heap_bytes=0))
        layers.append((tnn.ColumnParallelLinear(comm, d, f, seed=1, dtype=torch.float64, device="cpu"),
                       tnn.RowParallelLinear(comm, f, d, seed=2, dtype=torch.float64, device="cpu",
                                             sequence_parallel=sequence_parallel)))

    def rank_body(r):
        try:
            col, row = layers[r]
            tl = tokens // world
            rows = slice(r * tl, (r + 1) * tl)
            x = X[rows].clone().requires_grad_(True)
            z = row(torch.nn.functional.gelu(col(x)))
            gz = G[rows] if sequence_parallel else G  # without SP every rank holds every row: its loss is the loss
            (z * gz).sum().backward()
            results[r] = dict(z=z.detach(), dx=x.grad, dw1=col.weight.grad, db1=col.bias.grad, dw2=row.weight.grad,
                              db2=row.bias.grad, out_local=col.out_local, in_local=row.in_local)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append((r, e))
            sim.barrier.abort()

    threads = [threading.Thread(target=rank_body, args=(r,)) for r in range(world)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        lib._destroy()
    assert not errors, errors
    for r, res in enumerate(results):
        tl = tokens // world
        cols = slice(r * res["out_local"], (r + 1) * res["out_local"])
        ins = slice(r * res["in_local"], (r + 1) * res["in_local"])
        z_ref = l2(torch.nn.functional.gelu(l1(X))).detach()
        want = dict(z=z_ref[r * tl:(r + 1) * tl] if sequence_parallel else z_ref, dx=Xr.grad[r * tl:(r + 1) * tl],
                    dw1=l1.weight.grad[cols].t(), db1=l1.bias.grad[cols], dw2=l2.weight.grad[:, ins].t(),
                    db2=l2.bias.grad)
        for name, ref in want.items():
            err = float((res[name] - ref).abs().max())
            # the SP bias's gradient is summed through the gather of fp32 row sums (moved as 16-bit words):
            # float32 rounding there, exact elsewhere
            bound = 1e-5 if (name == "db2" and sequence_parallel) else 1e-12
            assert err < bound, (r, name, err)


def test_bench_train_plots_every_mode(tmp_path):
    pytest.importorskip("matplotlib")
    from tandem.bench import train

    rows = [dict(tokens=t, hidden=64, ffn=128, world=2, fused_ms=2.0, unfused_ms=1.5, auto_ms=1.4,
                 auto_serial_wgrad_ms=None, naive_ms=1.8) for t in (8, 16)]
    path = tmp_path / "train_w2.png"
    train.plot(rows, 2, str(path))
    assert path.stat().st_size > 1000
