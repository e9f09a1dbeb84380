"""Who can connect (docs/transports.md): stray processes against the heap's fd exchange, the peer monitor and the
TCP proxy. Each stray is refused (its connection closed, no descriptor, nothing applied), does not take a peer's
place, and the job completes. Everything talks over abstract unix sockets or 127.0.0.1; every wait is bounded.

The strays know what a member knows except the secret (they read the session name and the addresses from the
bootstrap directory); some even use the right secret with a wrong rank, a wrong pid or a wrong uid."""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from tests.cpu.rank_procs import finish
from tandem._native import available

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(not available(), reason="tandem._C not built")

LOCAL_MAGIC = 0x6C6E6454  # unix_socket.h kLocalHelloMagic
TCP_MAGIC = 0x746E6450    # tcp_backend.cc kMagic
HANDSHAKE_S = 2.0         # kLocalHandshake / kHelloTimeout


def _key_path(d, key):
    return os.path.join(d, key.replace("/", "."))


def _wait_key(d, key, timeout=30.0):
    p = _key_path(d, key)
    deadline = time.monotonic() + timeout
    while not os.path.exists(p):
        assert time.monotonic() < deadline, f"key {key} never appeared"
        time.sleep(0.01)
    with open(p, "rb") as f:
        return f.read()


def _spawn(mode, d, rank, world, args=None, env=None, stdin=False, module="tests.cpu.security_worker", extra=()):
    e = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.update(env or {})
    cmd = [sys.executable, "-m", module, mode, d, str(rank), *extra]
    if module == "tests.cpu.security_worker":
        cmd.append(str(world))
    cmd.append(json.dumps(args or {}))
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e, cwd=ROOT,
                            stdin=subprocess.PIPE if stdin else None)


def _finish(p, timeout=60):
    return finish(p, timeout)


def _local_hello(rank, secret):
    return struct.pack("<Ii32s", LOCAL_MAGIC, rank, secret)


class Stray:
    """One connection of a stray process: connects at once, sends `payload`, then watches for a descriptor and
    for the other side closing. `result` = dict(fd=bool, closed_after=seconds or None)."""

    def __init__(self, connect, payload=b""):
        self.sock = connect()
        self.t0 = time.monotonic()
        if payload:
            self.sock.sendall(payload)
        self.result = None
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self):
        got_fd = False
        closed = None
        self.sock.settimeout(15.0)
        try:
            while True:
                if self.sock.family == socket.AF_UNIX:
                    data, anc, _, _ = self.sock.recvmsg(64, socket.CMSG_SPACE(4 * 4))
                    for level, kind, _ in anc:
                        got_fd |= level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
                else:
                    data = self.sock.recv(1 << 16)
                if not data:
                    closed = time.monotonic() - self.t0
                    break
        except ConnectionResetError:
            closed = time.monotonic() - self.t0
        except socket.timeout:
            pass
        self.result = dict(fd=got_fd, closed_after=closed)

    def wait(self, timeout=20.0):
        self.thread.join(timeout)
        assert self.result is not None, "stray watcher hung"
        self.sock.close()
        return self.result


def _abstract(name):
    def connect():
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect("\0" + name)
        return s
    return connect


_OTHER_UID_STRAY = r"""
import socket, struct, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("\0" + sys.argv[1])
s.sendall(struct.pack("<Ii32s", int(sys.argv[2]), int(sys.argv[3]), bytes.fromhex(sys.argv[4])))
print("connected", flush=True)
s.settimeout(15.0)
fd = False
try:
    while True:
        data, anc, _, _ = s.recvmsg(64, socket.CMSG_SPACE(16))
        fd |= any(l == socket.SOL_SOCKET and k == socket.SCM_RIGHTS for l, k, _ in anc)
        if not data:
            break
    print("closed", fd, flush=True)
except ConnectionResetError:
    print("closed", fd, flush=True)
except socket.timeout:
    print("open", fd, flush=True)
"""


def _other_uid_stray(name, rank, secret):
    """A process of another uid (nobody) that even has the secret; None unless we are root."""
    if os.geteuid() != 0:
        return None
    for exe in ("/usr/bin/python3", sys.executable):  # one that uid 65534 may execute
        try:
            p = subprocess.Popen([exe, "-c", _OTHER_UID_STRAY, name, str(LOCAL_MAGIC), str(rank), secret.hex()],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, user=65534,
                                 group=65534, cwd="/")
            break
        except (PermissionError, FileNotFoundError):
            continue
    else:
        return None
    line = p.stdout.readline().strip()
    assert line == "connected", (line, p.stderr.read())
    return p


def _other_uid_result(p):
    o, e = p.communicate(timeout=20)
    return o.strip().splitlines()[-1]


def _local_strays(name, secret, claim_rank, own_rank):
    """The strays of the local listeners: in the listener's backlog before the real peer connects."""
    strays = {
        "no hello": Stray(_abstract(name)),
        "wrong secret": Stray(_abstract(name), _local_hello(claim_rank, os.urandom(32))),
        "bad magic": Stray(_abstract(name), struct.pack("<Ii32s", 0x12345678, claim_rank, secret)),
        "unknown rank": Stray(_abstract(name), _local_hello(77, secret)),
        "its own rank": Stray(_abstract(name), _local_hello(own_rank, secret)),
        # right secret, right rank, but not the process that rank published (pid check of SO_PEERCRED)
        "wrong pid": Stray(_abstract(name), _local_hello(claim_rank, secret)),
    }
    return strays


def test_fd_exchange_refuses_strays_and_serves_every_peer():
    with tempfile.TemporaryDirectory() as d:
        r0 = _spawn("fdx", d, 0, 2)
        _wait_key(d, "fdx/listening/0")  # rank 0 listens; rank 1 is not started yet
        session = _wait_key(d, "fdx/session/0").decode()
        secret = _wait_key(d, "fdx/secret")
        assert len(secret) == 32
        name = f"tandem.{session}.0"
        strays = _local_strays(name, secret, 1, 0)
        other = _other_uid_stray(name, 1, secret)
        r1 = _spawn("fdx", d, 1, 2)
        out0, err0 = _finish(r0)
        out1, _ = _finish(r1)
    # every peer was served its peer's descriptor, and only that
    assert out0["got"] == {"1": "payload of rank 1"}, out0
    assert out1["got"] == {"0": "payload of rank 0"}, out1
    results = {k: s.wait() for k, s in strays.items()}
    for k, r in results.items():
        assert not r["fd"], (k, r)
        assert r["closed_after"] is not None, (k, r)
    assert results["no hello"]["closed_after"] >= HANDSHAKE_S - 0.2
    assert out0["refused"] == len(strays) + (other is not None), (out0, err0)
    assert "wrong job secret" in err0 and "not a local peer" in err0 and "is not the rank's" in err0, err0
    assert secret.hex() not in err0  # refusals are logged without the secret
    if other is not None:
        assert _other_uid_result(other) == "closed False"
        assert "uid 65534 is not ours" in err0, err0


def test_fd_exchange_peer_that_never_connects_is_a_timeout_naming_it():
    # Rank 1 publishes its listening key (so rank 0 gets past the bootstrap) but never listens or connects.
    # Rank 0 must raise once, within its timeout: status timeout (1), naming peer 1, one "tandem: rank 0:" prefix
    # (the fd exchange used to wrap its inner error in a second "system error" message).
    timeout_s = 1.5
    with tempfile.TemporaryDirectory() as d:
        r0 = _spawn("fdx", d, 0, 2, dict(timeout_s=timeout_s, report_error=True))
        _wait_key(d, "fdx/listening/0")
        with open(_key_path(d, "fdx/listening/1"), "w") as f:
            f.write("never-connects")
        t0 = time.monotonic()
        out0, _ = _finish(r0)
        took = time.monotonic() - t0
    assert "error" in out0, out0
    assert out0["status"] == 1 and out0["op"] == "heap.fd_exchange" and out0["peer"] == 1, out0
    assert out0["error"].count("tandem: rank 0:") == 1, out0
    assert "cannot connect to peer" in out0["error"], out0
    assert took < timeout_s + 10, took


def test_peer_monitor_serves_only_authenticated_peers():
    with tempfile.TemporaryDirectory() as d:
        r0 = _spawn("monitor", d, 0, 2, stdin=True)
        _wait_key(d, "monitor/listening/0")
        session = _wait_key(d, "monitor/session/0").decode()
        secret = _wait_key(d, "monitor/secret")
        name = f"tandem.mon.{session}.0"
        strays = _local_strays(name, secret, 1, 0)
        other = _other_uid_stray(name, 1, secret)
        r1 = _spawn("monitor", d, 1, 2, stdin=True)
        for p in (r0, r1):
            line = p.stdout.readline()
            assert json.loads(line)["up"], line
        # after setup: the real rank 1 is connected, so the same claim is a duplicate; then a flood of silent
        # connections, more than the monitor holds at once (16)
        late = {"duplicate rank": Stray(_abstract(name), _local_hello(1, secret))}
        flood = [Stray(_abstract(name)) for _ in range(24)]
        results = {k: s.wait() for k, s in {**strays, **late}.items()}
        flood_results = [s.wait() for s in flood]
        r0.stdin.write("report\n")
        r0.stdin.flush()
        report = json.loads(r0.stdout.readline())
        for p in (r0, r1):
            p.stdin.write("close\n")
            p.stdin.flush()
        _, err0 = _finish(r0)
        _finish(r1)
    for k, r in results.items():
        assert r["closed_after"] is not None and r["closed_after"] < HANDSHAKE_S + 3, (k, r)
    for r in flood_results:
        assert r["closed_after"] is not None and r["closed_after"] < HANDSHAKE_S + 3, r
    n_refused = len(strays) + len(late) + len(flood) + (other is not None)
    assert report["accepted"] == 1 and report["refused"] == n_refused, report
    assert report["exited_peer"] == -1, report  # strays that went away are not a peer's death
    assert "already connected" in err0 and "too many connections" in err0, err0
    if other is not None:
        assert _other_uid_result(other) == "closed False"


# --- TCP proxy --------------------------------------------------------------------------------------------------

def _tcp_hello(rank, secret, magic=TCP_MAGIC):
    return struct.pack("<IIQ32s", magic, 5, rank, secret)


def _frame(kind, ticket=0, op=0, peer=0, flags=0, signal_op=0, src=0, dst=0, nbytes=0, sig=0, value=0):
    return struct.pack("<IIQ48xQIiHHIQQQQQ", TCP_MAGIC, kind, ticket, 0, op, peer, 0, flags, signal_op, src, dst,
                       nbytes, sig, value)


def _established_to(port):
    """Established TCP connections whose local port is `port` (the listener's accepted or backlogged ones)."""
    n = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if int(cols[1].split(":")[1], 16) == port and cols[3] == "01":
                n += 1
    return n


def test_tcp_proxy_refuses_strays_and_the_job_completes():
    n = 2000
    heap_mib = 2
    args = dict(count=n, heap_mib=heap_mib, capacity=64, timeout_s=20.0, world=4)
    with tempfile.TemporaryDirectory() as d:
        ps = {r: _spawn("mesh", d, r, 4, args, module="tests.cpu.proxy_worker", extra=("127.0.0.1",))
              for r in (0, 1, 3)}
        host, port = _wait_key(d, "proxy/tcp/3").decode().rsplit(":", 1)
        port = int(port)
        secret = _wait_key(d, "proxy/secret")
        # ranks 0 and 1 connect to 3 (highest peer first) and then wait for rank 2, which is not started yet
        deadline = time.monotonic() + 20
        while _established_to(port) < 2:
            assert time.monotonic() < deadline, "ranks 0 and 1 never connected to rank 3"
            time.sleep(0.02)

        def tcp():
            return socket.create_connection((host, port), timeout=5)

        # after each hello, a data frame that would write 0xEE over rank 3's guard region (the last 64 KiB)
        guard = (heap_mib << 20) - 65536
        evil = _frame(1, op=1, peer=3, dst=guard, nbytes=4096) + b"\xee" * 4096
        strays = {
            "no hello": Stray(tcp),
            "wrong secret": Stray(tcp, _tcp_hello(2, os.urandom(32)) + evil),
            "bad magic": Stray(tcp, _tcp_hello(2, secret, magic=0x11111111) + evil),
            "unknown rank": Stray(tcp, _tcp_hello(9, secret) + evil),
            "rank 2**63": Stray(tcp, _tcp_hello(1 << 63, secret) + evil),
            "its own rank": Stray(tcp, _tcp_hello(3, secret) + evil),
            "duplicate rank 0": Stray(tcp, _tcp_hello(0, secret) + evil),
            "duplicate rank 1": Stray(tcp, _tcp_hello(1, secret) + evil),
        }
        results = {k: s.wait() for k, s in strays.items()}
        ps[2] = _spawn("mesh", d, 2, 4, args, module="tests.cpu.proxy_worker", extra=("127.0.0.1",))
        outs = {r: _finish(p, timeout=120) for r, p in ps.items()}
    for k, r in results.items():
        assert r["closed_after"] is not None and r["closed_after"] < HANDSHAKE_S + 3, (k, r)
    for r, (out, _) in outs.items():
        assert out["sources"] == 3 and out["violations"] == 0 and out["retired"] == 3 * n, out
        assert out["guard_nonzero"] == 0, out  # nothing any stray sent was applied
    out3, err3 = outs[3]
    assert out3["refused"] == len(strays), (out3, err3)
    for why in ("no hello", "wrong job secret", "bad hello", "is not a remote peer", "is already connected"):
        assert why in err3, (why, err3)
    assert secret.hex() not in err3


class HostilePeer:
    """Plays rank 0 of 2 against a real rank 1 (mode victim): publishes the job secret as rank 0 would, connects
    with a valid hello, sends one valid put_signal, waits for its ack, then sends `bogus`."""

    def __init__(self, d, bogus):
        self.secret = os.urandom(32)
        with open(_key_path(d, "proxy/secret") + ".tmp", "wb") as f:
            f.write(self.secret)
        os.rename(_key_path(d, "proxy/secret") + ".tmp", _key_path(d, "proxy/secret"))
        host, port = _wait_key(d, "proxy/tcp/1").decode().rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.sendall(_tcp_hello(0, self.secret))
        self.sock.sendall(_frame(1, ticket=0, op=2, peer=1, flags=1, src=4096, dst=4096, nbytes=16, sig=0, value=1)
                          + b"\x11" * 16)
        deadline = time.monotonic() + 10
        while True:  # until the ack (kind 2) comes back: the valid frame was applied
            hdr = b""
            while len(hdr) < 128:
                chunk = self.sock.recv(128 - len(hdr))
                assert chunk, "victim closed before acking the valid frame"
                hdr += chunk
            if struct.unpack_from("<II", hdr)[1] == 2:
                break
            assert time.monotonic() < deadline
        time.sleep(0.2)
        self.sock.sendall(bogus)
        self.sock.settimeout(1.0)

    def close(self):
        self.sock.close()


HEAP = 1 << 20
BOGUS = {
    # a 2^63-byte payload: must fail the link before any allocation (resize would abort the process)
    "length 2^63": (_frame(1, op=1, peer=1, dst=0, nbytes=1 << 63), "exceeds the cap of 4194304"),
    # one byte more than any frame a proxy sends
    "length cap+1": (_frame(1, op=1, peer=1, dst=0, nbytes=(4 << 20) + 1), "exceeds the cap of 4194304"),
    "write past the heap": (_frame(1, op=1, peer=1, dst=HEAP - 100, nbytes=4096) + b"\xee" * 4096,
                            "outside this rank's heap"),
    "offset wraps": (_frame(1, op=1, peer=1, dst=(1 << 64) - 8, nbytes=16) + b"\xee" * 16,
                     "outside this rank's heap"),
    "flag outside": (_frame(1, op=3, peer=1, sig=HEAP, value=7), "not an aligned flag"),
    "flag misaligned": (_frame(1, op=3, peer=1, sig=12, value=7), "not an aligned flag"),
    "unknown op": (_frame(1, op=9, peer=1, dst=0, nbytes=8) + b"\xee" * 8, "unknown op 9"),
    "wrong destination": (_frame(1, op=1, peer=5, dst=0, nbytes=8) + b"\xee" * 8, "addressed to rank 5"),
}


@pytest.mark.parametrize("case", sorted(BOGUS))
def test_tcp_proxy_survives_bogus_frames_from_an_authenticated_peer(case):
    bogus, expect = BOGUS[case]
    with tempfile.TemporaryDirectory() as d:
        victim = _spawn("victim", d, 1, 2, dict(heap_mib=1, timeout_s=10.0))
        peer = HostilePeer(d, bogus)
        try:
            out, err = _finish(victim, timeout=60)  # exit 0: no abort, no crash
        finally:
            peer.close()
    assert out["valid_put"] == "11" * 16, out  # the link worked before the bogus frame
    assert out["raised"] and out["peer"] == 0 and expect in out["msg"], out
    assert out["nonzero"] == 0, out  # the bogus frame wrote nothing
