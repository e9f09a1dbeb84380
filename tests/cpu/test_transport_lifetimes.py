"""Failure paths of the host transport: a producer that times out on the command queue, a constructor that fails
once the proxy runs, and the same paths under AddressSanitizer (a standalone C++ driver, tests/cpu/asan/)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from tests.cpu.rank_procs import finish
from tandem._native import available, native

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_native = pytest.mark.skipif(not available(), reason="tandem._C not built")


@needs_native
def test_timed_out_producer_does_not_wedge_the_queue():
    from tandem.errors import TandemError

    q = native().CommandQueue(2, 0)
    q.push("put", 1, nbytes=8, timeout_s=0.1)
    q.push("put", 1, nbytes=8, timeout_s=0.1)
    with pytest.raises(TandemError) as e:
        q.push("put", 1, nbytes=8, timeout_s=0.2)  # the ring is full and nobody drains it
    assert e.value.status == 1 and "command not enqueued" in str(e.value)
    assert q.tail == 2  # no ticket was taken for it
    # the consumer drains; the next command gets ticket 2 and is there to be consumed (a reserved but never
    # published ticket 2 would hold the in-order consumer forever)
    assert q.peek(0) is not None and q.peek(1) is not None
    q.release_until(2)
    assert q.push("put", 1, nbytes=24, timeout_s=1.0) == 2
    cmd = q.peek(2)
    assert cmd is not None and cmd["bytes"] == 24


def _fault_pair(env_value):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TANDEM_TEST_FAIL_AFTER_PROXY=env_value)
    with tempfile.TemporaryDirectory() as d:
        ps = [subprocess.Popen([sys.executable, "-m", "tests.cpu.security_worker", "fault", d, str(r), "2", "{}"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
              for r in range(2)]
        return [finish(p, 60)[0] for p in ps]


@needs_native
def test_constructor_failing_after_the_proxy_started_unwinds():
    for r in _fault_pair("all"):
        assert r["raised"] and r["status"] == 10, r
        assert "fault injected after the proxy started" in r["msg"], r
        assert r["elapsed_s"] < 30, r


@needs_native
def test_one_rank_failing_after_the_proxy_started_leaves_the_other_intact():
    ok, failed = _fault_pair("1")
    assert not ok["raised"], ok
    assert failed["raised"] and "TANDEM_TEST_FAIL_AFTER_PROXY" in failed["msg"], failed


# --- AddressSanitizer -------------------------------------------------------------------------------------------

SOURCES = ["transport/src/proxy/proxy.cc", "transport/src/proxy/queue.cc", "transport/src/proxy/tcp_backend.cc",
           "transport/src/peer_monitor.cc", "transport/src/bootstrap.cc", "transport/src/status.cc"]


@pytest.fixture(scope="module")
def asan_driver():
    cxx = shutil.which("g++")
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if cxx is None:
        pytest.skip("no g++")
    if not os.path.exists(os.path.join(cuda, "include", "cuda_runtime_api.h")):
        pytest.skip("no CUDA headers (status.cc formats CUDA errors)")
    out = os.path.join(tempfile.mkdtemp(prefix="tandem-asan-"), "transport_asan")
    cmd = [cxx, "-std=c++20", "-g", "-O1", "-fsanitize=address,undefined", "-fno-omit-frame-pointer",
           "-fno-sanitize-recover=undefined", f"-I{ROOT}/transport/include", f"-I{ROOT}/transport/src",
           f"-I{cuda}/include", os.path.join(ROOT, "tests/cpu/asan/transport_asan.cc"),
           *[os.path.join(ROOT, s) for s in SOURCES], f"-L{cuda}/lib64", "-lcudart_static", "-ldl", "-lrt",
           "-lpthread", "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if r.returncode != 0 and "asan" in r.stderr.lower() and "cannot find" in r.stderr:
        pytest.skip(f"no AddressSanitizer runtime: {r.stderr[-500:]}")
    assert r.returncode == 0, r.stderr[-3000:]
    yield out
    shutil.rmtree(os.path.dirname(out), ignore_errors=True)


def _asan(driver, scenario):
    env = dict(os.environ, TANDEM_TEST_FAIL_AFTER_PROXY="all", ASAN_OPTIONS="detect_leaks=1:abort_on_error=0")
    with tempfile.TemporaryDirectory() as d:
        return subprocess.run([driver, scenario, d], capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize("scenario", ["fault_after_proxy", "hostile_frame", "queue_timeout", "monitor_strays"])
def test_failure_paths_are_clean_under_asan(asan_driver, scenario):
    r = _asan(asan_driver, scenario)
    assert "ERROR: AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr[-4000:]
    assert "ERROR: LeakSanitizer" not in r.stderr, r.stderr[-4000:]
    assert r.returncode == 0, r.stderr[-4000:]


def test_asan_catches_the_unsafe_teardown_order(asan_driver):
    # negative control: the backend freed under the running proxy thread (what member destruction order alone
    # did) is reported, so the clean runs above mean something
    r = _asan(asan_driver, "unsafe_order")
    assert r.returncode != 0 and "heap-use-after-free" in r.stderr, r.stderr[-4000:]


@needs_native
def test_proxy_queue_refuses_an_unknown_signal_op():
    from tandem.errors import TandemError

    q = native().CommandQueue(4, 0)
    with pytest.raises(TandemError, match="signal_op must be 'set' or 'add', got 'sum'"):
        q.push("signal", 1, sig=8, value=1, signal_op="sum", timeout_s=0.1)
    assert q.tail == 0  # refused before a ticket was taken
    assert q.push("signal", 1, sig=8, value=1, signal_op="add", timeout_s=0.1) == 0
    assert q.peek(0)["signal_op"] == "add"
