"""The installed CMake package works for a C++ consumer: configure, compile (nvcc, sm_90a) and link."""

import os
import shutil

import pytest

from tandem._native import available

pytestmark = pytest.mark.skipif(not available(), reason="tandem._C not built (package not installed)")


@pytest.mark.skipif(shutil.which("nvcc") is None and not os.path.exists("/usr/local/cuda/bin/nvcc"),
                    reason="nvcc not found")
def test_consumer_project_configures_builds_and_links(tmp_path):
    from tests.consumer_build import build_consumer

    exe = build_consumer(str(tmp_path / "build"))
    assert os.access(exe, os.X_OK)
    # The host library works on its own from C++ (no GPU needed): run its self-test.
    import subprocess

    r = subprocess.run([os.path.join(str(tmp_path / "build"), "host_selftest"), str(tmp_path / "boot")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 failed" in r.stdout
    # The device code was compiled for Hopper (sm_90a) from the installed headers alone.
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        import subprocess

        out = subprocess.run([cuobjdump, "--list-elf", exe], capture_output=True, text=True).stdout
        assert "sm_90a" in out
