"""C++ kernels of torch's CUDA dispatch key for torch.ops.tandem.gemm and torch.ops.tandem.scaled_gemm.

The two ops are defined with a Python implementation (_runtime.define_op). On a GPU host a call through torch's
dispatcher into Python costs more than the launch itself (tools/diag/gemm_host_path.py: on an H100 host the op took
14.5 us a call where the direct launch took 5.7 and torch.matmul 12.5), and a single-launch timing against cuBLAS
counts all of it. libtandem_torch_ops (python/torch_ops/tandem_torch_ops.cpp) registers C++ kernels for the CUDA key:
a call signature seen before (shapes, strides, dtypes, devices) runs without Python; the first call of a signature
asks the Python planner once (gemm.plan_gemm_for_dispatcher / plan_scaled_for_dispatcher: the full checks and the
plan), so bad input raises the same TandemError as before. CPU tensors, meta and fake tensors keep the Python
implementation and the fake (register_fake) they had.

The library is built against torch's C++ headers (python/CMakeLists.txt when torch is importable at build time, or
tools/build_torch_ops.sh), so it is loaded only into the torch version it was built for. Without it, or with
TANDEM_TORCH_OPS=0, the ops run their Python implementation; `status()` says which and why.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

_STATE: dict = {"lib": None, "installed": False, "enabled": True, "reason": "not tried"}

LIBRARY_NAME = "libtandem_torch_ops.so"


def library_path() -> str | None:
    """The library to load: $TANDEM_TORCH_OPS_LIB, else the one in the tandem package's directory or beside
    tandem._C (an editable install keeps its compiled files apart from the sources); None if there is none."""
    env = os.environ.get("TANDEM_TORCH_OPS_LIB")
    if env:
        return env
    # beside tandem._C first: the library built with it (a copy left in the package directory by an earlier
    # tools/build_torch_ops.sh must not shadow it)
    dirs = []
    try:
        from .._native import native

        dirs.append(os.path.dirname(os.path.abspath(native().__file__)))
    except Exception:  # noqa: BLE001 - no tandem._C: install() says so next
        pass
    dirs.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for d in dirs:
        path = os.path.join(d, LIBRARY_NAME)
        if os.path.exists(path):
            return path
    return None


def install() -> bool:
    """Load the library and register its CUDA kernels (once; tandem.ops.gemm calls this at import). False, with the
    reason in status(), where it cannot: not built, built for another torch, disabled, or no tandem._C."""
    if _STATE["installed"]:
        return True
    if os.environ.get("TANDEM_TORCH_OPS", "1") == "0":
        _STATE["reason"] = "disabled (TANDEM_TORCH_OPS=0)"
        return False
    path = library_path()
    if path is None:
        _STATE["reason"] = (f"{LIBRARY_NAME} not built (torch was not importable when tandem was built; "
                            "tools/build_torch_ops.sh builds it)")
        return False
    import torch

    try:
        lib = ctypes.PyDLL(path)
        lib.tandem_torch_ops_torch_version.restype = ctypes.c_char_p
        built_for = lib.tandem_torch_ops_torch_version().decode()
    except (OSError, AttributeError) as e:
        _STATE["reason"] = f"{path} does not load here ({e})"
        return False
    running = torch.__version__.split("+")[0]
    if built_for.split(".")[:2] != running.split(".")[:2]:
        _STATE["reason"] = f"{path} was built for torch {built_for}, this is torch {running}"
        return False
    from .._native import native
    from ..errors import launch_error
    from . import gemm

    try:
        table = native().kernels._gemm_launch_table()
    except Exception as e:  # no tandem._C (its import error says why), or one without the table
        _STATE["reason"] = f"tandem._C has no launch table ({e})"
        return False
    lib.tandem_torch_ops_install.restype = ctypes.c_int
    lib.tandem_torch_ops_install.argtypes = [ctypes.py_object] * 4
    try:  # refused where the library and tandem._C disagree (table version, Args sizes): the Python path runs
        lib.tandem_torch_ops_install(table, gemm.plan_gemm_for_dispatcher, gemm.plan_scaled_for_dispatcher,
                                     launch_error)
    except Exception as e:  # noqa: BLE001 - an import of tandem.ops must not fail for the optional fast path
        _STATE["reason"] = f"{path} refused this tandem._C ({type(e).__name__}: {e}); rebuild it " \
                           "(tools/build_torch_ops.sh)"
        return False
    lib.tandem_torch_ops_set_enabled.restype = ctypes.c_int
    lib.tandem_torch_ops_set_enabled.argtypes = [ctypes.c_int]
    lib.tandem_torch_ops_clear_cache.restype = None
    _STATE.update(lib=lib, installed=True, reason=f"C++ CUDA kernels ({os.path.basename(path)}, torch {built_for})")
    return True


def status() -> str:
    """How torch.ops.tandem.gemm / scaled_gemm reach the kernels on CUDA tensors: "C++ ..." or "Python (<why>)"."""
    if _STATE["installed"]:
        return _STATE["reason"] if enabled() else "Python (the C++ kernels are switched off: set_enabled(False))"
    return f"Python ({_STATE['reason']})"


def enabled() -> bool:
    return _STATE["installed"] and _STATE["enabled"]


def set_enabled(on: bool) -> None:
    """Switch the C++ kernels off (the ops then run their Python implementation, on CUDA tensors too) or back on;
    for timing the two paths in one process (bench gemm). No-op where they are not installed. Not while another
    thread calls the GEMM ops: it changes torch's dispatch table for them."""
    if not _STATE["installed"]:
        return
    _STATE["lib"].tandem_torch_ops_set_enabled(1 if on else 0)
    _STATE["enabled"] = bool(on)


@contextlib.contextmanager
def switched_off(off: bool = True):
    """The ops through their Python implementation inside the block (when `off`), the C++ kernels again after it, as
    they were; for timing both paths in one process."""
    was = enabled()
    if off and was:
        set_enabled(False)
    try:
        yield
    finally:
        if off and was:
            set_enabled(True)


def clear_cache() -> None:
    """Forget the C++ kernels' prepared calls (with tandem.ops._runtime's: release_workspaces)."""
    if _STATE["installed"]:
        _STATE["lib"].tandem_torch_ops_clear_cache()
