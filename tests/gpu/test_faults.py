"""kill -9 of a rank while fused AG+GEMM kernels that exchange data with it are in flight.

Run twice: under MPS (how tandem.launch runs several ranks on one GPU) and time-sliced (two ordinary CUDA
contexts on the GPU, no MPS), to separate what MPS does to the survivors from what tandem's kernels do. The
time-sliced run is the tandem check: there the survivor's context must stay usable, which it cannot if a
tandem kernel touched the dead peer's memory after it was unmapped (an illegal address in the survivor's own
context). docs/reliability.md records the outcome and what a survivor can do on a multi-GPU node."""

from __future__ import annotations

import json
import os
import tempfile
import time

import pytest

pytestmark = pytest.mark.gpu
W = "tests.gpu.workers_faults"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _record(name, results):
    """The survivors' outcomes go to $OUT/faults.jsonl when OUT is set (the device runs), for docs/reliability.md."""
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "faults.jsonl"), "a") as f:
            f.write(json.dumps(dict(test=name, results=results)) + "\n")


def _check_survivor(r, victim, killed_at, timeout_s):
    assert r is not None and "error" not in r, r
    # the peer monitor names the dead rank (11); a device timeout naming a peer (1) is the fallback
    assert r["raised"] and r["status"] in (11, 1), r
    assert r["peer"] == victim, r
    assert r["raised_at"] - killed_at <= timeout_s + 2.0, (r["raised_at"] - killed_at, r)


def test_kill_mid_ag_gemm_time_sliced(mps_session):
    """No MPS: the survivor raises naming the dead peer AND its own context keeps working (allocation, matmul,
    destroy). This is what fails if a tandem kernel accesses the dead peer's heap after it went away."""
    from tandem.launch import run_function

    timeout_s = 10.0
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as no_mps:
        # An empty pipe directory: the ranks find no MPS control daemon there and make ordinary contexts,
        # which the driver time-slices on the one GPU.
        env = {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "CUDA_MPS_PIPE_DIRECTORY": no_mps, "CUDA_MPS_LOG_DIRECTORY": no_mps}
        results, res = run_function(f"{W}:kill_mid_ag_gemm", 2, dict(victim=1, comm_timeout_s=timeout_s,
                                                                         stamp_dir=d, launches=16),
                                    mps="off", on_failure="wait", env=env, timeout_s=240)
        killed_at = float(open(os.path.join(d, "killed_at")).read())
    _record("time_sliced", results)
    assert not res.mps
    assert results[1] is None and res.returncodes[1] == -9, (res.returncodes, results[1])
    r = results[0]
    _check_survivor(r, 1, killed_at, timeout_s)
    assert r["context_ok"] and r["gpu_ok"] and r["destroyed"], r


@pytest.mark.parametrize("world", [2, 4])
def test_kill_mid_ag_gemm_under_mps(run_ranks, world):
    """Under MPS the survivors still raise naming the dead peer within the timeout. Their contexts may be lost:
    the MPS server tears the killed client's running kernel down as a fatal exception and reports it to every
    client of the GPU. Recorded, and a fresh process must then run on the GPU."""
    timeout_s = 10.0
    with tempfile.TemporaryDirectory() as d:
        # 1000 launches: the kernels take tens of microseconds under MPS, so a short queue would be finished
        # before the kill (the host blocks once the launch queue is full; the kill finds hundreds queued)
        res = run_ranks(f"{W}:kill_mid_ag_gemm", world, victim=1, comm_timeout_s=timeout_s, stamp_dir=d,
                        launches=1000, m_local=1024, on_failure="wait", allow_failures=True, timeout_s=240)
        killed_at = float(open(os.path.join(d, "killed_at")).read())
    _record(f"mps_w{world}", res)
    assert res[1] is None
    outcomes = []
    for i, r in enumerate(res):
        if i == 1:
            continue
        _check_survivor(r, 1, killed_at, timeout_s)
        outcomes.append((r["context_ok"], r["gpu_ok"], r["context_error"]))
        if not r["context_ok"]:
            assert "illegal memory access" in r["context_error"] or "MPS" in r["context_error"], r
    print("survivor outcomes under MPS (context_ok, gpu_ok, error):", outcomes)
    deadline = time.time() + 30
    while True:
        fresh = run_ranks("tests.gpu.workers_transport:gpu_sanity", 1, allow_failures=True, timeout_s=60)[0]
        if isinstance(fresh, dict) and "error" not in fresh:
            assert fresh["ok"], fresh
            break
        assert time.time() < deadline, f"no new process could use the GPU within 30 s: {fresh}"
        time.sleep(1.0)
