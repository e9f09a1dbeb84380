"""One rank of the proxy-path tests (run inside a network namespace by test_proxy_tcp.py).

usage: python -m tests.cpu.proxy_worker MODE BOOTSTRAP_DIR RANK HOST [JSON_ARGS]; prints one JSON line.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from tandem._native import native
from tandem.errors import TandemError

MiB = 1 << 20


def main():
    mode, d, rank, host = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    args = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    world = args.get("world", 2)
    heap = np.zeros(args.get("heap_mib", 16) * MiB, dtype=np.uint8)
    flags = 4096  # flag area at the start of the heap (offsets 0..4095)
    out = dict(rank=rank, mode=mode)
    t0 = time.monotonic()
    if mode in ("close_race", "close_early"):
        close_modes(mode, d, rank, host, args, heap, flags, out)
        out["elapsed_s"] = time.monotonic() - t0
        print(json.dumps(out), flush=True)
        return
    ep = native().ProxyEndpoint(d, rank, world, host, heap, args.get("capacity", 1024), args.get("timeout_s", 10.0))
    peer = 1 - rank if world == 2 else -1
    try:
        if mode == "ordered":
            n = args["count"]
            log = flags
            if rank == 0:
                ep.stream_log(peer, log, 0, n)
                ep.quiet()
                out.update(retired=ep.retired, tail=ep.tail)
            else:
                violations, polls = ep.verify_log(log, 0, n)
                out.update(violations=violations, polls=polls)
        elif mode == "mesh":
            # every rank streams to every other rank, interleaved; each source's log must arrive in order
            n = args["count"]
            log = flags
            others = [r for r in range(world) if r != rank]
            import threading

            results = {}

            def verify(src):
                results[src] = ep.verify_log(log + 8 * src * n, 8 * src, n)

            ts = [threading.Thread(target=verify, args=(s_,)) for s_ in others]
            for t in ts:
                t.start()
            ep.stream_log_multi(others, log, 0, n)
            ep.quiet()
            for t in ts:
                t.join()
            out.update(violations=sum(v[0] for v in results.values()), sources=len(results), retired=ep.retired,
                       guard_nonzero=int(np.count_nonzero(heap[-65536:])), refused=ep.refused)
        elif mode == "bulk":
            rounds, size = args["rounds"], args["round_mib"] * MiB
            data = flags
            wrong = 0
            for r in range(1, rounds + 1):
                if rank == 0:
                    heap[data:data + size] = np.random.default_rng(r).integers(0, 256, size, dtype=np.uint8)
                    ep.put_signal(peer, data, data, size, 0, r, 0)  # flag 0 on the peer := r, after the data
                    ep.wait_ge(8, r, args.get("timeout_s", 10.0) * 3)  # the peer checked round r
                else:
                    ep.wait_ge(0, r, args.get("timeout_s", 10.0) * 3)
                    exp = np.random.default_rng(r).integers(0, 256, size, dtype=np.uint8)
                    wrong += int(np.count_nonzero(heap[data:data + size] != exp))
                    ep.signal(peer, 8, r, 0)
            ep.quiet()
            out.update(wrong=wrong, bytes=rounds * size)
        elif mode == "duplex":
            # Both ranks stream large puts to each other at once (every frame is acked by the receiver): a receive
            # thread must never block on its own socket write, or both sides stop reading.
            rounds, size = args["rounds"], args["round_mib"] * MiB
            src0, dst0 = flags, flags + rounds * size
            for r in range(rounds):
                heap[src0 + r * size:src0 + (r + 1) * size] = np.random.default_rng(1000 * rank + r).integers(
                    0, 256, size, dtype=np.uint8)
            for r in range(rounds):
                ep.put_signal(peer, src0 + r * size, dst0 + r * size, size, 0, r + 1, 0)  # flag 0 := r + 1
            ep.wait_ge(0, rounds, args.get("timeout_s", 10.0) * 3)
            wrong = 0
            for r in range(rounds):
                exp = np.random.default_rng(1000 * peer + r).integers(0, 256, size, dtype=np.uint8)
                wrong += int(np.count_nonzero(heap[dst0 + r * size:dst0 + (r + 1) * size] != exp))
            ep.quiet()
            out.update(wrong=wrong, bytes=rounds * size, retired=ep.retired)
        elif mode == "cut":
            # Rank 0 streams large puts until something fails; rank 1 waits for a flag that never comes. The
            # test cuts the link meanwhile; both must raise within the timeout.
            size = args["put_mib"] * MiB
            try:
                if rank == 0:
                    for i in range(10_000):
                        ep.put(peer, flags, flags, size)
                        if i % 4 == 3:
                            ep.quiet()
                    out["raised"] = False
                else:
                    ep.wait_ge(0, 1, 600)
                    out["raised"] = False
            except TandemError as e:
                out.update(raised=True, status=e.status, op=e.op, peer=e.peer, msg=str(e), at=time.time())
        else:
            raise ValueError(mode)
        if mode != "cut":
            ep.check()
    finally:
        if mode != "cut":
            ep.close()
    out["elapsed_s"] = time.monotonic() - t0
    print(json.dumps(out), flush=True)
    if mode == "cut":
        import os

        os._exit(0)  # the link is gone: no orderly goodbye is possible


def close_modes(mode, d, rank, host, args, heap, flags, out):
    """Rank 1 closes its endpoint the moment it has what it waited for, while rank 0 may still sit in quiet().

    close_race: rank 1 waits for all `count` entries, then closes at once; rank 0's quiet() must still return
    (every frame rank 1 applied is acknowledged before its bye). Repeated `rounds` times on fresh endpoints.
    close_early: rank 1 closes after half the entries while rank 0 goes on sending; rank 0 must get an error
    naming rank 1 well before its timeout, not hang in quiet()."""
    import os

    n, timeout = args["count"], args.get("timeout_s", 10.0)
    rounds = args.get("rounds", 1)
    quiet_s = []
    for k in range(rounds):
        sub = os.path.join(d, str(k))
        os.makedirs(sub, exist_ok=True)
        heap[:] = 0
        ep = native().ProxyEndpoint(sub, rank, 2, host, heap, args.get("capacity", 64), timeout)
        t_round = time.monotonic()
        try:
            if rank == 0:
                t = None
                try:
                    ep.stream_log(1, flags, 0, n)
                    t = time.monotonic()
                    ep.quiet()
                    quiet_s.append(time.monotonic() - t)
                    ep.check()
                except TandemError as e:
                    out.update(raised=True, status=e.status, peer=e.peer, msg=str(e), round=k,
                               in_quiet=t is not None, raised_at=time.time(),
                               after_s=time.monotonic() - (t if t is not None else t_round))
                    break
            else:
                violations, _ = ep.verify_log(flags, 0, n if mode == "close_race" else n // 2)
                out["violations"] = out.get("violations", 0) + violations
        finally:
            if rank == 1:
                out["closed_at"] = time.time()  # wall clock: the sender's error is timed from here (same host)
            ep.close()
    out.update(rounds=len(quiet_s), max_quiet_s=max(quiet_s, default=None))


if __name__ == "__main__":
    main()
