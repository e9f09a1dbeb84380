#!/usr/bin/env bash
# Build python/tandem/libtandem_torch_ops.so (python/torch_ops/: the C++ CUDA-key kernels of torch.ops.tandem.gemm
# and scaled_gemm) against the torch of `python3` (or $PYTHON), without CMake: for a tree that runs tandem from
# python/ with a prebuilt tandem._C (tools/device_suite.sh), where the package build did not make it. A pip install
# with torch importable at build time builds the same library (python/CMakeLists.txt). One C++ file: ~30 s.
#   usage: tools/build_torch_ops.sh [OUT_DIR]     (default: the importable tandem package's directory)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
# default: the directory of the tandem package this python imports (an installed or editable one; python/tandem
# when it runs from the tree), where tandem.ops._dispatcher looks for the library
out=${1:-$("$PY" -c "import os, tandem; print(os.path.dirname(tandem.__file__))" 2>/dev/null || echo python/tandem)}
# (its output is eval'ed: a failing python would go unseen by set -e, so it is run first into a variable)
vars=$("$PY" - <<'PYEOF'
import shlex, sysconfig, torch, torch.utils.cpp_extension as ext
print("TORCH_INC=" + shlex.quote(" ".join("-I" + p for p in ext.include_paths())))
print("TORCH_LIB=" + shlex.quote(ext.library_paths()[0]))
print("PY_INC=" + shlex.quote(sysconfig.get_paths()["include"]))
print("ABI=" + str(int(torch._C._GLIBCXX_USE_CXX11_ABI)))
import os
homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), ext.CUDA_HOME, "/usr/local/cuda"]
inc = next((h + "/include" for h in homes if h and os.path.exists(h + "/include/cuda_runtime_api.h")), "")
print("CUDA_INC=" + shlex.quote(inc))
PYEOF
) || { echo "$PY cannot import torch (and torch.utils.cpp_extension): nothing to build against"; exit 2; }
eval "$vars"
[ -n "$CUDA_INC" ] || { echo "no CUDA headers (cuda_runtime_api.h): set CUDA_HOME"; exit 2; }
mkdir -p "$out"
# shellcheck disable=SC2086
g++ -std=c++20 -O2 -fPIC -shared -fvisibility=hidden -D_GLIBCXX_USE_CXX11_ABI=$ABI $TORCH_INC -I"$PY_INC" \
  -I"$CUDA_INC" -Ikernels/include -Itransport/include python/torch_ops/tandem_torch_ops.cpp \
  -L"$TORCH_LIB" -Wl,-rpath,"$TORCH_LIB" -lc10 -ltorch -ltorch_cpu -ltorch_python -o "$out/libtandem_torch_ops.so"
echo "built $out/libtandem_torch_ops.so"
