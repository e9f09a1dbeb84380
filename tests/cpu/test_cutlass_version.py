"""The build takes CUTLASS 4.2.x only: the GEMM schedulers specialize a CUTLASS-internal template of 4.2
(kernels/include/tandem/kernels/gemm/arrival_scheduler.hpp, whose static_assert says the same at compile time).
A configure against another version stops with a message naming the version and the fix."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("nvcc") is None, reason="needs cmake and nvcc")
def test_configure_refuses_a_cutlass_other_than_4_2(tmp_path):
    fake = tmp_path / "cutlass"
    (fake / "include" / "cutlass").mkdir(parents=True)
    (fake / "tools" / "util" / "include").mkdir(parents=True)
    (fake / "include" / "cutlass" / "cutlass.h").write_text("")
    (fake / "include" / "cutlass" / "version.h").write_text(
        "#define CUTLASS_MAJOR 4\n#define CUTLASS_MINOR 3\n#define CUTLASS_PATCH 0\n")
    r = subprocess.run(["cmake", "-S", str(ROOT), "-B", str(tmp_path / "build"), f"-DPython_EXECUTABLE={sys.executable}",
                        f"-DTANDEM_CUTLASS_DIR={fake}"], capture_output=True, text=True, timeout=300)
    out = " ".join((r.stdout + r.stderr).split())
    assert r.returncode != 0, out[-2000:]
    assert "tandem needs CUTLASS 4.2.x (found 4.3.0" in out, out[-2000:]
