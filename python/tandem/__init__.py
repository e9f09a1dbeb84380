"""tandem: fused multi-GPU communication + compute kernels.

Layers (docs/architecture.md): transport (symmetric heap, device put/signal/wait/barrier, host communicator),
kernels (role-specialized persistent kernels), and this package (torch-facing ops, bootstrap, launcher, bench).
Importing tandem never needs a GPU, torch or pyverbs; features that need them say so when used.
"""

from __future__ import annotations

import os

from .errors import TandemError

__version__ = "0.1.0"
__all__ = ["TandemError", "Communicator", "cmake_prefix_path", "__version__"]


def cmake_prefix_path() -> str:
    """Folder to put on CMAKE_PREFIX_PATH so that `find_package(tandem CONFIG)` finds the installed package."""
    from ._native import native

    return os.path.dirname(os.path.abspath(native().__file__))


def __getattr__(name):  # lazy: keep `import tandem` free of torch and CUDA
    if name == "Communicator":
        from .transport import Communicator

        return Communicator
    raise AttributeError(name)
