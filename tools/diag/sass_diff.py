#!/usr/bin/env python3
"""Which kernels of two builds of tandem's module differ in their machine code (SASS), and which are identical.

Issue 22 asks that a restructuring keep behaviour and speed. Where a kernel's SASS is identical in both builds,
its speed cannot have changed, so a before/after benchmark that moves is noise for that kernel; where it differs,
the benchmark has to settle it. Run it on two modules built from the two trees (tools/prebuild_device_module.sh
builds one on a CPU machine):

    python3 tools/diag/sass_diff.py OLD.so NEW.so [--show NAME_PART]

It runs `cuobjdump -sass` on both (found by cuda_tools.tool: CUOBJDUMP, CUDA_BIN, PATH, triton's) and compares
each kernel's instructions with what cannot matter removed: instruction addresses and encodings, the source
file names (`identifier =`, which name the build's tree), and the hash that nvcc puts in anonymous-namespace
names (it derives from the source path). --show prints the differing lines of the kernels whose name contains
NAME_PART.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys

from cuda_tools import tool

_ANON = re.compile(r"_GLOBAL__N__[0-9a-f]+_\d+_")
_ADDR = re.compile(r"/\*[0-9a-f]{4,}\*/")
_ENC = re.compile(r"/\* 0x[0-9a-f]+ \*/")


def kernels(path: str) -> dict:
    """kernel name (anonymous-namespace hash removed) -> its normalized instructions, one list per cubin holding it"""
    text = subprocess.run([tool("cuobjdump"), "-sass", path], capture_output=True, text=True, check=True).stdout
    out, name, body = {}, None, []
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            if name:
                out.setdefault(name, []).append(body)
            name, body = _ANON.sub("_GLOBAL__N__", m.group(1)), []
            continue
        if name is None:
            continue
        s = _ANON.sub("_GLOBAL__N__", _ENC.sub("", _ADDR.sub("", line))).strip()
        if s and not s.startswith("identifier"):
            body.append(s)
    if name:
        out.setdefault(name, []).append(body)
    return out


def demangle(name: str) -> str:
    try:
        return subprocess.run(["c++filt", name], capture_output=True, text=True).stdout.strip() or name
    except OSError:
        return name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--show", help="print the differing lines of kernels whose name contains this")
    a = ap.parse_args(argv)
    old, new = kernels(a.old), kernels(a.new)
    same = sorted(n for n in old if n in new and old[n] == new[n])
    differ = sorted(n for n in old if n in new and old[n] != new[n])
    print(f"{len(same)} kernels identical, {len(differ)} differ, {len(set(old) - set(new))} only in old, "
          f"{len(set(new) - set(old))} only in new")
    for tag, names in (("differ", differ), ("only in old", sorted(set(old) - set(new))),
                       ("only in new", sorted(set(new) - set(old)))):
        for n in names:
            sizes = "" if tag != "differ" else f" ({sum(map(len, old[n]))} -> {sum(map(len, new[n]))} instructions)"
            print(f"{tag}: {demangle(n)[:200]}{sizes}")
            if a.show and a.show in n and tag == "differ":
                lines = difflib.unified_diff([x for b in old[n] for x in b], [x for b in new[n] for x in b],
                                             lineterm="", n=0)
                print("\n".join(x for x in lines if x[:1] in "+-" and x[:3] not in ("---", "+++")))
    for n in same:
        print(f"identical: {demangle(n)[:200]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
