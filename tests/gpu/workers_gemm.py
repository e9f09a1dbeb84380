"""Rank-side bodies of the GEMM core tests (a world-1 rank in its own process)."""

from __future__ import annotations

import torch

import tandem.ops  # noqa: F401
from tandem.errors import TandemError


def _structured(m, n, k, dtype):
    # Small integers / 8: every product and every partial sum is exact in fp32, so the only rounding is the
    # final one to bf16/fp16 — shared with the reference. A misplaced row, column or K slice changes values.
    i = torch.arange(m, device="cuda").view(-1, 1)
    kk = torch.arange(k, device="cuda").view(1, -1)
    a = (((i * 7 + kk * 3) % 17) - 8).to(dtype) / 8
    kk2 = torch.arange(k, device="cuda").view(-1, 1)
    j = torch.arange(n, device="cuda").view(1, -1)
    b = (((kk2 * 5 + j * 11) % 13) - 6).to(dtype) / 8
    return a.contiguous(), b.contiguous()


def check(shapes, dtypes):
    out = []
    for m, n, k in shapes:
        for name in dtypes:
            dtype = getattr(torch, name)
            a, b = _structured(m, n, k, dtype)
            ref = (a.float() @ b.float()).to(dtype)
            got = torch.ops.tandem.gemm(a, b)
            torch.cuda.synchronize()
            wrong = int((got != ref).sum())
            # random data: relative error against fp64
            ra = torch.randn(m, k, device="cuda", dtype=dtype)
            rb = torch.randn(k, n, device="cuda", dtype=dtype)
            r64 = ra.double() @ rb.double()
            rel = float((torch.ops.tandem.gemm(ra, rb).double() - r64).norm() / r64.norm())
            out.append(dict(shape=[m, n, k], dtype=name, wrong=wrong, rel=rel))
    return out


def threads_sharing_a_signature(m, n, k, calls):
    """Two host threads call torch.ops.tandem.gemm and scaled_gemm with the same signature (shapes, strides,
    dtypes: one prepared Args) on their own inputs and streams, with the interpreter switching threads as often as it
    can. Each output must be its own inputs' product (the launchers used to set the call's addresses on the shared
    Args and then launch, so one thread could launch with the other's tensors)."""
    import sys
    import threading

    torch.manual_seed(0)
    inputs = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
               torch.randn(k, n, device="cuda", dtype=torch.bfloat16)) for _ in range(2)]
    fp8 = [(a.to(torch.float8_e4m3fn), b.t().contiguous().to(torch.float8_e4m3fn).t(),
            torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5) for a, b in inputs]
    refs = [torch.ops.tandem.gemm(a, b) for a, b in inputs]
    refs8 = [torch.ops.tandem.scaled_gemm(*f) for f in fp8]
    torch.cuda.synchronize()
    wrong = [0, 0]
    errors = []

    def body(t):
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                for _ in range(calls):
                    got = torch.ops.tandem.gemm(*inputs[t])
                    got8 = torch.ops.tandem.scaled_gemm(*fp8[t])
                    stream.synchronize()  # releases the interpreter lock: the other thread runs
                    wrong[t] += int(not torch.equal(got, refs[t])) + int(not torch.equal(got8, refs8[t]))
        except Exception as e:  # reported, not lost in the thread
            errors.append(repr(e))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=body, args=(t,)) for t in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    return dict(wrong=wrong, errors=errors, calls=calls)


def repeat_and_graph(m, n, k, launches):
    a, b = _structured(m, n, k, torch.bfloat16)
    first = torch.ops.tandem.gemm(a, b)
    same = 0
    for _ in range(launches):
        same += int(torch.equal(torch.ops.tandem.gemm(a, b), first))
    # CUDA-graph capture and replay
    static_a, static_b = a.clone(), b.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ops.tandem.gemm(static_a, static_b)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_d = torch.ops.tandem.gemm(static_a, static_b)
    static_a.copy_(a * 2)
    g.replay()
    torch.cuda.synchronize()
    graph_ok = bool(torch.equal(static_d, ((a * 2).float() @ b.float()).to(torch.bfloat16)))
    # the scheduler's swizzle reorders tiles, never their arithmetic: the same bits
    from tandem.ops.gemm import gemm_with

    swizzle_same = {s: bool(torch.equal(gemm_with(a, b, swizzle=s), first)) for s in (2, 4, 8)}
    # so does the raster order, alone and with a swizzle (the core: the op's configuration may differ)
    raster_same = {f"{r}/s{s}": bool(torch.equal(gemm_with(a, b, swizzle=s, raster=r, variant="coop_128x256_c2"),
                                                 gemm_with(a, b, variant="coop_128x256_c2")))
                   for r in ("along_m", "along_n", "heuristic") for s in (1, 4)}
    refused = {}
    for name, kw in (("swizzle 3", dict(swizzle=3)), ("raster diagonal", dict(raster="diagonal"))):
        try:
            gemm_with(a, b, **kw)
            refused[name] = None
        except TandemError as e:
            refused[name] = e.status
    return dict(same=same, launches=launches, graph_ok=graph_ok, swizzle_same=swizzle_same, swizzle_3=refused["swizzle 3"],
                raster_same=raster_same, raster_refused=refused["raster diagonal"])


def rejects():
    dev = "cuda"
    cases = {
        "cpu tensor": (torch.zeros(16, 16, dtype=torch.bfloat16), torch.zeros(16, 16, dtype=torch.bfloat16, device=dev)),
        "fp32": (torch.zeros(16, 16, device=dev), torch.zeros(16, 16, device=dev)),
        "mixed dtypes": (torch.zeros(16, 16, dtype=torch.bfloat16, device=dev),
                         torch.zeros(16, 16, dtype=torch.float16, device=dev)),
        "inner mismatch": (torch.zeros(16, 24, dtype=torch.bfloat16, device=dev),
                           torch.zeros(16, 16, dtype=torch.bfloat16, device=dev)),
        "N not multiple of 8": (torch.zeros(16, 16, dtype=torch.bfloat16, device=dev),
                                torch.zeros(16, 12, dtype=torch.bfloat16, device=dev)),
        "transposed a": (torch.zeros(16, 16, dtype=torch.bfloat16, device=dev).t(),
                         torch.zeros(16, 16, dtype=torch.bfloat16, device=dev)),
        "3-D": (torch.zeros(2, 16, 16, dtype=torch.bfloat16, device=dev),
                torch.zeros(16, 16, dtype=torch.bfloat16, device=dev)),
    }
    out = {}
    for name, (a, b) in cases.items():
        try:
            torch.ops.tandem.gemm(a, b)
            out[name] = "accepted"
        except TandemError as e:
            out[name] = e.status
        except Exception as e:  # noqa: BLE001
            out[name] = f"{type(e).__name__}: {e}"
    return out


def arrivals(chunk_rows: int, chunks: int, n: int, k: int, hold_s: float):
    """The arrival-aware scheduler: the GEMM must not finish before the host releases the chunks (through the
    copy engine, since the persistent GEMM holds every SM), must then be exact, and a chunk that never comes
    must become a recorded timeout, not a hang."""
    import time

    from tandem.ops.gemm import gemm_with_arrivals
    from tandem.transport import Communicator

    comm = Communicator(heap_bytes=16 << 20, timeout_s=2.0)
    m = chunk_rows * chunks
    a, b = _structured(m, n, k, torch.bfloat16)
    ref = (a.float() @ b.float()).to(torch.bfloat16)
    flags = comm.zeros(chunks, torch.int64)
    release = torch.full((chunks,), 1, dtype=torch.int64).pin_memory()
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    d = gemm_with_arrivals(comm, a, b, flags, epoch=1, chunk_rows=chunk_rows, first_chunk=chunks - 1)
    end.record()
    time.sleep(hold_s)
    done_early = end.query()
    with torch.cuda.stream(side):
        flags.copy_(release, non_blocking=True)
    end.synchronize()
    waited_ms = start.elapsed_time(end)
    wrong = int((d != ref).sum())
    comm.check()
    # epoch 2: only chunk 0 is released; the rest must time out (recorded), and the kernel must still end
    release2 = torch.tensor([2] + [1] * (chunks - 1), dtype=torch.int64).pin_memory()
    with torch.cuda.stream(side):
        flags.copy_(release2, non_blocking=True)
    side.synchronize()
    t0 = time.perf_counter()
    gemm_with_arrivals(comm, a, b, flags, epoch=2, chunk_rows=chunk_rows)
    torch.cuda.synchronize()
    timeout_elapsed = time.perf_counter() - t0
    err = comm.async_error()
    comm.destroy()
    return dict(done_early=bool(done_early), waited_ms=waited_ms, wrong=wrong, timeout_elapsed=timeout_elapsed,
                err=err)


def variants(shapes, sm_counts):
    """Every measurement configuration of the core (gemm_variants.h), bf16, structured and random data, at the
    given persistent-grid sizes."""
    from tandem._native import native
    from tandem.ops.gemm import gemm_args, variant_workspace

    K = native().kernels

    def variant(name, x, stream, wp=0):
        """None if the configuration ran, else (status, message) of the TandemError it raised."""
        try:
            K.gemm_variant(name, x, stream, wp)
            return None
        except TandemError as e:
            return (e.status, str(e))

    out = []
    stream = torch.cuda.current_stream().cuda_stream
    for name in K.gemm_variant_names():
        for m, n, k in shapes:
            for sms in sm_counts:
                a, b = _structured(m, n, k, torch.bfloat16)
                ref = (a.float() @ b.float()).to(torch.bfloat16)
                d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                x = gemm_args(a, b, d, sms)
                try:
                    ws = variant_workspace(name, x, a.device)  # split-K / stream-K: the fp32 partials
                except TandemError as e:  # a grid smaller than the variant's cluster is refused here already
                    out.append(dict(variant=name, shape=[m, n, k], sm_count=sms, err=(e.status, str(e)), wrong=None,
                                    rel=None, rerun_same=None))
                    continue
                if ws is not None:
                    ws.fill_(0xAB)  # run() must zero what it relies on itself
                wp = 0 if ws is None else ws.data_ptr()
                err = variant(name, x, stream, wp)
                torch.cuda.synchronize()
                wrong = int((d != ref).sum()) if not err else None
                ra = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                rb = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
                err2 = variant(name, gemm_args(ra, rb, d, sms), stream, wp)
                torch.cuda.synchronize()
                first = d.clone()
                err3 = variant(name, gemm_args(ra, rb, d, sms), stream, wp)  # again: the same bits
                torch.cuda.synchronize()
                rerun_same = bool(torch.equal(first, d)) if not err3 else None
                r64 = ra.double() @ rb.double()
                rel = float((d.double() - r64).norm() / r64.norm()) if not err2 else None
                out.append(dict(variant=name, shape=[m, n, k], sm_count=sms, err=err or err2 or err3, wrong=wrong,
                                rel=rel, rerun_same=rerun_same))
    # Leading dimensions past the row length (A, B and D views into wider buffers, as slices of a fused weight or
    # activation are): every configuration must use lda / ldb / ldd, not the packed strides, and write nothing
    # into D's padding (the swapped ones map them onto the transposed problem's strides).
    strided = []
    m, n, k = 257, 520, 1032
    sa, sb = _structured(m, n, k, torch.bfloat16)
    ref = (sa.float() @ sb.float()).to(torch.bfloat16)
    wa = torch.zeros(m, k + 24, device="cuda", dtype=torch.bfloat16)
    wb = torch.zeros(k, n + 40, device="cuda", dtype=torch.bfloat16)
    wa[:, :k] = sa
    wb[:, :n] = sb
    for name in K.gemm_variant_names():
        wd = torch.full((m, n + 16), float("nan"), device="cuda", dtype=torch.bfloat16)
        x = gemm_args(wa[:, :k], wb[:, :n], wd[:, :n], 0)
        ws = variant_workspace(name, x, wa.device)
        err = variant(name, x, stream, 0 if ws is None else ws.data_ptr())
        torch.cuda.synchronize()
        strided.append(dict(variant=name, err=err, wrong=int((wd[:, :n] != ref).sum()) if not err else None,
                            pad_written=int((~torch.isnan(wd[:, n:])).sum())))
    bad = variant("no_such_variant", gemm_args(a, b, d, 0), stream)
    # a split configuration without its workspace is refused, not run on a null pointer
    x = gemm_args(a, b, d, 0)
    no_ws = variant("splitk2_128x128_c1", x, stream) if K.gemm_variant_workspace_size(
        "splitk2_128x128_c1", x) else "needs none"
    return dict(rows=out, strided=strided, unknown=bad, no_workspace=no_ws)


# ---- FP8 GEMM with scales (torch.ops.tandem.scaled_gemm) against torch._scaled_mm -------------------------------

def _fp8_structured(m, n, k):
    """e4m3 operands of small integers / 4 (exact in e4m3) and power-of-two scales: every product, partial sum and
    scaled result is exact in fp32 at these K, so the only rounding is the final one to bf16 (shared with the
    reference); a misplaced row, column, K slice or scale changes values."""
    i = torch.arange(m, device="cuda").view(-1, 1)
    kk = torch.arange(k, device="cuda").view(1, -1)
    # (no short period along K, and b's mean is not 0: products do not cancel over K, sums reach hundreds)
    a = ((((i * 7 + kk * 3 + (i * kk) % 5) % 9) - 4).float() / 4).to(torch.float8_e4m3fn)
    j = torch.arange(n, device="cuda").view(-1, 1)
    b = ((((j * 5 + kk * 11) % 7) - 2).float() / 4).to(torch.float8_e4m3fn).t()  # K x N column-major
    return a, b


def _scales(m, n, scaling, structured):
    if scaling == "tensor":
        if structured:
            return torch.tensor(0.5, device="cuda"), torch.tensor(4.0, device="cuda")
        return torch.rand((), device="cuda") + 0.5, torch.rand((), device="cuda") + 0.5
    if structured:  # powers of two per row and per column: a misplaced scale changes the result
        sa = torch.pow(2.0, (torch.arange(m, device="cuda") % 5 - 2).float()).view(m, 1)
        sb = torch.pow(2.0, (torch.arange(n, device="cuda") % 3 - 1).float()).view(1, n)
        return sa.contiguous(), sb.contiguous()
    return torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5


def scaled(shapes):
    out = []
    for m, n, k in shapes:
        for scaling in ("tensor", "row"):
            a, b = _fp8_structured(m, n, k)
            sa, sb = _scales(m, n, scaling, True)
            exact = (a.float() @ b.float()) * sb * sa  # scale_b then scale_a, as the kernel; exact here
            got = torch.ops.tandem.scaled_gemm(a, b, sa, sb)
            torch.cuda.synchronize()
            wrong = int((got != exact.to(torch.bfloat16)).sum())
            # random data against torch._scaled_mm (its own kernels: cuBLASLt tensor-wise, CUTLASS row-wise)
            ra = (torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn)
            rb = (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn).t()
            rsa, rsb = _scales(m, n, scaling, False)
            mine = torch.ops.tandem.scaled_gemm(ra, rb, rsa, rsb).float()
            theirs = torch._scaled_mm(ra, rb, rsa, rsb, out_dtype=torch.bfloat16).float()
            r64 = (ra.double() @ rb.double()) * rsb.double() * rsa.double()
            out.append(dict(shape=[m, n, k], scaling=scaling, wrong=wrong,
                            rel_vs_scaled_mm=float((mine - theirs).norm() / theirs.norm()),
                            rel_vs_fp64=float((mine.double() - r64).norm() / r64.norm()),
                            scaled_mm_rel_vs_fp64=float((theirs.double() - r64).norm() / r64.norm()),
                            differ_from_scaled_mm=int((mine != theirs).sum()), of=m * n))
    return out


def scaled_configs(shapes):
    """Every FP8 configuration (gemm_plan.SCALED_CONFIGS) through scaled_gemm_with(config=...): exact on structured
    data, random data against torch._scaled_mm, a rerun with the same bits, both scalings; and an unknown name
    refused before launch."""
    from tandem.errors import TandemError
    from tandem.ops import gemm_plan
    from tandem.ops.gemm import scaled_gemm_with

    out = dict(rows=[], schedules=[], refused=None, refused_swizzle=None, refused_raster=None)
    for m, n, k in shapes:
        for scaling in ("tensor", "row"):
            a, b = _fp8_structured(m, n, k)
            sa, sb = _scales(m, n, scaling, True)
            exact = ((a.float() @ b.float()) * sb * sa).to(torch.bfloat16)
            ra = (torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn)
            rb = (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn).t()
            rsa, rsb = _scales(m, n, scaling, False)
            theirs = torch._scaled_mm(ra, rb, rsa, rsb, out_dtype=torch.bfloat16).float()
            core = scaled_gemm_with(ra, rb, rsa, rsb, config=gemm_plan.SCALED_CORE)
            for name in gemm_plan.SCALED_CONFIGS:
                got = scaled_gemm_with(a, b, sa, sb, config=name)
                mine = scaled_gemm_with(ra, rb, rsa, rsb, config=name)
                again = scaled_gemm_with(ra, rb, rsa, rsb, config=name)
                torch.cuda.synchronize()
                out["rows"].append(dict(shape=[m, n, k], scaling=scaling, config=name,
                                        split=name in gemm_plan.SCALED_SPLITS,
                                        wrong=int((got != exact).sum()),
                                        rel_vs_scaled_mm=float((mine.float() - theirs).norm() / theirs.norm()),
                                        rerun_same=bool(torch.equal(mine, again)),
                                        same_as_core=bool(torch.equal(mine, core)),
                                        # how far from the default configuration's bits, should they differ (a
                                        # wider wgmma, m64n192k32, summing its k32 products otherwise): elements,
                                        # and the largest difference relative to the output's largest magnitude
                                        differ_from_core=int((mine != core).sum()),
                                        max_rel_vs_core=float((mine.float() - core.float()).abs().max()
                                                              / core.float().abs().max().clamp_min(1e-30))))
                # two other tile schedules (the table may name any): exact on structured data; the unsplit
                # configurations' bits on random data do not depend on the walk
                for swizzle, raster in ((4, "along_m"), (2, "along_n")):
                    got = scaled_gemm_with(a, b, sa, sb, config=name, swizzle=swizzle, raster=raster)
                    walked = scaled_gemm_with(ra, rb, rsa, rsb, config=name, swizzle=swizzle, raster=raster)
                    torch.cuda.synchronize()
                    out["schedules"].append(dict(shape=[m, n, k], scaling=scaling, config=name, swizzle=swizzle,
                                                 raster=raster, split=name in gemm_plan.SCALED_SPLITS,
                                                 wrong=int((got != exact).sum()),
                                                 same_bits=bool(torch.equal(walked, mine))))
    for name, kw in (("config", dict(config="no_such_config")), ("swizzle", dict(swizzle=3)),
                     ("raster", dict(raster="diagonal"))):
        try:
            scaled_gemm_with(a, b, sa, sb, **kw)
        except TandemError as e:
            out["refused" if name == "config" else f"refused_{name}"] = e.status
    return out


def scaled_repeat_and_graph(m, n, k, launches):
    a, b = _fp8_structured(m, n, k)
    sa, sb = _scales(m, n, "row", True)
    first = torch.ops.tandem.scaled_gemm(a, b, sa, sb)
    same = sum(int(torch.equal(torch.ops.tandem.scaled_gemm(a, b, sa, sb), first)) for _ in range(launches))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.ops.tandem.scaled_gemm(a, b, sa, sb)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    static_sa = sa.clone()
    with torch.cuda.graph(g):
        static_d = torch.ops.tandem.scaled_gemm(a, b, static_sa, sb)
    static_sa.mul_(2)  # the graph reads the scales at replay
    g.replay()
    torch.cuda.synchronize()
    graph_ok = bool(torch.equal(static_d, ((a.float() @ b.float()) * sb * (sa * 2)).to(torch.bfloat16)))
    return dict(same=same, launches=launches, graph_ok=graph_ok)


def scaled_rejects():
    """Bad input is a TandemError (status) before any launch."""
    dev = "cuda"
    m, n, k = 256, 512, 1024
    a = torch.zeros(m, k, device=dev, dtype=torch.float8_e4m3fn)
    b = torch.zeros(n, k, device=dev, dtype=torch.float8_e4m3fn).t()
    sa, sb = torch.ones(m, 1, device=dev), torch.ones(1, n, device=dev)
    cases = {
        "bf16 a": (a.to(torch.bfloat16), b, sa, sb),
        "row-major b": (a, b.contiguous(), sa, sb),
        "mixed scalings": (a, b, sa, torch.ones((), device=dev)),
        "fp16 scale": (a, b, sa.half(), sb),
        "cpu scale": (a, b, sa.cpu(), sb),
        "k not a multiple of 16": (a[:, :1000], b[:1000], sa, sb),
        "misaligned a": (torch.zeros(m * k + 8, device=dev, dtype=torch.float8_e4m3fn)[8:].view(m, k), b, sa, sb),
        "misaligned scale": (a, b, torch.ones(m + 1, device=dev)[1:].view(m, 1), sb),
    }
    out = {}
    for name, args in cases.items():
        try:
            torch.ops.tandem.scaled_gemm(*args)
            out[name] = None
        except TandemError as e:
            out[name] = e.status
    return out


def op_variants(shapes):
    """torch.ops.tandem.gemm's configurations through the op (gemm_with(variant=...), the path gemm_plan.choose's
    pick takes): exact on structured data, and an unknown name or fp16 with a variant refused before launch."""
    from tandem.ops import gemm_plan
    from tandem.ops.gemm import gemm_with

    out = dict(rows=[], refused={})
    for m, n, k in shapes:
        a, b = _structured(m, n, k, torch.bfloat16)
        ref = (a.float() @ b.float()).to(torch.bfloat16)
        for name in gemm_plan.CONFIGS:
            got = gemm_with(a, b, variant=name)
            again = gemm_with(a, b, variant=name)  # the prepared call
            torch.cuda.synchronize()
            out["rows"].append(dict(shape=[m, n, k], variant=name, wrong=int((got != ref).sum()),
                                    same=bool(torch.equal(got, again))))
            # two other tile schedules of the configuration (the table may name any): still exact on this data
            for swizzle, raster in ((4, "along_m"), (2, "along_n")):
                got = gemm_with(a, b, variant=name, swizzle=swizzle, raster=raster)
                torch.cuda.synchronize()
                out["rows"].append(dict(shape=[m, n, k], variant=f"{name}/s{swizzle}/{raster}",
                                        wrong=int((got != ref).sum()), same=True))
        out["rows"].append(dict(shape=[m, n, k], variant="op", wrong=int((torch.ops.tandem.gemm(a, b) != ref).sum()),
                                same=True, chose=gemm_plan.choose(m, n, k, torch.cuda.get_device_properties(0)
                                                                  .multi_processor_count)))
    a, b = _structured(256, 256, 256, torch.float16)
    for name, call in (("unknown", lambda: gemm_with(a.bfloat16(), b.bfloat16(), variant="nope")),
                       ("fp16 variant", lambda: gemm_with(a, b, variant="pingpong_128x128_c1"))):
        try:
            call()
            out["refused"][name] = None
        except TandemError as e:
            out["refused"][name] = e.status
    return out


def cpp_path(shapes):
    """torch.ops.tandem.gemm / scaled_gemm through their C++ kernels of torch's dispatcher (tandem.ops._dispatcher):
    the same bits as the ops' Python implementation (switched in the same process) for bf16, fp16 and FP8 with
    both scalings; bad input on the first call of a signature and on a later one (a misaligned view with a cached
    signature's shapes and strides) raises TandemError INVALID_ARGUMENT from the planner, before any launch; a
    CUDA graph of the op replays with new inputs."""
    from tandem.ops import _dispatcher

    if not _dispatcher.enabled():
        return {"path": _dispatcher.status()}
    out = {"path": _dispatcher.status(), "rows": [], "errors": {}}

    def both(fn):  # the op through the C++ kernels, then through Python, on the same inputs
        got = fn()
        with _dispatcher.switched_off():
            ref = fn()
        return got, ref

    for m, n, k in shapes:
        for dtype in (torch.bfloat16, torch.float16):
            a = torch.randn(m, k, device="cuda", dtype=dtype)
            b = torch.randn(k, n, device="cuda", dtype=dtype)
            got, ref = both(lambda: torch.ops.tandem.gemm(a, b))
            again = torch.ops.tandem.gemm(a, b)  # the signature's cached entry this time
            exact = (a.double() @ b.double())
            out["rows"].append(dict(shape=[m, n, k], dtype=str(dtype), same_as_python=bool(torch.equal(got, ref)),
                                    same_again=bool(torch.equal(got, again)),
                                    rel=float((got.double() - exact).norm() / exact.norm())))
        for scaling in ("tensor", "row"):
            n16, k16 = n + (-n) % 16, k + (-k) % 16  # e4m3 rows for TMA: K and N multiples of 16
            a8 = torch.randn(m, k16, device="cuda").to(torch.float8_e4m3fn)
            b8 = torch.randn(n16, k16, device="cuda").to(torch.float8_e4m3fn).t()
            sa, sb = _scales(m, n16, scaling, False)
            got, ref = both(lambda: torch.ops.tandem.scaled_gemm(a8, b8, sa, sb))
            base = torch._scaled_mm(a8, b8, sa, sb, out_dtype=torch.bfloat16).float()
            out["rows"].append(dict(shape=[m, n16, k16], dtype=f"fp8/{scaling}", same_as_python=bool(torch.equal(got, ref)),
                                    same_again=bool(torch.equal(got, torch.ops.tandem.scaled_gemm(a8, b8, sa, sb))),
                                    rel=float((got.float() - base).norm() / base.norm())))

    def status_of(fn):
        try:
            fn()
            return "accepted"
        except TandemError as e:
            return e.status
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"

    m, n, k = 256, 512, 256
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    torch.ops.tandem.gemm(a, b)  # cache the signature
    flat = torch.randn(m * k + 8, device="cuda", dtype=torch.bfloat16)
    misaligned = flat[1:1 + m * k].view(m, k)  # the cached signature's shape and strides, 2 bytes off
    out["errors"]["misaligned a, cached signature"] = status_of(lambda: torch.ops.tandem.gemm(misaligned, b))
    out["errors"]["fp32"] = status_of(lambda: torch.ops.tandem.gemm(a.float(), b.float()))
    out["errors"]["inner mismatch"] = status_of(lambda: torch.ops.tandem.gemm(a, b[:128]))
    out["errors"]["3-D"] = status_of(lambda: torch.ops.tandem.gemm(a.view(2, m // 2, k), b))
    out["errors"]["b on the CPU"] = status_of(lambda: torch.ops.tandem.gemm(a, b.cpu()))
    a8 = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b8 = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
    one = torch.ones((), device="cuda")
    torch.ops.tandem.scaled_gemm(a8, b8, one, one)
    out["errors"]["scale on the CPU"] = status_of(lambda: torch.ops.tandem.scaled_gemm(a8, b8, one.cpu(), one))
    out["errors"]["row scale of the wrong length"] = status_of(
        lambda: torch.ops.tandem.scaled_gemm(a8, b8, torch.ones(m + 1, 1, device="cuda"), torch.ones(1, n, device="cuda")))
    out["errors"]["bf16 operands"] = status_of(lambda: torch.ops.tandem.scaled_gemm(a, b, one, one))
    # a CUDA graph of the op (the C++ kernel allocates from the graph's pool) replayed with new inputs
    static_a, static_b = a.clone(), b.clone()
    torch.ops.tandem.gemm(static_a, static_b)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_d = torch.ops.tandem.gemm(static_a, static_b)
    static_a.copy_(torch.randn_like(static_a))
    g.replay()
    torch.cuda.synchronize()
    out["graph_same"] = bool(torch.equal(static_d, torch.ops.tandem.gemm(static_a, static_b)))
    return out
