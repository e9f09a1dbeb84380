"""NVIDIA MPS (Multi-Process Service) control, for running N ranks on fewer GPUs.

Without MPS, processes on one GPU time-slice: a flag round trip between two of them measured 4.5 ms; with MPS
their kernels run concurrently (0.73 µs). A persistent kernel must also fit the SM share its rank really has:
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50 makes a context report 66 of the H200's 132 SMs, and tandem sizes grids
from that number (Communicator.sm_count).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time

from .errors import TandemError


def kill_group(p: subprocess.Popen, timeout_s: float = 10.0):
    """SIGKILL `p`'s whole process group (p started a session of its own) and reap p; quiet if it is gone."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        p.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pass


def gpu_count() -> int:
    """GPUs visible to child processes, without creating a CUDA context here (MPS must start first)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    n = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        n = min(n, len([v for v in visible.split(",") if v.strip() != ""]))
    return n


class MpsDaemon:
    """Start an MPS control daemon (or reuse a running one) for the lifetime of a `with` block.

    Every start leaves something to undo even when it fails (a pipe/log folder made here, a `-d` client that
    hung, a daemon that came up after the wait gave up): start() undoes it itself before raising, and stop()
    undoes whatever is left. stop() is idempotent and never quits a daemon this object did not start.
    """

    def __init__(self, pipe_dir: str | None = None, log_dir: str | None = None, *, start_timeout_s: float = 30.0,
                 pipe_timeout_s: float = 10.0, quit_timeout_s: float = 30.0):
        self._given = (pipe_dir or os.environ.get("CUDA_MPS_PIPE_DIRECTORY"),
                       log_dir or os.environ.get("CUDA_MPS_LOG_DIRECTORY"))
        self.pipe_dir, self.log_dir = self._given
        self.start_timeout_s = start_timeout_s  # the `nvidia-cuda-mps-control -d` call
        self.pipe_timeout_s = pipe_timeout_s  # its control pipe appearing (start) or going away (stop)
        self.quit_timeout_s = quit_timeout_s  # the `quit` call
        self.started = False
        self._tmp = None
        self._made: list = []  # folders this object created (removed by stop)
        self._launched = False  # `-d` was run: a daemon may exist even if start() then failed
        self._client: subprocess.Popen | None = None  # the `-d` process, in its own process group
        self._ctl: str | None = None

    def env(self) -> dict:
        return {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": self.log_dir}

    def running(self) -> bool:
        return bool(self.pipe_dir) and os.path.exists(os.path.join(self.pipe_dir, "control"))

    def start(self) -> "MpsDaemon":
        if self.started or self.running():
            return self
        ctl = shutil.which("nvidia-cuda-mps-control")
        if ctl is None:
            raise TandemError(
                "tandem: more ranks than GPUs needs NVIDIA MPS, but nvidia-cuda-mps-control is not on PATH", 9,
                "mps.start",
            )
        try:
            self._start(ctl)
        except BaseException:  # a timeout, a failure, or the launcher's stop signal: leave nothing behind
            self.stop()
            raise
        return self

    def _start(self, ctl: str):
        self._ctl = ctl
        if not self.pipe_dir:
            self._tmp = tempfile.mkdtemp(prefix="tandem-mps-")
            self._made.append(self._tmp)
            self.pipe_dir = os.path.join(self._tmp, "pipe")
            self.log_dir = os.path.join(self._tmp, "log")
        for d in (self.pipe_dir, self.log_dir or self.pipe_dir):
            if not os.path.isdir(d):
                os.makedirs(d)
                self._made.append(d)
        env = dict(os.environ, **self.env())
        # stderr to a file, not a pipe: a daemon that kept an inherited pipe open would block the read forever
        with tempfile.TemporaryFile(mode="w+") as err:
            self._launched = True  # before Popen: if we are interrupted right after it, stop() still sends quit
            self._client = subprocess.Popen([ctl, "-d"], env=env, stdin=subprocess.DEVNULL,
                                            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
            try:
                rc = self._client.wait(timeout=self.start_timeout_s)
            except subprocess.TimeoutExpired:
                raise TandemError(f"tandem: nvidia-cuda-mps-control -d did not return within "
                                  f"{self.start_timeout_s:g} s", 1, "mps.start") from None
            if rc != 0:
                err.seek(0)
                raise TandemError(f"tandem: nvidia-cuda-mps-control -d failed (exit {rc}): {err.read().strip()}", 6,
                                  "mps.start")
        deadline = time.monotonic() + self.pipe_timeout_s
        while not self.running():
            if time.monotonic() > deadline:
                raise TandemError(f"tandem: MPS control pipe {os.path.join(self.pipe_dir, 'control')} did not "
                                  f"appear within {self.pipe_timeout_s:g} s", 1, "mps.start")
            time.sleep(0.05)
        # Up: from now on the daemon is reached through its pipe. Forget the `-d` process (it exited and was
        # reaped): signalling its group hours later could hit an unrelated group that reused the number.
        self._client = None
        self.started = True

    def stop(self):
        """Quit the daemon this object started (also after a failed start), kill what its `-d` call left in its
        process group, remove the folders made here. Idempotent; a reused daemon is left running."""
        if self._launched:
            try:
                subprocess.run([self._ctl], input="quit\n", env=dict(os.environ, **self.env()), text=True,
                               timeout=self.quit_timeout_s, capture_output=True)
            except (OSError, subprocess.SubprocessError):
                pass
            deadline = time.monotonic() + self.pipe_timeout_s
            while self.running() and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._client is not None:  # its whole group: a hung `-d` and anything it forked in the group
                kill_group(self._client)
        self._launched = False
        self._client = None
        self.started = False
        for d in reversed(self._made):
            shutil.rmtree(d, ignore_errors=True)
        self._made = []
        if self._tmp:
            self._tmp = None
            self.pipe_dir, self.log_dir = self._given

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
