"""One rank of the "who can connect" tests (tests/cpu/test_security.py); prints JSON lines on stdout.

usage: python -m tests.cpu.security_worker MODE BOOTSTRAP_DIR RANK WORLD [JSON_ARGS]
  fdx     the heap's fd exchange with a memfd in place of the cuMem fd; prints what came through each peer's fd
  monitor the node-local peer monitor; prints "up", then on each stdin line "report" its counters; "close" ends
  victim  a TCP proxy endpoint (rank 1 of 2) whose rank 0 is the test itself, playing a hostile peer
  fault   a TCP proxy endpoint whose constructor fails after its proxy started (TANDEM_TEST_FAIL_AFTER_PROXY)
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np

from tandem._native import native
from tandem.errors import TandemError


def say(**kw):
    print(json.dumps(kw), flush=True)


def main():
    mode, d, rank, world = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    args = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    if mode == "fdx":
        try:
            got, refused = native()._fd_exchange_for_test(d, rank, world, args.get("timeout_s", 20.0),
                                                          f"payload of rank {rank}")
        except TandemError as e:
            if not args.get("report_error"):
                raise
            say(rank=rank, error=str(e), status=e.status, op=e.op, peer=e.peer)
            return
        say(rank=rank, got={str(k): v for k, v in got.items()}, refused=refused)
    elif mode == "monitor":
        m = native()._PeerMonitorForTest(d, rank, world, args.get("timeout_s", 20.0))
        say(rank=rank, up=True)
        for line in sys.stdin:
            if line.strip() == "report":
                say(rank=rank, accepted=m.accepted, refused=m.refused, exited_peer=m.exited_peer)
            elif line.strip() == "close":
                m.close()
                say(rank=rank, closed=True)
                return
    elif mode == "victim":
        heap = np.zeros(args.get("heap_mib", 1) << 20, dtype=np.uint8)
        ep = native().ProxyEndpoint(d, rank, world, "127.0.0.1", heap, 64, args.get("timeout_s", 10.0))
        out = dict(rank=rank, raised=False)
        try:
            ep.wait_ge(0, 1, 20.0)  # the hostile peer's one valid put_signal arrived
            out["valid_put"] = bytes(heap[4096:4112]).hex()
            deadline = time.monotonic() + 20.0
            while time.monotonic() < deadline:
                ep.check()
                time.sleep(0.02)
        except TandemError as e:
            out.update(raised=True, status=e.status, op=e.op, peer=e.peer, msg=str(e))
        heap[0:8] = 0  # the valid put_signal's flag and data: everything else must still be zero
        heap[4096:4112] = 0
        out["nonzero"] = int(np.count_nonzero(heap))
        ep.close()
        say(**out)
    elif mode == "fault":
        heap = np.zeros(1 << 20, dtype=np.uint8)
        t0 = time.monotonic()
        try:
            native().ProxyEndpoint(d, rank, world, "127.0.0.1", heap, 64, args.get("timeout_s", 10.0))
            say(rank=rank, raised=False)
        except TandemError as e:
            say(rank=rank, raised=True, status=e.status, op=e.op, msg=str(e), elapsed_s=time.monotonic() - t0)
    else:
        raise ValueError(mode)


if __name__ == "__main__":
    main()
