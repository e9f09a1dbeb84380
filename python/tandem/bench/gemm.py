"""GEMM benchmark at world 1 (issue 23): torch.ops.tandem.gemm against cuBLAS (torch.matmul) in bf16, and
torch.ops.tandem.scaled_gemm against torch._scaled_mm in FP8 (e4m3, bf16 out) with tensor-wise and row-wise
scales, in the same process, at the shapes of real layers: M in {256, 1024, 4096, 16384} crossed with the (N, K)
of Llama-3-8B and -70B MLP layers (4096/14336 and 8192/28672, both orders), plus ragged shapes (sizes not
multiples of 128). CUDA events, warm-ups, median; three input sets rotate so that the L2 does not hold them;
tandem's and the baseline's four columns are timed interleaved in --rounds rounds (bench.common.time_columns_ms).

Writes gemm_w1.json: a list of rows with m, n, k, dtype (bfloat16 / float8_e4m3fn), scaling (none / tensor / row),
tandem_ms, baseline_ms (cuBLAS for bf16, _scaled_mm for FP8; one call between two events), tandem_ms_inner20
and baseline_ms_inner20 (20 calls back to back between the events, per call), baseline (its name), and the
accuracy of tandem's result against the baseline's (rel_err, and for FP8 the elements that differ at all). bf16 rows also time the
core's other CUTLASS configurations (variants_ms: tile, cluster, schedule; tandem._C.kernels.gemm_variant_names),
and FP8 rows each FP8 configuration's (tandem.ops.gemm_plan.SCALED_CONFIGS, through the op's path): the data the
per-shape choice is built from (`python -m tandem tune gemm --from-bench`; issue 23, part 1). Every row also times
the other tile schedules (gemm_plan.SWIZZLES x RASTERS: the persistent scheduler's walk) of its --schedules fastest
configurations, as those were timed (schedules_ms, keyed by gemm_plan.Schedule.name(), e.g.
"coop_128x256_c2/s4/along_m"); the row's `schedule` is what the op ran. The header's `op_path` says how the op
reached its kernels (tandem.ops._dispatcher.status(): C++ kernels of torch's dispatcher, or Python); where the C++
kernels ran, tandem_ms_python_op is the same single call through the op's Python implementation, same run."""

from __future__ import annotations

SIZES_M = (256, 1024, 4096, 16384)
LAYERS_NK = ((4096, 14336), (14336, 4096), (8192, 28672), (28672, 8192))
RAGGED = ((3000, 5000, 4000), (1000, 1000, 1008), (777, 4104, 4096), (5000, 3000, 8208), (100, 8192, 8192),
          (12345, 4096, 4096), (4096, 1000, 2064), (2500, 14336, 4096))
SHAPES = [(m, n, k) for m in SIZES_M for (n, k) in LAYERS_NK] + list(RAGGED)  # M, N, K: 24


def _fp8_inputs(m, n, k, scaling):
    """e4m3 a (M x K row-major), b (K x N column-major) and float32 scales of the given kind."""
    import torch

    a = (torch.randn(m, k, device="cuda") * 2).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, device="cuda") * 2).to(torch.float8_e4m3fn).t()  # column-major K x N
    if scaling == "tensor":
        sa = torch.rand((), device="cuda") + 0.5
        sb = torch.rand((), device="cuda") + 0.5
    else:
        sa = torch.rand(m, 1, device="cuda") + 0.5
        sb = torch.rand(1, n, device="cuda") + 0.5
    return a, b, sa, sb


def _variants_ms(sets, pick, reps):
    """ms of each of the core's CUTLASS configurations on the whole GPU (None where one cannot run the shape)."""
    import torch

    from .._native import native
    from ..errors import TandemError
    from ..ops._runtime import stream_handle
    from ..ops.gemm import gemm_args, variant_workspace
    from . import common

    K = native().kernels
    a, b = sets[0]
    d = torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=torch.bfloat16)
    out = {}
    for name in K.gemm_variant_names():
        args = [gemm_args(x, y, d) for x, y in sets]  # the Args made once, outside the timed calls
        ws = variant_workspace(name, args[0], a.device)  # the split-K / stream-K ones need one (same shapes: one)
        wp = 0 if ws is None else ws.data_ptr()
        i = [0]

        def call(name=name, args=args, wp=wp):
            i[0] = (i[0] + 1) % len(args)
            K.gemm_variant(name, args[i[0]], stream_handle(a.device), wp)  # TandemError if it cannot run the shape

        try:
            out[name] = common.time_launches(call, warmup=3, reps=reps) * 1e3
        except TandemError:
            out[name] = None
    return out


def _schedules_ms(sets, names, reps):
    """ms of configurations `names` with every other tile schedule (gemm_plan.SWIZZLES x RASTERS but the default
    one, which variants_ms timed), keyed by gemm_plan.Schedule.name(); None where one cannot run the shape."""
    import torch

    from .._native import native
    from ..errors import TandemError
    from ..ops import gemm_plan
    from ..ops._runtime import stream_handle
    from ..ops.gemm import gemm_args, variant_workspace
    from . import common

    K = native().kernels
    a, b = sets[0]
    d = torch.empty(a.shape[0], b.shape[1], device="cuda", dtype=torch.bfloat16)
    out = {}
    for name in names:
        for sch in gemm_plan.Schedule(name).others():
            args = [gemm_args(x, y, d, 0, sch.swizzle, sch.raster) for x, y in sets]
            ws = variant_workspace(name, args[0], a.device)
            wp = 0 if ws is None else ws.data_ptr()
            i = [0]

            def call(name=name, args=args, wp=wp):
                i[0] = (i[0] + 1) % len(args)
                K.gemm_variant(name, args[i[0]], stream_handle(a.device), wp)

            try:
                out[sch.name()] = common.time_launches(call, warmup=3, reps=reps) * 1e3
            except TandemError:
                out[sch.name()] = None
    return out


def _scaled_variants_ms(sets, reps):
    """ms of each FP8 configuration (gemm_plan.SCALED_CONFIGS) through the op's own path (scaled_gemm_with with
    the configuration named), 20 calls back to back per timing; None where one cannot run the shape."""
    from ..ops import gemm_plan
    from ..ops.gemm import scaled_gemm_with
    from . import common

    out = {}
    for name in gemm_plan.SCALED_CONFIGS:
        i = [0]

        def call(name=name):
            i[0] = (i[0] + 1) % len(sets)
            # the default schedule named: with config alone a table's schedule for the plan's configuration
            # would be timed under the default's name
            scaled_gemm_with(*sets[i[0]], config=name, swizzle=1, raster="heuristic")

        try:
            # 20 calls between the events: the op's host path (cache lookup, workspace) would otherwise rank the
            # configurations of the smallest shapes, whose kernels take tens of microseconds
            out[name] = common.time_launches(call, warmup=3, reps=reps, inner=20) * 1e3
        except Exception:  # noqa: BLE001 - a configuration that refuses the shape is reported as None
            out[name] = None
    return out


def _scaled_schedules_ms(sets, names, reps):
    """ms of FP8 configurations `names` with every other tile schedule (as _schedules_ms), through the op's path
    and 20 calls back to back per timing (as _scaled_variants_ms)."""
    from ..ops import gemm_plan
    from ..ops.gemm import scaled_gemm_with
    from . import common

    out = {}
    for name in names:
        for sch in gemm_plan.Schedule(name).others():
            i = [0]

            def call(sch=sch):
                i[0] = (i[0] + 1) % len(sets)
                scaled_gemm_with(*sets[i[0]], config=sch.variant, swizzle=sch.swizzle, raster=sch.raster)

            try:
                out[sch.name()] = common.time_launches(call, warmup=3, reps=reps, inner=20) * 1e3
            except Exception:  # noqa: BLE001 - a schedule that cannot run the shape is reported as None
                out[sch.name()] = None
    return out


COLUMNS = ["M x N x K", "dtype", "scaling", "tandem ms", "baseline ms", "baseline", "baseline/tandem",
           "tandem TFLOP/s", "rel. error vs baseline", "elements differing"]


def run(shapes, reps, out_dir, command, dtypes=("bfloat16", "fp8_tensor", "fp8_row"), variants=True,
        schedules=2, rounds=3):
    import torch

    from .. import ops  # noqa: F401
    from . import common

    from ..ops import _dispatcher

    rows, data = [], []
    meta = common.header(command)
    # how the op reached its kernels: C++ kernels of torch's dispatcher, or the Python implementation (and why)
    meta["op_path"] = _dispatcher.status()
    print(f"op path: {meta['op_path']}", flush=True)
    for m, n_shape, k in shapes:
        for kind in dtypes:
            n = n_shape
            if kind == "bfloat16":
                sets = [(torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                         torch.randn(k, n, device="cuda", dtype=torch.bfloat16)) for _ in range(3)]
                ours = lambda s: torch.ops.tandem.gemm(*s)  # noqa: E731
                base = lambda s: torch.matmul(*s)  # noqa: E731
                base_name, scaling, dtype = "cuBLAS", "none", "bfloat16"
            else:
                scaling = kind.split("_")[1]
                n = n_shape + (-n_shape) % 16  # torch._scaled_mm wants N a multiple of 16: the next one up
                sets = [_fp8_inputs(m, n, k, scaling) for _ in range(3)]
                ours = lambda s: torch.ops.tandem.scaled_gemm(*s)  # noqa: E731
                base = lambda s: torch._scaled_mm(s[0], s[1], s[2], s[3], out_dtype=torch.bfloat16)  # noqa: E731
                base_name, dtype = "torch._scaled_mm", "float8_e4m3fn"
            i = [0]

            def pick():
                i[0] = (i[0] + 1) % len(sets)
                return sets[i[0]]

            d = dict(m=m, n=n, k=k, dtype=dtype, scaling=scaling, baseline=base_name,
                     sm_count=torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count)
            from ..ops import gemm_plan

            if kind == "bfloat16":
                plan = gemm_plan.choose_schedule(m, n, k, d["sm_count"])  # what torch.ops.tandem.gemm ran
                d["variant"], d["schedule"] = plan.variant, plan.name()
            else:
                plan = gemm_plan.choose_scaled_schedule(m, n, k, d["sm_count"], scaling)  # what scaled_gemm ran
                d["variant"], d["schedule"] = plan.variant, plan.name()
            try:
                # the four columns interleaved in rounds (common.time_columns_ms; drift between columns timed in
                # blocks decided single rows of the lowest-shape targets); the *_inner20 ones are the same calls 20
                # back to back between the events: the host's time a call before its launch no longer shows unless
                # it exceeds the GPU's (the op ran 8-21 % slower than its configuration called directly on
                # 2026-12-05: host path, or device?)
                errors = []
                ms, spread = common.time_columns_ms(
                    common.SINGLE, {"tandem_ms": lambda: ours(pick()), "baseline_ms": lambda: base(pick()),
                                    "tandem_ms_inner20": lambda: ours(pick()),
                                    "baseline_ms_inner20": lambda: base(pick())},
                    warmup=5, reps=reps, rounds=rounds, inner={"tandem_ms_inner20": 20, "baseline_ms_inner20": 20},
                    log=errors.append)
                if errors:
                    raise RuntimeError(errors[0].strip())
                d.update(ms)
                d["spread"] = spread
                d["rounds"] = rounds
                if _dispatcher.enabled():  # the same op through its Python implementation, in the same run
                    with _dispatcher.switched_off():
                        d["tandem_ms_python_op"] = common.time_launches(lambda: ours(pick()), warmup=5,
                                                                        reps=reps) * 1e3
                got, ref = ours(sets[0]).float(), base(sets[0]).float()
                d["rel_err"] = float((got - ref).norm() / ref.norm().clamp_min(1e-30))
                d["differ"] = int((got != ref).sum())
                if kind == "bfloat16" and variants:
                    d["variants_ms"] = _variants_ms(sets, pick, reps)
                    # the other tile schedules of the `schedules` fastest configurations
                    timed = sorted((t, v) for v, t in d["variants_ms"].items() if t is not None)
                    if schedules and timed:
                        d["schedules_ms"] = _schedules_ms(sets, [v for _, v in timed[:schedules]], reps)
                elif variants:
                    d["variants_ms"] = _scaled_variants_ms(sets, reps)
                    timed = sorted((t, v) for v, t in d["variants_ms"].items() if t is not None)
                    if schedules and timed:
                        d["schedules_ms"] = _scaled_schedules_ms(sets, [v for _, v in timed[:schedules]], reps)
            except Exception as e:  # noqa: BLE001 - a row that cannot run says why; the sweep goes on
                d["error"] = str(e).splitlines()[0][:200]
            data.append(d)
            ratio = d["baseline_ms"] / d["tandem_ms"] if "tandem_ms" in d and "baseline_ms" in d else None
            flop = 2.0 * m * n * k
            rows.append([f"{m}x{n}x{k}", dtype, scaling,
                         f"{d['tandem_ms']:.3f}" if "tandem_ms" in d else "-",
                         f"{d['baseline_ms']:.3f}" if "baseline_ms" in d else "-", base_name,
                         f"{ratio:.3f}" if ratio else "-",
                         f"{flop / d['tandem_ms'] / 1e9:.0f}" if "tandem_ms" in d else "-",
                         f"{d['rel_err']:.1e}" if "rel_err" in d else d.get("error", "-"),
                         str(d.get("differ", "-"))])
            sets = []  # free this case's inputs before the next
            # the rows so far, after every case (as bench tp): a sweep stopped by its time limit keeps what it
            # measured
            part_meta = dict(meta, partial=f"{len(data)} of {len(shapes) * len(dtypes)} cases")
            common.write_outputs(out_dir, "gemm_w1", part_meta, common.markdown_table(COLUMNS, rows), data)
    table = common.markdown_table(COLUMNS, rows)
    print(f"# tandem GEMM vs cuBLAS / torch._scaled_mm — {meta['device']}, commit {meta['commit']}, {meta['date']}")
    print(table)
    for line in summary_lines(data):
        print(line)
    common.write_outputs(out_dir, "gemm_w1", meta, table, data)
    if out_dir:
        plot([dict(d, run=meta) for d in data], out_dir)
    return data


def configuration_baseline_key(dtype: str) -> str:
    """The baseline column timed as a row's configurations are: bf16/fp16 configurations are single calls
    (baseline_ms), the FP8 ones 20 calls back to back (baseline_ms_inner20; _scaled_variants_ms)."""
    return "baseline_ms" if dtype in ("bfloat16", "float16") else "baseline_ms_inner20"


def best_ratio(d, with_schedules: bool = False):
    """A row's baseline time over its fastest configuration's (configuration_baseline_key's baseline), with the
    timed tile schedules too if asked (schedules_ms); None where the row has neither times nor that baseline."""
    times = [t for t in (d.get("variants_ms") or {}).values() if t]
    if with_schedules:
        times += [t for t in (d.get("schedules_ms") or {}).values() if t]
    base = d.get(configuration_baseline_key(d["dtype"]))
    return base / min(times) if times and base else None


def summary_lines(data) -> list:
    """Per dtype / scaling: the op's geometric mean of baseline/tandem (both one call between two events), and
    where the rows carry per-configuration times, the best configuration per shape against the baseline timed
    the same way as the configurations: bf16 configurations are single calls (baseline_ms), the FP8 ones 20 calls
    back to back (baseline_ms_inner20; _scaled_variants_ms). Comparing 20-call configuration times with a
    single-call baseline flattered the configurations by the baseline's host time (docs/results.md, 2026-12-06)."""
    import math

    def geo(r):
        return math.exp(sum(map(math.log, r)) / len(r))

    lines = []
    for kind in sorted({d["dtype"] + "/" + d["scaling"] for d in data}):
        rows = [d for d in data if d["dtype"] + "/" + d["scaling"] == kind]
        r = [d["baseline_ms"] / d["tandem_ms"] for d in rows if "tandem_ms" in d and "baseline_ms" in d]
        if r:
            lines.append(f"{kind}: geometric mean baseline/tandem {geo(r):.3f} over {len(r)} shapes, lowest "
                         f"{min(r):.3f}")
        base_key = configuration_baseline_key(rows[0]["dtype"])
        best = [x for x in map(best_ratio, rows) if x is not None]
        best_scheduled = [x for x in (best_ratio(d, True) for d in rows) if x is not None]
        if best:
            lines.append(f"{kind}: best configuration per shape, baseline/configuration ({base_key}) "
                         f"{geo(best):.3f} over {len(best)} shapes, lowest {min(best):.3f}")
        if best_scheduled and any(d.get("schedules_ms") for d in rows):
            lines.append(f"{kind}: best configuration and tile schedule per shape ({base_key}) "
                         f"{geo(best_scheduled):.3f} over {len(best_scheduled)} shapes, lowest "
                         f"{min(best_scheduled):.3f}")
    return lines


def plot(data, out_dir) -> list:
    """gemm_w1_<dtype>_<scaling>.png in out_dir per kind of row: per shape, baseline time over tandem's (above 1:
    tandem faster) for the op, the best configuration and, where timed, the best configuration with its best tile
    schedule (each against the baseline timed as it was: summary_lines' rule), with issue 23's lines. Returns the
    paths (none without matplotlib)."""
    import os

    from . import common

    paths = []
    os.makedirs(out_dir, exist_ok=True)
    for kind in sorted({d["dtype"] + "_" + d["scaling"] for d in data}):
        rows = [d for d in data if d["dtype"] + "_" + d["scaling"] == kind and "tandem_ms" in d and "baseline_ms" in d]
        if not rows:
            continue
        series = [("op", [d["baseline_ms"] / d["tandem_ms"] for d in rows]),
                  ("best configuration", [best_ratio(d) for d in rows])]
        if any(d.get("schedules_ms") for d in rows):
            series.append(("best configuration and tile schedule", [best_ratio(d, True) for d in rows]))
        floor = 0.92 if rows[0]["dtype"] in ("bfloat16", "float16") else 0.90
        path = os.path.join(out_dir, f"gemm_w1_{kind}.png")
        run = rows[0].get("run") or {}
        common.grouped_bars(path, [f"{d['m']}x{d['n']}x{d['k']}" for d in rows], series,
                            f"{rows[0]['baseline']} time / tandem time", f"tandem GEMM, {kind.replace('_', ' ')}, "
                            f"{run.get('device', '')} {run.get('commit', '')[:7]}",
                            hlines=[(1.0, "parity"), (floor, f"issue 23's floor {floor}")])
        if os.path.exists(path):
            paths.append(path)
    return paths


def main(argv=None) -> int:
    from . import common

    ap = common.parser("gemm", __doc__, reps=20, ranks=False)
    ap.add_argument("--shapes", default=None, help="MxNxK,MxNxK,... (default: the 24 of issue 23)")
    ap.add_argument("--dtypes", default="bfloat16,fp8_tensor,fp8_row",
                    help="which of bfloat16, fp8_tensor, fp8_row to run")
    ap.add_argument("--no-variants", action="store_true", help="skip timing the core's other configurations")
    ap.add_argument("--schedules", type=int, default=2, metavar="N",
                    help="time every other tile schedule (swizzle x raster) of the N fastest configurations of each "
                         "row (0: none)")
    ap.add_argument("--plot-from", default=None, metavar="GEMM_JSON",
                    help="no run: plot a recorded gemm_w1.json (into --out, else beside it) and print its summary")
    ap.add_argument("--rounds", type=int, default=3,
                    help="tandem's and the baseline's columns timed interleaved in this many rounds (1: each in one "
                         "block, as before 2026-12-07 19:30); the JSON's spread is each column's max / min round "
                         "median")
    a = ap.parse_args(argv)
    if a.plot_from:
        import json
        import os

        with open(a.plot_from) as f:
            data = json.load(f)
        for line in summary_lines(data):
            print(line)
        plot(data, a.out or os.path.dirname(os.path.abspath(a.plot_from)))
        return 0
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")] if a.shapes else SHAPES
    run(shapes, a.reps, a.out, common.command_line("gemm", argv), dtypes=tuple(a.dtypes.split(",")),
        variants=not a.no_variants, schedules=a.schedules, rounds=a.rounds)
    return 0
