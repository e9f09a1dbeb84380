#!/usr/bin/env bash
# Issue 22's "before" on the device: the python/ tree of commit $1 (default af75616, the last commit whose
# benchmarks issue 22's comparison uses) with tandem._C built here for the device's Python 3.12, in .carry/before/,
# so that device part b22x times before and after on one machine in one call (any card: the two sides share it).
#   bash tools/prebuild_before.sh [commit]        (a full build of that commit: about 10-15 min on 2 cores)
#   run(command="export OUT; TANDEM_COMMIT=<hash> bash tools/device_next.sh b22x", carry=[".whl", ".carry/prebuilt", ".carry/before"])
set -euo pipefail
rev=${1:-af75616}
root=$(git rev-parse --show-toplevel)
wt=${TANDEM_BEFORE_WORKTREE:-/tmp/wt-before}
[ -d "$wt" ] || git worktree add --detach "$wt" "$rev" -q
mkdir -p "$wt/tools"
cp "$root/tools/prebuild_device_module.sh" "$root/tools/native_sources_hash.sh" "$wt/tools/"
(cd "$wt" && TANDEM_PREBUILD_DIR=${TANDEM_PREBUILD_DIR:-/tmp/b312-before} bash tools/prebuild_device_module.sh)
rm -rf "$root/.carry/before"
mkdir -p "$root/.carry/before"
git -C "$root" archive "$rev" python | tar -x -C "$root/.carry/before"
cp "$wt/.carry/prebuilt/_C.cpython-312-x86_64-linux-gnu.so" "$root/.carry/before/python/tandem/"
# The one change to the old tree, in its bench harness, not in what it measures: af75616's bench moe asked every
# rank for a 40 GiB heap, which two ranks on an 80 GB H100 cannot reserve; cap it as bench.common.heap_bytes_for
# does today (45 % of the GPU over the ranks sharing it)
moe="$root/.carry/before/python/tandem/bench/moe.py"
grep -q "heap_bytes=40 << 30" "$moe" && sed -i 's/heap_bytes=40 << 30/heap_bytes=min(40 << 30, int(0.45 * torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory \/ int(os.environ.get("LOCAL_WORLD_SIZE", "1"))) >> 30 << 30)/' "$moe"
grep -n "heap_bytes=" "$moe"
git -C "$root" rev-parse --short "$rev" > "$root/.carry/before/COMMIT"
du -sh "$root/.carry/before"
