"""Rank-side bodies of the transport GPU tests (run in every rank by tests/conftest.py:run_ranks)."""

from __future__ import annotations

import time

import torch

from tandem.errors import TandemError
from tandem.transport import Communicator
from tandem.transport import probe

from .worker_common import kill_self

GUARD = 64
POISON = 0xA5


def _loop_counters():
    """(errors, status, progress) device scalars of the probe loops."""
    return (torch.zeros(1, dtype=torch.int64, device="cuda"), torch.zeros(1, dtype=torch.int32, device="cuda"),
            torch.zeros(1, dtype=torch.int64, device="cuda"))


def _expected(sender: int, case: int, nbytes: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1_000_003 * (sender + 1) + case)
    return torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)


def put_exact(sizes, src_offsets, dst_offsets, modes):
    """Every rank puts to (rank+1) % world; bytes must arrive exactly, and nothing outside the range changes."""
    comm = Communicator(heap_bytes=64 << 20, timeout_s=20)
    rank, world = comm.rank, comm.world_size
    peer, src_rank = (rank + 1) % world, (rank - 1) % world
    remote_peer = peer not in comm.local_ranks
    cap = max(sizes) + max(dst_offsets) + 2 * GUARD
    recv = comm.empty(cap, torch.uint8)
    src_buf = comm.empty(cap, torch.uint8)  # symmetric: the proxy path reads sources by heap offset
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    wrong_total, cases, failures = 0, 0, []
    case = 0
    for mode in modes:
        for n in sizes:
            if mode == "thread" and n > 70_000:
                continue  # one thread copying a MiB bytewise takes seconds; the warp/block paths cover it
            for so in src_offsets:
                for do in dst_offsets:
                    case += 1
                    recv.fill_(POISON)
                    src = src_buf[:n + so + 16]
                    src.fill_(0x11)
                    src[so:so + n] = _expected(rank, case, n).cuda()
                    torch.cuda.synchronize()
                    comm.barrier()
                    probe.put(comm, recv[GUARD + do:], src[so:], n, peer=peer, mode=mode, status=status)
                    probe.quiet(comm, status)  # proxied puts: complete at the peer
                    torch.cuda.synchronize()
                    comm.check()
                    comm.barrier()
                    got = recv.cpu()
                    exp = torch.full((cap,), POISON, dtype=torch.uint8)
                    exp[GUARD + do:GUARD + do + n] = _expected(src_rank, case, n)
                    wrong = int((got != exp).sum())
                    wrong_total += wrong
                    cases += 1
                    if wrong and len(failures) < 8:
                        failures.append(dict(mode=mode, n=n, src_off=so, dst_off=do, wrong=wrong))
    st = int(status.item())
    # Bounds check: a put whose destination is not in the symmetric heap is refused on the device and
    # recorded, and writes nothing.
    outside = torch.full((256,), 7, dtype=torch.uint8, device="cuda")
    victim = torch.zeros(256, dtype=torch.uint8, device="cuda")
    bad_status = torch.zeros(1, dtype=torch.int32, device="cuda")
    comm.barrier()
    probe.native().probe.put(comm.native, 0, victim.data_ptr(), outside.data_ptr(), 256, peer, 1, 32, 0,
                             bad_status.data_ptr(), probe._stream())
    torch.cuda.synchronize()
    try:
        comm.check()
        bad = None
    except TandemError as e:
        bad = dict(status=e.status, op=e.op, peer=e.peer, msg=str(e))
    victim_untouched = bool((victim == 0).all())
    comm.destroy()
    return dict(wrong=wrong_total, cases=cases, failures=failures, status=st, bad=bad,
                victim_untouched=victim_untouched, heap_kind=comm_kind(comm), remote_peer=remote_peer)


def comm_kind(comm):
    try:
        return comm.heap_kind
    except TandemError:
        return "destroyed"


def put_signal_ordering(iters: int, nbytes: int, cross: bool = False, proxy_capacity: int = 4096,
                        pageable_copy: bool = False, comm_timeout_s: float = 30.0):
    """Even ranks stream put_signals to rank+1 (cross: ranks of the first half to rank + world/2, i.e. to the
    other emulated node), which checks every word of every round (data before flag).

    pageable_copy: right after the launch, every rank copies a device tensor to pageable host memory on the same
    stream (what .cpu(), .tolist() and print(t) do): that copy waits for the streaming kernel, which waits for
    proxy traffic. The proxy's own copies must not wait for it."""
    comm = Communicator(heap_bytes=32 << 20, timeout_s=comm_timeout_s, proxy_capacity=proxy_capacity)
    rank, world = comm.rank, comm.world_size
    kind = comm.heap_kind
    buf = comm.zeros(nbytes, torch.uint8)
    flag = comm.zeros(16, torch.int64)
    ack = comm.zeros(16, torch.int64)
    scratch = comm.empty(nbytes, torch.uint8)  # symmetric, so the proxy path can read it
    errors = torch.zeros(1, dtype=torch.int64, device="cuda")
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()
    comm.barrier()
    role = None
    if cross:
        half = world // 2
        send_to = rank + half if rank < half else None
        recv_from = rank - half if rank >= half else None
    else:
        send_to = rank + 1 if rank % 2 == 0 and rank + 1 < world else None
        recv_from = rank - 1 if rank % 2 == 1 else None
    behind = torch.randn(1 << 20, device="cuda") if pageable_copy else None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if send_to is not None:
        role = "sender"
        probe.put_signal_stream(comm, buf, scratch, nbytes, flag, ack, peer=send_to, iters=iters, base=0,
                                sender=True, errors=errors, status=status)
    elif recv_from is not None:
        role = "receiver"
        probe.put_signal_stream(comm, buf, scratch, nbytes, flag, ack, peer=recv_from, iters=iters, base=0,
                                sender=False, errors=errors, status=status)
    if behind is not None:
        behind.cpu()  # pageable, on the current stream: returns once the streaming kernel has finished
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    comm.check()
    out = dict(role=role, errors=int(errors.item()), status=int(status.item()), elapsed_s=elapsed,
               has_proxy=comm.has_proxy,
               final_flag=int(flag[0].item()), final_ack=int(ack[0].item()), heap_kind=kind)
    comm.destroy()
    return out


def barrier_many(iters: int):
    comm = Communicator(heap_bytes=16 << 20, timeout_s=30)
    world = comm.world_size
    slots = comm.zeros(world, torch.int64)
    errors, status, progress = _loop_counters()
    torch.cuda.synchronize()
    comm.barrier()
    t0 = time.perf_counter()
    probe.barrier_loop(comm, slots, iters=iters, base=0, errors=errors, status=status, progress=progress)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    first = dict(errors=int(errors.item()), status=int(status.item()), progress=int(progress.item()))
    # A second launch continues the counters (no reset between launches).
    errors.zero_()
    progress.zero_()
    probe.barrier_loop(comm, slots, iters=100, base=iters, errors=errors, status=status, progress=progress)
    torch.cuda.synchronize()
    comm.check()
    second = dict(errors=int(errors.item()), status=int(status.item()), progress=int(progress.item()))
    comm.destroy()
    return dict(first=first, second=second, elapsed_s=elapsed, us_per_barrier=elapsed / (2 * iters) * 1e6)


def wait_timeouts(comm_timeout_s: float):
    timeout_s = comm_timeout_s
    """Rank 0 waits on a flag nobody signals: the timeout form returns 'timeout' without recording; the
    bounded form records an error naming the expected peer; the host abort flag stops an unbounded wait."""
    comm = Communicator(heap_bytes=8 << 20, timeout_s=timeout_s)
    rank, world = comm.rank, comm.world_size
    expected_peer = 1 if world > 1 else -1
    flag = comm.zeros(16, torch.int64)
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    observed = torch.zeros(1, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    comm.barrier()
    out = dict(rank=rank)
    if rank == 0:
        t0 = time.perf_counter()
        probe.wait(comm, flag, cmp="ge", value=5, peer=expected_peer, timeout_s=0.25, status=status,
                   observed=observed)
        torch.cuda.synchronize()
        out["timeout_form"] = dict(status=int(status.item()), elapsed_s=time.perf_counter() - t0,
                                   recorded=comm.async_error() is not None)
        # A wait that is satisfied returns ok (value already there: 0 >= 0).
        probe.wait(comm, flag, cmp="ge", value=0, peer=expected_peer, timeout_s=0.25, status=status,
                   observed=observed)
        torch.cuda.synchronize()
        out["satisfied_status"] = int(status.item())
        t0 = time.perf_counter()
        probe.wait(comm, flag, cmp="eq", value=3, peer=expected_peer, status=status, observed=observed)
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        try:
            comm.check()
            out["bounded_form"] = dict(raised=False)
        except TandemError as e:
            out["bounded_form"] = dict(raised=True, status=e.status, op=e.op, peer=e.peer, rank=e.rank,
                                       msg=str(e), elapsed_s=elapsed, kernel_status=int(status.item()))
    comm.barrier()
    comm.destroy()

    # Host abort: a wait with no time bound stops when the host raises the flag.
    comm2 = Communicator(heap_bytes=8 << 20, timeout_s=timeout_s)
    flag2 = comm2.zeros(16, torch.int64)
    torch.cuda.synchronize()
    comm2.barrier()
    if comm2.rank == 0:
        status.zero_()
        probe.wait(comm2, flag2, cmp="ge", value=1, peer=expected_peer, timeout_s=0, status=status,
                   observed=observed)
        time.sleep(0.3)
        t0 = time.perf_counter()
        comm2.abort()
        torch.cuda.synchronize()
        out["abort"] = dict(status=int(status.item()), stop_s=time.perf_counter() - t0)
    comm2.barrier()
    comm2.destroy()
    return out


def kill_peer(victim: int, comm_timeout_s: float, stamp_dir: str):
    """Everyone runs an endless barrier loop; `victim` kills itself with SIGKILL while its kernel runs.
    Survivors must raise a TandemError naming it within timeout + 1 s. Whether their own CUDA context survives
    is recorded, not assumed: under MPS the teardown of a killed client's running kernel is a fatal exception
    that the MPS server propagates to every client of the GPU (they must exit; the server then recovers)."""
    timeout_s = comm_timeout_s
    comm = Communicator(heap_bytes=8 << 20, timeout_s=timeout_s)
    rank, world = comm.rank, comm.world_size
    slots = comm.zeros(world, torch.int64)
    errors, status, progress = _loop_counters()
    torch.cuda.synchronize()
    comm.barrier()
    probe.barrier_loop(comm, slots, iters=2_000_000_000, base=0, errors=errors, status=status, progress=progress)
    if rank == victim:
        time.sleep(1.0)
        kill_self(stamp_dir)
    out = dict(rank=rank, raised=False, context_ok=True, context_error=None)
    try:
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - recorded for the test
        out.update(context_ok=False, context_error=f"{type(e).__name__}: {e}".splitlines()[0])
    try:
        comm.check()  # host-side state (peer monitor, host-mapped error record): works on a broken context too
    except TandemError as e:
        out.update(raised=True, status=e.status, op=e.op, peer=e.peer, err_rank=e.rank, msg=str(e))
    out["raised_at"] = time.time()
    try:
        out["progress"] = int(progress.item())
        x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
        out["gpu_ok"] = bool(abs(float((x * 2).sum().item()) - float((1 << 20) * ((1 << 20) - 1))) < 1e6)
        comm.destroy()
    except Exception as e:  # noqa: BLE001
        out.update(context_ok=False, gpu_ok=False, context_error=out["context_error"] or
                   f"{type(e).__name__}: {e}".splitlines()[0])
    return out


def gpu_sanity():
    """A fresh process can use the GPU: a kernel runs and gives the right answer."""
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float64)
    return dict(ok=float(x.sum().item()) == float((1 << 20) * ((1 << 20) - 1) // 2))


def symmetric_tensors():
    """Symmetric allocation: same offsets everywhere, peer views see the peer's data, out-of-step
    allocation is detected, a freed range is reused."""
    comm = Communicator(heap_bytes=16 << 20, timeout_s=20)
    rank, world = comm.rank, comm.world_size
    a = comm.empty((1000, 37), torch.float32)
    b = comm.empty(4097, torch.bfloat16)
    rows = torch.arange(1000, device="cuda").view(-1, 1).float()
    cols = torch.arange(37, device="cuda").view(1, -1).float()
    a.copy_(rank * 100000 + rows * 37 + cols)
    b.copy_((torch.arange(4097, device="cuda") % 251 + rank).to(torch.bfloat16))
    torch.cuda.synchronize()
    comm.barrier()
    wrong = 0
    for p in comm.local_ranks:  # load/store views exist for this node's ranks only
        va = comm.peer_view(a, p)
        vb = comm.peer_view(b, p)
        wrong += int((va != p * 100000 + rows * 37 + cols).sum())
        wrong += int((vb != (torch.arange(4097, device="cuda") % 251 + p).to(torch.bfloat16)).sum())
    comm.barrier()
    # A view aliases the mapping (no copy) on this rank's device, and a write through it lands at the peer.
    aliased = 0
    w = comm.zeros(64, torch.int64)
    torch.cuda.synchronize()
    comm.barrier()
    for p in comm.local_ranks:
        v = comm.peer_view(w, p)
        aliased += int(v.data_ptr() == comm.native.peer_ptr(w.data_ptr(), p) and v.device.index == comm.device)
        v[rank].fill_(1000 + rank)
    torch.cuda.synchronize()
    comm.barrier()
    seen = sorted(int(x) for x in w[w != 0].tolist())
    writes_landed = seen == [1000 + p for p in comm.local_ranks]
    comm.barrier()
    off_a = comm.offset_of(a)
    del b
    c = comm.empty(4097, torch.bfloat16)  # reuses b's range
    reuse = comm.offset_of(c)
    mismatch = None
    if world > 1:
        if rank == 0:
            comm.native.alloc(4096, 256, False)  # rank 0 steps out of line
        try:
            comm.empty(128, torch.int64)
        except TandemError as e:
            mismatch = dict(status=e.status, op=e.op, msg=str(e))
    comm.barrier()
    nlocal = len(comm.local_ranks)  # (every property raises after destroy)
    comm.destroy()
    return dict(wrong=wrong, off_a=off_a, reuse=reuse, mismatch=mismatch, aliased=aliased,
                local_ranks=nlocal, writes_landed=writes_landed)


def kill_peer_waiting(victim: int, comm_timeout_s: float, stamp_dir: str):
    """Like kill_peer, but the survivors only wait for a flag the victim would set (no stores to it)."""
    comm = Communicator(heap_bytes=8 << 20, timeout_s=comm_timeout_s)
    rank = comm.rank
    flag = comm.zeros(16, torch.int64)
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    observed = torch.zeros(1, dtype=torch.int64, device="cuda")
    torch.cuda.synchronize()
    comm.barrier()
    if rank == victim:
        time.sleep(1.0)
        kill_self(stamp_dir)
    probe.wait(comm, flag, cmp="ge", value=1, peer=victim, status=status, observed=observed)
    torch.cuda.synchronize()
    out = dict(rank=rank, raised_at=time.time())
    try:
        comm.check()
        out["raised"] = False
    except TandemError as e:
        out.update(raised=True, status=e.status, op=e.op, peer=e.peer, msg=str(e))
    x = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    out["gpu_ok"] = bool(abs(float((x * 2).sum().item()) - float((1 << 20) * ((1 << 20) - 1))) < 1e6)
    comm.destroy()
    return out


def team_barriers(iters: int):
    """Two teams at once, even and odd ranks, each barriering among itself: no cross-talk, no stale epochs."""
    comm = Communicator(heap_bytes=16 << 20, timeout_s=30)
    rank, world = comm.rank, comm.world_size
    team = (rank % 2, 2, world // 2)
    slots = comm.zeros(world, torch.int64)
    errors, status, progress = _loop_counters()
    torch.cuda.synchronize()
    comm.barrier()
    probe.barrier_loop(comm, slots, iters=iters, base=0, errors=errors, status=status, progress=progress, team=team)
    torch.cuda.synchronize()
    comm.check()
    # then the whole world, whose pairwise counters must be unaffected by the team barriers
    errors2 = torch.zeros(1, dtype=torch.int64, device="cuda")
    progress2 = torch.zeros(1, dtype=torch.int64, device="cuda")
    world_slots = comm.zeros(world, torch.int64)
    # every rank's zeroed slots must exist before any peer signals into them: a rank still in its team loop
    # would otherwise zero a slot its peer already set
    torch.cuda.synchronize()
    comm.barrier()
    probe.barrier_loop(comm, world_slots, iters=100, base=0, errors=errors2, status=status, progress=progress2)
    torch.cuda.synchronize()
    comm.check()
    out = dict(team=list(team), errors=int(errors.item()), progress=int(progress.item()),
               world_errors=int(errors2.item()), world_progress=int(progress2.item()), status=int(status.item()))
    comm.barrier()
    comm.destroy()
    return out


def pingpong_orders(iters: int, variants):
    """Ranks 0 and 1 ping-pong a flag with each variant; each must finish with status 0 and the final flag at
    the last round's value (a lost or early-returning wait leaves either a status or a smaller flag)."""
    comm = Communicator(heap_bytes=1 << 20, timeout_s=20)
    rank = comm.rank
    flag = comm.zeros(16, torch.int64)
    status = torch.zeros(1, dtype=torch.int32, device="cuda")
    out = {}
    base = 0
    for variant in variants:
        comm.barrier()
        if rank < 2:
            probe.pingpong(comm, flag, peer=1 - rank, iters=iters, base=base, initiator=rank == 0, status=status,
                           variant=variant)
            torch.cuda.synchronize()
        comm.barrier()
        out[variant] = dict(status=int(status.item()), final=int(flag[0].item()))
        base += iters
    out["expected_finals"] = [iters * (i + 1) for i in range(len(variants))]
    comm.destroy()
    return out
