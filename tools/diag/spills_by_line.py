#!/usr/bin/env python3
"""Where a kernel's register spills are, by source line: the local-memory loads and stores (LDL / STL) of each
kernel in one translation unit of tandem's module, attributed to the file and line nvdisasm names for them (the
build compiles with -lineinfo).

ptxas only says how many bytes a kernel spills. Where they are decides what they cost: a spill in a per-tile path
(the tile scheduler, the mainloop) is paid on every tile, one in a per-launch path (a role's set-up, a signal) once.
No GPU is needed: it reads the module's cubins.

    python3 tools/diag/spills_by_line.py MODULE.so UNIT [--kernel NAME_PART] [--top N]

UNIT is the cubin's source name (gemm_rs_sm90, ag_gemm_sm90, moe_sm90, ...; cuobjdump -lelf lists them). cuobjdump
and nvdisasm are found by cuda_tools.tool.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

from cuda_tools import tool


def disassemble(module: str, unit: str) -> str:
    cubin = f"{unit}.sm_90a.cubin"
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([tool("cuobjdump"), "-xelf", cubin, os.path.abspath(module)], cwd=d, check=True,
                       capture_output=True)
        return subprocess.run([tool("nvdisasm"), "-g", "-c", os.path.join(d, cubin)], check=True,
                              capture_output=True, text=True).stdout


def spills(sass: str) -> dict:
    """kernel (mangled) -> Counter of (file, line) -> local loads and stores there"""
    out = collections.defaultdict(collections.Counter)
    kernel, where = None, ("?", 0)
    for line in sass.splitlines():
        m = re.match(r"\s*\.text\.(\S+):", line)
        if m:
            kernel, where = m.group(1), ("?", 0)
            continue
        m = re.search(r'//## File "([^"]+)", line (\d+)', line)
        if m:
            where = (os.path.basename(m.group(1)), int(m.group(2)))
            continue
        if kernel and re.search(r"\b(STL|LDL)(\.\S+)?\s", line):
            out[kernel][where] += 1
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("module")
    ap.add_argument("unit")
    ap.add_argument("--kernel", default="", help="only kernels whose mangled name contains this")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args(argv)
    for kernel, where in sorted(spills(disassemble(a.module, a.unit)).items(), key=lambda kv: -sum(kv[1].values())):
        if a.kernel not in kernel:
            continue
        name = subprocess.run(["c++filt", kernel], capture_output=True, text=True).stdout.strip() or kernel
        print(f"{sum(where.values())} local loads/stores: {name[:160]}")
        for (f, n), count in where.most_common(a.top):
            print(f"  {count:5d}  {f}:{n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
