"""The persistent-kernel runtime's argument checks (check_world, check_launch_common) and the TP adapters'
check_common on top of them, run on the host (tests/cpu/runtime_checks.cu says what): compiled with nvcc here,
run without a GPU. Every fused kernel's adapter (TP, MoE, ring attention) reports these faults in these words."""

from tests.cpu.host_program import build_and_run


def test_runtime_checks_name_each_fault(tmp_path):
    build_and_run(tmp_path, "runtime_checks")
