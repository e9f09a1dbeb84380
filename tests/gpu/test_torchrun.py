"""A tandem job under torchrun, as a user runs it: MPS started through tandem.mps when the ranks outnumber the
GPUs (each rank's SM share through CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, as tandem.launch gives it), then
`python -m torch.distributed.run --standalone --nproc_per_node=2 tests/gpu/workers_torchrun.py`: every rank
builds tandem.Communicator() from torchrun's environment and checks ag_gemm / gemm_rs / gemm_ar against torch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "gpu", "workers_torchrun.py")
NPROC = 2
TIMEOUT_S = 240  # the torchrun job; a healthy run takes well under a minute
# pytest-timeout's bound above the job's own (device_suite.sh passes --timeout=150): this test's timeout fires
# first, stops torchrun and MPS, and reports the ranks' log
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(TIMEOUT_S + 120)]


def _stop(proc: subprocess.Popen):
    """torchrun in its own session: SIGTERM (it stops its workers), then SIGKILL to what is left of its group."""
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass


@pytest.mark.parametrize("bootstrap", ["env", "process_group"])
def test_torchrun_two_ranks_tp_ops_match_torch(tmp_path, bootstrap):
    from tandem.launch import plan
    from tandem.mps import MpsDaemon, gpu_count

    plans, use_mps = plan(NPROC, gpu_count())  # what tandem.launch would do: MPS when ranks outnumber GPUs
    env = dict(os.environ)
    env.update(PYTHONUNBUFFERED="1", TANDEM_RANK_DUMP_AFTER_S=str(TIMEOUT_S - 30),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TANDEM_DEVICE",
              "TANDEM_RANKS_PER_NODE", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"):
        env.pop(k, None)  # torchrun sets the rank variables; nothing of an outer launch may leak in
    # A daemon already running for this session (tests/conftest.py:mps_session exports its pipe folder) is
    # reused and left running; otherwise this starts one and stop() quits it.
    daemon = MpsDaemon()
    log = tmp_path / "torchrun.log"
    proc = None
    try:
        if use_mps:
            daemon.start()
            env.update(daemon.env())
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(plans[0].sm_percent)  # 50: the same share every rank
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={NPROC}",
               WORKER, str(tmp_path), bootstrap]
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _stop(proc)
                pytest.fail(f"torchrun still running after {TIMEOUT_S} s; stopped. Log:\n{log.read_text()[-6000:]}")
    finally:
        if proc is not None:
            _stop(proc)
        daemon.stop()
    text = log.read_text()
    paths = [tmp_path / f"{r}.json" for r in range(NPROC)]
    results = [json.loads(p.read_text()) if p.exists() else None for p in paths]
    # a rank's own error first: torchrun stops the other ranks when one fails, so they may have written nothing
    errors = [x for x in results if x is not None and "error" in x]
    assert not errors, "\n".join(f"rank {x['rank']}: {x['traceback']}" for x in errors) + f"\nLog:\n{text[-3000:]}"
    missing = [r for r, x in enumerate(results) if x is None]
    assert not missing, f"ranks {missing} wrote no result (torchrun exit {rc}). Log:\n{text[-6000:]}"
    assert rc == 0, f"torchrun exit {rc}. Log:\n{text[-6000:]}"

    for r, x in enumerate(results):
        assert x["rank"] == r and x["world"] == NPROC and x["local_rank"] == r, x
        if use_mps:
            assert x["mps_percent"] == str(plans[0].sm_percent), x
        assert len(x["cases"]) == 6, x
        for c in x["cases"]:
            assert c["finite"] and c["rel"] < 2e-2, (r, c)
            rows = NPROC * 256 if c["op"] in ("ag_gemm", "gemm_ar") else 256
            assert c["shape"] == [rows, 512], (r, c)
    # all-reduce: the same bits on every rank
    for i, c in enumerate(results[0]["cases"]):
        if c["op"] == "gemm_ar":
            assert len({x["cases"][i]["digest"] for x in results}) == 1, [x["cases"][i] for x in results]
