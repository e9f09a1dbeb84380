"""The layering rules of issue 22, checked on the source tree: kernels reach the transport only through the device
API's public headers (no `impl::`, no `device/impl/` include), keep no `__device__` variables (state travels in
the kernels' parameters and workspaces), and the op modules under python/tandem/ops use no other op module's
private names (shared helpers live in _runtime or are public)."""

import ast
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
KERNEL_SOURCES = sorted(p for d in ("kernels/src", "kernels/include") for p in (ROOT / d).rglob("*")
                        if p.suffix in (".cu", ".cuh", ".h", ".hpp"))
# a declaration at the start of a line that is __device__ (or __constant__ / __managed__) and has no parameter
# list: a variable, not a function
_DEVICE_VARIABLE = re.compile(r"^\s*(?:static\s+|extern\s+)?(?:__device__|__constant__|__managed__)(?:\s+__\w+__)*"
                              r"\s+[\w:<>,\s\*]+\s+\w+\s*(?:\[[^\]]*\]\s*)*(?:=[^;(]*)?;\s*$")


def _strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)


def test_the_sources_are_there():
    assert len(KERNEL_SOURCES) > 20 and any(p.name == "persistent.cuh" for p in KERNEL_SOURCES)


def test_no_kernel_names_the_device_apis_private_namespace():
    offenders = []
    for p in KERNEL_SOURCES:
        code = _strip_comments(p.read_text())
        for i, line in enumerate(code.splitlines(), 1):
            if re.search(r"\bimpl::|\bdevice::impl\b", line) or re.search(r'#\s*include\s*[<"]tandem/device/impl/', line):
                offenders.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_no_device_variables_in_the_kernels():
    offenders = []
    for p in KERNEL_SOURCES:
        for i, line in enumerate(_strip_comments(p.read_text()).splitlines(), 1):
            if _DEVICE_VARIABLE.match(line):
                offenders.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_the_device_variable_rule_sees_a_variable_and_not_a_function():
    assert _DEVICE_VARIABLE.match("__device__ Trace g_moe_trace;")
    assert _DEVICE_VARIABLE.match("static __device__ uint64_t counters[64] = {};")
    assert _DEVICE_VARIABLE.match("__constant__ float scale;")
    assert not _DEVICE_VARIABLE.match("__device__ __forceinline__ bool last_of(uint64_t* counter, uint64_t total);")
    assert not _DEVICE_VARIABLE.match("__device__ void run(const Params& p) {")


def test_op_modules_use_no_other_op_modules_private_names():
    ops = ROOT / "python" / "tandem" / "ops"
    modules = {p.stem for p in ops.glob("*.py")}
    offenders = []
    for p in sorted(ops.glob("*.py")):
        tree = ast.parse(p.read_text())
        imported = set()  # names bound to other op modules in this file
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module is None:  # from . import tp, moe
                    imported |= {a.asname or a.name for a in node.names if a.name in modules}
                elif node.module in modules and node.module != "_runtime":
                    offenders += [f"{p.name}:{node.lineno}: from .{node.module} import {a.name}"
                                  for a in node.names if a.name.startswith("_")]
        imported.discard("_runtime")
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in imported
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                offenders.append(f"{p.name}:{node.lineno}: {node.value.id}.{node.attr}")
    assert not offenders, "\n".join(offenders)
