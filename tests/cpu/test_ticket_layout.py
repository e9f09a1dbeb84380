"""What the ticket reduction assumes of the GEMM core's accumulators (tests/cpu/ticket_layout.cu says what), checked
on the host: compiled with nvcc here, run without a GPU. A wrong coordinate map would put the last arriver's sums in
the wrong rows or columns of the owner's output on the GPU; this finds it on the CPU."""

import os

import pytest

from tests.cpu.host_program import build_and_run
from tests.cpu.test_ring_layouts import _cutlass


def test_ticket_sums_cover_the_tile_once_in_column_pairs(tmp_path):
    cutlass = _cutlass()
    if cutlass is None:
        pytest.skip("needs the CUTLASS headers (pip install --no-deps nvidia-cutlass==4.2.0.0)")
    out = build_and_run(tmp_path, "ticket_layout", flags=("-Xptxas", "-O0", "--expt-relaxed-constexpr"),
                        include_dirs=(os.path.join(cutlass, "include"),
                                      os.path.join(cutlass, "tools", "util", "include")))
    assert "cover the 128x256 tile once" in out
