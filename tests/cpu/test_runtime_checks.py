"""The persistent-kernel runtime's argument checks (check_world, check_launch_common) and the TP adapters'
check_common on top of them, run on the host (tests/cpu/runtime_checks.cu says what): compiled with nvcc here,
run without a GPU. Every fused kernel's adapter (TP, MoE, ring attention) reports these faults in these words."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_runtime_checks_name_each_fault(tmp_path):
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc is None:
        pytest.skip("needs nvcc")
    exe = str(tmp_path / "runtime_checks")
    cmd = [nvcc, "-std=c++20", "-arch=sm_90a", "-O1",
           "-I" + os.path.join(ROOT, "transport", "include"), "-I" + os.path.join(ROOT, "kernels", "include"),
           os.path.join(ROOT, "tests", "cpu", "runtime_checks.cu"), "-o", exe]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    sys.stdout.write(run.stdout)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr
