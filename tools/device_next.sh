#!/usr/bin/env bash
# The first device call of the session after 2026-12-04 (branch next-device: code written without a GPU). Check
# out next-device first: a device call sends the session's checkout. One call, under 590 s: build; the GPU tests
# of what was written blind (the open MoE regression last, it may use its whole 150 s); the GEMM-under-MPS
# diagnostic; bench tp with the pipelined mode at world 4. Results land in $OUT, archived after each step (at
# most 8 files come back).
#   run(command="export OUT; TANDEM_COMMIT=<hash> timeout 590 bash tools/device_next.sh", carry=[".whl"])
set -uo pipefail
OUT=${OUT:-$PWD/_out}
export OUT TANDEM_BENCH=0
tests=(
  "tests/gpu/test_transport.py::test_emulated_nodes_survive_a_pageable_host_copy_behind_the_waiting_kernel"
  "tests/gpu/test_transport.py::test_symmetric_tensors"                  # peer views through DLPack
  "tests/gpu/test_gemm.py::test_gemm_variants_match_torch"
  "tests/gpu/test_tp.py::test_pipelined_mode_matches_torch_repeats_and_replays"
  "tests/gpu/test_moe.py::test_moe_across_emulated_nodes"                # issue 20's open regression
)
# SIGINT first: pytest then tears its fixtures down (the session's MPS daemon) and prints its summary
timeout -s INT -k 20 330 bash tools/device_suite.sh "${tests[@]}"
mkdir -p "$OUT/diag"
timeout -s INT -k 10 110 python3 -m tandem.launch -n 4 -- python3 tools/diag/gemm_mps.py --reps 3 \
  --out "$OUT/diag" --shapes 16384x8192x4096,16384x8192x1024 2>&1 | tail -12
tar czf "$OUT/diag.tgz" -C "$OUT" diag
timeout -s INT -k 10 90 python3 -m tandem bench tp -n 4 --reps 3 --out "$OUT/diag" --shapes 16384x8192x4096 2>&1 \
  | tail -6
tar czf "$OUT/diag.tgz" -C "$OUT" diag && rm -rf "$OUT/diag"
