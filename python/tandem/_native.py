"""Access to the compiled module, with a clear error when it is missing."""

from __future__ import annotations

from .errors import TandemError

_module = None
_import_error: BaseException | None = None


def native():
    """Return tandem._C, or raise TandemError saying why it cannot be loaded."""
    global _module, _import_error
    if _module is not None:
        return _module
    try:
        from . import _C  # type: ignore[attr-defined]
    except ImportError as e:  # pragma: no cover - depends on the build
        _import_error = e
        raise TandemError(
            f"tandem: the native module tandem._C is not available ({e}); build it with "
            "`pip install --no-build-isolation -e .`",
            status=9,
            op="import",
        ) from e
    _module = _C
    return _module


def available() -> bool:
    try:
        native()
        return True
    except TandemError:
        return False
