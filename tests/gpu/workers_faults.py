"""Rank-side bodies of the fault tests (tests/gpu/test_faults.py): a rank killed with SIGKILL while fused
kernels that exchange data with it are in flight, under MPS and time-sliced (no MPS), to tell what MPS does
to the survivors from what tandem does."""

from __future__ import annotations

import time

import torch

import tandem.ops  # noqa: F401
from tandem.errors import TandemError
from tandem.ops import tp
from tandem.transport import Communicator

from .worker_common import kill_self


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0]


def kill_mid_ag_gemm(victim: int, comm_timeout_s: float, stamp_dir: str, m_local: int = 512, n: int = 2048,
                     k: int = 2048, launches: int = 64):
    """Every rank queues `launches` fused AG+GEMM kernels; `victim` SIGKILLs itself once the first of them has
    finished, so that the rest are queued or running on the device. The survivors record: the TandemError
    (status, peer), whether their CUDA context still works (synchronize, a new allocation, a matmul checked on
    the host), and whether the communicator can be destroyed."""
    comm = Communicator(heap_bytes=128 << 20, timeout_s=comm_timeout_s)
    rank = comm.rank
    g = torch.Generator(device="cuda").manual_seed(1234 + rank)
    a_local = torch.randn(m_local, k, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=g)
    tp.ag_gemm(comm, a_local, b, mode="fused")  # the workspace (collective), outside the timed region
    torch.cuda.synchronize()
    comm.check()
    comm.barrier()
    first = torch.cuda.Event()
    for i in range(launches):
        tp.ag_gemm(comm, a_local, b, mode="fused")
        if i == 0:
            first.record()
    if rank == victim:
        while not first.query():  # the kernels have started on the device: kill with work in flight
            time.sleep(0.0005)
        kill_self(stamp_dir)
    out = dict(rank=rank, raised=False, context_ok=True, context_error=None)
    try:
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - recorded for the test
        out.update(context_ok=False, context_error=_first_line(e))
    try:
        comm.check()  # host-side state (peer monitor, host-mapped error record): works on a broken context too
    except TandemError as e:
        out.update(raised=True, status=e.status, op=e.op, peer=e.peer, msg=str(e))
    out["raised_at"] = time.time()
    try:  # the context after the error: a new allocation and a kernel whose result is checked on the host
        x = torch.randn(256, 256, device="cuda", dtype=torch.float32)
        y = x @ x
        ref = x.cpu().double() @ x.cpu().double()
        out["gpu_ok"] = bool(torch.allclose(y.cpu().double(), ref, rtol=1e-3, atol=1e-3))
    except Exception as e:  # noqa: BLE001
        out.update(gpu_ok=False, context_ok=False, context_error=out["context_error"] or _first_line(e))
    try:
        tp.release_workspaces(comm) if hasattr(tp, "release_workspaces") else None
        comm.destroy()
        out["destroyed"] = True
    except Exception as e:  # noqa: BLE001
        out.update(destroyed=False, destroy_error=_first_line(e))
    return out
