"""libtandem_torch_ops (python/torch_ops/): the C++ kernels of torch's CUDA dispatch key for torch.ops.tandem.gemm and
scaled_gemm. Here, without a GPU: it builds against this torch (tools/build_torch_ops.sh, as tools/device_suite.sh
builds it; the package build makes the same library where torch is importable), installs through
tandem.ops._dispatcher with tandem._C's launch table, registers both ops for the CUDA key and nothing else (CPU and
meta tensors keep the Python implementation and the fake), switches off and on, stays out with TANDEM_TORCH_OPS=0,
and refuses a launch table that is not tandem._C's. tests/gpu/test_gemm.py runs its kernels."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

PROBE = r"""
import ctypes, json, torch
import tandem.ops
from tandem.ops import _dispatcher as d
from tandem.errors import TandemError

def cuda_kernels():
    return [torch._C._dispatch_has_kernel_for_dispatch_key(f"tandem::{n}", "CUDA") for n in ("gemm", "scaled_gemm")]

res = {"status": d.status(), "on": cuda_kernels()}
d.set_enabled(False)
res["off"], res["status_off"] = cuda_kernels(), d.status()
d.set_enabled(True)
res["on_again"] = cuda_kernels()
try:
    torch.ops.tandem.gemm(torch.ones(16, 16, dtype=torch.bfloat16), torch.ones(16, 16, dtype=torch.bfloat16))
    res["cpu"] = "accepted"
except TandemError as e:
    res["cpu"] = e.status
m = torch.empty(8, 16, device="meta", dtype=torch.bfloat16)
res["meta"] = list(torch.ops.tandem.gemm(m, torch.empty(16, 24, device="meta", dtype=torch.bfloat16)).shape)
print("RESULT " + json.dumps(res))
"""

# A library that was not installed refuses a capsule that is not tandem._C's launch table.
WRONG_TABLE = r"""
import ctypes, json, os, torch
lib = ctypes.PyDLL(os.environ["TANDEM_TORCH_OPS_LIB"])
lib.tandem_torch_ops_install.argtypes = [ctypes.py_object] * 4
new = ctypes.pythonapi.PyCapsule_New
new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
buf = ctypes.create_string_buffer(64)
wrong = new(ctypes.cast(buf, ctypes.c_void_p), b"not.the.table", None)
try:
    lib.tandem_torch_ops_install(wrong, print, print, print)
    out = "accepted"
except Exception as e:
    out = type(e).__name__
print("RESULT " + json.dumps(out))
"""


def _result(code: str, env: dict) -> object:
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(next(line for line in p.stdout.splitlines() if line.startswith("RESULT "))[7:])


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    pytest.importorskip("torch")
    if shutil.which("g++") is None:
        pytest.skip("no g++ here")
    out = tmp_path_factory.mktemp("torch_ops")
    p = subprocess.run(["bash", "tools/build_torch_ops.sh", str(out)], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHON=sys.executable), timeout=600)
    if p.returncode == 2 and "no CUDA headers" in p.stdout:
        pytest.skip("no CUDA headers (cuda_runtime_api.h) here")
    assert p.returncode == 0, p.stdout + p.stderr
    return out / "libtandem_torch_ops.so"


def test_the_library_installs_and_registers_the_cuda_kernels(library):
    env = dict(os.environ, TANDEM_TORCH_OPS_LIB=str(library))
    env.pop("TANDEM_TORCH_OPS", None)
    r = _result(PROBE, env)
    assert r["status"].startswith("C++ CUDA kernels"), r
    assert r["on"] == [True, True] and r["on_again"] == [True, True], r
    assert r["off"] == [False, False] and r["status_off"].startswith("Python"), r
    assert r["cpu"] == 3, r  # the Python implementation's INVALID_ARGUMENT, as without the library
    assert r["meta"] == [8, 24], r


def test_the_library_stays_out_when_switched_off(library):
    r = _result(PROBE, dict(os.environ, TANDEM_TORCH_OPS_LIB=str(library), TANDEM_TORCH_OPS="0"))
    assert r["status"] == "Python (disabled (TANDEM_TORCH_OPS=0))", r
    assert r["on"] == [False, False], r
    assert r["cpu"] == 3 and r["meta"] == [8, 24], r


def test_the_library_refuses_a_table_that_is_not_tandems(library):
    out = _result(WRONG_TABLE, dict(os.environ, TANDEM_TORCH_OPS_LIB=str(library), TANDEM_TORCH_OPS="0"))
    assert out == "ValueError", out  # PyCapsule_GetPointer's: the capsule's name is not the table's


# A library that refuses this tandem._C (here a stand-in whose install fails as a stale build's would: another
# launch-table version or Args size) leaves the ops on their Python implementation; importing tandem.ops works.
REFUSING_LIBRARY = r"""
#include <Python.h>
const char* tandem_torch_ops_torch_version(void) { return TORCH_VERSION_STRING; }
int tandem_torch_ops_install(PyObject* table, PyObject* plan_gemm, PyObject* plan_scaled, PyObject* error) {
  PyErr_SetString(PyExc_RuntimeError, "launch table v1, Args 120 / 96 bytes, does not match tandem._C");
  return -1;
}
"""


def test_a_library_that_refuses_this_tandem_leaves_the_python_path(tmp_path):
    torch = pytest.importorskip("torch")
    if shutil.which("gcc") is None:
        pytest.skip("no gcc here")
    import sysconfig

    src = tmp_path / "refusing.c"
    src.write_text(REFUSING_LIBRARY)
    lib = tmp_path / "libtandem_torch_ops.so"
    version = torch.__version__.split("+")[0]
    subprocess.run(["gcc", "-shared", "-fPIC", f'-DTORCH_VERSION_STRING="{version}"',
                    f"-I{sysconfig.get_paths()['include']}", str(src), "-o", str(lib)], check=True, timeout=120)
    env = dict(os.environ, TANDEM_TORCH_OPS_LIB=str(lib))
    env.pop("TANDEM_TORCH_OPS", None)
    r = _result(PROBE, env)
    assert r["status"].startswith("Python (") and "refused this tandem._C" in r["status"], r
    assert "does not match tandem._C" in r["status"], r
    assert r["on"] == [False, False] and r["cpu"] == 3 and r["meta"] == [8, 24], r
