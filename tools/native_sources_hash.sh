#!/usr/bin/env bash
# One hash of every file that goes into tandem._C (C++/CUDA sources and headers, the bindings, the CMake files), by
# content, sorted by path: the same here and on the device machine (whose copy of the tree may carry stale git
# metadata). tools/prebuild_device_module.sh records it; tools/device_suite.sh compares it.
set -euo pipefail
find kernels transport python/bindings cmake CMakeLists.txt python/CMakeLists.txt pyproject.toml -type f \
  ! -name "*.md" ! -name "*.pyc" -print0 | LC_ALL=C sort -z | xargs -0 sha1sum | sha1sum | cut -d' ' -f1
