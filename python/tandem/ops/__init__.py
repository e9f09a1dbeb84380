"""torch-facing ops (torch.library custom ops). Inputs are validated before anything is launched; every
failure is a TandemError (a ValueError-like INVALID_ARGUMENT for bad input) naming the op and the argument.

    import tandem.ops
    d = torch.ops.tandem.gemm(a, b)          # the Hopper GEMM core (world 1)
"""

from __future__ import annotations

from .gemm import gemm  # noqa: F401  (registers torch.ops.tandem.gemm)
