"""The ring-attention kernel's register and shared-memory layouts, checked on the host (tests/cpu/ring_layouts.cu
says what): compiled with nvcc here, run without a GPU. A wrong re-view of the S accumulator as the A operand of
O += P V, or a wrong transposed view of V, would give wrong attention on the H200; this finds it on the CPU."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cutlass():
    try:
        import cutlass_library
    except ImportError:
        return None
    src = os.path.join(os.path.dirname(cutlass_library.__file__), "source")
    return src if os.path.exists(os.path.join(src, "include", "cute", "tensor.hpp")) else None


def test_kernel_layouts_hold_the_elements_the_mma_expects(tmp_path):
    nvcc = shutil.which("nvcc")
    cutlass = _cutlass()
    if nvcc is None or cutlass is None:
        pytest.skip("needs nvcc and the CUTLASS headers (pip install --no-deps nvidia-cutlass==4.2.0.0)")
    exe = str(tmp_path / "ring_layouts")
    cmd = [nvcc, "-std=c++20", "-arch=sm_90a", "-O1", "-Xptxas", "-O0", "--expt-relaxed-constexpr",
           "-I" + os.path.join(ROOT, "transport", "include"), "-I" + os.path.join(ROOT, "kernels", "include"),
           "-I" + os.path.join(cutlass, "include"), "-I" + os.path.join(cutlass, "tools", "util", "include"),
           os.path.join(ROOT, "tests", "cpu", "ring_layouts.cu"), "-o", exe]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    sys.stdout.write(run.stdout)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stdout + run.stderr
