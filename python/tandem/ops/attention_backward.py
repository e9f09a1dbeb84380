"""The backward of ring attention (issue 25), registered as torch.ops.tandem.ring_attention's autograd: dQ, dK and
dV of this rank's shard from the saved q, k, v, o and lse and the incoming dO.

This is the unfused mode: the ring's K/V blocks and the dK/dV partials move by copy engine through peer
mappings (tandem's stream-ordered flags order them across ranks, as the TP ops' pipelined mode does), and each
block's gradients come from a block backward kernel in torch, called with the *global* o and lse of the forward:
it then computes exactly that block's share of the gradients (P = exp(S - lse) is the block's columns of the
global softmax, and D = rowsum(dO * o) is the global one). The block kernel is cuDNN's SDPA backward
(aten::_scaled_dot_product_cudnn_attention_backward: about twice FlashAttention-2's rate on Hopper, where SDPA's
cuDNN backward ran at 457-551 TFLOP/s against flash's 254-324 in bench attention) or FlashAttention-2's
(aten::_scaled_dot_product_flash_attention_backward): cuDNN by default; FlashAttention-2 in the deterministic mode
(torch.use_deterministic_algorithms(True), not warn-only: torch promises FlashAttention-2's deterministic path,
not cuDNN's), where cuDNN
is missing or refuses the problem (then this shape keeps FlashAttention-2: `block_kernel_counts` says which ran),
and with TANDEM_RING_BWD_BLOCK=flash (default auto). The fused persistent backward kernel (comm roles beside an FA3-style
mainloop) is not built yet (docs/ring-attention.md has its design); this mode is its reference and what bench
attention times until then.

Schedule, rank r of W, one call (epoch e of the workspace's counter):
    copy k, v into this rank's kv_own (symmetric)            barrier A: every kv_own written, and every rank
                                                             has summed its slots of call e-1
    for s = 0 .. W-1, src = (r - s) mod W:
        K, V of src (s = 0: k, v; else a copy-engine copy of src's kv_own into one of two local stages, issued
        on a side stream one step ahead: it overlaps the previous step's block kernels)
        the one block of (query rows, key rows) the mask leaves (block_pairs; causal: the shard against itself
        causally, or a rectangle without mask):
            block backward of it -> dq rows += (fp32), dk/dv partial of src rows += (fp32)
        copy the fp32 dk/dv partial into src's slot [r] (its kv_slots, symmetric)
    barrier B: every partial written
    dk, dv = sum over the W slots in rank order (fp32), rounded once to the input dtype
dq sums its W contributions in ring-step order in fp32 and is rounded once. The sums' order is fixed, so the
result is deterministic whenever the block kernel is: FlashAttention-2's backward accumulates dQ with atomics
unless torch.use_deterministic_algorithms(True) is on, and not in warn-only mode (then it runs its deterministic
path; warn_only=True only warns and keeps the atomics); cuDNN's is not taken in that mode.

Every backward of one shape on one communicator must be issued on the same stream: the workspace's slots and
kv_own are reused in stream order (a call on another stream first waits for the stream of the previous call).

GQA / MQA: cuDNN's block kernel takes K/V with their own heads (native GQA: cuDNN's graph reduces each K/V
head's group into dK/dV; TANDEM_RING_BWD_GQA=repeat, or a shape cuDNN refuses natively, takes the old path);
FlashAttention-2's gets K and V repeated to the query heads and the repeated heads' dK/dV summed back (in
fp32). lse's gradient is not propagated (lse is an auxiliary output, as in FlashAttention).
One node only: across nodes the copies have no peer mapping (a clear error before anything runs).
"""

from __future__ import annotations

import math
import os
import warnings

import torch

from .._native import native
from ..errors import invalid
from . import _runtime as rt

OP = "ring_attention_backward"
_CTL = 4096                   # counter at 0; barrier A's flags at 1024 + 8 q; barrier B's at 2048 + 8 q
_FLAGS_A, _FLAGS_B = 1024, 2048
_MAX_WORLD = 64


def _align(n: int, a: int = 256) -> int:
    return (n + a - 1) // a * a


def block_pairs(rank: int, src: int, world: int, seq_local: int, causal: bool):
    """[(q_rows, k_rows, is_causal)]: the one block of (query rows of this rank, key rows of src's shard) that the
    mask leaves at this ring step, and whether it takes the causal mask (top-left aligned, square). Non-causal: the
    whole shard against the whole shard. Causal (zigzag): this rank holds global chunks rank and 2W - 1 - rank
    (rows [0, c) and [c, 2c) of its shard, c = S_l / 2), src the same for src; a query chunk sees a key chunk with
    a lower index whole, its own chunk causally, a higher one not at all. So each step is one rectangle:
      src == rank   the shard against itself, causally: its two chunks are in global order (rank < 2W - 1 - rank),
                    so the local causal mask is the global one (chunk r causal, 2W-1-r sees r whole and itself
                    causally);
      src < rank    every query row against src's first chunk (src < rank and src < 2W - 1 - rank), not its
                    second (2W - 1 - src > 2W - 1 - rank > rank);
      src > rank    our second chunk's rows against src's whole shard (src and 2W - 1 - src are both below
                    2W - 1 - rank), our first chunk against nothing (both are above rank).
    One block kernel call a step (before 2026-12-06: one per chunk pair, three at src == rank and two otherwise, each
    on half the rows, with an fp32 sum between them)."""
    if not causal:
        return [(slice(0, seq_local), slice(0, seq_local), False)]
    c = seq_local // 2
    if src == rank:
        return [(slice(0, 2 * c), slice(0, 2 * c), True)]
    if src < rank:
        return [(slice(0, 2 * c), slice(0, c), False)]
    return [(slice(c, 2 * c), slice(0, 2 * c), False)]


def _per_kv_head(sdpa_backward, do, q, k, v, o, lse, causal: bool, scale: float):
    """(dq, dk, dv) of one block by `sdpa_backward` (an aten SDPA backward taking (B, H, S, d) tensors with as many
    K/V heads as query heads), for (B, S, H, d) views: K/V with fewer heads than q (GQA) are repeated to q's heads
    and their gradients summed back in fp32."""
    group = q.shape[2] // k.shape[2]
    if group > 1:
        k = k.repeat_interleave(group, dim=2)
        v = v.repeat_interleave(group, dim=2)
    empty = torch.empty(0, dtype=torch.int64, device=q.device)  # philox seed/offset: unused without dropout
    dq, dk, dv = sdpa_backward(do.transpose(1, 2), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                               o.transpose(1, 2), empty, q.shape[1], k.shape[1], float(scale), bool(causal))
    dq, dk, dv = dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
    if group > 1:
        b, s, _, d = dk.shape
        dk = dk.float().reshape(b, s, -1, group, d).sum(3)
        dv = dv.float().reshape(b, s, -1, group, d).sum(3)
    return dq, dk, dv


def flash_block_backward(do, q, k, v, o, lse, causal: bool, scale: float):
    """(dq, dk, dv) of one block with the global o and lse, by FlashAttention-2's backward in torch. Tensors are
    (B, S, H, d) views (last dimension contiguous); lse (B, Hq, S_q) fp32."""
    def flash(dot, qt, kt, vt, ot, empty, max_q, max_k, sc, cz):
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dot, qt, kt, vt, ot, lse.contiguous(), None, None, max_q, max_k, 0.0, cz, empty, empty, scale=sc)
    return _per_kv_head(flash, do, q, k, v, o, lse, causal, scale)


def cudnn_block_backward(do, q, k, v, o, lse, causal: bool, scale: float, native_gqa: bool = False):
    """flash_block_backward's contract by cuDNN's SDPA backward in torch. cuDNN reads the softmax statistics as a
    (B, H, S_q, 1) fp32 tensor of natural-log logsumexp, the layout of SDPA's cuDNN forward, and aligns the causal
    mask top-left, as FlashAttention does (the ring's causal pairs are square, where the two agree anyway).

    native_gqa: K/V with fewer heads than q go to cuDNN as they are (what SDPA's cuDNN backend does with
    enable_gqa=True: cuDNN's graph reduces each K/V head's group and returns dK/dV with the K/V heads), not
    repeated to q's heads with their gradients summed back in fp32 afterwards. Why: the repeat wrote group x the
    K/V bytes and read back group x the dK/dV bytes around every block; the 8/32/8 row of bench attention (S
    2048, causal) was the furthest behind SDPA's cuDNN backward (0.40; docs/results.md)."""
    def cudnn(dot, qt, kt, vt, ot, empty, max_q, max_k, sc, cz):
        # attn_bias, cum_seq_q and cum_seq_k are undefined tensors (None): no bias, dense (not nested) inputs
        return torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            dot, qt, kt, vt, ot, lse.contiguous().unsqueeze(-1), empty, empty, None, None, None, max_q, max_k, 0.0,
            cz, scale=sc)
    if native_gqa:
        empty = torch.empty(0, dtype=torch.int64, device=q.device)
        dq, dk, dv = cudnn(do.transpose(1, 2), q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                           o.transpose(1, 2), empty, q.shape[1], k.shape[1], float(scale), bool(causal))
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
    return _per_kv_head(cudnn, do, q, k, v, o, lse, causal, scale)


# which block kernel ran, per call of a block (tests and bench read it); shapes cuDNN refused, with its reason;
# (shape, path) pairs cuDNN ran, path "native" (GQA K/V with their own heads) or "heads" (K/V with q's heads):
# their plans are built, so a CUDA graph capture may call them
block_kernel_counts = {"cudnn": 0, "flash": 0, "cudnn_gqa": 0}  # cudnn_gqa: of the cudnn calls, native GQA
cudnn_refused: dict = {}
# GQA/MQA block shapes whose native-GQA cuDNN call was refused, with the reason (they take the repeated heads)
cudnn_gqa_refused: dict = {}
_cudnn_ran: set = set()
_STICKY = tuple(t for t in (getattr(torch, "AcceleratorError", None), torch.OutOfMemoryError) if t is not None)
_GQA_CHOICES = ("native", "repeat")


def _block_choice(rank: int) -> str:
    choice = os.environ.get("TANDEM_RING_BWD_BLOCK", "auto")
    if choice not in ("auto", "flash"):
        raise invalid(f"TANDEM_RING_BWD_BLOCK must be auto or flash, got {choice!r}", OP, rank)
    gqa = os.environ.get("TANDEM_RING_BWD_GQA", "native")
    if gqa not in _GQA_CHOICES:
        raise invalid(f"TANDEM_RING_BWD_GQA must be one of {_GQA_CHOICES}, got {gqa!r}", OP, rank)
    return choice


def _cudnn_allowed(q) -> bool:
    if os.environ.get("TANDEM_RING_BWD_BLOCK", "auto") == "flash":
        return False
    if torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled():
        return False  # the deterministic mode: FlashAttention-2's deterministic path
    return (q.dtype in (torch.bfloat16, torch.float16) and torch.backends.cudnn.is_available()
            and torch.backends.cudnn.enabled)


def block_backward(do, q, k, v, o, lse, causal: bool, scale: float):
    """One block's (dq, dk, dv) by the block kernel this call may use (module docstring): cuDNN when allowed and
    it has not refused this block's shape before, else FlashAttention-2. A refusal is an error raised by cuDNN's
    graph build before anything is written; it is remembered per shape so the next call goes straight to flash.
    GQA/MQA blocks try cuDNN with K/V in their own heads first ("native"), then with K/V repeated to q's heads
    ("heads"; TANDEM_RING_BWD_GQA=repeat starts there); a native refusal is remembered per shape likewise."""
    key = (tuple(q.shape), tuple(q.stride()), tuple(k.shape), q.dtype, bool(causal))
    # a path's first cuDNN call for a shape builds its plan (host work, possibly allocations): not inside a graph
    # capture, where a refusal could leave the capture broken; under capture only a (shape, path) that ran
    # eagerly, else flash
    capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
    if key not in cudnn_refused and min(q.shape[1], k.shape[1]) == 1 and _cudnn_allowed(q):
        # torch's SDPA never gives a sequence length of 1 to cuDNN (sdp_utils check_cudnn_tensor_shapes), though
        # the frontend takes it unless both are 1; the causal rectangles have one at S_l = 2: FlashAttention-2,
        # named here like a refusal
        cudnn_refused[key] = "a sequence length of 1 (torch's SDPA does not give it to cuDNN)"
    if key not in cudnn_refused and _cudnn_allowed(q):
        paths = ["heads"]
        if (k.shape[2] != q.shape[2] and key not in cudnn_gqa_refused
                and os.environ.get("TANDEM_RING_BWD_GQA", "native") == "native"):
            paths.insert(0, "native")
        if capturing:
            paths = [pth for pth in paths if (key, pth) in _cudnn_ran]
        try:
            for pth in paths:
                try:
                    out = cudnn_block_backward(do, q, k, v, o, lse, causal, scale, native_gqa=pth == "native")
                except _STICKY:
                    raise
                except RuntimeError as e:
                    if pth != "native":
                        raise
                    # no engine for native GQA here: the repeated heads next
                    cudnn_gqa_refused[key] = str(e).splitlines()[0][:200]
                    warnings.warn(f"tandem: ring attention backward: cuDNN refused native GQA for the block q "
                                  f"{tuple(q.shape)} k {tuple(k.shape)} ({cudnn_gqa_refused[key]}); K/V heads are "
                                  "repeated to q's for it", RuntimeWarning, stacklevel=2)
                    continue
                block_kernel_counts["cudnn"] += 1
                if pth == "native":
                    block_kernel_counts["cudnn_gqa"] += 1
                _cudnn_ran.add((key, pth))
                return out
        except _STICKY:  # out of memory or a CUDA error: not a refusal
            raise
        except RuntimeError as e:  # cuDNN has no engine for this problem: its graph build fails before any launch
            cudnn_refused[key] = str(e).splitlines()[0][:200]
            warnings.warn(f"tandem: ring attention backward: cuDNN refused the block q {tuple(q.shape)} k "
                          f"{tuple(k.shape)} {q.dtype} causal={bool(causal)} ({cudnn_refused[key]}); "
                          "FlashAttention-2 runs it", RuntimeWarning, stacklevel=2)
    block_kernel_counts["flash"] += 1
    return flash_block_backward(do, q, k, v, o, lse, causal, scale)


def reference_block_backward(do, q, k, v, o, lse, causal: bool, scale: float):
    """flash_block_backward's contract in plain torch (float64 if given float64): the CPU tests check the ring's
    schedule and sums with it."""
    group = q.shape[2] // k.shape[2]
    kk = k.repeat_interleave(group, dim=2)
    vv = v.repeat_interleave(group, dim=2)
    qt, kt, vt, dot, ot = (x.transpose(1, 2) for x in (q, kk, vv, do, o))  # (B, H, S, d)
    s = qt @ kt.transpose(-1, -2) * scale
    if causal:
        sq, sk = s.shape[-2], s.shape[-1]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    p = torch.exp(s - lse.unsqueeze(-1).to(s.dtype))
    dv = p.transpose(-1, -2) @ dot
    dp = dot @ vt.transpose(-1, -2)
    d_row = (dot * ot).sum(-1, keepdim=True)
    ds = p * (dp - d_row)
    dq = ds @ kt * scale
    dk = ds.transpose(-1, -2) @ qt * scale
    dq, dk, dv = dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)
    if group > 1:
        b, sl, _, d = dk.shape
        dk = dk.reshape(b, sl, -1, group, d).sum(3)
        dv = dv.reshape(b, sl, -1, group, d).sum(3)
    return dq, dk, dv


def ring_backward_math(rank, world, do, q, o, lse, kv_of, causal, scale, block=block_backward):
    """dq (fp32) of this rank and the fp32 dk/dv partials it owes every source rank: {src: (dk, dv)}. kv_of(src)
    gives src's (k, v). The schedule and the sums of the op, without the transport (the CPU tests run it for
    every rank of a simulated world against autograd on the whole sequence)."""
    seq_local = q.shape[1]
    dq = torch.zeros(q.shape, dtype=torch.float32 if q.dtype != torch.float64 else torch.float64, device=q.device)
    partials = {}
    for s in range(world):
        src = (rank - s) % world
        k, v = kv_of(src)
        acc = dq.dtype
        dk = torch.zeros(k.shape, dtype=acc, device=k.device)
        dv = torch.zeros(v.shape, dtype=acc, device=v.device)
        for q_rows, k_rows, diag in block_pairs(rank, src, world, seq_local, causal):
            gq, gk, gv = block(do[:, q_rows], q[:, q_rows], k[:, k_rows], v[:, k_rows], o[:, q_rows],
                               lse[:, :, q_rows], diag, scale)
            dq[:, q_rows] += gq
            dk[:, k_rows] += gk
            dv[:, k_rows] += gv
        partials[src] = (dk, dv)
    return dq, partials


def _side_stream(ws, device) -> torch.cuda.Stream:
    """The K/V prefetch stream of one workspace (one shape on one communicator), made on its first call: a graph
    capture must not create streams, and calls of other shapes (other workspaces, possibly on other streams) must
    not be ordered behind each other through a shared side stream (ranks issuing them in different orders could
    then wait for each other's barriers)."""
    st = getattr(ws, "_tandem_prefetch_stream", None)
    if st is None:
        st = ws._tandem_prefetch_stream = torch.cuda.Stream(device=device)
    return st


def _check(comm, q, k, v, o, lse, do, op=OP):
    rank = comm.rank
    n = comm.native
    if n.num_nodes > 1:
        raise invalid("ring attention's backward (unfused: copy engines through peer mappings) runs on one node; "
                      "across nodes it is not built yet", op, rank)
    if comm.world_size > _MAX_WORLD:
        raise invalid(f"ring attention's backward takes at most {_MAX_WORLD} ranks", op, rank)
    for name, t in (("do", do), ("o", o)):
        if t.shape != q.shape or t.dtype != q.dtype:
            raise invalid(f"{name} must be like q {tuple(q.shape)} {q.dtype}, got {tuple(t.shape)} {t.dtype}", op,
                          rank)
    b, s_l, hq, _ = q.shape
    if tuple(lse.shape) != (b, hq, s_l) or lse.dtype != torch.float32:
        raise invalid(f"lse must be float32 ({b}, {hq}, {s_l}), got {tuple(lse.shape)} {lse.dtype}", op, rank)


def _barrier(K, comm, base, which, s):
    """Every rank's work before this point on its stream is done (and its copies visible) before any rank goes
    on: signal this rank's flag on every peer, wait for every peer's (epoch = the workspace counter)."""
    world, rank = comm.world_size, comm.rank
    others = [p for p in range(world) if p != rank]
    if not others:
        return
    K.stream_signal(comm.native, base + which + 8 * rank, others, base, 0, s.cuda_stream)
    K.stream_wait(comm.native, [base + which + 8 * p for p in others], others, base, 0, s.cuda_stream)


def _ring_backward_impl(do, q, k, v, o, lse, comm, causal=False, softmax_scale=0.0):
    c = rt.comm_from_handle(comm, OP)
    from .attention import validate

    b, s_l, hq, hkv, d = validate(q, k, v, causal=causal, softmax_scale=softmax_scale, comm_blocks=0, sm_count=0,
                                  device=torch.device("cuda", c.device), rank=c.rank, op=OP)
    _check(c, q, k, v, o, lse, do)
    _block_choice(c.rank)
    do = do.contiguous()
    scale = float(softmax_scale) or 1.0 / math.sqrt(d)
    world, rank = c.world_size, c.rank
    if world == 1:
        # one ring step, one block (the whole shard, causally or not): its gradients are the op's, rounded once
        # (ring_backward_math's fp32 zeros and sums around the one block would give the same bits, a pass later)
        ((q_rows, k_rows, diag),) = block_pairs(0, 0, 1, s_l, causal)
        dq, dk, dv = block_backward(do[:, q_rows], q[:, q_rows], k[:, k_rows], v[:, k_rows], o[:, q_rows],
                                    lse[:, :, q_rows], diag, scale)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
    K = native().kernels
    kv_bytes = k.numel() * k.element_size()
    part_bytes = k.numel() * 4
    own_off = _CTL
    slots_off = own_off + _align(2 * kv_bytes)
    nbytes = slots_off + world * 2 * _align(part_bytes)
    key = (OP, rt.token(c), b, s_l, hq, hkv, d, bool(causal), q.dtype)
    agree = rt.op_key(OP, batch=b, seq_local=s_l, heads_q=hq, heads_kv=hkv, head_dim=d, causal=bool(causal),
                      dtype=q.dtype)
    ws = rt.workspace(c, key, nbytes, loaders=("stream_sync_preload_kernels",), agree=agree)
    bases = rt.peer_bases(c, ws, OP)
    base = bases[rank]
    s = torch.cuda.current_stream(q.device)
    last = getattr(ws, "_tandem_last_stream", None)
    if last is not None and last != s:  # the previous call's sums and copies are on `last`: after them
        s.wait_stream(last)
    ws._tandem_last_stream = s

    K.stream_advance(base, s.cuda_stream)  # this call's epoch
    kc, vc = k.contiguous(), v.contiguous()
    K.stream_copy(base + own_off, kc.data_ptr(), kv_bytes, s.cuda_stream)
    K.stream_copy(base + own_off + kv_bytes, vc.data_ptr(), kv_bytes, s.cuda_stream)
    _barrier(K, c, base, _FLAGS_A, s)
    # K/V of step t's source arrive in stage[t % 2] by a copy-engine copy on a side stream, issued one step
    # ahead, so that it overlaps step t-1's block kernels: the copy into a buffer waits for the step that last
    # read it (event done[t-2]), and a step waits for its copy (event copied[t]). Every side-stream copy is waited
    # for by this stream before barrier B, so no peer rewrites its kv_own under a copy (and a graph capture joins)
    stage = torch.empty((min(2, world - 1), 2) + tuple(k.shape), dtype=k.dtype, device=k.device)
    side = _side_stream(ws, q.device)
    side.wait_stream(s)  # after barrier A: every kv_own is written
    copied, done = {}, {}

    def prefetch(t):
        if t >= world:
            return
        src_t = (rank - t) % world
        with torch.cuda.stream(side):
            if t - 2 in done:
                side.wait_event(done[t - 2])
            K.stream_copy(stage[t % len(stage)].data_ptr(), bases[src_t] + own_off, 2 * kv_bytes, side.cuda_stream)
            copied[t] = torch.cuda.Event()
            copied[t].record(side)

    def slot(owner, writer):  # owner's slot for writer's partial: dk then dv, fp32
        return bases[owner] + slots_off + writer * 2 * _align(part_bytes)

    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    try:
        for step in range(world):
            src = (rank - step) % world
            if step == 0:
                kk, vv = kc, vc
            else:
                s.wait_event(copied[step])
                kk, vv = stage[step % len(stage), 0], stage[step % len(stage), 1]
            prefetch(step + 1)  # into the other buffer: after step - 1's kernels, beside this step's
            dk = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
            dv = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
            for q_rows, k_rows, diag in block_pairs(rank, src, world, s_l, causal):
                gq, gk, gv = block_backward(do[:, q_rows], q[:, q_rows], kk[:, k_rows], vv[:, k_rows],
                                                  o[:, q_rows], lse[:, :, q_rows], diag, scale)
                dq[:, q_rows] += gq
                dk[:, k_rows] += gk
                dv[:, k_rows] += gv
            done[step] = torch.cuda.Event()
            done[step].record(s)
            K.stream_copy(slot(src, rank), dk.data_ptr(), part_bytes, s.cuda_stream)
            K.stream_copy(slot(src, rank) + _align(part_bytes), dv.data_ptr(), part_bytes, s.cuda_stream)
    finally:
        s.wait_stream(side)  # also on an error: no copy is left writing into `stage` once it is freed
    _barrier(K, c, base, _FLAGS_B, s)
    slots = ws[slots_off:slots_off + world * 2 * _align(part_bytes)]
    dk_sum = torch.zeros(k.shape, dtype=torch.float32, device=k.device)
    dv_sum = torch.zeros(v.shape, dtype=torch.float32, device=v.device)
    n_el = k.numel()
    for writer in range(world):  # rank order: the same sum on every run
        off = writer * 2 * _align(part_bytes)
        dk_sum += slots[off:off + part_bytes].view(torch.float32)[:n_el].view(k.shape)
        dv_sum += slots[off + _align(part_bytes):off + _align(part_bytes) + part_bytes].view(torch.float32)[
            :n_el].view(v.shape)
    return dq.to(q.dtype), dk_sum.to(k.dtype), dv_sum.to(v.dtype)


def _ring_backward_fake(do, q, k, v, o, lse, comm, causal=False, softmax_scale=0.0):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


ring_attention_backward_op = rt.define_op(
    OP, "(Tensor do, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, SymInt comm, bool causal=False, "
    "float softmax_scale=0.) -> (Tensor, Tensor, Tensor)", _ring_backward_impl, _ring_backward_fake)


def _setup(ctx, inputs, output):
    q, k, v, comm, causal, softmax_scale = inputs[:6]
    o, lse = output
    ctx.mark_non_differentiable(lse)  # a loss on lse is an error in autograd, not a silent zero gradient
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.comm, ctx.causal, ctx.softmax_scale = comm, causal, softmax_scale


def _backward(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = torch.ops.tandem.ring_attention_backward(do, q, k, v, o, lse, ctx.comm, ctx.causal,
                                                          ctx.softmax_scale)
    return dq, dk, dv, None, None, None, None, None, None


torch.library.register_autograd("tandem::ring_attention", _backward, setup_context=_setup)
