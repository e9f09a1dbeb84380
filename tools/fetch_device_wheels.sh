#!/usr/bin/env bash
# Wheels the H200 needs but cannot download (it has no internet): put them in .whl/ (git-ignored) and name
# `.whl` in the device call's carry list. tools/device_suite.sh installs them there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
python3 -m pip download -q --no-deps -d .whl nvidia-cutlass==4.2.0.0
ls -la .whl
