#!/usr/bin/env bash
# Fourth device call of 2026-12-04 afternoon (branch next-device): cuBLAS exactness at other MPS shares for
# world 3 (33% = 42 SMs computed wrong tiles), the world-3 TP tests at 31%, then as much of the remaining GPU
# suite as the time allows. Under 560 s; logs in $OUT.
#   run(command="export OUT; TANDEM_COMMIT=<hash> timeout 590 bash tools/device_next4.sh", carry=[".whl"])
set -uo pipefail
OUT=${OUT:-$PWD/_out}
export OUT TANDEM_BENCH=0
start=$(date +%s)
left() { echo $(( 560 - ($(date +%s) - start) )); }
# build only (no tests): device_suite.sh with a test id that selects nothing
timeout -s INT -k 20 200 bash tools/device_suite.sh tests/cpu/test_launch_and_bootstrap.py::test_plan_mps_shares
mkdir -p "$OUT/diag"
for pct in 31 30 28; do
  timeout -s INT -k 10 45 python3 -m tandem.launch -n 3 --sm-percent $pct -- python3 tools/diag/cublas_mps_check.py \
    --out "$OUT/diag/cublas_w3_p$pct" 2>&1 | grep -v "^|---" | tail -14
done
tar czf "$OUT/diag.tgz" -C "$OUT" diag
TANDEM_SM_PERCENT=31 timeout -s INT -k 20 120 python3 -m pytest -v -rs --tb=short --timeout=150 -p no:cacheprovider \
  "tests/gpu/test_tp.py::test_pipelined_mode_matches_torch_repeats_and_replays[3]" \
  "tests/gpu/test_tp.py::test_ag_gemm_and_gemm_rs_match_torch[3]" > "$OUT/pytest_w3.log" 2>&1
grep -E "PASSED|FAILED|^E " "$OUT/pytest_w3.log" | cut -c1-400 | head -12
t=$(( $(left) - 10 ))
echo "rest of the suite: $t s"
timeout -s INT -k 10 $t python3 -m pytest -v -rs --tb=short --timeout=150 -p no:cacheprovider \
  tests/gpu/test_transport.py tests/gpu/test_moe.py tests/gpu/test_ring_attention.py tests/gpu/test_faults.py \
  tests/gpu/test_gemm.py tests/gpu/test_consumer.py tests/gpu/test_torchrun.py \
  -k "not test_moe_across_emulated_nodes and not test_gemm_variants_match_torch and not test_symmetric_tensors" \
  > "$OUT/pytest_rest.log" 2>&1
grep -E "PASSED|FAILED|ERROR|^E |passed|failed" "$OUT/pytest_rest.log" | cut -c1-300 | head -80
