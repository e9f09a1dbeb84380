"""Which CUTLASS configuration computes a bf16 GEMM of a given shape (issue 23, part 1).

The GEMM core (gemm.h) is one configuration: 128x256x64 tiles, 2x1 clusters, cooperative. At medium and ragged
shapes it loses to cuBLAS by wave quantization and tile waste (docs/results.md: 0.78-0.82 at 3000x5000x4000 and
4096 cubed). The core's other configurations (kernels/include/tandem/kernels/gemm/gemm_variants.h: tile 128x256 /
256x128 / 128x128, cluster 2 or 1, cooperative or ping-pong) are the candidates; `choose` names one:

1. a measured table, keyed by (SM count, log2 buckets of M, N, K): the user's (TANDEM_GEMM_TUNE_FILE, else
   ~/.cache/tandem/gemm_tune.json), then the one shipped for this GPU (gemm_tune_h100.json on an H100, else
   gemm_tune_h200.json: _tune_table.device_table). `python -m tandem tune gemm --from-bench docs/results/gemm_w1.json` writes one from `bench gemm`'s
   per-configuration times;
2. else a wave model: the time of a configuration is its waves (output tiles over the CTAs that run at once)
   times one tile's work over the configuration's relative rate. It moves off the core only when it predicts a
   gain of more than MARGIN: the rates below are estimates until the table has the shape.

Only bf16 takes the other configurations (they are built for bf16); fp16 and swizzles other than 1 stay on the
core. The FP8 GEMM (torch.ops.tandem.scaled_gemm) has configurations of its own (SCALED_CONFIGS, scaled_gemm.h's
ScaledConfig), chosen the same way by `choose_scaled`; the table keeps them apart by a "kind" per row ("bf16",
"fp8_tensor", "fp8_row"; a row without one is bf16). An op decides its configuration on the first call of a call
signature (its prepared-call cache): a table rewritten later applies to new signatures, and to old ones after
tandem.ops._runtime's prepared calls are dropped (release_workspaces). The unsplit configurations compute every output element with the same K order, so choosing among them changes
time, not bits; the split-K / stream-K ones (for shapes whose output tiles do not fill the GPU: small M, long K)
sum fp32 partial tiles in a fixed order, so they are deterministic but round differently
(tests/gpu/test_gemm.py::test_gemm_variants_match_torch checks both kinds).
"""

from __future__ import annotations

import json
import math
import os
import statistics

from . import _tune_table

CORE = "coop_128x256_c2"
# name -> (tile M, tile N, CTAs a cluster along M (CLUSTER_N: along N), relative per-CTA rate on a full tile). The
# rates are estimates (the cooperative 128x256 tile has the most MMA work per byte of shared memory traffic;
# ping-pong 128x128 overlaps its epilogue with the other warp group's MMAs, which helps short K); the table
# replaces them where it has a shape.
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
    # cluster 1x2 (the third field counts CTAs along M; CLUSTER_N below along N) and 256x128 in 2x1 clusters
    "coop_128x256_c1x2": (128, 256, 1, 1.00),
    "coop_256x128_c2": (256, 128, 2, 1.00),
    # swapped (the kernel computes D^T = B^T A^T; the tile named in the problem's orientation, M x N): 256 x 128, and
    # 208-row tiles in pairs along M (near cuBLAS's swapped 200-row tile at 777 x 4104 x 4096)
    "swap_coop_256x128_c1": (256, 128, 1, 0.97),
    "swap_coop_208x128_c2": (208, 128, 2, 1.00),
}
# CTAs a cluster along N (absent: 1)
CLUSTER_N = {"coop_128x256_c1x2": 2}
# Configurations the wave model does not pick until a measured table has them (their rates are guesses)
UNTIMED = frozenset({"coop_128x256_c1x2", "coop_256x128_c2", "swap_coop_256x128_c1", "swap_coop_208x128_c2"})
# K slices a configuration cuts each output tile into ("stream" = balanced over the grid, modelled as the slices
# that fill one wave); unsplit configurations are absent
SPLITS = {"splitk2_128x128_c1": 2, "splitk4_128x128_c1": 4, "streamk_128x128_c1": "stream",
          "streamk_128x256_c1": "stream"}
MARGIN = 0.10  # the model leaves the core only for a predicted gain above this
TILE_K = 64  # the bf16 configurations' tile depth (the FP8 ones': SCALED_TILE_K)
STREAM_K_MIN_KTILES = 8  # CUTLASS's smallest stream-K unit (k-tiles); the model never spreads K thinner
SPLIT_COST = 0.15  # the model's extra time of a split configuration (partials through the workspace, fix-up)
STREAM_K_TABLE_MARGIN = 0.03  # a stream-K win over the unsplit configurations the table takes where tiles fill a wave

# The persistent scheduler's walk over the output tiles, a runtime argument of every configuration, bf16 and FP8
# (gemm.h GemmArgs, scaled_gemm.h ScaledGemmArgs: max_swizzle and raster): which A and B tiles are in the L2
# together, never the result's bits. The
# default (swizzle 1, CUTLASS's raster heuristic) is what every configuration ran before the table had these; a row
# names another schedule only where `bench gemm` measured it faster by more than SCHEDULE_TABLE_MARGIN (on the
# H200 a larger swizzle was slower at every large square-ish shape: docs/results.md, 2026-12-03).
SWIZZLES = (1, 2, 4, 8)
RASTERS = ("heuristic", "along_m", "along_n")
SCHEDULE_TABLE_MARGIN = 0.02


class Schedule(tuple):
    """(variant, swizzle, raster): what torch.ops.tandem.gemm (a bf16 configuration) or scaled_gemm (an FP8 one)
    runs for a shape."""

    __slots__ = ()

    def __new__(cls, variant: str, swizzle: int = 1, raster: str = "heuristic"):
        return super().__new__(cls, (variant, int(swizzle), str(raster)))

    variant = property(lambda self: self[0])
    swizzle = property(lambda self: self[1])
    raster = property(lambda self: self[2])

    def name(self) -> str:
        """'variant' for the default schedule, else 'variant/s<swizzle>/<raster>' (bench gemm's schedules_ms keys)."""
        return self.variant if self[1:] == (1, "heuristic") else f"{self.variant}/s{self.swizzle}/{self.raster}"

    @classmethod
    def parse(cls, name: str) -> "Schedule":
        """The inverse of name(); ValueError for a name that is not one."""
        parts = str(name).split("/")
        if len(parts) == 1:
            return cls(parts[0])
        if len(parts) != 3 or not parts[1].startswith("s") or not parts[1][1:].isdigit():
            raise ValueError(f"not a schedule name: {name!r}")
        return cls(parts[0], int(parts[1][1:]), parts[2])

    def valid(self, kind: str = "bf16") -> bool:
        return self.variant in _configs(kind) and self.swizzle in SWIZZLES and self.raster in RASTERS

    def others(self):
        """The other tile schedules of this configuration (bench gemm times them)."""
        return [Schedule(self.variant, s, r) for s in SWIZZLES for r in RASTERS if (s, r) != self[1:]]

    def overridden(self, variant=None, swizzle=None, raster=None) -> "Schedule":
        """This plan with a caller's knobs (None: the plan's): another configuration than the plan's starts from
        the default walk (the plan's walk was measured for its own configuration)."""
        plan = self if variant is None or variant == self.variant else Schedule(variant)
        return Schedule(plan.variant, plan.swizzle if swizzle is None else swizzle,
                        plan.raster if raster is None else raster)


def tile_walk_error(swizzle, raster):
    """What is wrong with a caller's swizzle / raster (None: unset, fine), or None (gemm.h tile_walk_error)."""
    if swizzle is not None and swizzle not in SWIZZLES:
        return f"swizzle must be 1, 2, 4 or 8, got {swizzle!r}"
    if raster is not None and raster not in RASTERS:
        return f"raster must be one of {RASTERS}, got {raster!r}"
    return None

# The FP8 GEMM's configurations (scaled_gemm.h ScaledConfig; the enum value is the name upper-cased; "fp8_" keeps
# them apart from the bf16 names in one table file, also for a reader that predates the "kind" field):
# name -> (tile M, tile N, cluster M, cluster N, relative per-CTA rate on a full tile). Tiles are 128 deep in K.
SCALED_TILE_K = 128
SCALED_CORE = "fp8_coop_128x128_c2"
SCALED_CONFIGS = {
    "fp8_coop_128x128_c2": (128, 128, 2, 1, 1.00),
    "fp8_coop_128x128_c1": (128, 128, 1, 1, 0.97),
    "fp8_coop_128x128_c1x2": (128, 128, 1, 2, 1.00),
    "fp8_pingpong_64x128_c1": (64, 128, 1, 1, 0.50),
    "fp8_splitk2_128x128_c1": (128, 128, 1, 1, 0.95),
    "fp8_streamk_128x128_c1": (128, 128, 1, 1, 0.95),
    # the widest tiles the promotion buffer leaves registers for (scaled_gemm.h; 128x256 spills); rates guessed
    # from the MMA work per byte loaded (128x192: 1.2x 128x128's), not measured
    "fp8_coop_128x192_c2": (128, 192, 2, 1, 1.05),
    "fp8_coop_128x192_c1": (128, 192, 1, 1, 1.02),
    "fp8_pingpong_64x192_c1": (64, 192, 1, 1, 0.55),
}
SCALED_SPLITS = {"fp8_splitk2_128x128_c1": 2, "fp8_streamk_128x128_c1": "stream"}
# configurations no GPU has timed yet: run by name (scaled_gemm_with(config=...)), by `bench gemm` and by the GPU
# tests, and taken from a measured table, but never by the wave model (its rates for them are guesses)
SCALED_UNTIMED = frozenset({"fp8_coop_128x192_c2", "fp8_coop_128x192_c1", "fp8_pingpong_64x192_c1"})
KINDS = ("bf16", "fp8_tensor", "fp8_row")

SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gemm_tune_h200.json")
RECHECK_S = 1.0
_TABLES: dict = {}


bucket = _tune_table.bucket


def _configs(kind: str) -> dict:
    return CONFIGS if kind == "bf16" else SCALED_CONFIGS


def key(sms: int, m: int, n: int, k: int, kind: str = "bf16") -> tuple:
    return (kind, int(sms), bucket(m), bucket(n), bucket(k))


def table_path() -> str:
    return os.environ.get("TANDEM_GEMM_TUNE_FILE") or os.path.join(os.path.expanduser("~"), ".cache", "tandem",
                                                                    "gemm_tune.json")


def _rows_to_table(rows) -> dict:
    table = {}
    for r in rows:
        kind = str(r.get("kind", "bf16"))
        if kind not in KINDS or str(r.get("variant")) not in _configs(kind):
            continue
        # a Schedule (rows written before schedules: the default one); a row whose schedule is not one is skipped,
        # not the whole table
        swizzle, raster = r.get("swizzle", 1), r.get("raster", "heuristic")
        if type(swizzle) is not int:  # (not a bool, a float or a string: the table is written by tune)
            continue
        value = Schedule(str(r["variant"]), swizzle, str(raster))
        if not value.valid(kind):
            continue
        table[(kind, int(r["sms"]), int(r["mb"]), int(r["nb"]), int(r["kb"]))] = value
    return table


def _load(path: str) -> dict:
    return _tune_table.load(path, _TABLES, RECHECK_S, _rows_to_table)


def lookup(sms: int, m: int, n: int, k: int, kind: str = "bf16"):
    """The measured configuration for this shape: the user's table, else the shipped one, else None."""
    return _tune_table.lookup((table_path(), _tune_table.device_table(SHIPPED)), key(sms, m, n, k, kind), _load)


def _tiles(tm, tn, cm, cn, m, n) -> int:
    """Output tiles, clusters whole (M tiles pad to cm, N tiles to cn)."""
    return math.ceil(math.ceil(m / tm) / cm) * cm * math.ceil(math.ceil(n / tn) / cn) * cn


def _waves_time(tm, tn, cm, cn, rate, split, m, n, k, sms, tile_k) -> float:
    """Waves of output tiles over the CTAs that run at once, each a full tile's K loop (whole k-tiles of depth
    tile_k) at `rate`. A split configuration cuts each tile's K loop in `split` slices (CUTLASS cuts the count to
    the k-tiles there are) or, "stream", spreads the k-tiles of every tile over the grid in units of at least
    STREAM_K_MIN_KTILES, at SPLIT_COST extra; a K of fewer than 2 x STREAM_K_MIN_KTILES k-tiles is never split
    (the fix-up and the workspace would cost more than the split saves)."""
    tiles = _tiles(tm, tn, cm, cn, m, n)
    size = cm * cn
    slots = max(size, (sms // size) * size)
    ktiles = math.ceil(max(k, 1) / tile_k)
    if split is None:
        return math.ceil(tiles / slots) * tm * tn * ktiles * tile_k / rate
    if ktiles < 2 * STREAM_K_MIN_KTILES:
        return math.inf
    if split == "stream":
        per_cta = max(math.ceil(tiles * ktiles / slots), min(ktiles, STREAM_K_MIN_KTILES))
        return per_cta * tm * tn * tile_k / rate * (1 + SPLIT_COST)
    split = min(split, ktiles)
    return math.ceil(tiles * split / slots) * tm * tn * math.ceil(ktiles / split) * tile_k / rate * (1 + SPLIT_COST)


def predicted(name: str, m: int, n: int, k: int, sms: int) -> float:
    """The wave model's time of bf16 configuration `name` (arbitrary units; only ratios mean anything)."""
    tm, tn, cluster, rate = CONFIGS[name]
    return _waves_time(tm, tn, cluster, CLUSTER_N.get(name, 1), rate, SPLITS.get(name), m, n, k, sms, TILE_K)


def predicted_scaled(name: str, m: int, n: int, k: int, sms: int) -> float:
    """The wave model's time of FP8 configuration `name` (arbitrary units)."""
    tm, tn, cm, cn, rate = SCALED_CONFIGS[name]
    return _waves_time(tm, tn, cm, cn, rate, SCALED_SPLITS.get(name), m, n, k, sms, SCALED_TILE_K)


def choose_schedule(m: int, n: int, k: int, sms: int, dtype_is_bf16: bool = True) -> Schedule:
    """The configuration and tile schedule for D (M x N) = A (M x K) @ B on `sms` SMs: the table's, else the
    model's configuration (core unless another is predicted more than MARGIN faster) with the default schedule.
    fp16 runs the core with the default schedule (the table is measured in bf16)."""
    if not dtype_is_bf16:
        return Schedule(CORE)
    hit = lookup(sms, m, n, k)
    if hit is not None:
        return hit
    core = predicted(CORE, m, n, k, sms)
    best = min((c for c in CONFIGS if c not in UNTIMED), key=lambda c: predicted(c, m, n, k, sms))
    return Schedule(best if predicted(best, m, n, k, sms) < (1 - MARGIN) * core else CORE)


def choose(m: int, n: int, k: int, sms: int, dtype_is_bf16: bool = True) -> str:
    """The configuration choose_schedule picks (its name only)."""
    return choose_schedule(m, n, k, sms, dtype_is_bf16).variant


def choose_scaled_schedule(m: int, n: int, k: int, sms: int, scaling: str) -> Schedule:
    """The FP8 GEMM's configuration and tile schedule ("tensor" or "row" scaling): the table's, else the model's
    configuration (SCALED_CORE unless another, not one of SCALED_UNTIMED, is predicted more than MARGIN faster)
    with the default schedule."""
    hit = lookup(sms, m, n, k, "fp8_" + scaling)
    if hit is not None:
        return hit
    core = predicted_scaled(SCALED_CORE, m, n, k, sms)
    modelled = [c for c in SCALED_CONFIGS if c not in SCALED_UNTIMED]
    best = min(modelled, key=lambda c: predicted_scaled(c, m, n, k, sms))
    return Schedule(best if predicted_scaled(best, m, n, k, sms) < (1 - MARGIN) * core else SCALED_CORE)


def choose_scaled(m: int, n: int, k: int, sms: int, scaling: str) -> str:
    """The configuration choose_scaled_schedule picks (its name only)."""
    return choose_scaled_schedule(m, n, k, sms, scaling).variant


def write_table(rows: list, path: str | None = None) -> str:
    """Merge rows {kind, sms, m, n, k, variant, ms} into the table at `path` (default table_path()); returns the
    path. A row without a kind is bf16."""
    rows = [dict(r, kind=r.get("kind", "bf16")) for r in rows]
    return _tune_table.write(path or table_path(), rows, ("kind", "sms", "mb", "nb", "kb"), _TABLES,
                             defaults={"kind": "bf16"})


def _merged_bench_rows(paths) -> list:
    """The bench rows of several `bench gemm` outputs, one per (kind, SM count, M, N, K): where more than one file
    timed a shape, each configuration's (and tile schedule's) time is the median of the files that timed it. One
    sweep's single timing of two configurations a few percent apart picks either by chance (2026-12-06: a FP8 row
    whose choice moved between sweeps ran 0.87 of _scaled_mm instead of 1.10); the median of several sweeps picks
    the one that is faster more often."""
    groups = {}
    for p in paths:
        with open(p) as f:
            data = json.load(f)
        for r in data if isinstance(data, list) else []:
            kind = "bf16" if r.get("dtype") == "bfloat16" else f"fp8_{r.get('scaling')}"
            if kind not in KINDS:
                continue
            key = (kind, int(r.get("sm_count") or 132), int(r["m"]), int(r["n"]), int(r["k"]))
            groups.setdefault(key, []).append(r)
    merged = []
    for (kind, sms, m, n, k), rs in groups.items():
        row = dict(kind=kind, sm_count=sms, m=m, n=n, k=k)
        for field in ("variants_ms", "schedules_ms"):
            timed = {}
            for r in rs:
                for name, t in (r.get(field) or {}).items():
                    if t is not None:
                        timed.setdefault(name, []).append(float(t))
            row[field] = {name: statistics.median(ts) for name, ts in timed.items()}
        merged.append(row)
    return merged


def rows_from_bench(paths) -> list:
    """Table rows from `python -m tandem bench gemm` outputs (gemm_w1.json): per shape and kind (bf16, FP8
    tensor-wise, FP8 row-wise) with per-configuration times (variants_ms), the fastest configuration, on the SM
    count of that run's device."""
    rows = []
    for r in _merged_bench_rows(paths):
        kind = r["kind"]
        configs = _configs(kind)
        times = {v: t for v, t in (r.get("variants_ms") or {}).items() if t is not None and v in configs}
        if not times:
            continue
        sms = int(r.get("sm_count") or 132)
        # Where the output tiles fill a wave or more: split-K is not taken (its workspace grows with the whole
        # output: 1.9 GB at 16384 x 28672), and stream-K (whose partials are the grid's units, bounded by the
        # SMs) only if it beats every unsplit configuration by more than STREAM_K_TABLE_MARGIN, since its bits
        # differ from the unsplit ones' and a win within the bench's noise is not worth that. (Before
        # 2026-12-06 stream-K was dropped there too: on the H100 that left 4-16 % at 7 of 72 bench rows.)
        splits = SPLITS if kind == "bf16" else SCALED_SPLITS
        full_wave = {v for v in times if v in splits and
                     _tiles(configs[v][0], configs[v][1], 1, 1, int(r["m"]), int(r["n"])) >= sms}
        unsplit = [t for v, t in times.items() if v not in splits]
        for v in full_wave:
            if splits[v] != "stream" or not unsplit or times[v] * (1 + STREAM_K_TABLE_MARGIN) >= min(unsplit):
                del times[v]
        if not times:
            continue
        best = min(times, key=times.get)
        row = dict(kind=kind, sms=sms, m=int(r["m"]), n=int(r["n"]), k=int(r["k"]), variant=best, ms=times[best],
                   candidates=times)
        # other tile schedules of the configurations that could be chosen (schedules_ms, timed as the row's
        # variants_ms are); one is taken only where it beats the default schedule's best by more than
        # SCHEDULE_TABLE_MARGIN
        scheduled = {}
        for name, t in (r.get("schedules_ms") or {}).items():
            try:
                sch = Schedule.parse(name)
            except ValueError:
                continue
            if t is not None and sch.valid(kind) and sch.variant in times:
                scheduled[sch] = t
        if scheduled:
            sch = min(scheduled, key=scheduled.get)
            row["schedules"] = {x.name(): t for x, t in scheduled.items()}
            if scheduled[sch] * (1 + SCHEDULE_TABLE_MARGIN) < times[best]:
                row.update(variant=sch.variant, swizzle=sch.swizzle, raster=sch.raster, ms=scheduled[sch])
        rows.append(row)
    return rows
