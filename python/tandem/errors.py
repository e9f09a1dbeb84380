"""tandem's exception type. Every failure inside tandem (C++ or Python) surfaces as TandemError."""

from __future__ import annotations

_STATUS_NAMES = {
    0: "ok",
    1: "timeout",
    2: "aborted",
    3: "invalid argument",
    4: "unreachable peer",
    5: "CUDA error",
    6: "system error",
    7: "bootstrap error",
    8: "out of memory",
    9: "unsupported",
    10: "internal error",
    11: "peer exited",
}

TIMEOUT = 1
ABORTED = 2
INVALID_ARGUMENT = 3
UNREACHABLE_PEER = 4
UNSUPPORTED = 9
PEER_EXITED = 11


class TandemError(RuntimeError):
    """A tandem failure.

    Attributes:
        status: numeric status (see tandem.errors; 1 = timeout, 2 = aborted, ...).
        op: the operation that failed, e.g. "barrier", "wait_until", "heap.alloc".
        rank: the rank that observed the failure (-1 if unknown).
        peer: the rank it was waiting for or talking to (-1 if none).
    """

    def __init__(self, message: str, status: int = 10, op: str = "", rank: int = -1, peer: int = -1):
        super().__init__(message)
        self.status = int(status)
        self.op = op
        self.rank = int(rank)
        self.peer = int(peer)

    @property
    def status_name(self) -> str:
        return _STATUS_NAMES.get(self.status, "unknown")

    @property
    def is_timeout(self) -> bool:
        return self.status == TIMEOUT

    def __reduce__(self):  # picklable across processes (launcher results)
        return (type(self), (str(self), self.status, self.op, self.rank, self.peer))


def invalid(message: str, op: str = "validate", rank: int = -1) -> TandemError:
    """A TandemError for bad input, raised before anything is launched."""
    return TandemError(f"tandem: {op}: {message}", INVALID_ARGUMENT, op, rank, -1)


def launch_error(status: int, op: str, reason: str) -> TandemError:
    """The TandemError of a launcher's non-OK status (the C++ dispatcher kernels of the GEMM ops build theirs here,
    so a failure reads as it does from the Python path)."""
    return TandemError(f"tandem: {op}: {reason or _STATUS_NAMES.get(int(status), 'failed')}", int(status), op, -1, -1)
