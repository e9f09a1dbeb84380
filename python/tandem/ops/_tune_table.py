"""The measured tuning tables behind tandem.ops.tp_plan and tandem.ops.gemm_plan: a JSON list of rows per file,
keyed by the planner's own fields plus log2 buckets of M, N and K (mb, nb, kb), looked up in the user's file first,
then in the one shipped for the H200. Each planner keeps its cache dict and recheck interval (tests reset them)
and says how a row becomes a key and a value."""

from __future__ import annotations

import json
import math
import os
import time


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
