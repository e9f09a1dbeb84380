#!/usr/bin/env bash
# Second device call of 2026-12-04 afternoon (branch next-device): the pipelined mode's failures with per-output
# detail, once through the copy engines and once with TANDEM_PIPELINE_COPY=sm (copy kernel: is the copy engine
# path the cause?), then the rest of tests/gpu/test_tp.py (unfused = cuBLAS now) and test_transport.py.
#   run(command="export OUT; TANDEM_COMMIT=<hash> timeout 590 bash tools/device_next2.sh", carry=[".whl"])
set -uo pipefail
OUT=${OUT:-$PWD/_out}
export OUT TANDEM_BENCH=0
timeout -s INT -k 20 200 bash tools/device_suite.sh \
  "tests/gpu/test_tp.py::test_pipelined_mode_matches_torch_repeats_and_replays"
cp "$OUT/pytest.log" "$OUT/pytest_pipelined_engine.log"
TANDEM_PIPELINE_COPY=sm timeout -s INT -k 20 120 python3 -m pytest -v -rs --tb=short --timeout=150 -p no:cacheprovider \
  "tests/gpu/test_tp.py::test_pipelined_mode_matches_torch_repeats_and_replays" > "$OUT/pytest_pipelined_sm.log" 2>&1
grep -E "PASSED|FAILED|^E " "$OUT/pytest_pipelined_sm.log" | cut -c1-600 | head -20
timeout -s INT -k 20 ${REST_S:-230} python3 -m pytest -v -rs --tb=short --timeout=150 -p no:cacheprovider \
  tests/gpu/test_tp.py tests/gpu/test_transport.py -k "not pipelined and not pageable_host_copy" \
  > "$OUT/pytest_rest.log" 2>&1
grep -E "FAILED|ERROR|^E |passed|failed" "$OUT/pytest_rest.log" | cut -c1-400 | head -40
