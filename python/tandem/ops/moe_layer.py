"""The whole MoE layer as one op (issue 26): torch.ops.tandem.moe_ffn.

    out = tandem.ops.moe_ffn(comm, x, topk_ids, topk_weights, w1, w2)

    x (T, H) this rank's tokens; topk_ids (T, k) int32/int64 and topk_weights (T, k) their experts and weights;
    w1 (E_l, H, 2 I) this rank's experts' gate and up projections (gate in columns [0, I), up in [I, 2 I));
    w2 (E_l, I, H) their down projections. E = W x E_l experts; expert e lives on rank e // E_l.
    out[t] = sum over slots s of topk_weights[t, s] * FFN_e(x[t]),  e = topk_ids[t, s],
    FFN_e(v) = (silu(v W1_e[:, :I]) * (v W1_e[:, I:])) W2_e            (activation "swiglu")

Mode "unfused" and "auto" (what runs today): the chain of tandem's MoE ops, an elementwise SwiGLU and torch's
grouped GEMM (about eight launches),
    y, layout = moe_dispatch_gemm(x, topk_ids, w1)     tokens to their experts' ranks, y = x_j W1_j per expert
    a = silu(y[:, :I]) * y[:, I:]                      tandem's kernel over the received rows only (their count
                                                       read on the device; swiglu_received)
    z = grouped GEMM a_j W2_j                          torch._grouped_mm over the layout's expert offsets (on the
                                                       device: no host sync, CUDA graphs capture it); bf16 only
    out = moe_combine(z, layout, topk_ids, topk_weights)   each row back to its token, weighted sum in fp32
Rows of the layout past the received ones hold no token; the activation and the grouped GEMM leave them
unspecified and the combine never reads them. Mode "fused" (dispatch, both GEMMs, the activation and the combine
in one persistent kernel with roles) is not built yet: asking for it is an error. "auto" is "unfused".

Autograd (moe_backward.py, registered on this op): gradients for x, topk_weights, w1 and w2 by one op,
torch.ops.tandem.moe_ffn_backward: one dispatch of [x | dOut | the weights' bits] (the kernels' Mode DISPATCH, no
GEMM), y recomputed and the GEMMs' transposes by torch._grouped_mm, SwiGLU's backward in fp32, and one combine of
[dx rows | d weights]. The forward keeps its inputs only for the backward (no y, a or z). docs/moe.md has the
schedule.
"""

from __future__ import annotations

import os

import torch

from .._native import native
from ..errors import invalid
from . import _runtime as rt
from . import moe

OP = "moe_ffn"
ACTIVATIONS = ("swiglu",)
MODES = ("auto", "unfused", "fused")


def check(comm, x, topk_ids, topk_weights, w1, w2, activation, mode, op=OP):
    """Errors before anything is launched (the MoE ops check the rest: ids, max_tokens, the ranks' agreement):
    returns (I, E_l)."""
    rank = comm.rank
    rt.check_mode(mode, MODES, op, rank)
    if mode == "fused":
        raise invalid("mode 'fused' (the whole layer in one persistent kernel) is not built yet; use 'unfused' or "
                      "'auto'", op, rank)
    if activation not in ACTIVATIONS:
        raise invalid(f"activation must be one of {ACTIVATIONS}, got {activation!r}", op, rank)
    dev = torch.device("cuda", comm.device)
    rt.check_tensor(x, "x", op, rank, dims=2, device=dev, dims_doc=" (tokens, hidden)", layout="contiguous")
    for name, w in (("w1", w1), ("w2", w2)):
        rt.check_tensor(w, name, op, rank, dims=3, device=dev, layout="contiguous")
    if x.dtype != torch.bfloat16:
        raise invalid(f"x must be bfloat16 (the unfused chain's grouped GEMM, torch._grouped_mm, takes bf16 only), "
                      f"got {x.dtype}", op, rank)
    if w1.dtype != x.dtype or w2.dtype != x.dtype:
        raise invalid(f"w1 and w2 must be {x.dtype} like x, got {w1.dtype} and {w2.dtype}", op, rank)
    tokens, hidden = x.shape
    epr, h1, two_i = w1.shape
    if h1 != hidden or two_i % 2:
        raise invalid(f"w1 must be (experts_per_rank, {hidden}, 2 I): gate and up side by side, got "
                      f"{tuple(w1.shape)}", op, rank)
    inter = two_i // 2
    if epr >= 1024:
        raise invalid(f"at most 1023 experts a rank (torch._grouped_mm's group limit), got {epr}", op, rank)
    if tuple(w2.shape) != (epr, inter, hidden):
        raise invalid(f"w2 must be ({epr}, {inter}, {hidden}) (experts_per_rank, I, H) to match w1 "
                      f"{tuple(w1.shape)}, got {tuple(w2.shape)}", op, rank)
    if inter % 8 or hidden % 8:
        raise invalid(f"H ({hidden}) and I ({inter}) must be multiples of 8 (16-byte rows)", op, rank)
    rt.check_on_device(comm, topk_weights, "topk_weights", op)
    if topk_weights.shape != topk_ids.shape:
        raise invalid(f"topk_weights {tuple(topk_weights.shape)} and topk_ids {tuple(topk_ids.shape)} differ", op,
                      rank)
    return inter, epr


def swiglu(y, inter: int):
    """silu(gate) * up of the dispatch's rows, y = [gate | up] (fp32 math, one rounding to y's dtype; one fp32
    temporary of y's rows x I: it runs on every receive-capacity row, the received count being on the device;
    float64 math for float64 y: the CPU reference of the backward)."""
    g = y[:, :inter].to(torch.float64 if y.dtype == torch.float64 else torch.float32, copy=True)
    torch.nn.functional.silu(g, inplace=True)
    g.mul_(y[:, inter:])
    return g.to(y.dtype)


# "kernel" (the default): the SwiGLU over the received rows only, by tandem's kernel (moe.h: SwigluArgs); "torch":
# swiglu() above over every receive-capacity row (the way before 2026-12-06; the issue-26 step timing compares them)
_SWIGLU = os.environ.get("TANDEM_MOE_SWIGLU", "kernel")


def swiglu_received(y, layout, inter: int, sm_count: int = 0):
    """swiglu(y, inter) on the dispatch layout's received rows (layout[0], read on the device: no host sync); the
    rows past them are left unwritten (GEMM 2 and the combine never read them). The same bits as swiglu() on those
    rows (fp32 math, one rounding; tests/gpu/test_moe.py checks it). CPU tensors and TANDEM_MOE_SWIGLU=torch take
    swiglu() over every row."""
    if not y.is_cuda or _SWIGLU == "torch" or y.dtype not in rt.DTYPES:
        return swiglu(y, inter)
    # the kernel takes dense (rows, 2 I) rows and the int32 layout on y's GPU; anything else: torch's path
    if (y.dim() != 2 or y.shape[1] != 2 * inter or not y.is_contiguous() or layout.dtype != torch.int32
            or layout.device != y.device or y.data_ptr() % 16):
        return swiglu(y, inter)
    out = torch.empty((y.shape[0], inter), dtype=y.dtype, device=y.device)
    if y.shape[0] == 0:
        return out
    args = rt.kernel_args("SwigluArgs", dtype=rt.DTYPES[y.dtype], y=y.data_ptr(), received=layout.data_ptr(),
                          capacity=y.shape[0], inter=inter, out=out.data_ptr(), sm_count=int(sm_count))
    with torch.cuda.device(y.device):  # the binding launches on the current device (no communicator to scope it)
        native().kernels.moe_swiglu(args, rt.stream_handle(y.device))
    return out


# GEMM 1 of the chain: "tandem" (moe_dispatch_gemm: the dispatch kernel, then tandem's CUTLASS grouped GEMM, whose
# 128x256 tiles in 2x1 clusters pad every expert's rows to 256: 4x the MMA work at 65 rows an expert, the DeepSeek
# config at 1,024 tokens a rank) or "torch" (the dispatch alone, the kernels' Mode DISPATCH that the backward uses,
# then torch._grouped_mm over the layout's expert offsets, as GEMM 2 runs; it chooses its tile by the rows an
# expert has). TANDEM_MOE_GEMM1 sets it; tools/device_next.sh z2 times both (issue 26).
_GEMM1 = os.environ.get("TANDEM_MOE_GEMM1", "tandem")


def gemm1(c, x, topk_ids, w1, max_tokens: int, mode: str, sm_count: int):
    """(y, layout): the dispatch and GEMM 1 (y = x_j W1_j per local expert, receive-capacity rows in the dispatch
    layout; rows past the received ones unspecified), by tandem's grouped GEMM or torch's (_GEMM1)."""
    if _GEMM1 == "torch":
        rows, layout = moe.dispatch_rows(c, x, topk_ids, w1.shape[0], max_tokens, 0, sm_count)
        lv = moe.layout_view(c, layout, w1.shape[0], max_tokens, topk_ids.shape[1])
        return torch._grouped_mm(rows, w1, offs=lv["expert_offset"][1:]), layout
    # "unfused" asks for the unfused dispatch too; "auto" lets the dispatch choose (its fused kernel at world 1)
    return moe.run_dispatch_gemm(c, x, topk_ids, w1, max_tokens, "unfused" if mode == "unfused" else "auto", 0,
                                 sm_count)


# GEMM 2 of the chain: "torch" (torch._grouped_mm over the layout's expert offsets) or "tandem" (tandem's CUTLASS
# grouped GEMM as its own launch, moe.h: GroupedGemmArgs). TANDEM_MOE_GEMM2 forces one (read at each call); by
# default the rows an expert expects under even routing decide, as they decide GEMM 1's clusters (moe_sm90.cu:
# gemm_alone_cluster_rows): at most one 128-row tile, tandem's GEMM in 1x1 clusters (2026-12-07, H100, world 2:
# 10.5 against 13.6 ms for the layer at 64 rows an expert), else torch's (20.3 against 22.6 ms at 256).
ONE_ROW_TILE_ROWS = 128


def expected_rows_per_expert(max_tokens: int, topk: int, experts_per_rank: int) -> int:
    """Rows each expert receives under even routing: max_tokens x topk x world over world x experts_per_rank (the
    same on every rank, known before launch)."""
    return -(-int(max_tokens) * int(topk) // int(experts_per_rank))


def _forced_cluster_rows() -> int:
    """TANDEM_MOE_GEMM_CLUSTER's cluster rows (1 or 2; read at each call, as the C++ side reads it at each launch),
    0 when it does not force one."""
    forced = os.environ.get("TANDEM_MOE_GEMM_CLUSTER")
    return int(forced) if forced in ("1", "2") else 0


def _gemm2_plan(expected_rows: int):
    """(kind, cluster_rows) of GEMM 2: TANDEM_MOE_GEMM2 (torch / tandem) and TANDEM_MOE_GEMM_CLUSTER (1 / 2) force
    them; otherwise tandem's in 1x1 clusters for experts of at most one row tile, torch's beyond."""
    kind = os.environ.get("TANDEM_MOE_GEMM2", "auto")
    small = expected_rows <= ONE_ROW_TILE_ROWS
    if kind not in ("torch", "tandem"):
        kind = "tandem" if small else "torch"
    return kind, _forced_cluster_rows() or (1 if small else 2)


def grouped_gemm_rows(c, a, w, lv, sm_count: int = 0, cluster_rows: int = 0):
    """z rows [offset_j, offset_j + rows_j) = a rows (the same) @ w[j] for each local expert j, rows_j and offset_j
    from the dispatch layout's view `lv` (on the device: no host sync); z has a's rows, rows outside every expert
    unspecified. tandem's grouped GEMM (moe.h: GroupedGemmArgs), any of bf16 / fp16, in 2x1 or 1x1 clusters
    (cluster_rows 2 / 1; 0: TANDEM_MOE_GEMM_CLUSTER, else 2x1)."""
    op = "moe_grouped_gemm"
    rank = getattr(c, "rank", -1)
    if a.dim() != 2 or w.dim() != 3 or a.shape[1] != w.shape[1]:
        raise invalid(f"a (rows, K) and w (experts, K, N) must agree in K, got {tuple(a.shape)} and "
                      f"{tuple(w.shape)}", op, rank)
    if a.dtype != w.dtype or a.dtype not in rt.DTYPES:
        raise invalid(f"a and w must both be bfloat16 or float16, got {a.dtype} and {w.dtype}", op, rank)
    if not (a.is_contiguous() and w.is_contiguous()) or a.device != w.device or not a.is_cuda:
        raise invalid("a and w must be contiguous and on one GPU", op, rank)
    rows, offs = lv["expert_rows"], lv["expert_offset"]
    if (rows.dtype != torch.int32 or offs.dtype != torch.int32 or rows.device != a.device
            or offs.device != a.device or rows.numel() != w.shape[0] or offs.numel() < w.shape[0]):
        raise invalid(f"the layout's expert_rows / expert_offset must be int32 on {a.device} with one entry an "
                      f"expert ({w.shape[0]})", op, rank)
    experts, k, n = w.shape
    z = torch.empty((a.shape[0], n), dtype=a.dtype, device=a.device)
    if a.shape[0] == 0:
        return z
    K = native().kernels
    if cluster_rows not in (0, 1, 2):
        raise invalid(f"cluster_rows must be 1 or 2 (0: the default), got {cluster_rows}", op, rank)
    cluster = int(cluster_rows) or _forced_cluster_rows() or 2
    args = rt.kernel_args("GroupedGemmArgs", dtype=rt.DTYPES[a.dtype], experts=experts, n=n, k=k, a=a.data_ptr(),
                          w=w.data_ptr(), d=z.data_ptr(), expert_rows=rows.data_ptr(), expert_offset=offs.data_ptr(),
                          sm_count=(int(sm_count) or c.sm_count) & ~1, cluster_rows=cluster)
    # the arrays and CUTLASS's tensormaps: device memory of this call (the caching allocator keeps it cheap)
    ws = torch.empty(K.moe_grouped_gemm_workspace_size(args), dtype=torch.uint8, device=a.device)
    args.workspace = ws.data_ptr()
    with torch.cuda.device(a.device):  # the binding launches on the current device
        K.moe_grouped_gemm(args, rt.stream_handle(a.device))
    return z


def _impl(x, topk_ids, topk_weights, w1, w2, comm, activation="swiglu", max_tokens=0, mode="auto", sm_count=0):
    c = rt.comm_from_handle(comm, OP)
    inter, epr = check(c, x, topk_ids, topk_weights, w1, w2, activation, mode)
    max_tokens = int(max_tokens) or x.shape[0]
    y, layout = gemm1(c, x, topk_ids, w1, max_tokens, mode, sm_count)
    a = swiglu_received(y, layout, inter, sm_count)
    lv = moe.layout_view(c, layout, epr, max_tokens, topk_ids.shape[1])
    kind, cluster = _gemm2_plan(expected_rows_per_expert(max_tokens, topk_ids.shape[1], epr))
    if kind == "tandem":
        z = grouped_gemm_rows(c, a, w2, lv, sm_count, cluster)
    else:
        ends = lv["expert_offset"][1:]  # each local expert's last row + 1, on the device (int32)
        z = torch._grouped_mm(a, w2, offs=ends)  # rows (H a multiple of 8: no padding) contiguous, as the combine takes
    # the ids were checked by the dispatch (one host sync); the combine does not check them again
    return moe.run_combine(c, z, layout, topk_ids, topk_weights, max_tokens, sm_count, check_ids=False)


def _fake(x, topk_ids, topk_weights, w1, w2, comm, activation="swiglu", max_tokens=0, mode="auto", sm_count=0):
    return x.new_empty((x.shape[0], w2.shape[2]))


moe_ffn_op = rt.define_op(
    OP, '(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w1, Tensor w2, SymInt comm, str activation="swiglu", '
    'SymInt max_tokens=0, str mode="auto", SymInt sm_count=0) -> Tensor', _impl, _fake)


def moe_ffn(comm, x, topk_ids, topk_weights, w1, w2, *, activation: str = "swiglu", max_tokens: int = 0,
            mode: str = "auto", sm_count: int = 0):
    """The MoE layer's output for this rank's tokens (module docstring). Every rank passes the same max_tokens
    (default: its own token count, which then must agree) and calls the op in the same order (a collective)."""
    return torch.ops.tandem.moe_ffn(x, topk_ids, topk_weights, w1, w2, rt.register(comm), activation, max_tokens,
                                    mode, sm_count)


def reference(x, topk_ids, topk_weights, w1_all, w2_all):
    """The layer on one device with every expert's weights (w1_all (E, H, 2 I), w2_all (E, I, H)), fp32 math
    (float64 if x is float64): the torch reference the tests and the bench compare with. Differentiable (torch
    autograd): the backward's tests compare with its gradients."""
    inter = w1_all.shape[2] // 2
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    out = torch.zeros(x.shape[0], w2_all.shape[2], dtype=acc, device=x.device)
    xf = x.to(acc)
    for e in topk_ids.unique().tolist():
        rows, slots = (topk_ids == e).nonzero(as_tuple=True)
        y = xf[rows] @ w1_all[e].to(acc)
        a = torch.nn.functional.silu(y[:, :inter]) * y[:, inter:]
        out = out.index_add(0, rows, topk_weights[rows, slots].to(acc).unsqueeze(1) * (a @ w2_all[e].to(acc)))
    return out
