"""runtime/launch_cache.hpp (the dynamic shared memory attribute set once per kernel and CUDA context) on the host:
tests/cpu/launch_cache_checks.cu says what. Without a GPU it checks the failure path (the same error as the driver
call, nothing recorded, no sticky error left for a later check); with one, the records."""

from tests.cpu.host_program import build_and_run


def test_dynamic_smem_cache_reports_failures_and_records_only_successes(tmp_path):
    out = build_and_run(tmp_path, "launch_cache_checks")
    assert "0 failure(s)" in out
