#!/usr/bin/env bash
# The H200 session in one call: build, GPU tests (MPS ranks at world 1/2/4), benchmarks. Logs go to $OUT.
#   usage: tools/device_suite.sh [pytest selection...]     (OUT defaults to ./_out)
set -uo pipefail
OUT=${OUT:-$PWD/_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TANDEM_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
nvidia-smi -L
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"
t0=$(date +%s)
python3 -m pip install --no-build-isolation --no-deps -e . > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
sel=${*:-tests}
python3 -m pytest $sel -v -rs --timeout=600 2>&1 | tee "$OUT/pytest.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|Error" | tail -60
