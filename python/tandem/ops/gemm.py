"""torch.ops.tandem.gemm: D = A @ B on the Hopper GEMM core (CUTLASS 3, TMA + wgmma, persistent)."""

from __future__ import annotations

import torch

from .._native import native
from ..errors import invalid
from ._runtime import DTYPES as _DTYPES, define_op, kernel_args, prepared, remember, stream_handle


def validate(a: torch.Tensor, b: torch.Tensor, op: str = "gemm") -> None:
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise invalid(f"{name} must be a torch.Tensor, got {type(t).__name__}", op)
        if not t.is_cuda:
            raise invalid(f"{name} must be a CUDA tensor, got device {t.device}", op)
        if t.dim() != 2:
            raise invalid(f"{name} must be 2-D, got shape {tuple(t.shape)}", op)
        if t.dtype not in _DTYPES:
            raise invalid(f"{name} must be bfloat16 or float16, got {t.dtype}", op)
        if t.stride(1) != 1:
            raise invalid(f"{name} must have contiguous rows (stride(1) == 1), got strides {t.stride()}", op)
        if t.stride(0) % 8 or t.data_ptr() % 16:
            raise invalid(f"{name} rows must be 16-byte aligned (row stride a multiple of 8 elements)", op)
    if a.dtype != b.dtype:
        raise invalid(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}", op)
    if a.device != b.device:
        raise invalid(f"a and b must be on the same device, got {a.device} and {b.device}", op)
    if a.shape[1] != b.shape[0]:
        raise invalid(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}", op)
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0 or k == 0:
        raise invalid(f"empty problem {m}x{n}x{k}", op)
    if k % 8 or n % 8:
        raise invalid(f"K ({k}) and N ({n}) must be multiples of 8 (16-byte rows for TMA)", op)


def _sm_count(device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def gemm_args(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, sm_count: int = 0, swizzle: int = 1):
    """The GEMM core's typed arguments (tandem._C.kernels.GemmArgs) for D = A @ B on these tensors (checked by
    the caller: validate)."""
    return kernel_args("GemmArgs", m=a.shape[0], n=b.shape[1], k=a.shape[1], dtype=_DTYPES[a.dtype], a=a.data_ptr(),
                       lda=a.stride(0), b=b.data_ptr(), ldb=b.stride(0), d=d.data_ptr(), ldd=d.stride(0),
                       sm_count=int(sm_count), max_swizzle=int(swizzle))


def gemm_with(a: torch.Tensor, b: torch.Tensor, *, swizzle: int = 1) -> torch.Tensor:
    """The GEMM core with its tuning knobs exposed (the torch op uses the defaults): swizzle is the persistent
    tile scheduler's (1, 2, 4 or 8; the same bits, different L2 reuse)."""
    # Per call signature (shapes, strides, dtype, device, swizzle): the GEMM's Args and workspace size, made on its
    # first call after the full checks and kept in the ops' prepared-call cache (_runtime.prepared: no
    # communicator, so no token); a later call checks the addresses (16-byte alignment) and launches.
    try:
        key = ("gemm", None, a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device, swizzle)
        hit = prepared(key)
    except (AttributeError, TypeError):  # not tensors, or an unhashable swizzle: the full checks say so
        key, hit = None, None
    if hit is None or (a.data_ptr() | b.data_ptr()) & 15:
        if swizzle not in (1, 2, 4, 8):
            raise invalid(f"swizzle must be 1, 2, 4 or 8, got {swizzle!r}", "gemm")
        validate(a, b)
        m, n = a.shape[0], b.shape[1]
        d = torch.empty((m, n), dtype=a.dtype, device=a.device)
        x = gemm_args(a, b, d, _sm_count(a.device), swizzle)
        hit = (x, max(native().kernels.workspace_size(x), 1))
        if key is not None:
            remember(key, hit)
    else:
        d = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    x, ws_bytes = hit
    x.a, x.b, x.d = a.data_ptr(), b.data_ptr(), d.data_ptr()
    ws = torch.empty(ws_bytes, dtype=torch.uint8, device=a.device)
    native().kernels.gemm(x, ws.data_ptr(), stream_handle(a.device))  # raises TandemError (its status) if it fails
    return d


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
    K.gemm_with_arrivals(comm.native, x, flags.data_ptr(), int(epoch), int(chunk_rows), chunks, int(first_chunk),
                         int(source_of_chunk0), ws.data_ptr(), stream_handle(a.device))
    return d
