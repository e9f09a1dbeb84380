#!/usr/bin/env bash
# Third device call of 2026-12-04 afternoon (branch next-device): the pipelined test with lone-call references,
# the world-3 GEMM mismatch and the cross-node unfused stall re-run, cuBLAS exactness under MPS (world 3 and 2),
# then bench tp at worlds 4 and 2 as time allows. Everything under 590 s; outputs archived in $OUT.
#   run(command="export OUT; TANDEM_COMMIT=<hash> timeout 590 bash tools/device_next3.sh", carry=[".whl"])
set -uo pipefail
OUT=${OUT:-$PWD/_out}
export OUT TANDEM_BENCH=0
start=$(date +%s)
left() { echo $(( 575 - ($(date +%s) - start) )); }
timeout -s INT -k 20 250 bash tools/device_suite.sh \
  "tests/gpu/test_tp.py::test_pipelined_mode_matches_torch_repeats_and_replays" \
  "tests/gpu/test_tp.py::test_ag_gemm_and_gemm_rs_match_torch" \
  "tests/gpu/test_tp.py::test_tp_ops_across_emulated_nodes"
mkdir -p "$OUT/diag"
for n in 3 2; do
  timeout -s INT -k 10 60 python3 -m tandem.launch -n $n -- python3 tools/diag/cublas_mps_check.py \
    --out "$OUT/diag/cublas_w$n" 2>&1 | tail -16
done
tar czf "$OUT/diag.tgz" -C "$OUT" diag
for n in 4 2; do
  t=$(( $(left) - 15 ))
  [ "$t" -lt 60 ] && { echo "bench tp -n $n skipped: $t s left"; continue; }
  timeout -s INT -k 10 $t python3 -m tandem bench tp -n $n --reps 5 --out "$OUT/diag" 2>&1 | tail -14
  tar czf "$OUT/diag.tgz" -C "$OUT" diag
done
