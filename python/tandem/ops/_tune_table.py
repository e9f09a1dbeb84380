"""The measured tuning tables behind tandem.ops.tp_plan and tandem.ops.gemm_plan: a JSON list of rows per file,
keyed by the planner's own fields plus log2 buckets of M, N and K (mb, nb, kb), looked up in the user's file first,
then in the one shipped for this GPU (`device_table`: <name>_h100.json on an H100 where one is shipped, else the
H200's, <name>_h200.json). Each planner keeps its cache dict and recheck interval (tests reset them) and says how a
row becomes a key and a value.

Why a table per GPU model: the key has the SM count, which the H100 SXM and the H200 share (132), while the fastest
configuration of a shape is not the same on both (HBM3 against HBM3e; docs/results.md, 2026-12-06: the H200's
GEMM table on an H100 gave 0.885 of cuBLAS where the H100's own best configurations gave 0.982)."""

from __future__ import annotations

import json
import math
import os
import time


# GPU models with tables of their own, by the tag in the device name (the H200's is the default)
DEVICE_TAGS = ("H100", "H200")
_DEVICE_NAMES: dict = {}


def _device_name() -> str:
    """This process's current CUDA device name ("" without CUDA); asked once per device index."""
    try:
        import torch

        # never the first CUDA call of a process (a CPU tool, a test's parent before its workers): the ops look
        # up with CUDA tensors, so CUDA is initialized wherever the device matters
        if not torch.cuda.is_initialized():
            return ""
        index = torch.cuda.current_device()
        if index not in _DEVICE_NAMES:
            _DEVICE_NAMES[index] = torch.cuda.get_device_name(index)
        return _DEVICE_NAMES[index]
    except Exception:  # no driver, no device: the default table
        return ""


def device_table(default: str) -> str:
    """The shipped table for this GPU: `default` (a path ending in _h200.json) with the model's tag in its place
    (_h100.json on an H100) when that file exists, else `default`."""
    name = _device_name()
    stem, suffix = "_h200", ".json"
    if not default.endswith(stem + suffix):
        return default
    for tag in DEVICE_TAGS:
        if tag in name:
            path = default[: -len(stem + suffix)] + "_" + tag.lower() + suffix
            return path if os.path.exists(path) else default
    return default


def bucket(x: int) -> int:
    """log2 bucket of a dimension (nearest power of two)."""
    return int(round(math.log2(max(1, int(x)))))


def load(path: str, cache: dict, recheck_s: float, parse) -> dict:
    """{key: value} of the table at `path` (parse(rows) makes it; a missing or unreadable file is {}). The file is
    stat'ed at most every `recheck_s` seconds and read again only when its mtime changed: a table that `tandem tune`
    rewrites is picked up within that time."""
    now = time.monotonic()
    cached = cache.get(path)
    if cached is not None and now - cached[2] < recheck_s:
        return cached[1]
    try:
        mtime = os.path.getmtime(path)
    except OSError:
        cache[path] = (None, {}, now)
        return {}
    if cached is not None and cached[0] == mtime:
        cache[path] = (mtime, cached[1], now)
        return cached[1]
    try:
        with open(path) as f:
            table = parse(json.load(f))
    except (OSError, ValueError, KeyError, TypeError):
        table = {}
    cache[path] = (mtime, table, now)
    return table


def lookup(paths, key, load_one):
    """The first table among `paths` (the user's, then the shipped one) that has `key`: its value, else None."""
    for path in paths:
        hit = load_one(path).get(key)
        if hit is not None:
            return hit
    return None


def write(path: str, rows: list, fields: tuple, cache: dict, defaults: dict | None = None) -> str:
    """Merge `rows` (with m, n, k; their buckets are added) into the table at `path`, one row per key `fields`
    (the planner's fields, then "mb", "nb", "kb"; a new row replaces an old one), sorted by key; returns the path.
    `defaults`: values of key fields that rows written before the field existed lack (they are filled in)."""
    old = []
    if os.path.exists(path):
        try:
            with open(path) as f:
                old = json.load(f)
        except (OSError, ValueError):
            old = []
    merged = {}
    old = [dict(defaults or {}, **r) for r in old]
    for r in old + [dict(r, mb=bucket(r["m"]), nb=bucket(r["n"]), kb=bucket(r["k"])) for r in rows]:
        merged[tuple(r[f] for f in fields)] = r
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(sorted(merged.values(), key=lambda r: tuple(r[f] for f in fields)), f, indent=1)
    cache.pop(path, None)
    return path
