"""Run N ranks on the GPUs present: `python -m tandem.launch -n 4 -- python my_job.py`.

If there are fewer GPUs than ranks, MPS is started (and stopped afterwards) and every rank gets an equal share
of its GPU's SMs through CUDA_MPS_ACTIVE_THREAD_PERCENTAGE. Each rank gets RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR/MASTER_PORT (torch.distributed TCPStore bootstrap), TANDEM_DEVICE and
TANDEM_BOOTSTRAP_DIR (for C++ programs using tandem::FileBootstrap).

Stopping: SIGTERM, SIGINT (Ctrl-C) or SIGHUP to the launcher stops every rank (SIGTERM to each rank's process
group, SIGKILL to what is left after --term-grace seconds) and the MPS daemon it started, then exits with
128 + the signal number. Each rank runs in its own session, so a terminal's Ctrl-C reaches only the launcher.
When a rank fails, the others are stopped 30 s later (launch(on_failure="kill", grace_s=...)). A SIGKILL to the
launcher cannot be handled: then nothing stops the ranks.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from .errors import ABORTED, TandemError
from .mps import MpsDaemon, gpu_count, kill_group


@dataclass
class RankPlan:
    rank: int
    device: int
    sm_percent: int | None  # None: the whole GPU


@dataclass
class LaunchResult:
    returncodes: list
    elapsed_s: float
    mps: bool
    plans: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(rc == 0 for rc in self.returncodes)


# SM shares (percent) used instead of 100 / ranks-per-GPU. cuBLAS computed whole output tiles wrong on the H200
# (2026-12-04, tools/diag/cublas_mps_check.py: plain torch.matmul against a CPU reference, bf16 and fp16) with
# three ranks at 28, 30, 31 and 33 percent (36 to 42 SMs a rank); it was exact with two ranks at 50 (66 SMs), and
# with four at 25 percent (32 SMs) every TP test, whose references are exact, passed (the diagnostic did not run
# there). Three ranks therefore get 25 percent (32 SMs each; 36 SMs idle). Whether it
# is the SM count or the number of clients that matters was not separated: three ranks at 25 percent have not
# run yet (docs/reliability.md).
_DEFAULT_PERCENT = {3: 25}


def _sm_percent_override(sm_percent):
    """The SM share asked for (argument, else TANDEM_SM_PERCENT), validated; None when neither is set."""
    raw = sm_percent if sm_percent is not None else os.environ.get("TANDEM_SM_PERCENT") or None
    if raw is None:
        return None
    try:
        pct = int(raw)
    except ValueError:
        pct = 0
    if not 1 <= pct <= 100:
        raise TandemError(f"tandem.launch: the SM share must be a percentage in [1, 100], got {raw!r}", 3, "launch")
    return pct


def plan(nprocs: int, gpus: int, mps: str = "auto", require_gpu: bool = True,
         sm_percent: int | None = None) -> tuple[list[RankPlan], bool]:
    """Place ranks round-robin on GPUs; decide whether MPS is needed and each rank's SM share (100 / ranks per
    GPU percent, or _DEFAULT_PERCENT's, unless `sm_percent` or TANDEM_SM_PERCENT says otherwise)."""
    if nprocs < 1:
        raise TandemError(f"tandem.launch: need at least one rank, got {nprocs}", 3, "launch")
    if mps not in ("auto", "on", "off"):
        raise TandemError(f"tandem.launch: mps must be auto, on or off, got {mps!r}", 3, "launch")
    if gpus < 1 and not require_gpu:
        return [RankPlan(r, -1, None) for r in range(nprocs)], False
    if gpus < 1:
        raise TandemError(
            "tandem.launch: no NVIDIA GPU found (nvidia-smi lists none). tandem's jobs run on CUDA GPUs; on a "
            "machine without one, run the CPU tests: python -m pytest tests", 9, "launch")
    per_gpu = -(-nprocs // gpus)
    use_mps = {"on": True, "off": False, "auto": per_gpu > 1}[mps]
    override = _sm_percent_override(sm_percent)
    pct = (override or _DEFAULT_PERCENT.get(per_gpu) or max(1, 100 // per_gpu)) if use_mps and per_gpu > 1 else None
    return [RankPlan(r, r % gpus, pct) for r in range(nprocs)], use_mps


class LaunchInterrupted(TandemError):
    """The launcher got a stop signal; every rank and the MPS daemon it started have been stopped."""

    def __init__(self, signum: int):
        super().__init__(f"tandem.launch: {signal.Signals(signum).name} received: stopped every rank and the MPS "
                         "daemon this launcher started", ABORTED, "launch")
        self.signum = int(signum)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # what a shell reports for a process killed by that signal

    def __reduce__(self):
        return (type(self), (self.signum,))


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class _StopSignals:
    """Stop signals for the duration of a launch. While armed (starting MPS, waiting for the ranks) a signal raises
    LaunchInterrupted there, so the launch's cleanup runs; while disarmed (spawning a rank, cleaning up) it is
    only recorded, so that it cannot land between a Popen and its bookkeeping (an orphan) and a second Ctrl-C
    cannot cut the cleanup short. Python delivers signals to the main thread only: elsewhere nothing is
    installed and the caller's handling stays as it was."""

    def __init__(self):
        self.signum = None
        self.armed = False
        self.installed = False
        self._previous = {}

    def install(self) -> "_StopSignals":
        if threading.current_thread() is not threading.main_thread():
            return self
        for s in _STOP_SIGNALS:
            prev = signal.getsignal(s)
            if prev is signal.SIG_IGN:  # nohup, or a background job: whoever started us wants it ignored
                continue
            self._previous[s] = signal.signal(s, self._handle)
        self.installed = True
        self.armed = True
        return self

    def arm(self):
        self.armed = self.installed

    def _handle(self, signum, frame):
        if self.signum is None:
            self.signum = signum
        if self.armed:
            self.armed = False
            raise LaunchInterrupted(signum)

    def check(self):
        """Raise for a signal recorded while disarmed."""
        if self.signum is not None:
            self.armed = False
            raise LaunchInterrupted(self.signum)

    def restore(self):
        self.armed = False
        for s, h in self._previous.items():
            signal.signal(s, h if h is not None else signal.SIG_DFL)
        self._previous.clear()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(cmd: list, nprocs: int, *, mps: str = "auto", timeout_s: float | None = None, env: dict | None = None,
           on_failure: str = "kill", grace_s: float = 30.0, ranks_per_node: int | None = None,
           rank_env: dict | None = None, require_gpu: bool = True, term_grace_s: float = 5.0,
           redeliver_signal: bool = True, sm_percent: int | None = None) -> LaunchResult:
    """Start `cmd` as `nprocs` ranks and wait for them.

    on_failure: "kill" stops the other ranks `grace_s` after the first one fails (like torchrun); "wait" lets
    the survivors finish (used by the dead-peer tests). timeout_s kills everything and raises.
    rank_env: {rank: {VAR: value}} extra variables for single ranks.
    require_gpu=False lets CPU-only jobs (and the launcher's own tests) run where there is no GPU.
    sm_percent: each rank's MPS SM share when ranks share a GPU (plan(): else TANDEM_SM_PERCENT, else the default).
    SIGTERM/SIGINT/SIGHUP while it runs (main thread only): every rank gets SIGTERM to its process group, SIGKILL
    `term_grace_s` later if still there, and the MPS daemon started here is stopped. Then, with redeliver_signal,
    the signal is raised again under the caller's own handling (restored by then): SIGINT becomes the usual
    KeyboardInterrupt, SIGTERM ends the process as it would have, so a caller such as pytest or the bench stops
    as asked instead of seeing one failed call; if that handling returns, or without redeliver_signal (the CLI),
    LaunchInterrupted (a TandemError with .signum and .exit_code = 128 + signum) is raised. Ranks still running
    when launch returns or raises for any other reason are stopped the same way (SIGTERM, then SIGKILL).
    """
    sig = _StopSignals().install()
    procs = []
    daemon = None
    boot_dir = None
    try:
        try:
            gpus = gpu_count()
            plans, use_mps = plan(nprocs, gpus, mps, require_gpu, sm_percent)
            t0 = time.monotonic()
            boot_dir = tempfile.mkdtemp(prefix="tandem-boot-")
            if use_mps:  # a daemon named in `env` (a test session's) is reused, as one named in os.environ is
                daemon = MpsDaemon((env or {}).get("CUDA_MPS_PIPE_DIRECTORY"), (env or {}).get("CUDA_MPS_LOG_DIRECTORY"))
                daemon.start()  # interruptible: a signal here stops it (start and stop clean up after themselves)
            port = _free_port()
            sig.armed = False  # spawning: a signal now is acted on once every started rank is in `procs`
            for p in plans:
                e = dict(os.environ)
                e.update(env or {})
                e.update(
                    RANK=str(p.rank), WORLD_SIZE=str(nprocs), LOCAL_RANK=str(p.rank), LOCAL_WORLD_SIZE=str(nprocs),
                    MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TANDEM_BOOTSTRAP_DIR=boot_dir,
                    PYTHONUNBUFFERED="1",
                )
                if p.device >= 0:
                    e["TANDEM_DEVICE"] = str(p.device)
                if ranks_per_node:
                    e["TANDEM_RANKS_PER_NODE"] = str(ranks_per_node)
                if daemon is not None:
                    e.update(daemon.env())
                    if p.sm_percent is not None:
                        e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(p.sm_percent)
                e.update((rank_env or {}).get(p.rank, {}))
                # own session: a terminal's Ctrl-C goes to the launcher alone, which stops the ranks in order
                procs.append(subprocess.Popen(cmd, env=e, start_new_session=True))
            sig.check()
            sig.arm()
            codes = _wait_all(procs, timeout_s, on_failure, grace_s, t0)
            sig.armed = False
            result = LaunchResult(codes, time.monotonic() - t0, use_mps, plans)
        except BaseException:
            sig.armed = False  # a second signal must not interrupt the cleanup below
            raise
        finally:
            sig.armed = False
            _stop_ranks(procs, term_grace_s)
            if daemon is not None:
                daemon.stop()
            if boot_dir:
                shutil.rmtree(boot_dir, ignore_errors=True)
    except LaunchInterrupted:
        pass  # acted on below, once the caller's handlers are back
    finally:
        sig.restore()
    # (also a signal during the cleanup of a launch that had finished: it still means "stop")
    if sig.signum is not None:
        if redeliver_signal:
            signal.raise_signal(sig.signum)  # the restored handler runs here (or the default action)
        raise LaunchInterrupted(sig.signum)
    return result


def _signal_group(p: subprocess.Popen, signum: int):
    try:
        os.killpg(p.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_ranks(procs, term_grace_s: float):
    """Stop the ranks still running: SIGTERM to each one's process group (the rank and whatever it started), so
    that a rank can exit in order (and faulthandler can print where it was), then SIGKILL to the groups of all of
    them after `term_grace_s` (also reaching a child that ignored the SIGTERM after its rank exited)."""
    live = [p for p in procs if p.poll() is None]
    if not live:
        return
    for p in live:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + term_grace_s
    while any(p.poll() is None for p in live) and time.monotonic() < deadline:
        time.sleep(0.02)
    for p in live:
        _signal_group(p, signal.SIGKILL)
    for p in live:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def _wait_all(procs, timeout_s, on_failure, grace_s, t0) -> list:
    first_failure = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return codes
        now = time.monotonic()
        if first_failure is None and any(c not in (None, 0) for c in codes):
            first_failure = now
        if on_failure == "kill" and first_failure is not None and now - first_failure > grace_s:
            for p in procs:
                if p.poll() is None:
                    kill_group(p)
            return [p.poll() for p in procs]
        if timeout_s is not None and now - t0 > timeout_s:
            for p in procs:
                if p.poll() is None:
                    kill_group(p)
            raise TandemError(f"tandem.launch: ranks still running after {timeout_s:.0f} s; killed", 1, "launch")
        time.sleep(0.02)


def run_function(target: str, nprocs: int, args: dict | None = None, **kw) -> list:
    """Run `module:function(**args)` in every rank and return the per-rank results (JSON-able values, or
    {"error": ...} for a rank that raised). Ranks that died return None."""
    out_dir = tempfile.mkdtemp(prefix="tandem-run-")
    try:
        cmd = [sys.executable, "-m", "tandem._rank_entry", target, json.dumps(args or {}), out_dir]
        res = launch(cmd, nprocs, **kw)
        results = []
        for r in range(nprocs):
            path = os.path.join(out_dir, f"{r}.json")
            if os.path.exists(path):
                with open(path) as f:
                    results.append(json.load(f))
            else:
                results.append(None)
        return results, res
    finally:
        import shutil

        shutil.rmtree(out_dir, ignore_errors=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tandem.launch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--nprocs", type=int, required=True, help="number of ranks")
    ap.add_argument("--mps", choices=["auto", "on", "off"], default="auto",
                    help="auto: start MPS when ranks outnumber GPUs")
    ap.add_argument("--timeout", type=float, default=None, help="kill all ranks after this many seconds")
    ap.add_argument("--ranks-per-node", type=int, default=None, help="emulate nodes of this many ranks")
    ap.add_argument("--term-grace", type=float, default=5.0,
                    help="on SIGTERM/SIGINT: seconds between SIGTERM and SIGKILL to the ranks (default 5)")
    ap.add_argument("--sm-percent", type=int, default=None,
                    help="each rank's MPS SM share in percent when ranks share a GPU (default 100 / ranks per GPU, 25 "
                         "for three; TANDEM_SM_PERCENT likewise)")
    ap.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command and its arguments")
    a = ap.parse_args(argv)
    cmd = a.cmd[1:] if a.cmd[:1] == ["--"] else a.cmd
    if not cmd:
        ap.error("no command given (use: -- python script.py ...)")
    try:
        _sm_percent_override(a.sm_percent)  # a bad value is an error (status 2) before anything starts
        res = launch(cmd, a.nprocs, mps=a.mps, timeout_s=a.timeout, ranks_per_node=a.ranks_per_node,
                     term_grace_s=a.term_grace, redeliver_signal=False, sm_percent=a.sm_percent)
    except LaunchInterrupted as e:
        print(str(e), file=sys.stderr)
        return e.exit_code
    except TandemError as e:
        print(str(e), file=sys.stderr)
        return 2
    bad = [(r, c) for r, c in enumerate(res.returncodes) if c != 0]
    for r, c in bad:
        print(f"tandem.launch: rank {r} exited with {c}", file=sys.stderr)
    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
