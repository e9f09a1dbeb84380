"""Which CUTLASS configuration computes a bf16 GEMM of a given shape (issue 23, part 1).

The GEMM core (gemm.h) is one configuration: 128x256x64 tiles, 2x1 clusters, cooperative. At medium and ragged
shapes it loses to cuBLAS by wave quantization and tile waste (docs/results.md: 0.78-0.82 at 3000x5000x4000 and
4096 cubed). The core's other configurations (kernels/include/tandem/kernels/gemm/gemm_variants.h: tile 128x256 /
256x128 / 128x128, cluster 2 or 1, cooperative or ping-pong) are the candidates; `choose` names one:

1. a measured table, keyed by (SM count, log2 buckets of M, N, K): the user's (TANDEM_GEMM_TUNE_FILE, else
   ~/.cache/tandem/gemm_tune.json), then the one shipped for the H200 (gemm_tune_h200.json, when a run has made
   it). `python -m tandem tune gemm --from-bench docs/results/gemm_w1.json` writes one from `bench gemm`'s
   per-configuration times;
2. else a wave model: the time of a configuration is its waves (output tiles over the CTAs that run at once)
   times one tile's work over the configuration's relative rate. It moves off the core only when it predicts a
   gain of more than MARGIN: the rates below are estimates until the table has the shape.

Only bf16 takes the other configurations (they are built for bf16); fp16 and swizzles other than 1 stay on the
core. The unsplit configurations compute every output element with the same K order, so choosing among them changes
time, not bits; the split-K / stream-K ones (for shapes whose output tiles do not fill the GPU: small M, long K)
sum fp32 partial tiles in a fixed order, so they are deterministic but round differently
(tests/gpu/test_gemm.py::test_gemm_variants_match_torch checks both kinds).
"""

from __future__ import annotations

import json
import math
import os

from . import _tune_table

CORE = "coop_128x256_c2"
# name -> (tile M, tile N, CTAs a cluster, relative per-CTA rate on a full tile). The rates are estimates (the
# cooperative 128x256 tile has the most MMA work per byte of shared memory traffic; ping-pong 128x128 overlaps its
# epilogue with the other warp group's MMAs, which helps short K); the table replaces them where it has a shape.
CONFIGS = {
    "coop_128x256_c2": (128, 256, 2, 1.00),
    "coop_128x256_c1": (128, 256, 1, 0.97),
    "coop_256x128_c1": (256, 128, 1, 0.97),
    "pingpong_128x128_c1": (128, 128, 1, 0.45),
    "pingpong_128x128_c2": (128, 128, 2, 0.46),
    # split along K (a runtime decomposition of CUTLASS's stream-K scheduler): more work units than output tiles
    # where the tiles do not fill the GPU, at the cost of summing fp32 partial tiles through the workspace
    "splitk2_128x128_c1": (128, 128, 1, 0.90),
    "splitk4_128x128_c1": (128, 128, 1, 0.90),
    "streamk_128x128_c1": (128, 128, 1, 0.90),
    "streamk_128x256_c1": (128, 256, 1, 0.97),
}
# K slices a configuration cuts each output tile into ("stream" = balanced over the grid, modelled as the slices
# that fill one wave); unsplit configurations are absent
SPLITS = {"splitk2_128x128_c1": 2, "splitk4_128x128_c1": 4, "streamk_128x128_c1": "stream",
          "streamk_128x256_c1": "stream"}
TILE_K = 64  # the bf16 configurations' tile depth
STREAM_K_MIN_KTILES = 8  # CUTLASS's smallest stream-K unit (k-tiles); the model never spreads K thinner
SPLIT_COST = 0.15  # the model's extra time of a split configuration (partials through the workspace, fix-up)
MARGIN = 0.10  # the model leaves the core only for a predicted gain above this

SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemm_tune_h200.json")
RECHECK_S = 1.0
_TABLES: dict = {}


bucket = _tune_table.bucket


def key(sms: int, m: int, n: int, k: int) -> tuple:
    return (int(sms), bucket(m), bucket(n), bucket(k))


def table_path() -> str:
    return os.environ.get("TANDEM_GEMM_TUNE_FILE") or os.path.join(os.path.expanduser("~"), ".cache", "tandem",
                                                                    "gemm_tune.json")


def _rows_to_table(rows) -> dict:
    return {(int(r["sms"]), int(r["mb"]), int(r["nb"]), int(r["kb"])): str(r["variant"]) for r in rows
            if str(r.get("variant")) in CONFIGS}


def _load(path: str) -> dict:
    return _tune_table.load(path, _TABLES, RECHECK_S, _rows_to_table)


def lookup(sms: int, m: int, n: int, k: int):
    """The measured configuration for this shape: the user's table, else the shipped one, else None."""
    return _tune_table.lookup((table_path(), SHIPPED), key(sms, m, n, k), _load)


def predicted(name: str, m: int, n: int, k: int, sms: int) -> float:
    """The wave model's time of configuration `name` (arbitrary units; only ratios mean anything): waves of
    output tiles over the CTAs that run at once, each wave one full tile's K loop at the configuration's rate."""
    tm, tn, cluster, rate = CONFIGS[name]
    tiles = math.ceil(m / tm) * math.ceil(n / tn)
    if cluster > 1:  # clusters are whole: M tiles pad to the cluster
        tiles = math.ceil(math.ceil(m / tm) / cluster) * cluster * math.ceil(n / tn)
    slots = max(cluster, (sms // cluster) * cluster)
    split = SPLITS.get(name)
    ktiles = math.ceil(max(k, 1) / TILE_K)
    if split is not None and ktiles < 2 * STREAM_K_MIN_KTILES:
        return math.inf  # a short K is not worth a split: the fix-up and the workspace cost more than it saves
    if split is None:
        return math.ceil(tiles / slots) * tm * tn * ktiles * TILE_K / rate
    if split == "stream":
        # the K iterations of every tile spread over the grid, but CUTLASS's stream-K units are at least
        # STREAM_K_MIN_KTILES k-tiles (fewer: it falls back to whole tiles)
        per_cta = max(math.ceil(tiles * ktiles / slots), min(ktiles, STREAM_K_MIN_KTILES))
        return per_cta * tm * tn * TILE_K / rate * (1 + SPLIT_COST)
    split = min(split, ktiles)  # CUTLASS cuts the split count to the k-tiles there are
    return math.ceil(tiles * split / slots) * tm * tn * math.ceil(ktiles / split) * TILE_K / rate * (1 + SPLIT_COST)


def choose(m: int, n: int, k: int, sms: int, dtype_is_bf16: bool = True) -> str:
    """The configuration for D (M x N) = A (M x K) @ B on `sms` SMs: the table's, else the model's (core unless
    another is predicted more than MARGIN faster)."""
    if not dtype_is_bf16:
        return CORE
    hit = lookup(sms, m, n, k)
    if hit is not None:
        return hit
    core = predicted(CORE, m, n, k, sms)
    best = min(CONFIGS, key=lambda c: predicted(c, m, n, k, sms))
    return best if predicted(best, m, n, k, sms) < (1 - MARGIN) * core else CORE


def write_table(rows: list, path: str | None = None) -> str:
    """Merge rows {sms, m, n, k, variant, ms} into the table at `path` (default table_path()); returns the path."""
    return _tune_table.write(path or table_path(), rows, ("sms", "mb", "nb", "kb"), _TABLES)


def rows_from_bench(paths) -> list:
    """Table rows from `python -m tandem bench gemm` outputs (gemm_w1.json): per bf16 shape with per-configuration
    times (variants_ms), the fastest configuration, on the SM count of that run's device."""
    rows = []
    for p in paths:
        with open(p) as f:
            data = json.load(f)
        for r in data if isinstance(data, list) else []:
            times = {v: t for v, t in (r.get("variants_ms") or {}).items() if t is not None and v in CONFIGS}
            if r.get("dtype") != "bfloat16" or not times:
                continue
            sms = int(r.get("sm_count") or 132)
            best = min(times, key=times.get)
            rows.append(dict(sms=sms, m=int(r["m"]), n=int(r["n"]), k=int(r["k"]), variant=best, ms=times[best],
                             candidates=times))
    return rows
