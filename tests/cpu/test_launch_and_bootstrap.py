"""Launcher, bootstrap and error plumbing on the CPU (no GPU needed)."""

import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import tempfile

import pytest

from tandem.errors import TandemError
from tandem.launch import launch, plan


def test_plan_without_gpu_is_a_clear_error():
    with pytest.raises(TandemError, match="no NVIDIA GPU found"):
        plan(2, 0)


def test_plan_mps_shares():
    plans, use_mps = plan(4, 1)
    assert use_mps and [p.device for p in plans] == [0, 0, 0, 0] and {p.sm_percent for p in plans} == {25}
    plans, use_mps = plan(2, 1)
    assert use_mps and plans[0].sm_percent == 50
    plans, use_mps = plan(4, 4)
    assert not use_mps and [p.device for p in plans] == [0, 1, 2, 3] and plans[0].sm_percent is None
    plans, use_mps = plan(3, 1)
    assert use_mps and plans[0].sm_percent == 25  # not 33: cuBLAS dropped tiles at 36-42 SMs (launch._DEFAULT_PERCENT)
    plans, use_mps = plan(8, 2)
    assert use_mps and [p.device for p in plans] == [0, 1] * 4 and plans[0].sm_percent == 25
    with pytest.raises(TandemError):
        plan(0, 1)


def test_plan_sm_percent_override(monkeypatch):
    monkeypatch.delenv("TANDEM_SM_PERCENT", raising=False)
    assert plan(3, 1, sm_percent=31)[0][0].sm_percent == 31
    assert plan(3, 3, sm_percent=31)[0][0].sm_percent is None  # a GPU each: no MPS, no share
    monkeypatch.setenv("TANDEM_SM_PERCENT", "40")
    assert plan(3, 1)[0][2].sm_percent == 40
    assert plan(3, 1, sm_percent=20)[0][0].sm_percent == 20  # the argument wins over the environment
    for bad in ("0", "101", "x"):
        monkeypatch.setenv("TANDEM_SM_PERCENT", bad)
        with pytest.raises(TandemError, match="percentage in \\[1, 100\\]"):
            plan(3, 1)


def test_launcher_cli_refuses_a_bad_sm_percent_with_status_2(capsys):
    from tandem.launch import main

    assert main(["-n", "3", "--sm-percent", "0", "--", "true"]) == 2
    assert "percentage in [1, 100], got 0" in capsys.readouterr().err


def test_launch_sets_rank_env_and_reports_exit_codes(tmp_path):
    code = (
        "import os, sys; r = int(os.environ['RANK']);"
        f"open(os.path.join({str(tmp_path)!r}, str(r)), 'w').write(os.environ['WORLD_SIZE'] + ' ' + "
        "os.environ['MASTER_ADDR'] + ' ' + os.environ['TANDEM_BOOTSTRAP_DIR']);"
        "sys.exit(3 if r == 2 else 0)"
    )
    res = launch([sys.executable, "-c", code], 3, require_gpu=False, on_failure="wait", timeout_s=60)
    assert res.returncodes == [0, 0, 3]
    for r in range(3):
        world, addr, boot = open(tmp_path / str(r)).read().split()
        assert world == "3" and addr == "127.0.0.1" and boot


def test_launch_kills_hung_ranks_after_a_failure():
    code = "import os, sys, time; r = int(os.environ['RANK']); sys.exit(1) if r == 0 else time.sleep(600)"
    res = launch([sys.executable, "-c", code], 2, require_gpu=False, on_failure="kill", grace_s=0.5, timeout_s=60)
    assert res.returncodes[0] == 1 and res.returncodes[1] != 0
    assert res.elapsed_s < 30


def test_launch_timeout_raises():
    with pytest.raises(TandemError, match="still running"):
        launch([sys.executable, "-c", "import time; time.sleep(600)"], 1, require_gpu=False, timeout_s=1.0)


def test_launcher_cli_without_gpu_prints_clear_message():
    if os.path.exists("/dev/nvidia0"):
        pytest.skip("this machine has a GPU")
    r = subprocess.run([sys.executable, "-m", "tandem.launch", "-n", "2", "--", "true"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "no NVIDIA GPU found" in r.stderr


def test_tandem_error_is_picklable_and_named():
    e = TandemError("tandem: rank 3: barrier (peer 1): timeout", 1, "barrier", 3, 1)
    e2 = pickle.loads(pickle.dumps(e))
    assert (e2.status, e2.op, e2.rank, e2.peer, e2.is_timeout, e2.status_name) == (1, "barrier", 3, 1, True, "timeout")


def test_import_needs_no_gpu_and_communicator_says_why():
    r = subprocess.run([sys.executable, "-c", "import tandem; print(tandem.__version__)"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "0.1.0"
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(TandemError, match="no CUDA device"):
        import tandem

        tandem.Communicator()


def _file_bootstrap_rank(d, rank, world, q):
    from tandem._native import native

    q.put((rank, native().file_bootstrap_roundtrip(d, rank, world, f"value-of-{rank}")))


def test_file_bootstrap_all_gather_across_processes():
    pytest.importorskip("tandem._C")
    with tempfile.TemporaryDirectory() as d:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        ps = [ctx.Process(target=_file_bootstrap_rank, args=(d, r, 3, q)) for r in range(3)]
        for p in ps:
            p.start()
        got = dict(q.get(timeout=60) for _ in ps)
        for p in ps:
            p.join(30)
    for r in range(3):
        assert got[r] == [f"value-of-{i}" for i in range(3)]


def test_bootstrap_resolve_defaults():
    pytest.importorskip("torch")
    from tandem.bootstrap import resolve

    env = {k: os.environ.pop(k) for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k in os.environ}
    try:
        store, rank, world = resolve()
        assert (rank, world) == (0, 1)
        store.set("k", b"v")
        assert store.get("k") == b"v"
        with pytest.raises(TandemError, match="not in a world"):
            resolve(store, 3, 2)
        os.environ.update(RANK="1", WORLD_SIZE="2")
        with pytest.raises(TandemError, match="MASTER_ADDR"):
            resolve()
    finally:
        for k in ("RANK", "WORLD_SIZE"):
            os.environ.pop(k, None)
        os.environ.update(env)
