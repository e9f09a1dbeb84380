#!/usr/bin/env bash
# Build tandem._C for the device machine's Python (3.12) here, on the CPU machine, so that a fresh device machine
# skips its ~160 s build (tools/device_suite.sh uses it when the native sources are the same: the hash of
# tools/native_sources_hash.sh, so later Python, test or doc changes keep it valid). Run it on the tree the device
# call will carry, then name .carry/prebuilt in run's carry list:
#   bash tools/prebuild_device_module.sh          (about 8-10 min on 2 cores; incremental after that)
#   TANDEM_PREBUILD_CMAKE_ARGS="-DTANDEM_FP8_OVERLAPPED_PROMOTION=OFF" ...   (extra CMake options; an option that
#   stays in the cache: pass its default back for the next build)
#   run(command="export OUT; TANDEM_COMMIT=<hash> bash tools/device_next.sh <part>", carry=[".whl", ".carry/prebuilt"])
# The module is torch-free and links the CUDA runtime statically (the kernels are sm_90a cubins from this nvcc);
# it needs a glibc/libstdc++ at least as new as this machine's (Debian 12), which the device's Ubuntu has.
set -euo pipefail
PY=${TANDEM_DEVICE_PYTHON:-$(ls -d /root/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null | head -1)}
[ -x "$PY" ] || { echo "no python3.12 here (TANDEM_DEVICE_PYTHON=/path/to/python3.12)"; exit 2; }
commit=$(git rev-parse --short HEAD)
SP=$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source'))")
B=${TANDEM_PREBUILD_DIR:-build/device-cp312}
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DTANDEM_BUILD_PYTHON=ON -DPython_EXECUTABLE="$PY" \
  -Dpybind11_DIR="$(python3 -c 'import pybind11; print(pybind11.get_cmake_dir())')" -DTANDEM_CUTLASS_DIR="$SP" \
  ${TANDEM_PREBUILD_CMAKE_ARGS:-} > /dev/null
ninja -C $B -j "$(nproc)" _C > $B/ninja.log 2>&1 || { tail -30 $B/ninja.log; exit 1; }
mkdir -p .carry/prebuilt
so=$(find $B -name "_C.cpython-312-*.so" | head -1)
cp "$so" .carry/prebuilt/_C.cpython-312-x86_64-linux-gnu.so
echo "$commit" > .carry/prebuilt/COMMIT
bash tools/native_sources_hash.sh > .carry/prebuilt/SOURCES  # what device_suite.sh compares
ls -la .carry/prebuilt
