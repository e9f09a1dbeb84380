#!/usr/bin/env bash
# The first device call of the session after 2026-12-04 (branch next-device: code written without a GPU).
# One call, about 9 minutes: build; the GPU tests of what was written blind; the GEMM-under-MPS diagnostic; the
# TP bench with the pipelined mode at two shapes. Everything lands in $OUT (at most 8 files come back: tar).
#   run(command="export OUT; TANDEM_COMMIT=<hash> timeout 590 bash tools/device_next.sh", carry=[".whl"])
set -uo pipefail
OUT=${OUT:-$PWD/_out}
export OUT TANDEM_BENCH=0
tests=(
  "tests/gpu/test_moe.py::test_moe_across_emulated_nodes"                # issue 20's open regression
  "tests/gpu/test_transport.py::test_emulated_nodes_survive_a_pageable_host_copy_behind_the_waiting_kernel"
  "tests/gpu/test_transport.py::test_symmetric_tensors"                  # peer views through DLPack
  "tests/gpu/test_gemm.py::test_gemm_variants_match_torch"
  "tests/gpu/test_tp.py::test_pipelined_mode_matches_torch_repeats_and_replays"
  "tests/gpu/test_tp.py::test_ag_gemm_and_gemm_rs_match_torch"           # unfused through cuBLAS now
)
timeout 400 bash tools/device_suite.sh "${tests[@]}"
mkdir -p "$OUT/diag"
timeout 120 python3 -m tandem.launch -n 4 -- python3 tools/diag/gemm_mps.py --reps 3 --out "$OUT/diag" \
  --shapes 16384x8192x4096,16384x8192x1024 2>&1 | tail -12
for n in 4 2; do
  timeout 100 python3 -m tandem bench tp -n $n --reps 3 --out "$OUT/diag" \
    --shapes $([ $n = 4 ] && echo 16384x8192x4096 || echo 8192x4096x8192) 2>&1 | tail -6
done
tar czf "$OUT/diag.tgz" -C "$OUT" diag && rm -rf "$OUT/diag"
