"""The launcher's and MPS's cleanup on the CPU (issue 20): SIGTERM/SIGINT to the launcher leave no rank and no MPS
daemon behind; a failed or hung MPS start leaves nothing behind either.

No GPU here: a fake `nvidia-smi` (lists one GPU, so that two ranks need MPS) and a fake `nvidia-cuda-mps-control`
go first on PATH. The fake control's `-d` starts a fake daemon (a sleeping process in its own session, as a real
daemon detaches) and creates the control pipe file; `quit` on its stdin kills the daemon and removes the pipe.
Both write what they did to a record file. FAKE_MPS_MODE makes `-d` fail (exit 1), hang (after starting the
daemon, which then stays in the hung call's process group) or exit 0 without ever creating the pipe.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

import tandem
from tandem.errors import TandemError

pytestmark = pytest.mark.timeout(120)

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(tandem.__file__)))

FAKE_SMI = """\
#!{python}
print("GPU 0: Fake H200 (UUID: GPU-00000000-fake)")
"""

FAKE_CTL = """\
#!{python}
import os, signal, subprocess, sys, time

record = os.environ["FAKE_MPS_RECORD"]
mode = os.environ.get("FAKE_MPS_MODE", "ok")
pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]


def log(line):
    with open(record, "a") as f:
        f.write(line + "\\n")


if sys.argv[1:] == ["-d"]:
    log("start %d" % os.getpid())
    if mode == "fail":
        sys.stderr.write("fake: cannot start the daemon\\n")
        sys.exit(1)
    daemon = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=(mode != "hang"))
    log("daemon %d" % daemon.pid)
    if mode == "hang":
        time.sleep(600)
    if mode != "nopipe":
        open(os.path.join(pipe, "control"), "w").close()
    sys.exit(0)
command = sys.stdin.read().strip()
log("command " + command)
if command == "quit":
    for line in open(record).read().splitlines():
        if line.startswith("daemon "):
            try:
                os.kill(int(line.split()[1]), signal.SIGTERM)
            except ProcessLookupError:
                pass
    try:
        os.remove(os.path.join(pipe, "control"))
    except FileNotFoundError:
        pass
"""


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    """PATH with the fakes first, a record file, TMPDIR in tmp_path; the same applied to this process. Kills every
    process the record or the test names at the end, so that a failing test leaves nothing running either."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, text in (("nvidia-smi", FAKE_SMI), ("nvidia-cuda-mps-control", FAKE_CTL)):
        path = bindir / name
        path.write_text(text.format(python=sys.executable))
        path.chmod(0o755)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    record = tmp_path / "record"
    record.write_text("")
    env = dict(os.environ)
    for k in ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "FAKE_MPS_MODE"):
        env.pop(k, None)
        monkeypatch.delenv(k, raising=False)
    env.update(PATH=f"{bindir}{os.pathsep}{env['PATH']}", FAKE_MPS_RECORD=str(record), TMPDIR=str(tmp),
               PYTHONPATH=PKG_PARENT + os.pathsep + env.get("PYTHONPATH", ""))
    for k in ("PATH", "FAKE_MPS_RECORD", "TMPDIR"):
        monkeypatch.setenv(k, env[k])
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    state = dict(env=env, record=record, tmp=tmp, pids=[])
    yield state
    # Only processes of this test that still run: a number whose process ended may have been reused since.
    for pid in state["pids"] + _recorded(record, "daemon") + _recorded(record, "start"):
        cmd = _cmdline(pid)
        if _alive(pid) and (str(tmp_path) in cmd or "time.sleep(600)" in cmd):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _recorded(record, what) -> list:
    return [int(line.split()[1]) for line in record.read_text().splitlines() if line.startswith(what + " ")]


def _alive(pid: int) -> bool:
    """Running (a zombie counts as gone: it no longer runs, only waits for its parent to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_until(cond, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def _all_gone(pids, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _leftovers(tmp) -> list:
    return sorted(n for n in os.listdir(tmp) if n.startswith(("tandem-mps-", "tandem-boot-")))


def _write_pid_file(piddir) -> str:
    """Python statements for a rank: its pid into piddir/<RANK>, the file appearing whole (written beside the
    directory, then renamed into it). The tests count the files and then read them; a file opened but not yet
    written read as '' (CI, 2026-12-07)."""
    return (f"import os, signal, time; d = {str(piddir)!r}; t = d + '.' + os.environ['RANK']; "
            f"open(t, 'w').write(str(os.getpid())); os.replace(t, os.path.join(d, os.environ['RANK']))")


def _start_launcher(fake_gpu, tmp_path, rank_code: str, nprocs=2, extra=()):
    piddir = tmp_path / "pids"
    piddir.mkdir(exist_ok=True)
    code = f"{_write_pid_file(piddir)}; {rank_code}; time.sleep(600)"
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tandem.launch", "-n", str(nprocs), *extra, "--", sys.executable, "-c", code],
        env=fake_gpu["env"], start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # a shell's background job (CI started with `&`) inherits SIGINT ignored, and so would the launcher: the test
        # is of a launcher started from a terminal, with the default disposition
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    fake_gpu["pids"].append(launcher.pid)
    return launcher, piddir


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_stops_ranks_and_mps(fake_gpu, tmp_path, signum):
    launcher, piddir = _start_launcher(fake_gpu, tmp_path, "pass")
    try:
        _wait_until(lambda: len(os.listdir(piddir)) == 2 or launcher.poll() is not None, 60, "both ranks")
        assert launcher.poll() is None, launcher.communicate()
        ranks = [int((piddir / r).read_text()) for r in ("0", "1")]
        fake_gpu["pids"].extend(ranks)
        daemons = _recorded(fake_gpu["record"], "daemon")
        assert len(daemons) == 1 and _alive(daemons[0]), fake_gpu["record"].read_text()
        launcher.send_signal(signum)
        out, err = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 128 + signum, err
    assert f"{signal.Signals(signum).name} received" in err
    assert _all_gone(ranks + daemons) == [], "ranks or the MPS daemon survived the launcher"
    assert "command quit" in fake_gpu["record"].read_text()
    assert _leftovers(fake_gpu["tmp"]) == []


def test_rank_ignoring_sigterm_is_killed_after_the_grace(fake_gpu, tmp_path):
    launcher, piddir = _start_launcher(fake_gpu, tmp_path, "signal.signal(signal.SIGTERM, signal.SIG_IGN)",
                                       extra=("--term-grace", "1"))
    try:
        _wait_until(lambda: len(os.listdir(piddir)) == 2 or launcher.poll() is not None, 60, "both ranks")
        ranks = [int((piddir / r).read_text()) for r in ("0", "1")]
        fake_gpu["pids"].extend(ranks)
        time.sleep(0.2)  # the ranks have installed SIG_IGN (it comes before the pid file is written)
        t0 = time.monotonic()
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 128 + signal.SIGTERM, err
    assert 0.9 <= took < 15, took
    assert _all_gone(ranks + _recorded(fake_gpu["record"], "daemon")) == []


def test_signal_during_a_hung_mps_start_stops_it(fake_gpu, tmp_path):
    fake_gpu["env"]["FAKE_MPS_MODE"] = "hang"
    launcher, piddir = _start_launcher(fake_gpu, tmp_path, "pass")
    try:
        _wait_until(lambda: _recorded(fake_gpu["record"], "daemon") or launcher.poll() is not None, 60,
                    "the MPS start")
        launcher.send_signal(signal.SIGTERM)
        _, err = launcher.communicate(timeout=30)  # well before the start's own 30 s timeout
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 128 + signal.SIGTERM, err
    procs = _recorded(fake_gpu["record"], "start") + _recorded(fake_gpu["record"], "daemon")
    assert _all_gone(procs) == []
    assert os.listdir(piddir) == []  # no rank was started
    assert _leftovers(fake_gpu["tmp"]) == []


@pytest.mark.parametrize("mode,match", [("fail", r"-d failed \(exit 1\): fake: cannot start the daemon"),
                                        ("hang", r"did not return within 1 s"),
                                        ("nopipe", r"control pipe .*control did not appear within 1 s")])
def test_failed_mps_start_cleans_up(fake_gpu, monkeypatch, mode, match):
    from tandem.mps import MpsDaemon

    monkeypatch.setenv("FAKE_MPS_MODE", mode)
    d = MpsDaemon(start_timeout_s=1, pipe_timeout_s=1, quit_timeout_s=10)
    with pytest.raises(TandemError, match=match):
        d.start()
    record = fake_gpu["record"].read_text()
    procs = _recorded(fake_gpu["record"], "start") + _recorded(fake_gpu["record"], "daemon")
    assert _all_gone(procs) == [], record
    assert "command quit" in record  # a daemon may have come up: it was told to quit
    assert _leftovers(fake_gpu["tmp"]) == [] and not d.started
    d.stop()  # idempotent: nothing more is sent
    assert fake_gpu["record"].read_text() == record


def test_failed_mps_start_in_launch_cleans_up(fake_gpu, monkeypatch):
    from tandem.launch import launch

    monkeypatch.setenv("FAKE_MPS_MODE", "fail")
    with pytest.raises(TandemError, match="-d failed"):
        launch([sys.executable, "-c", "pass"], 2, timeout_s=60)
    assert _leftovers(fake_gpu["tmp"]) == []
    assert "command quit" in fake_gpu["record"].read_text()


def test_mps_stop_is_idempotent_and_leaves_a_reused_daemon(fake_gpu, tmp_path):
    from tandem.mps import MpsDaemon

    with MpsDaemon() as d:
        assert d.started and d.running()
        pipe = d.pipe_dir
        reused = MpsDaemon(pipe_dir=pipe, log_dir=d.log_dir).start()  # finds the running one
        assert not reused.started
        reused.stop()
        assert d.running()  # not quit by the object that only reused it
    record = fake_gpu["record"].read_text()
    assert record.count("command quit") == 1 and not os.path.exists(pipe)
    assert _all_gone(_recorded(fake_gpu["record"], "daemon")) == []
    d.stop()
    assert fake_gpu["record"].read_text() == record
    assert _leftovers(fake_gpu["tmp"]) == []


def test_launcher_signal_handlers_are_restored(fake_gpu):
    from tandem.launch import launch

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    res = launch([sys.executable, "-c", "pass"], 1, require_gpu=False, mps="off", timeout_s=60)
    assert res.ok
    assert {s: signal.getsignal(s) for s in before} == before



def test_library_launch_stops_its_ranks_then_redelivers_the_signal(fake_gpu, tmp_path):
    """launch() called in-process (pytest, the bench): the ranks are stopped, then the signal reaches the caller's
    own handling: SIGINT is a KeyboardInterrupt; a handler that returns runs and LaunchInterrupted follows."""
    import threading

    from tandem.launch import LaunchInterrupted, launch

    for signum in (signal.SIGINT, signal.SIGTERM):
        piddir = tmp_path / f"pids{int(signum)}"
        piddir.mkdir()
        code = f"{_write_pid_file(piddir)}; time.sleep(600)"

        def fire():
            deadline = time.monotonic() + 60
            while len(os.listdir(piddir)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            os.kill(os.getpid(), signum)

        got = []
        old = signal.signal(signal.SIGTERM, lambda s, f: got.append(s)) if signum == signal.SIGTERM else None
        # Python's own SIGINT handling, as in a process started from a terminal (a background job of a
        # non-interactive shell starts with SIGINT ignored, and then no KeyboardInterrupt could follow)
        old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
        t = threading.Thread(target=fire)
        t.start()
        try:
            expected = KeyboardInterrupt if signum == signal.SIGINT else LaunchInterrupted
            with pytest.raises(expected) as ei:
                launch([sys.executable, "-c", code], 2, mps="off", timeout_s=60)
        finally:
            t.join(60)
            signal.signal(signal.SIGINT, old_int)
            if old is not None:
                signal.signal(signal.SIGTERM, old)
        ranks = [int((piddir / r).read_text()) for r in ("0", "1")]
        fake_gpu["pids"].extend(ranks)
        assert _all_gone(ranks) == []
        if signum == signal.SIGTERM:
            assert got == [signal.SIGTERM] and ei.value.exit_code == 128 + signal.SIGTERM
