"""Compare two bench runs row by row (issue 22: "benchmark numbers within noise").

    python tools/diag/compare_runs.py OLD.json NEW.json [--keys unfused_ms,auto_ms,...]
    python tools/diag/compare_runs.py git:af75616:docs/results/tp_w4.json /path/new/tp_w4.json

Rows are matched on their identifying keys (op, m, n, k, world, label, b, s, hq, hkv, d, causal, pass, tokens,
...: the fields in IDENTITY that a row has). For each timing key it prints new/old per row and, over the rows,
the median and range. The same run's baselines (cuBLAS alone, naive, SDPA, torch ring) are printed beside the
tandem columns: when they moved as much as tandem did, the change is the machine's, not the code's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys


def load(spec: str) -> list:
    if spec.startswith("git:"):
        _, rev, path = spec.split(":", 2)
        text = subprocess.run(["git", "show", f"{rev}:{path}"], check=True, capture_output=True, text=True).stdout
    else:
        with open(spec) as f:
            text = f.read()
    data = json.loads(text)
    while isinstance(data, dict):  # {"rows": [...]}, {"meta": ..., "data": {"rows": [...]}}
        data = data.get("rows", data.get("data"))
    rows = data
    return [r for r in rows if isinstance(r, dict)]


# the fields that name a row (shape, op, world, ...); picks, splits and run metadata are not among them
IDENTITY = ("op", "label", "config", "m", "n", "k", "world", "b", "batch", "s", "seq", "seq_local", "hq", "heads_q",
            "hkv", "heads_kv", "d", "head_dim", "causal", "pass", "tokens", "experts", "topk", "hidden", "inter",
            "ffn", "dtype", "scaling", "mode", "layer", "baseline")


def ident(row: dict, timing: set) -> tuple:
    return tuple((k, row[k]) for k in IDENTITY if k in row and k not in timing)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--keys", default="", help="timing keys (default: every key ending in _ms or _tflops)")
    args = ap.parse_args(argv)
    old, new = load(args.old), load(args.new)
    keys = [k for k in args.keys.split(",") if k] or sorted(
        {k for r in old + new for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
         and (k.endswith("_ms") or k.endswith("_tflops"))})
    timing = set(keys) | {k for r in old + new for k, v in r.items() if isinstance(v, float)}
    by_id = {ident(r, timing): r for r in old}
    pairs = [(by_id[ident(r, timing)], r) for r in new if ident(r, timing) in by_id]
    print(f"{len(pairs)} rows matched of {len(new)} new / {len(old)} old")
    if not pairs:
        return 1
    for k in keys:
        ratios = [n[k] / o[k] for o, n in pairs if isinstance(o.get(k), (int, float)) and
                  isinstance(n.get(k), (int, float)) and o[k] > 0]
        if ratios:
            print(f"{k:28s} new/old median {statistics.median(ratios):.3f}  range {min(ratios):.2f}-{max(ratios):.2f}"
                  f"  ({len(ratios)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
