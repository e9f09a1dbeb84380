"""The SM plan of the TP ops: which mode (fused / unfused) and how many comm SMs (comm_blocks), per shape.

mode="auto" asks `choose()`. It looks the problem up in a tuned table first, keyed by (op, world, SMs a rank,
M/N/K buckets: the nearest power of two); `python -m tandem tune` measures every candidate on the machine it
runs on and writes that table; an entry at a nearby SM count, else of a nearby shape (each bucket within 2),
stands in for a missing one (lookup). Without any, it falls back to a cost model of the modes:

    fused(c)  = max(GEMM on S - c SMs, collective bytes / (c x role rate a SM)) + one chunk's fill and drain
    unfused   = GEMM on S SMs + collective bytes / min(S x role rate a SM, memory rate / ranks on the GPU)
    pipelined = GEMM on S SMs in W pieces + a sync step per piece + what the copy engines cannot hide (RS: one
                piece's push per ring step; AR: that plus the owners' rows copied at the end); one node only

with the GEMM at a measured rate per SM and the role rates of `python -m tandem bench roles` (defaults below,
measured on the H200; a table entry always wins over the model).

Tables: TANDEM_TP_TUNE_FILE, else ~/.cache/tandem/tp_tune.json, else the one shipped beside this file
(tp_tune_h100.json on an H100, else tp_tune_h200.json: _tune_table.device_table), each a JSON list of rows {op, world, sms, mb, nb, kb, mode, comm_blocks, ms}.
Modes: "fused" (comm_blocks: the reduce/copy role's SMs), "unfused", "pipelined" (one node), and for GEMM+RS/AR
"ticket" (the fused kernel by tickets, one node; comm_blocks holds its rounds, TANDEM_RS_TICKET_ROUNDS's meaning).
"""

from __future__ import annotations

import os

from . import _tune_table

# Rates of the cost model (per SM of a rank; the H200 under MPS, docs/results.md). Overridable for other parts.
GEMM_TFLOPS_PER_SM = 5.9          # bf16 dense, CUTLASS core at ~780 TFLOP/s on 132 SMs
ROLE_GBS_PER_SM = {"ag_gemm": 40.0, "gemm_rs": 40.0, "gemm_ar": 40.0}
MEMORY_GBS = 4300.0               # device-to-device copy, bytes read + written
FILL_FRACTION = 0.5               # of one chunk's collective time that fused cannot hide (first/last chunk)
SYNC_STEP_US = 15.0               # a stream-ordered flag wait/signal pair between two GEMM pieces (pipelined)
PIECE_EFFICIENCY = 0.97           # a GEMM cut into W row pieces runs at this fraction of the whole one's rate
PIPELINE_SPLITS = int(os.environ.get("TANDEM_PIPELINE_SPLITS", "2"))  # as tandem.ops.tp_pipelined.SPLITS
# The model's pipelined term is a guess until the mode is measured (`tandem tune` then puts it in the table, which
# auto follows); TANDEM_TP_MODEL_PIPELINED=1 lets the model pick it without a table entry.
PIPELINED_IN_MODEL = os.environ.get("TANDEM_TP_MODEL_PIPELINED", "0") == "1"

SHIPPED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tp_tune_h200.json")


bucket = _tune_table.bucket


def table_path() -> str:
    env = os.environ.get("TANDEM_TP_TUNE_FILE")
    if env:
        return env
    return os.path.join(os.path.expanduser("~"), ".cache", "tandem", "tp_tune.json")


_TABLES: dict = {}
# A table file is stat'ed at most this often (the lookup runs on the first call of each call signature: the ops
# keep what it chose, tandem.ops._runtime.prepared). A table that `tandem tune` rewrites is picked up within this
# time, by signatures first called after it.
RECHECK_S = 1.0


def _rows_to_table(rows) -> dict:
    return {(r["op"], int(r["world"]), int(r["sms"]), int(r["mb"]), int(r["nb"]), int(r["kb"])):
            (str(r["mode"]), int(r["comm_blocks"])) for r in rows}


def _load(path: str) -> dict:
    return _tune_table.load(path, _TABLES, RECHECK_S, _rows_to_table)


def key(op: str, world: int, sms: int, m: int, n: int, k: int) -> tuple:
    return (op, int(world), int(sms), bucket(m), bucket(n), bucket(k))


# A table entry measured at another SM count stands in for a missing one when the counts are within this factor
# of each other (the closest count wins). Why: the tables are measured at the launcher's shares (32 SMs a rank at 4
# ranks a GPU, 66 at 2, 132 alone), while a caller's sm_count or another share (TANDEM_SM_PERCENT) asks for counts
# no sweep timed; the cost model is then the only other answer (2026-12-06, H100, world 4 at 26 SMs a rank, AG+GEMM
# 16384x8192x4096: the model picked unfused, 7.86 ms, where the 32-SM entry's pipelined ran 7.56). Beyond a third
# more or less SMs the choice between modes shifts (the split's cost grows as SMs shrink) and the model decides.
NEAR_SMS_FACTOR = 4 / 3


def _nearest(table: dict, k: tuple, shape_buckets: int):
    """The entry of `table` with k's op and world, an SM count within NEAR_SMS_FACTOR of k's and every M/N/K bucket
    within `shape_buckets` of k's: the closest (bucket distance, then SM count; ties: the larger count, then key
    order); a fused entry's comm_blocks kept within the model's range at k's count. Else None."""
    op, world, sms = k[0], k[1], k[2]
    best = None
    for other, value in table.items():
        if other[:2] != (op, world) or other[2] <= 0:
            continue
        if max(other[2], sms) / max(1, min(other[2], sms)) > NEAR_SMS_FACTOR:
            continue
        gaps = [abs(a - b) for a, b in zip(other[3:], k[3:])]
        if max(gaps) > shape_buckets:
            continue
        rank = (sum(gaps), abs(other[2] - sms), -other[2], other)
        if best is None or rank < best[0]:
            best = (rank, value)
    if best is None:
        return None
    mode, blocks = best[1]
    if mode == "fused" and blocks > 0:
        blocks = max(2, min(blocks, max(2, sms // 4)) & ~1)
    return mode, blocks


# A table entry of a nearby shape stands in for a missing one when each of its M/N/K buckets is within this many
# of the problem's (2: a factor of 4 either way), the closest (fewest buckets apart in all) first, before the cost
# model. Why: the model misjudges the pipelined mode and small-M AG+GEMM at world 2. Leave-one-out over bench tp's
# rows of 2026-12-06 (H100, docs/results/tp_w2.json / tp_w4.json, each row's own entry removed from the shipped
# table), the chosen mode's time over the fastest mode's: the model 1.086 geometric mean at world 2 (10 of 21 rows
# more than 5 % off, up to 1.46x), the nearest entry 1.014 (1 row, 1.34x); world 4 1.014 either way.
NEAR_SHAPE_BUCKETS = 2


def lookup(op: str, world: int, sms: int, m: int, n: int, k: int):
    """(mode, comm_blocks) from the user's table, else the shipped one, else None. Exact keys first (in both tables),
    then an entry at a nearby SM count (NEAR_SMS_FACTOR), then one of a nearby shape (NEAR_SHAPE_BUCKETS); the
    user's table first at each stage."""
    paths = (table_path(), _tune_table.device_table(SHIPPED))
    want = key(op, world, sms, m, n, k)
    hit = _tune_table.lookup(paths, want, _load)
    if hit is not None:
        return hit
    for shape_buckets in (0, NEAR_SHAPE_BUCKETS):  # the same buckets at a nearby SM count, then a nearby shape
        for path in paths:
            hit = _nearest(_load(path), want, shape_buckets)
            if hit is not None:
                return hit
    return None


def collective_bytes(op: str, world: int, m: int, n: int, k: int) -> float:
    """Bytes one rank's collective moves through memory (read + written once). AG: m is the layer's M (A_local is
    M/W x K); RS/AR: the partial is M x N, this rank reduces M/W rows."""
    if op == "ag_gemm":
        return 2.0 * m * k * 2  # every chunk of A written once here, read once by its sender
    chunk = m // world * n * 2
    rs = chunk * (world + 1)
    return rs if op == "gemm_rs" else rs + 2.0 * chunk * (world - 1)


def gemm_flops(op: str, world: int, m: int, n: int, k: int) -> float:
    """The rank's GEMM: M x N x K with M the layer's rows (AG: the gathered A) and K the rank's (RS/AR: K/W)."""
    return 2.0 * m * n * k


def _terms(op: str, world: int, m: int, n: int, k: int, ranks_on_gpu: int | None = None):
    """The model's quantities for one problem: (t_gemm(s): the GEMM's seconds on s SMs, the collective's bytes,
    a comm SM's role rate and a rank's share of the memory rate, both in bytes/s)."""
    flops = gemm_flops(op, world, m, n, k)

    def t_gemm(s):
        return flops / (s * GEMM_TFLOPS_PER_SM * 1e12)

    return (t_gemm, collective_bytes(op, world, m, n, k), ROLE_GBS_PER_SM[op] * 1e9,
            MEMORY_GBS * 1e9 / (ranks_on_gpu or world))


def model(op: str, world: int, sms: int, m: int, n: int, k: int, ranks_on_gpu: int | None = None, nodes: int = 1,
          pipelined: bool = True):
    """(mode, comm_blocks, predicted ms) of the cost model; comm_blocks 0 for unfused and pipelined (which is a
    candidate on one node only)."""
    t_gemm, nbytes, role, mem = _terms(op, world, m, n, k, ranks_on_gpu)
    best = ("unfused", 0, t_gemm(sms) + nbytes / min(sms * role, mem))
    if world > 1 and nodes == 1 and pipelined and PIPELINED_IN_MODEL:
        piece = m // world * n * 2 / PIPELINE_SPLITS  # bytes of one ring piece (RS/AR)
        if op == "ag_gemm":  # the pushes share the memory with the GEMMs: their bytes count at the memory rate
            t = t_gemm(sms) / PIECE_EFFICIENCY + (world - 1) * SYNC_STEP_US * 1e-6 + nbytes / mem / world
        else:
            steps = (world - 1) * PIPELINE_SPLITS
            t = t_gemm(sms) / PIECE_EFFICIENCY + steps * SYNC_STEP_US * 1e-6 + (world - 1) * 2 * piece / mem
            if op == "gemm_ar":
                t += (world - 1) * 2 * PIPELINE_SPLITS * piece / mem
        if t < best[2]:
            best = ("pipelined", 0, t)
    if world > 1:
        c, t = _best_fused(t_gemm, nbytes, role, mem, sms, world)
        if t < best[2]:
            best = ("fused", c, t)
    return best[0], best[1], best[2] * 1e3


def _best_fused(t_gemm, nbytes, role, mem, sms, world):
    """(comm_blocks, predicted s) of the fused kernel's best split, comm_blocks even in [2, max(2, sms / 4)] (beyond
    a quarter of the SMs the sweeps of 2026-12-03/04 collapsed: comm blocks that spin while the GEMM blocks they
    wait for have no SM under MPS)."""
    times = []
    c = 2
    while c <= max(2, sms // 4) and c <= sms - 2:
        t_coll = nbytes / min(c * role, mem)
        times.append((c, max(t_gemm(sms - c), t_coll) + FILL_FRACTION * t_coll / world))
        c += 2
    fastest = min(t for _, t in times)
    # the fewest comm blocks within 2 % (or 5 us, below which a launch's fixed costs rule) of the fastest: SMs the
    # model cannot tell apart stay with the GEMM
    return next((c, t) for c, t in times if t <= fastest * 1.02 + 5e-6)


def fused_grid_sms(op: str, sms: int, ranks_on_device: int) -> int:
    """The fused kernel's grid (SMs) when the caller leaves sm_count 0: the rank's share, except GEMM+RS/AR on a
    GPU shared by 4 or more ranks (MPS), where 7/8 of it (even).

    Why: the fused kernels run on 2-CTA clusters, and MPS does not place every rank's clusters at once. At world
    4 (32 SMs a rank of 132) one rank's 7 of 16 clusters started 1-3 ms late in every traced launch; on 28 SMs
    every cluster of every rank was resident, and GEMM+RS/AR, whose owners wait for every rank's pieces, ran
    5-15 % faster (tools/diag/tp_trace.py --sm-counts, H100, 2026-12-05; docs/results.md). AG+GEMM (a late
    rank delays only itself) was faster on the whole share, and at world 2 (66 SMs a rank) no grid down to 56
    made both ranks resident nor changed the time beyond noise. TANDEM_TP_FUSED_SMS=<n> sets the grid (0: the
    share)."""
    env = os.environ.get("TANDEM_TP_FUSED_SMS")
    if env is not None and env.strip() != "":
        want = int(env)
        return min(want, sms) if want > 0 else sms
    if op in ("gemm_rs", "gemm_ar") and ranks_on_device >= 4 and sms >= 16:
        return (sms * 7 // 8) & ~1
    return sms


def fused_split(op: str, world: int, sms: int, m: int, n: int, k: int) -> int:
    """comm_blocks for mode="fused" when the caller leaves it 0: the tuned table's split if its entry for this shape
    is a fused one, else the cost model's best split. (Before 2026-12-04 it was a sixteenth of the rank's SMs
    whatever the shape: GEMM+RS at world 4, 16384x8192x4096, took 12.0 ms there against 6.2 at 8 blocks.)"""
    hit = lookup(op, world, sms, m, n, k)
    if hit is not None and hit[0] == "fused" and hit[1] > 0:
        return int(hit[1])
    c, _ = _best_fused(*_terms(op, world, m, n, k), sms, world)
    return c


def choose(op: str, world: int, sms: int, m: int, n: int, k: int, nodes: int = 1, pipelined: bool = True):
    """(mode, comm_blocks) for mode="auto": the tuned table's entry, else the cost model's choice. "pipelined" is
    never chosen across nodes (nodes > 1) or when the caller rules it out (pipelined=False: it restricted the
    SMs), "ticket" (GEMM+RS/AR by tickets; its number is the kernel's rounds) never across nodes nor for AG: an entry
    naming them is then skipped for the model, which never picks "ticket" itself (it has no term for it)."""
    if world == 1:
        return "unfused", 0
    ok = pipelined and nodes == 1
    hit = lookup(op, world, sms, m, n, k)
    # "ticket" (the fused GEMM+RS/AR by tickets, comm_blocks = its rounds) runs on one node only
    if hit is not None and (ok or hit[0] != "pipelined") and ((nodes == 1 and op != "ag_gemm") or hit[0] != "ticket"):
        return hit
    mode, c, _ = model(op, world, sms, m, n, k, nodes=nodes, pipelined=ok)
    return mode, c


def write_table(rows: list, path: str | None = None) -> str:
    """Merge rows {op, world, sms, m, n, k, mode, comm_blocks, ms} into the table at `path` (default
    table_path()); returns the path."""
    return _tune_table.write(path or table_path(), rows, ("op", "world", "sms", "mb", "nb", "kb"), _TABLES)
