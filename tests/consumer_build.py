"""Configure and build tests/consumer against the installed tandem package (find_package(tandem CONFIG))."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def build_consumer(build_dir: str) -> str:
    import tandem

    cmake = shutil.which("cmake")
    if cmake is None:
        raise RuntimeError("cmake not on PATH")
    prefix = tandem.cmake_prefix_path()
    if not glob.glob(os.path.join(prefix, "*", "cmake", "tandem", "tandemConfig.cmake")):  # lib/ or lib64/
        # a module copied next to the sources (tools/device_suite.sh's prebuilt path) has no CMake package
        raise RuntimeError(f"no tandemConfig.cmake under {prefix}: the worked examples build against the installed "
                           "package (pip install .), not a module copied into python/tandem")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    cfg = [cmake, "-S", os.path.join(HERE, "consumer"), "-B", build_dir, *gen,
           f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release"]
    for cmd in (cfg, [cmake, "--build", build_dir, "-j", str(os.cpu_count() or 2)]):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}")
    for name in ("allgather_epilogue", "allgather_epilogue_roles", "host_selftest"):
        if not os.path.exists(os.path.join(build_dir, name)):
            raise RuntimeError(f"{name} was not built")
    return os.path.join(build_dir, "allgather_epilogue")
