"""Python front of the transport probe kernels (kernels/include/tandem/kernels/transport_probe.h).

They drive one device primitive each; the transport tests and `tandem bench transport` are built on them.
Arguments are torch tensors; symmetric ones must come from Communicator.empty/zeros.
"""

from __future__ import annotations

from .._native import native
from ..errors import invalid

PUT_MODES = {"thread": 0, "warp": 1, "block": 2, "bulk": 3}
CMP = {"eq": 0, "ne": 1, "ge": 2, "gt": 3, "le": 4, "lt": 5}
SIGNAL_OPS = {"set": 0, "add": 1}


def _stream():
    import torch

    return torch.cuda.current_stream().cuda_stream


def _ptr(t, what: str, comm=None, symmetric=False, dtype=None, min_bytes=0):
    import torch

    if not isinstance(t, torch.Tensor):
        raise invalid(f"{what} must be a torch.Tensor, got {type(t).__name__}", "probe")
    if not t.is_cuda:
        raise invalid(f"{what} must be on a CUDA device, got {t.device}", "probe")
    if dtype is not None and t.dtype != dtype:
        raise invalid(f"{what} must be {dtype}, got {t.dtype}", "probe")
    if not t.is_contiguous():
        raise invalid(f"{what} must be contiguous", "probe")
    if t.numel() * t.element_size() < min_bytes:
        raise invalid(f"{what} holds {t.numel() * t.element_size()} bytes, needs {min_bytes}", "probe")
    if symmetric:
        comm.offset_of(t)
    return t.data_ptr()


def _check_peer(comm, peer):
    if not isinstance(peer, int) or not 0 <= peer < comm.world_size:
        raise invalid(f"peer {peer!r} not in [0, {comm.world_size})", "probe", comm.rank)


def put(comm, dst, src, nbytes: int | None = None, *, peer: int, mode: str = "block", blocks: int = 0,
        threads: int = 512, sig=None, status=None) -> int:
    """dst (symmetric, on `peer`) <- src; returns the number of blocks (each adds 1 to `sig` if given)."""
    import torch

    if mode not in PUT_MODES:
        raise invalid(f"mode must be one of {sorted(PUT_MODES)}, got {mode!r}", "probe.put", comm.rank)
    _check_peer(comm, peer)
    if nbytes is None:
        nbytes = src.numel() * src.element_size()
    d = _ptr(dst, "dst", comm, symmetric=True, min_bytes=nbytes)
    s = _ptr(src, "src", min_bytes=nbytes)
    g = _ptr(sig, "sig", comm, symmetric=True, dtype=torch.int64) if sig is not None else 0
    st = _ptr(status, "status", dtype=torch.int32) if status is not None else 0
    return native().probe.put(comm.native, PUT_MODES[mode], d, s, int(nbytes), peer, int(blocks), int(threads), g,
                              st, _stream())


# see kernels/src/transport_probe.cu for what each measures
PINGPONG_VARIANTS = {"api": 0, "api-relaxed": 8, "api-sys": 3, "api-hoisted": 7, "acq.gpu": 4, "rlx+fence.gpu": 5,
                     "1fence.gpu": 6, "1fence.sys": 1, "unordered": 2, "rlx.gpu": 9, "rlx.sys": 10,
                     "api-relaxed-sys": 11, "api-target-relaxed": 12, "api-target": 13}


def pingpong(comm, flag, *, peer: int, iters: int, base: int, initiator: bool, status=None, variant: str = "api"):
    import torch

    _check_peer(comm, peer)
    if variant not in PINGPONG_VARIANTS:
        raise invalid(f"variant must be one of {sorted(PINGPONG_VARIANTS)}", "probe.pingpong", comm.rank)
    f = _ptr(flag, "flag", comm, symmetric=True, dtype=torch.int64)
    st = _ptr(status, "status", dtype=torch.int32) if status is not None else 0
    native().probe.pingpong(comm.native, f, peer, int(iters), int(base), bool(initiator), PINGPONG_VARIANTS[variant],
                            st, _stream())


def put_signal_stream(comm, buf, scratch, nbytes, flag, ack, *, peer, iters, base, sender, errors, status,
                      threads=512):
    import torch

    _check_peer(comm, peer)
    if nbytes % 4:
        raise invalid("nbytes must be a multiple of 4", "probe.put_signal_stream", comm.rank)
    native().probe.put_signal_stream(
        comm.native, _ptr(buf, "buf", comm, True, min_bytes=nbytes), _ptr(scratch, "scratch", min_bytes=nbytes),
        int(nbytes), _ptr(flag, "flag", comm, True, torch.int64), _ptr(ack, "ack", comm, True, torch.int64), peer,
        int(iters), int(base), bool(sender), int(threads), _ptr(errors, "errors", dtype=torch.int64),
        _ptr(status, "status", dtype=torch.int32), _stream())


def barrier_loop(comm, slots, *, iters, base, errors, status, progress, team=None):
    """team: (start, stride, size) — the ranks start + i*stride; None = the world. The caller must be a member."""
    import torch

    start, stride, size = team if team is not None else (0, 1, comm.world_size)
    members = [start + i * stride for i in range(size)]
    if size < 1 or stride < 1 or start < 0 or members[-1] >= comm.world_size or comm.rank not in members:
        raise invalid(f"team {team} is not a set of ranks of this world containing rank {comm.rank}",
                      "probe.barrier_loop", comm.rank)
    native().probe.barrier_loop(
        comm.native, _ptr(slots, "slots", comm, True, torch.int64, min_bytes=8 * comm.world_size), int(iters),
        int(base), int(start), int(stride), int(size), _ptr(errors, "errors", dtype=torch.int64),
        _ptr(status, "status", dtype=torch.int32), _ptr(progress, "progress", dtype=torch.int64), _stream())


def wait(comm, flag, *, cmp: str, value: int, peer: int = -1, timeout_s: float | None = None, status, observed):
    """timeout_s=None: the communicator-timeout form (records an error on timeout); else wait_until_timeout
    (0 = no time bound, only the abort flag stops it)."""
    import torch

    if cmp not in CMP:
        raise invalid(f"cmp must be one of {sorted(CMP)}", "probe.wait", comm.rank)
    f = _ptr(flag, "flag", dtype=torch.int64)
    native().probe.wait(comm.native, f, CMP[cmp], int(value), int(peer),
                        0 if timeout_s is None else int(timeout_s * 1e9), timeout_s is None,
                        _ptr(status, "status", dtype=torch.int32), _ptr(observed, "observed", dtype=torch.int64),
                        _stream())


def signal(comm, flag, *, value: int, op: str = "set", peer: int, status=None):
    import torch

    if op not in SIGNAL_OPS:
        raise invalid(f"op must be one of {sorted(SIGNAL_OPS)}", "probe.signal", comm.rank)
    _check_peer(comm, peer)
    native().probe.signal(comm.native, _ptr(flag, "flag", comm, True, torch.int64), int(value), SIGNAL_OPS[op], peer,
                          _ptr(status, "status", dtype=torch.int32) if status is not None else 0, _stream())


def memcpy_d2d(dst, src, nbytes: int):
    native().probe.memcpy_d2d(_ptr(dst, "dst", min_bytes=nbytes), _ptr(src, "src", min_bytes=nbytes), int(nbytes),
                              _stream())


def quiet(comm, status=None):
    """One device thread runs quiet(): every proxied command so far is complete at its destination."""
    import torch

    native().probe.quiet(comm.native, _ptr(status, "status", dtype=torch.int32) if status is not None else 0,
                         _stream())
