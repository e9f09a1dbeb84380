"""Shared pytest setup: markers, GPU detection without creating a CUDA context, and the multi-rank runner.

Multi-rank GPU tests run their ranks as separate processes through tandem.launch: on a machine with fewer
GPUs than ranks it starts MPS once for the session and gives each rank its SM share.
"""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def _gpus() -> int:
    from tandem.mps import gpu_count

    return gpu_count()


def _native_ok() -> tuple[bool, str]:
    try:
        from tandem._native import native

        native()
        return True, ""
    except Exception as e:  # noqa: BLE001
        return False, str(e)


def native_kernels(*bindings: str):
    """tandem._C's kernel bindings for a CPU test, or a skip: the package is not built, or it was built before
    `bindings` existed (then it needs a rebuild)."""
    from tandem._native import available, native

    if not available():
        pytest.skip("tandem._C not built")
    kernels = native().kernels
    missing = [b for b in bindings if not hasattr(kernels, b)]
    if missing:
        pytest.skip(f"tandem._C was built before {', '.join(missing)} (python/bindings/kernels.cc): rebuild")
    return kernels


GPUS = _gpus()
NATIVE_OK, NATIVE_WHY = _native_ok()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="no CUDA GPU on this machine (nvidia-smi lists none): GPU tests run on the H200")
    skip_native = pytest.mark.skip(reason=f"tandem._C not built: {NATIVE_WHY}")
    for item in items:
        if "gpu" in item.keywords:
            if GPUS == 0:
                item.add_marker(skip_gpu)
            elif not NATIVE_OK:
                item.add_marker(skip_native)


@pytest.fixture(scope="session")
def mps_session():
    """One MPS daemon for the whole session when ranks will outnumber GPUs (stopped at the end)."""
    if GPUS == 0:
        pytest.skip("no GPU")
    from tandem.mps import MpsDaemon

    daemon = MpsDaemon()
    if GPUS == 1:  # every multi-rank test is MPS here: every process joins the session's daemon
        daemon.start()
        old = {k: os.environ.get(k) for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")}
        os.environ.update(daemon.env())
        yield daemon
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        daemon.stop()
    elif GPUS < 4:
        # Some worlds fit one rank per GPU here (world 2 on 2 GPUs): those must run as users run them, without MPS.
        # The daemon's environment goes only to the runs whose placement needs MPS (run_ranks below).
        daemon.start()
        yield daemon
        daemon.stop()
    else:
        yield daemon


@pytest.fixture
def run_ranks(mps_session):
    """run_ranks(target, world, **args) -> per-rank results; raises with every rank's error on failure."""
    from tandem.launch import run_function

    def run(target: str, world: int, *, timeout_s: float = 150, on_failure: str = "kill", allow_failures=False,
            rank_env=None, ranks_per_node=None, **args):
        env = {"PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               "TANDEM_RANK_DUMP_AFTER_S": str(timeout_s - 10)}
        if 1 < GPUS < 4 and mps_session.running():
            from tandem.launch import plan

            if plan(world, GPUS)[1]:
                env.update(mps_session.env())
        results, res = run_function(target, world, args, timeout_s=timeout_s, on_failure=on_failure, env=env,
                                    rank_env=rank_env, ranks_per_node=ranks_per_node)
        if not allow_failures:
            errors = [(r, x) for r, x in enumerate(results) if x is None or (isinstance(x, dict) and "error" in x)]
            if errors:
                msg = "\n".join(f"rank {r}: {x if x is None else x.get('traceback', x['error'])}" for r, x in errors)
                raise AssertionError(f"{target} failed at world {world} (exit codes {res.returncodes}):\n{msg}")
        return results

    return run
