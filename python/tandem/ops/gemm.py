"""torch.ops.tandem.gemm: D = A @ B on the Hopper GEMM core (CUTLASS 3, TMA + wgmma, persistent)."""

from __future__ import annotations

import torch

from .._native import native
from ..errors import TandemError, invalid

_DTYPES = {torch.bfloat16: 0, torch.float16: 1}


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


@torch.library.custom_op("tandem::gemm", mutates_args=())
def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A (M x K) @ B (K x N) -> D (M x N), bf16/fp16 in, fp32 accumulate."""
    validate(a, b)
    m, k = a.shape
    n = b.shape[1]
    d = torch.empty((m, n), dtype=a.dtype, device=a.device)
    K = native().kernels
    ws_bytes = K.gemm_workspace_size(m, n, k, _DTYPES[a.dtype])
    ws = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device=a.device)
    err = K.gemm(m, n, k, _DTYPES[a.dtype], a.data_ptr(), a.stride(0), b.data_ptr(), b.stride(0), d.data_ptr(),
                 d.stride(0), 1.0, _sm_count(a.device), ws.data_ptr(), torch.cuda.current_stream(a.device).cuda_stream)
    if err:
        raise TandemError(f"tandem: gemm: {err}", 5, "gemm")
    return d


@gemm.register_fake
def _(a, b):
    return a.new_empty((a.shape[0], b.shape[1]))
