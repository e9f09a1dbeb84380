"""Where the CUDA binary tools the offline diagnostics run are (sass_diff.py, spills_by_line.py): no GPU needed."""

from __future__ import annotations

import glob
import os
import shutil
import sys


def tool(name: str) -> str:
    """The path of CUDA tool `name` (cuobjdump, nvdisasm): the environment variable of its name upper-cased
    (CUOBJDUMP=...), else CUDA_BIN/<name>, else PATH, else CUDA's install, else the copy triton ships; exits with
    a message when there is none."""
    explicit = os.environ.get(name.upper())
    if explicit:
        return explicit
    if os.environ.get("CUDA_BIN") and os.path.exists(os.path.join(os.environ["CUDA_BIN"], name)):
        return os.path.join(os.environ["CUDA_BIN"], name)
    found = shutil.which(name)
    if found:
        return found
    for pattern in (f"/usr/local/cuda*/bin/{name}",
                    os.path.join(sys.prefix, "lib", "python3*", "site-packages", "triton", "backends", "nvidia", "bin",
                                 name)):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[0]
    sys.exit(f"no {name}: set {name.upper()} or CUDA_BIN")
