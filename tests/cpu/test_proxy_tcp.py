"""The proxy path (command queue -> proxy thread -> TCP -> remote proxy -> host memory) between two processes
in separate network namespaces joined by a veth pair. Needs root and iproute2; every address used lives in
namespaces this test creates, and they are deleted afterwards."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from tests.cpu.rank_procs import finish
from tandem._native import available

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = [pytest.mark.netns, pytest.mark.skipif(not available(), reason="tandem._C not built")]


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


@pytest.fixture(scope="module")
def netns_pair():
    if shutil.which("ip") is None:
        pytest.skip("iproute2 (ip) not installed")
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root")
    tag = f"{os.getpid() % 100000}"
    a, b = f"tdm-a{tag}", f"tdm-b{tag}"
    va, vb = f"tva{tag}", f"tvb{tag}"
    addr_a, addr_b = "10.231.7.1", "10.231.7.2"
    try:
        _ip("netns", "add", a)
        _ip("netns", "add", b)
    except subprocess.CalledProcessError as e:
        _ip("netns", "del", a, check=False)
        pytest.skip(f"cannot create network namespaces here: {e.stderr.strip()}")
    try:
        _ip("link", "add", va, "type", "veth", "peer", "name", vb)
        _ip("link", "set", va, "netns", a)
        _ip("link", "set", vb, "netns", b)
        for ns, dev, addr in ((a, va, addr_a), (b, vb, addr_b)):
            _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        yield dict(ns=(a, b), dev=(va, vb), addr=(addr_a, addr_b))
    finally:
        _ip("netns", "del", a, check=False)
        _ip("netns", "del", b, check=False)


def _start(pair, mode, rank, d, args, ns_index=None):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    i = rank if ns_index is None else ns_index
    cmd = ["ip", "netns", "exec", pair["ns"][i], sys.executable, "-m", "tests.cpu.proxy_worker", mode, d,
           str(rank), pair["addr"][i], json.dumps(args)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _run_pair(pair, mode, args, timeout=300, during=None, world=2):
    with tempfile.TemporaryDirectory() as d:
        # world 4: ranks 0 and 1 in the first namespace, 2 and 3 in the second (two "hosts" of two ranks)
        ps = [_start(pair, mode, r, d, dict(args, world=world), None if world == 2 else r * 2 // world)
              for r in range(world)]
        if during is not None:
            during()
        return [finish(p, timeout, f"{mode}: ")[0] for p in ps]


def test_100k_small_put_signals_arrive_in_order(netns_pair):
    n = 100_000
    send, recv = _run_pair(netns_pair, "ordered", dict(count=n, heap_mib=2))
    assert send["retired"] == n and send["tail"] == n
    assert recv["violations"] == 0 and recv["polls"] > 0


def test_four_ranks_on_two_hosts_stream_to_each_other_in_order(netns_pair):
    n = 20_000
    outs = _run_pair(netns_pair, "mesh", dict(count=n, heap_mib=2, capacity=64), world=4)
    for r in outs:
        assert r["sources"] == 3 and r["violations"] == 0, r
        assert r["retired"] == 3 * n, r


def test_full_queue_applies_back_pressure_and_loses_nothing(netns_pair):
    n = 20_000
    send, recv = _run_pair(netns_pair, "ordered", dict(count=n, heap_mib=1, capacity=8))
    assert send["retired"] == n
    assert recv["violations"] == 0


def test_one_gib_arrives_bit_exact(netns_pair):
    send, recv = _run_pair(netns_pair, "bulk", dict(rounds=8, round_mib=128, heap_mib=132, timeout_s=20.0))
    assert recv["bytes"] == 8 * 128 << 20 == 1 << 30
    assert recv["wrong"] == 0


def test_both_directions_at_full_speed_do_not_deadlock(netns_pair):
    # 64 MiB each way at once in 4 MiB frames: with acks written by the receive threads both sides could block
    # writing while neither reads (found on the H200 between emulated nodes)
    outs = _run_pair(netns_pair, "duplex", dict(rounds=16, round_mib=4, heap_mib=132, timeout_s=10.0), timeout=120)
    for r in outs:
        assert r["bytes"] == 64 << 20 and r["wrong"] == 0, r
        assert r["retired"] == 16, r


def test_link_cut_mid_transfer_fails_both_sides_within_timeout(netns_pair):
    timeout_s = 2.0
    cut = {}

    def cut_link():
        time.sleep(1.5)  # let the transfer run
        cut["at"] = time.time()
        _ip("-n", netns_pair["ns"][0], "link", "set", netns_pair["dev"][0], "down")

    try:
        send, recv = _run_pair(netns_pair, "cut", dict(put_mib=32, heap_mib=40, timeout_s=timeout_s), timeout=120,
                               during=cut_link)
    finally:
        _ip("-n", netns_pair["ns"][0], "link", "set", netns_pair["dev"][0], "up", check=False)
    for r in (send, recv):
        print(f"rank {r['rank']}: raised {r['at'] - cut['at']:.2f} s after the cut: {r.get('msg', '')[:160]}")
        assert r["raised"], r
        assert r["status"] in (1, 2, 6), r  # timeout, aborted (proxy stopped), or a socket error
        assert r["at"] - cut["at"] <= 2 * timeout_s + 2.0, (r["at"] - cut["at"], r)


def _routable_in(ns):
    code = "from tandem._native import native; import json; print(json.dumps(native()._routable_ipv4()))"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_proxy_address_for_a_job_across_hosts(netns_pair):
    # A namespace with loopback and one veth: the veth's address (what other hosts reach), never 127.0.0.1
    addr, why = _routable_in(netns_pair["ns"][0])
    assert addr == netns_pair["addr"][0], (addr, why)
    # Loopback only: nothing routable, and the reason names what was seen (the communicator raises with it)
    lonely = f"tdm-l{os.getpid() % 100000}"
    _ip("netns", "add", lonely)
    try:
        _ip("-n", lonely, "link", "set", "lo", "up")
        addr, why = _routable_in(lonely)
        assert addr == "" and "lo 127.0.0.1" in why, (addr, why)
    finally:
        _ip("netns", "del", lonely, check=False)
