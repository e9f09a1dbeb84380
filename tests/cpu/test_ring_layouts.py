"""The ring-attention kernel's register and shared-memory layouts, checked on the host (tests/cpu/ring_layouts.cu
says what): compiled with nvcc here, run without a GPU. A wrong re-view of the S accumulator as the A operand of
O += P V, or a wrong transposed view of V, would give wrong attention on the H200; this finds it on the CPU."""

import os

import pytest

from tests.cpu.host_program import build_and_run


def _cutlass():
    try:
        import cutlass_library
    except ImportError:
        return None
    src = os.path.join(os.path.dirname(cutlass_library.__file__), "source")
    return src if os.path.exists(os.path.join(src, "include", "cute", "tensor.hpp")) else None


def test_kernel_layouts_hold_the_elements_the_mma_expects(tmp_path):
    cutlass = _cutlass()
    if cutlass is None:
        pytest.skip("needs the CUTLASS headers (pip install --no-deps nvidia-cutlass==4.2.0.0)")
    build_and_run(tmp_path, "ring_layouts", flags=("-Xptxas", "-O0", "--expt-relaxed-constexpr"),
                  include_dirs=(os.path.join(cutlass, "include"), os.path.join(cutlass, "tools", "util", "include")))
