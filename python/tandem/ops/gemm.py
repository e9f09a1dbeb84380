"""torch.ops.tandem.gemm: D = A @ B on the Hopper GEMM core (CUTLASS 3, TMA + wgmma, persistent)."""

from __future__ import annotations

import torch

from .._native import native
from ..errors import invalid
from ._runtime import DTYPES as _DTYPES, check_matmul, define_op, kernel_args, prepared, remember, stream_handle


def validate(a: torch.Tensor, b: torch.Tensor, op: str = "gemm") -> None:
    """The checks of D = A @ B before any launch (_runtime.check_matmul, shared with the TP ops)."""
    check_matmul(a, b, op)


def _on_another_device(t) -> bool:
    """t is a CUDA tensor of a device that is not the current one."""
    dev = getattr(t, "device", None)
    return dev is not None and dev.type == "cuda" and dev.index is not None and dev.index != torch.cuda.current_device()


def _sm_count(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def gemm_args(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, sm_count: int = 0, swizzle: int = 1,
              raster: str = "heuristic"):
    """The GEMM core's typed arguments (tandem._C.kernels.GemmArgs) for D = A @ B on these tensors (checked by
    the caller: validate); raster one of gemm_plan.RASTERS."""
    return kernel_args("GemmArgs", m=a.shape[0], n=b.shape[1], k=a.shape[1], dtype=_DTYPES[a.dtype], a=a.data_ptr(),
                       lda=a.stride(0), b=b.data_ptr(), ldb=b.stride(0), d=d.data_ptr(), ldd=d.stride(0),
                       sm_count=int(sm_count), max_swizzle=int(swizzle),
                       raster=getattr(native().kernels.Raster, str(raster).upper()))


def variant_workspace(name: str, x, device) -> torch.Tensor | None:
    """Device memory for configuration `name` on the Args `x` (None where it needs none: the unsplit ones)."""
    n = native().kernels.gemm_variant_workspace_size(name, x)
    return torch.empty(n, dtype=torch.uint8, device=device) if n else None


def gemm_with(a: torch.Tensor, b: torch.Tensor, *, swizzle: int | None = None, raster: str | None = None,
              variant: str | None = None) -> torch.Tensor:
    """The GEMM core with its tuning knobs exposed (the torch op uses the plan's): variant names the CUTLASS
    configuration (tandem.ops.gemm_plan.CONFIGS; bf16 only); swizzle (1, 2, 4, 8) and raster ("heuristic",
    "along_m", "along_n") are its persistent scheduler's walk over the output tiles (the same bits, different L2
    reuse). Each None: gemm_plan.choose_schedule's for the shape (the measured table, else the wave model's
    configuration with swizzle 1 and CUTLASS's raster heuristic; fp16: the core)."""
    # Per call signature (shapes, strides, dtype, device, knobs): the GEMM's Args and workspace size, made on its
    # first call after the full checks and kept in the ops' prepared-call cache (_runtime.prepared: no
    # communicator, so no token); a later call checks the addresses (16-byte alignment) and launches.
    if _on_another_device(a):  # the launchers and the planner work on the current device (as the C++ kernels do)
        with torch.cuda.device(a.device):
            return gemm_with(a, b, swizzle=swizzle, raster=raster, variant=variant)
    try:
        key = ("gemm", None, a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device, swizzle,
               raster, variant)
        hit = prepared(key)
    except (AttributeError, TypeError):  # not tensors, or an unhashable knob: the full checks say so
        key, hit = None, None
    if hit is None or (a.data_ptr() | b.data_ptr()) & 15:
        hit = _prepare_gemm(a, b, swizzle, raster, variant)
        if key is not None:
            remember(key, hit)
    d = a.new_empty((a.shape[0], b.shape[1]))
    # The prepared Args are shared by every call of this signature (threads included): this call's addresses go to
    # the launcher as arguments, which sets them on its own copy (gemm_at / gemm_variant_at), never on x.
    x, ws_bytes, variant = hit
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device=a.device) if ws_bytes else None
    if variant is not None:
        # raises TandemError with the launcher's status (invalid argument, CUDA failure, ...)
        native().kernels.gemm_variant_at(variant, x, a.data_ptr(), b.data_ptr(), d.data_ptr(), stream_handle(a.device),
                                         0 if ws is None else ws.data_ptr())
        return d
    # the core's CUTLASS kernel needs no workspace (persistent scheduler): no allocation per call then (a null
    # workspace is what CUTLASS expects at size 0)
    native().kernels.gemm_at(x, a.data_ptr(), b.data_ptr(), d.data_ptr(), 0 if ws is None else ws.data_ptr(),
                             stream_handle(a.device))  # raises if it fails
    return d


def _prepare_gemm(a, b, swizzle, raster, variant):
    """The full path of a call signature: the checks (raise TandemError on bad input), the plan, and the prepared
    (GemmArgs without addresses, workspace bytes, configuration name or None for the core)."""
    from . import gemm_plan

    if bad := gemm_plan.tile_walk_error(swizzle, raster):
        raise invalid(bad, "gemm")
    validate(a, b)
    m, n = a.shape[0], b.shape[1]
    if variant is not None and variant not in gemm_plan.CONFIGS:
        raise invalid(f"unknown variant {variant!r}; one of {sorted(gemm_plan.CONFIGS)}", "gemm")
    if variant is not None and variant != gemm_plan.CORE and a.dtype != torch.bfloat16:
        raise invalid(f"variant {variant!r} takes bf16 (got {a.dtype}); fp16 runs the core", "gemm")
    sms = _sm_count(a.device)
    variant, swizzle, raster = gemm_plan.choose_schedule(m, n, a.shape[1], sms, a.dtype == torch.bfloat16) \
        .overridden(variant, swizzle, raster)
    d = torch.empty((m, n), dtype=a.dtype, device=a.device)
    x = gemm_args(a, b, d, sms, swizzle, raster)
    # the core runs through gemm::run (fp16 too); another configuration through its variant launcher (the
    # split-K / stream-K ones with a workspace of their own size)
    if variant == gemm_plan.CORE:
        return (x, native().kernels.workspace_size(x), None)
    return (x, native().kernels.gemm_variant_workspace_size(variant, x), variant)


def plan_gemm_for_dispatcher(a, b):
    """torch.ops.tandem.gemm's C++ CUDA kernel (tandem.ops._dispatcher) calls this once per call signature: the full
    checks and the plan of gemm_with's defaults, as (the GemmArgs' bytes, workspace bytes, configuration name or ""
    for the core)."""
    x, ws_bytes, variant = _prepare_gemm(a, b, None, None, None)
    return x._raw(), int(ws_bytes), variant or ""


def _gemm_fake(a, b):
    return a.new_empty((a.shape[0], b.shape[1]))


# torch.ops.tandem.gemm(a, b): A (M x K) @ B (K x N) -> D (M x N), bf16/fp16 in, fp32 accumulate (gemm_with's
# defaults)
gemm = define_op("gemm", "(Tensor a, Tensor b) -> Tensor", lambda a, b: gemm_with(a, b), _gemm_fake)


def gemm_with_arrivals(comm, a: torch.Tensor, b: torch.Tensor, flags: torch.Tensor, *, epoch: int, chunk_rows: int,
                       first_chunk: int = 0, source_of_chunk0: int = 0) -> torch.Tensor:
    """A @ B where each output tile waits until its chunk of A rows has arrived (flags[c] >= epoch) and chunks are
    taken from `first_chunk` on: the mainloop contract of the fused AG+GEMM. `flags` is an int64 tensor in
    the communicator's symmetric heap; a wait that times out is recorded in `comm` (comm.check() raises)."""
    validate(a, b, "gemm_with_arrivals")
    m, k = a.shape
    n = b.shape[1]
    chunks = flags.numel()
    if flags.dtype != torch.int64 or not flags.is_cuda:
        raise invalid("flags must be an int64 CUDA tensor", "gemm_with_arrivals", comm.rank)
    comm.offset_of(flags)
    if chunk_rows <= 0 or chunk_rows % 256 or chunks * chunk_rows != m:
        raise invalid(f"M ({m}) must be len(flags) ({chunks}) x chunk_rows ({chunk_rows}), chunk_rows a multiple of "
                      "256", "gemm_with_arrivals", comm.rank)
    if not 0 <= first_chunk < chunks:
        raise invalid(f"first_chunk {first_chunk} not in [0, {chunks})", "gemm_with_arrivals", comm.rank)
    d = torch.empty((m, n), dtype=a.dtype, device=a.device)
    K = native().kernels
    x = gemm_args(a, b, d)  # sm_count 0: the communicator's
    ws = torch.empty(max(K.workspace_size(x), 1), dtype=torch.uint8, device=a.device)
    schedule = kernel_args("ArrivalSchedule", flags=flags.data_ptr(), epoch=int(epoch), chunk_rows=int(chunk_rows),
                           chunks=chunks, first_chunk=int(first_chunk), source_of_chunk0=int(source_of_chunk0))
    K.gemm_with_arrivals(comm.native, x, schedule, ws.data_ptr(), stream_handle(a.device))
    return d


# ---- FP8 GEMM with scales: torch.ops.tandem.scaled_gemm ------------------------------------------------------------

_FP8 = getattr(torch, "float8_e4m3fn", None)


def scaling_of(a: torch.Tensor, b: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
               op: str = "scaled_gemm") -> str:
    """Check scaled_gemm's inputs as torch._scaled_mm takes them, before any launch (shapes, dtypes, layouts,
    devices; not the addresses, which fake tensors lack), and say which scaling they ask for: "tensor" (one
    float32 each) or "row" (scale_a (M, 1), scale_b (1, N), float32)."""
    for name, t in (("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b)):
        if not isinstance(t, torch.Tensor):
            raise invalid(f"{name} must be a torch.Tensor, got {type(t).__name__}", op)
        if not t.is_cuda:
            raise invalid(f"{name} must be a CUDA tensor, got device {t.device}", op)
        if t.device != a.device:
            raise invalid(f"{name} must be on a's device {a.device}, got {t.device}", op)
    for name, t in (("a", a), ("b", b)):
        if t.dim() != 2:
            raise invalid(f"{name} must be 2-D, got shape {tuple(t.shape)}", op)
        if t.dtype != _FP8:
            raise invalid(f"{name} must be float8_e4m3fn, got {t.dtype}", op)
    m, k = a.shape
    if b.shape[0] != k:
        raise invalid(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}", op)
    n = b.shape[1]
    if m == 0 or n == 0 or k == 0:
        raise invalid(f"empty problem {m}x{n}x{k}", op)
    if a.stride(1) != 1:
        raise invalid(f"a must be row-major (stride(1) == 1), got strides {a.stride()}", op)
    if b.stride(0) != 1:
        raise invalid(f"b must be column-major (stride(0) == 1: the transpose of a row-major N x K tensor), got "
                      f"strides {b.stride()}", op)
    if k % 16 or a.stride(0) % 16 or b.stride(1) % 16:
        raise invalid(f"K ({k}) and the leading dimensions of a and b ({a.stride(0)}, {b.stride(1)}) must be "
                      "multiples of 16 (16-byte rows of e4m3 for TMA)", op)
    if n % 8:
        raise invalid(f"N ({n}) must be a multiple of 8 (16-byte rows of the bf16 output)", op)
    for name, t in (("scale_a", scale_a), ("scale_b", scale_b)):
        if t.dtype != torch.float32:
            raise invalid(f"{name} must be float32, got {t.dtype}", op)
    if scale_a.numel() == 1 and scale_b.numel() == 1:
        return "tensor"
    if (tuple(scale_a.shape) == (m, 1) and tuple(scale_b.shape) == (1, n) and scale_a.is_contiguous()
            and scale_b.is_contiguous()):
        return "row"
    raise invalid(f"scales must be one float32 each (tensor-wise) or scale_a (M, 1) = ({m}, 1) and scale_b (1, N) = "
                  f"(1, {n}), contiguous (row-wise); got {tuple(scale_a.shape)} and {tuple(scale_b.shape)}", op)


def scaled_gemm_with(a, b, scale_a, scale_b, *, sm_count: int = 0, out: torch.Tensor | None = None,
                     config: str | None = None, swizzle: int | None = None, raster: str | None = None) -> torch.Tensor:
    """D (bf16, M x N) = scale_a * (scale_b * (a @ b)): a (M x K) e4m3 row-major, b (K x N) e4m3 column-major,
    fp32 accumulation, scales tensor-wise or row-wise as torch._scaled_mm takes them (scaling_of). `out`: a bf16
    M x N tensor with contiguous, 16-byte aligned rows to write D into (else a new one). `config`: the CUTLASS
    configuration (tandem.ops.gemm_plan.SCALED_CONFIGS); swizzle and raster its tile schedule (as gemm_with's);
    each None = gemm_plan.choose_scaled_schedule's for the shape (a config named without a schedule: the default
    one unless it is the plan's configuration)."""
    op = "scaled_gemm"
    if _on_another_device(a):  # as gemm_with's
        with torch.cuda.device(a.device):
            return scaled_gemm_with(a, b, scale_a, scale_b, sm_count=sm_count, out=out, config=config,
                                    swizzle=swizzle, raster=raster)
    try:
        key = (op, None, a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), scale_a.shape, scale_b.shape,
               scale_a.stride(), scale_b.stride(), scale_a.dtype, scale_b.dtype, scale_b.device, scale_a.device,
               b.dtype, b.device, sm_count, config, swizzle, raster,
               None if out is None else (out.shape, out.stride(), out.dtype, out.device))
        hit = prepared(key)
    except (AttributeError, TypeError):  # not tensors: the full checks say so
        key, hit = None, None
    addresses = (a.data_ptr() | b.data_ptr() | scale_a.data_ptr() | scale_b.data_ptr()
                 | (0 if out is None else out.data_ptr())) if hit is not None else 0
    if hit is None or addresses & 15:
        hit = _prepare_scaled(a, b, scale_a, scale_b, sm_count, out, config, swizzle, raster)
        if key is not None:
            remember(key, hit)
    d = out if out is not None else torch.empty((a.shape[0], b.shape[1]), dtype=torch.bfloat16, device=a.device)
    x, ws_bytes = hit  # shared by the signature's calls: the addresses go to the launcher's copy (gemm_with's)
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device=a.device) if ws_bytes else None  # as gemm_with's
    native().kernels.scaled_gemm_at(x, a.data_ptr(), b.data_ptr(), d.data_ptr(), scale_a.data_ptr(),
                                    scale_b.data_ptr(), 0 if ws is None else ws.data_ptr(),
                                    stream_handle(a.device))  # raises if it fails
    return d


def _prepare_scaled(a, b, scale_a, scale_b, sm_count, out, config, swizzle, raster):
    """scaled_gemm_with's full path of a call signature: the checks (TandemError on bad input), the plan, and the
    prepared (ScaledGemmArgs, workspace bytes)."""
    op = "scaled_gemm"
    scaling = scaling_of(a, b, scale_a, scale_b, op)
    m, k = a.shape
    n = b.shape[1]
    if out is not None:
        if (not isinstance(out, torch.Tensor) or out.dtype != torch.bfloat16 or out.device != a.device
                or tuple(out.shape) != (m, n) or out.stride(1) != 1 or out.stride(0) % 8):
            raise invalid(f"out must be a bf16 ({m}, {n}) tensor on {a.device} with contiguous rows (row stride a "
                          f"multiple of 8)", op)
    for name, t in (("a", a), ("b", b), ("scale_a", scale_a), ("scale_b", scale_b)) + \
            ((("out", out),) if out is not None else ()):
        if t.data_ptr() % 16:
            raise invalid(f"{name} must be 16-byte aligned (address {t.data_ptr():#x})", op)
    from . import gemm_plan

    if config is not None and config not in gemm_plan.SCALED_CONFIGS:
        raise invalid(f"unknown config {config!r}; one of {sorted(gemm_plan.SCALED_CONFIGS)}", op)
    if bad := gemm_plan.tile_walk_error(swizzle, raster):
        raise invalid(bad, op)
    config, swizzle, raster = gemm_plan.choose_scaled_schedule(
        m, n, k, int(sm_count) or _sm_count(a.device), scaling).overridden(config, swizzle, raster)
    K = native().kernels
    d = out if out is not None else torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    x = kernel_args("ScaledGemmArgs", m=m, n=n, k=k, lda=a.stride(0), ldb=b.stride(1), ldd=d.stride(0),
                    scaling=getattr(K.Scaling, scaling.upper()), sm_count=int(sm_count),
                    config=getattr(K.ScaledConfig, config.upper()), max_swizzle=int(swizzle),
                    raster=getattr(K.Raster, raster.upper()))
    x.a, x.b, x.d, x.scale_a, x.scale_b = a.data_ptr(), b.data_ptr(), d.data_ptr(), scale_a.data_ptr(), \
        scale_b.data_ptr()
    why = K.can_implement(x)
    if why:
        raise invalid(why, op)
    return (x, K.workspace_size(x))


def plan_scaled_for_dispatcher(a, b, scale_a, scale_b):
    """torch.ops.tandem.scaled_gemm's C++ CUDA kernel calls this once per call signature (as
    plan_gemm_for_dispatcher): (the ScaledGemmArgs' bytes, workspace bytes)."""
    x, ws_bytes = _prepare_scaled(a, b, scale_a, scale_b, 0, None, None, None, None)
    return x._raw(), int(ws_bytes)


def _scaled_gemm_fake(a, b, scale_a, scale_b):
    scaling_of(a, b, scale_a, scale_b)
    return a.new_empty((a.shape[0], b.shape[1]), dtype=torch.bfloat16)


# torch.ops.tandem.scaled_gemm(a, b, scale_a, scale_b) -> bf16: torch._scaled_mm(a, b, scale_a, scale_b,
# out_dtype=torch.bfloat16)'s semantics for tensor-wise and row-wise scales
scaled_gemm = define_op("scaled_gemm", "(Tensor a, Tensor b, Tensor scale_a, Tensor scale_b) -> Tensor",
                        lambda a, b, scale_a, scale_b: scaled_gemm_with(a, b, scale_a, scale_b), _scaled_gemm_fake)

# Their CUDA-tensor calls through C++ kernels of torch's dispatcher where libtandem_torch_ops is built for this torch
# (tandem.ops._dispatcher; status() says which path runs).
from . import _dispatcher  # noqa: E402

_dispatcher.install()
