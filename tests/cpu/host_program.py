"""Build a host-side checking program (a .cu in tests/cpu that includes the kernels' headers and prints "ok" at
the end) with nvcc and run it, without a GPU: the shared steps of the CPU tests that check device-side layouts
and argument checks on the host."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def nvcc():
    """nvcc on PATH, else CUDA's default install path, else None."""
    return shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)


def build_and_run(tmp_path, name: str, flags=(), include_dirs=()) -> str:
    """Compile tests/cpu/<name>.cu (C++20, sm_90a, -O1, the transport and kernels headers plus include_dirs, then
    `flags`), run it, and require exit status 0 and a last line "ok"; returns its output. Skips without nvcc."""
    compiler = nvcc()
    if compiler is None:
        pytest.skip("needs nvcc")
    exe = str(tmp_path / name)
    cmd = [compiler, "-std=c++20", "-arch=sm_90a", "-O1", *flags,
           "-I" + os.path.join(ROOT, "transport", "include"), "-I" + os.path.join(ROOT, "kernels", "include"),
           *("-I" + d for d in include_dirs), os.path.join(ROOT, "tests", "cpu", name + ".cu"), "-o", exe]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    sys.stdout.write(run.stdout)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr
    return run.stdout
