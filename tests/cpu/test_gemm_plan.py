"""The GEMM's per-shape choice of CUTLASS configuration (tandem.ops.gemm_plan, issue 23 part 1): the wave model,
the measured table and `tandem tune gemm --from-bench`. No GPU: the choice is host code."""

import json

import pytest

from tandem.ops import gemm_plan


@pytest.fixture(autouse=True)
def no_tables(tmp_path, monkeypatch):
    monkeypatch.setattr(gemm_plan, "SHIPPED", str(tmp_path / "none.json"))
    monkeypatch.setenv("TANDEM_GEMM_TUNE_FILE", str(tmp_path / "user.json"))
    monkeypatch.setattr(gemm_plan, "RECHECK_S", 0.0)
    gemm_plan._TABLES.clear()


def test_the_wave_model_counts_waves_and_padding():
    # 4096 x 4096 on 132 SMs: 32 x 16 = 512 tiles of 128x256 -> 4 waves; 128x128: 1024 tiles -> 8 waves
    assert gemm_plan.predicted("coop_128x256_c2", 4096, 4096, 1024, 132) == 4 * 128 * 256 * 1024 / 1.0
    assert gemm_plan.predicted("pingpong_128x128_c1", 4096, 4096, 1024, 132) == pytest.approx(
        8 * 128 * 128 * 1024 / gemm_plan.CONFIGS["pingpong_128x128_c1"][3])
    # 2x1 clusters pad M tiles to pairs: 3 M tiles count as 4
    assert gemm_plan.predicted("coop_128x256_c2", 384, 256, 64, 132) == 1 * 128 * 256 * 64
    one = gemm_plan.predicted("coop_128x256_c2", 128 * 2 * 66, 256, 64, 132)  # exactly one wave of 132 tiles
    assert gemm_plan.predicted("coop_128x256_c2", 128 * 2 * 66 + 128, 256, 64, 132) == 2 * one


def test_the_model_stays_on_the_core_unless_another_is_clearly_faster(monkeypatch):
    assert gemm_plan.choose(4096, 4096, 4096, 132) == gemm_plan.CORE
    assert gemm_plan.choose(3000, 5000, 4000, 132, dtype_is_bf16=False) == gemm_plan.CORE
    # a configuration the model rates far better is taken; within the margin it is not
    monkeypatch.setitem(gemm_plan.CONFIGS, "pingpong_128x128_c1", (128, 128, 1, 5.0))
    assert gemm_plan.choose(4096, 4096, 4096, 132) == "pingpong_128x128_c1"
    monkeypatch.setitem(gemm_plan.CONFIGS, "pingpong_128x128_c1", (128, 128, 1, 0.5 * 1.05))
    assert gemm_plan.choose(4096, 4096, 4096, 132) == gemm_plan.CORE


def test_the_model_splits_k_only_where_the_output_tiles_do_not_fill_the_gpu():
    # 256 x 4096: 2 x 32 = 64 tiles of 128x128 for 132 SMs; split in 2 along K: 128 units in one wave, each half of
    # K=14336, at the configuration's rate and the split's extra cost
    rate = gemm_plan.CONFIGS["splitk2_128x128_c1"][3]
    assert gemm_plan.predicted("splitk2_128x128_c1", 256, 4096, 14336, 132) == pytest.approx(
        128 * 128 * 7168 / rate * (1 + gemm_plan.SPLIT_COST))
    # tiny problems: CUTLASS does not split a K of a few k-tiles, and the model must not expect it to
    for shape in ((128, 128, 128), (512, 256, 256), (64, 1024, 768)):
        assert gemm_plan.choose(*shape, 132) not in gemm_plan.SPLITS, shape
    assert gemm_plan.choose(256, 4096, 14336, 132) in gemm_plan.SPLITS
    assert gemm_plan.choose(100, 8192, 8192, 132) in gemm_plan.SPLITS
    # enough tiles for every SM: no split
    for shape in ((4096, 4096, 4096), (16384, 28672, 8192), (1024, 28672, 8192)):
        assert gemm_plan.choose(*shape, 132) not in gemm_plan.SPLITS, shape
    assert set(gemm_plan.SPLITS) <= set(gemm_plan.CONFIGS)


def test_the_measured_table_wins_and_is_keyed_by_buckets(tmp_path):
    path = gemm_plan.write_table([dict(sms=132, m=3000, n=5000, k=4000, variant="coop_256x128_c1", ms=1.0)])
    assert json.loads(open(path).read())[0]["mb"] == gemm_plan.bucket(3000)
    assert gemm_plan.choose(3000, 5000, 4000, 132) == "coop_256x128_c1"
    assert gemm_plan.choose(2900, 5100, 4100, 132) == "coop_256x128_c1"  # same buckets
    assert gemm_plan.choose(3000, 5000, 4000, 32) == gemm_plan.CORE  # another SM count: the model's
    assert gemm_plan.choose(3000, 5000, 4000, 132, dtype_is_bf16=False) == gemm_plan.CORE  # fp16: the core


def test_tune_gemm_from_bench_takes_each_shapes_fastest_configuration(tmp_path, capsys):
    from tandem import tune

    bench = tmp_path / "gemm_w1.json"
    rows = [dict(m=3000, n=5000, k=4000, dtype="bfloat16", scaling="none", sm_count=132, tandem_ms=2.0,
                 variants_ms={"coop_128x256_c2": 2.0, "coop_256x128_c1": 1.5, "pingpong_128x128_c1": None}),
            dict(m=3000, n=5000, k=4000, dtype="float8_e4m3fn", scaling="row", sm_count=132, tandem_ms=1.0),
            dict(m=256, n=4096, k=14336, dtype="bfloat16", scaling="none", sm_count=132, tandem_ms=0.3,
                 variants_ms={"coop_128x256_c2": 0.3, "coop_128x256_c1": 0.31, "made_up": 0.01})]
    bench.write_text(json.dumps(rows))
    out = tmp_path / "table.json"
    assert tune.main(["gemm", "--from-bench", str(bench), "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    assert sorted((r["m"], r["variant"]) for r in table) == [(256, "coop_128x256_c2"), (3000, "coop_256x128_c1")]
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    assert tune.main(["gemm", "--from-bench", str(empty), "--out", str(out)]) == 1


def test_fp8_configurations_are_chosen_apart_from_bf16(tmp_path, monkeypatch):
    from tandem import tune

    # the model: a small M with a long K splits, a large square shape stays on the FP8 core
    assert gemm_plan.choose_scaled(64, 4096, 8192, 132, "row") in gemm_plan.SCALED_SPLITS
    assert gemm_plan.choose_scaled(8192, 8192, 8192, 132, "tensor") == gemm_plan.SCALED_CORE
    # bench rows of both kinds make one table; each kind is looked up apart (the same shape, other choices), and a
    # configuration of the other kind's set is ignored
    bench = tmp_path / "gemm_w1.json"
    rows = [dict(m=3000, n=5000, k=4000, dtype="bfloat16", scaling="none", sm_count=132,
                 variants_ms={"coop_128x256_c2": 2.0, "coop_256x128_c1": 1.5}),
            dict(m=3000, n=5000, k=4000, dtype="float8_e4m3fn", scaling="row", sm_count=132,
                 variants_ms={"fp8_coop_128x128_c2": 1.0, "fp8_coop_128x128_c1x2": 0.8, "coop_256x128_c1": 0.1}),
            dict(m=3000, n=5000, k=4000, dtype="float8_e4m3fn", scaling="tensor", sm_count=132,
                 variants_ms={"fp8_coop_128x128_c2": 1.0, "fp8_pingpong_64x128_c1": 0.9})]
    bench.write_text(json.dumps(rows))
    out = tmp_path / "table.json"
    assert tune.main(["gemm", "--from-bench", str(bench), "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    assert sorted((r["kind"], r["variant"]) for r in table) == [
        ("bf16", "coop_256x128_c1"), ("fp8_row", "fp8_coop_128x128_c1x2"), ("fp8_tensor", "fp8_pingpong_64x128_c1")]
    monkeypatch.setenv("TANDEM_GEMM_TUNE_FILE", str(out))
    gemm_plan._TABLES.clear()
    assert gemm_plan.choose(3000, 5000, 4000, 132) == "coop_256x128_c1"
    assert gemm_plan.choose_scaled(3000, 5000, 4000, 132, "row") == "fp8_coop_128x128_c1x2"
    assert gemm_plan.choose_scaled(3000, 5000, 4000, 132, "tensor") == "fp8_pingpong_64x128_c1"


def test_untimed_fp8_configurations_come_only_from_a_measured_table(monkeypatch):
    # 128x192 / 64x192 (no GPU has timed them): the wave model never picks one, however it rates them; a table
    # row naming one is taken
    assert gemm_plan.SCALED_UNTIMED <= set(gemm_plan.SCALED_CONFIGS)
    for name in gemm_plan.SCALED_UNTIMED:
        tm, tn, cm, cn, _ = gemm_plan.SCALED_CONFIGS[name]
        monkeypatch.setitem(gemm_plan.SCALED_CONFIGS, name, (tm, tn, cm, cn, 100.0))
    for shape in ((16384, 28672, 8192), (4096, 4096, 4096), (3000, 5000, 4000), (1024, 8192, 8192)):
        assert gemm_plan.choose_scaled(*shape, 132, "row") not in gemm_plan.SCALED_UNTIMED, shape
    gemm_plan.write_table([dict(kind="fp8_row", sms=132, m=16384, n=28672, k=8192, variant="fp8_coop_128x192_c2",
                                ms=8.0)])
    assert gemm_plan.choose_scaled(16384, 28672, 8192, 132, "row") == "fp8_coop_128x192_c2"
    assert gemm_plan.choose_scaled(16384, 28672, 8192, 132, "tensor") not in gemm_plan.SCALED_UNTIMED


def test_a_table_written_before_kinds_reads_as_bf16(tmp_path, monkeypatch):
    old = tmp_path / "old.json"
    old.write_text(json.dumps([dict(sms=132, m=3000, n=5000, k=4000, mb=12, nb=12, kb=12, variant="coop_256x128_c1",
                                    ms=1.0)]))
    monkeypatch.setenv("TANDEM_GEMM_TUNE_FILE", str(old))
    assert gemm_plan.choose(3000, 5000, 4000, 132) == "coop_256x128_c1"
    assert gemm_plan.choose_scaled(3000, 5000, 4000, 132, "row") != "coop_256x128_c1"
    # merging new rows into it keeps the old row, now with its kind
    gemm_plan.write_table([dict(kind="fp8_row", sms=132, m=64, n=4096, k=8192, variant="fp8_splitk2_128x128_c1",
                                ms=0.1)], str(old))
    assert sorted(r["kind"] for r in json.loads(old.read_text())) == ["bf16", "fp8_row"]


def test_a_split_configuration_is_tabled_only_where_the_tiles_fill_less_than_a_wave(tmp_path):
    # (or, for stream-K, where it wins by more than gemm_plan.STREAM_K_TABLE_MARGIN)
    bench = tmp_path / "gemm_w1.json"
    rows = [dict(m=256, n=4096, k=14336, dtype="bfloat16", scaling="none", sm_count=132,  # 64 tiles: may split
                 variants_ms={"coop_128x256_c2": 0.15, "splitk2_128x128_c1": 0.06}),
            dict(m=16384, n=28672, k=8192, dtype="bfloat16", scaling="none", sm_count=132,  # 28672 tiles
                 variants_ms={"coop_128x256_c2": 12.0, "streamk_128x256_c1": 11.9}),
            dict(m=64, n=4096, k=8192, dtype="float8_e4m3fn", scaling="row", sm_count=132,
                 variants_ms={"fp8_coop_128x128_c2": 0.05, "fp8_splitk2_128x128_c1": 0.03})]
    # beyond a wave: stream-K only by more than the margin (3 %), split-K never
    rows += [dict(m=2500, n=14336, k=4096, dtype="bfloat16", scaling="none", sm_count=132,  # 1120 tiles
                  variants_ms={"coop_128x256_c2": 0.50, "coop_128x256_c1": 0.48, "streamk_128x256_c1": 0.43,
                               "splitk2_128x128_c1": 0.30}),
             dict(m=256, n=28672, k=8192, dtype="float8_e4m3fn", scaling="row", sm_count=132,  # 448 tiles
                  variants_ms={"fp8_coop_128x128_c1": 0.160, "fp8_streamk_128x128_c1": 0.158,
                               "fp8_splitk2_128x128_c1": 0.10})]
    bench.write_text(json.dumps(rows))
    got = {(r["kind"], r["m"]): r["variant"] for r in gemm_plan.rows_from_bench([str(bench)])}
    assert got == {("bf16", 256): "splitk2_128x128_c1", ("bf16", 16384): "coop_128x256_c2",
                   ("fp8_row", 64): "fp8_splitk2_128x128_c1", ("bf16", 2500): "streamk_128x256_c1",
                   ("fp8_row", 256): "fp8_coop_128x128_c1"}


def test_several_sweeps_are_merged_by_each_configurations_median_time(tmp_path):
    # one sweep's single timing picks either of two configurations a few percent apart; with three sweeps of the
    # same shape the table takes the configuration whose median time is lowest. A tile schedule counts only where
    # every sweep that timed its configuration timed it too (bench times schedules only for a sweep's fastest
    # configurations), at the configuration's median time times the median of its ratios to the default.
    def sweep(name, pingpong, coop, sched, lucky=None):
        path = tmp_path / name
        schedules = {"fp8_coop_128x128_c1/s2/along_m": sched}
        if lucky is not None:
            schedules["fp8_coop_128x128_c1/s4/along_n"] = lucky
        path.write_text(json.dumps([dict(m=4096, n=4096, k=4096, dtype="float8_e4m3fn", scaling="tensor", sm_count=132,
                                         variants_ms={"fp8_pingpong_64x128_c1": pingpong, "fp8_coop_128x128_c1": coop},
                                         schedules_ms=schedules),
                                    dict(m=512, n=4096, k=4096, dtype="bfloat16", scaling="none", sm_count=132,
                                         variants_ms={"coop_128x256_c2": 0.2})]))
        return str(path)

    paths = [sweep("a.json", 0.95, 1.00, 0.97), sweep("b.json", 1.20, 1.00, 0.90, lucky=0.5),
             sweep("c.json", 1.10, 1.05, 0.99)]
    rows = {(r["kind"], r["m"]): r for r in gemm_plan.rows_from_bench(paths)}
    assert len(rows) == 2  # one row a shape, not one a file
    fp8 = rows[("fp8_tensor", 4096)]
    # medians: ping-pong 1.10, coop 1.00; the schedule's ratios 0.97, 0.90, 0.99 / 1.05: median 0.9429, so
    # 0.9429 ms, more than the margin below coop's 1.00; the s4 schedule timed in one sweep of three is dropped
    assert fp8["candidates"] == {"fp8_pingpong_64x128_c1": 1.10, "fp8_coop_128x128_c1": 1.00}
    assert set(fp8["schedules"]) == {"fp8_coop_128x128_c1/s2/along_m"}, fp8["schedules"]
    assert fp8["variant"] == "fp8_coop_128x128_c1" and fp8["raster"] == "along_m" and fp8["swizzle"] == 2
    assert abs(fp8["ms"] - 0.99 / 1.05) < 1e-9
    # a shape timed once keeps its times as they are (the s4 schedule of that one sweep wins there)
    (only,) = [r for r in gemm_plan.rows_from_bench([paths[1]]) if r["kind"] == "fp8_tensor"]
    assert only["variant"] == "fp8_coop_128x128_c1" and only["ms"] == 0.5 and only["swizzle"] == 4


def test_the_shipped_h100_table_is_what_tune_makes_from_the_sweeps_in_docs_results(tmp_path):
    # provenance: python/tandem/ops/gemm_tune_h100.json = `tandem tune gemm --from-bench` of the bf16 sweep
    # (docs/results/gemm_swap208) and the FP8 sweep (docs/results/gemm_fp8_table, 2026-12-06) it was made from;
    # a hand edit, or a table rebuilt from files that are not kept, fails here
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sweeps = [os.path.join(root, "docs/results/gemm_swap208/sweep_bf16.json"),
              os.path.join(root, "docs/results/gemm_fp8_table/sweep_fp8.json")]
    out = str(tmp_path / "table.json")
    gemm_plan.write_table(gemm_plan.rows_from_bench(sweeps), out)
    with open(out) as f:
        rebuilt = json.load(f)
    with open(os.path.join(root, "python/tandem/ops/gemm_tune_h100.json")) as f:
        shipped = json.load(f)
    assert len(rebuilt) == len(shipped) == 72
    assert rebuilt == shipped


def test_the_shipped_h200_tables_fp8_rows_are_what_tune_makes_from_the_h200_sweep(tmp_path):
    # provenance: gemm_tune_h200.json's FP8 rows = `tandem tune gemm --from-bench` of the H200 FP8 sweep in
    # docs/results/gemm_h200_fp8 (2026-12-07, part f8ab); its bf16 rows come from an earlier H200 sweep
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sweeps = [os.path.join(root, f"docs/results/gemm_h200_fp8/sweep_{h}.json") for h in "ab"]
    out = str(tmp_path / "table.json")
    gemm_plan.write_table(gemm_plan.rows_from_bench(sweeps), out)
    with open(out) as f:
        rebuilt = json.load(f)
    with open(os.path.join(root, "python/tandem/ops/gemm_tune_h200.json")) as f:
        shipped = [r for r in json.load(f) if r["kind"] != "bf16"]
    assert len(rebuilt) == len(shipped) == 48
    assert sorted(rebuilt, key=json.dumps) == sorted(shipped, key=json.dumps)


def test_the_planner_names_exactly_the_native_configurations():
    from tests.conftest import native_kernels

    K = native_kernels("gemm_variant_names")
    if set(K.gemm_variant_names()) < set(gemm_plan.CONFIGS):
        pytest.skip("tandem._C was built before the newest configurations of gemm_variants_sm90.cu: rebuild")
    assert set(K.gemm_variant_names()) == set(gemm_plan.CONFIGS)
    assert set(gemm_plan.CLUSTER_N) <= set(gemm_plan.CONFIGS) and gemm_plan.UNTIMED <= set(gemm_plan.CONFIGS)


def test_untimed_configurations_come_only_from_a_measured_table(monkeypatch):
    # the wave model never picks a configuration whose rate is a guess, even where it would predict it fastest
    for name in gemm_plan.UNTIMED:
        monkeypatch.setitem(gemm_plan.CONFIGS, name, gemm_plan.CONFIGS[name][:3] + (100.0,))
    for shape in ((777, 4104, 4096), (4096, 4096, 4096), (16384, 28672, 8192), (3000, 5000, 4000)):
        assert gemm_plan.choose(*shape, 132) not in gemm_plan.UNTIMED, shape
    gemm_plan.write_table([dict(sms=132, m=777, n=4104, k=4096, variant="coop_128x256_c1x2", ms=0.05)])
    assert gemm_plan.choose(777, 4104, 4096, 132) == "coop_128x256_c1x2"
    # a 1x2 cluster pads N tiles, not M tiles, in the wave model
    assert gemm_plan._tiles(128, 256, 1, 2, 777, 4104) == 7 * 18
    assert gemm_plan._tiles(128, 256, 2, 1, 777, 4104) == 8 * 17


def test_schedule_names_round_trip_and_bad_ones_are_refused():
    default = gemm_plan.Schedule("coop_128x256_c2")
    assert default == ("coop_128x256_c2", 1, "heuristic") and default.name() == "coop_128x256_c2"
    other = gemm_plan.Schedule("pingpong_128x128_c1", 4, "along_m")
    assert other.name() == "pingpong_128x128_c1/s4/along_m"
    for s in (default, other, gemm_plan.Schedule("coop_256x128_c1", 1, "along_n")):
        assert gemm_plan.Schedule.parse(s.name()) == s and s.valid()
    for bad in ("coop_128x256_c2/4/along_m", "coop_128x256_c2/s4", "a/b/c/d", "coop_128x256_c2/sx/along_m"):
        with pytest.raises(ValueError):
            gemm_plan.Schedule.parse(bad)
    assert not gemm_plan.Schedule("coop_128x256_c2", 3).valid()
    assert not gemm_plan.Schedule("coop_128x256_c2", 1, "diagonal").valid()
    assert not gemm_plan.Schedule("made_up").valid()


def test_a_tile_schedule_is_tabled_only_where_it_beats_the_default_by_the_margin(tmp_path):
    # 16384 x 28672: along_m with swizzle 4 8 % faster than the best default schedule -> tabled with it;
    # 4096 x 4096: a schedule 1 % faster (within SCHEDULE_TABLE_MARGIN) -> the default schedule stays;
    # a schedule of a configuration the row did not time, and an invalid one, are ignored
    rows = [dict(m=16384, n=28672, k=8192, dtype="bfloat16", scaling="none", sm_count=132,
                 variants_ms={"coop_128x256_c2": 12.0, "streamk_128x256_c1": 12.5},
                 schedules_ms={"coop_128x256_c2/s4/along_m": 11.0, "coop_128x256_c2/s2/along_n": 12.2,
                               "pingpong_128x128_c1/s8/along_m": 1.0, "coop_128x256_c2/s3/along_m": 0.5,
                               "coop_128x256_c2/s8/along_n": None}),
            dict(m=4096, n=4096, k=4096, dtype="bfloat16", scaling="none", sm_count=132,
                 variants_ms={"coop_128x256_c2": 1.0, "coop_256x128_c1": 1.1},
                 schedules_ms={"coop_256x128_c1/s2/along_m": 0.99})]
    bench = tmp_path / "gemm_w1.json"
    bench.write_text(json.dumps(rows))
    tabled = gemm_plan.rows_from_bench([str(bench)])
    big, square = tabled
    assert (big["variant"], big["swizzle"], big["raster"], big["ms"]) == ("coop_128x256_c2", 4, "along_m", 11.0)
    assert set(big["schedules"]) == {"coop_128x256_c2/s4/along_m", "coop_128x256_c2/s2/along_n"}
    assert square["variant"] == "coop_128x256_c2" and "swizzle" not in square and square["ms"] == 1.0
    gemm_plan.write_table(tabled)
    assert gemm_plan.choose_schedule(16384, 28672, 8192, 132) == ("coop_128x256_c2", 4, "along_m")
    assert gemm_plan.choose(16384, 28672, 8192, 132) == "coop_128x256_c2"
    assert gemm_plan.choose_schedule(4096, 4096, 4096, 132) == ("coop_128x256_c2", 1, "heuristic")
    # fp16 is never given a table's schedule (the table is measured in bf16)
    assert gemm_plan.choose_schedule(16384, 28672, 8192, 132, dtype_is_bf16=False) == (gemm_plan.CORE, 1,
                                                                                       "heuristic")


def test_a_table_row_with_a_bad_schedule_is_skipped(tmp_path):
    # swizzle 5, a null swizzle, a string: each row skipped alone; the good row of another shape still read
    def row(m, **kw):
        return dict(kind="bf16", sms=132, m=m, n=5000, k=4000, mb=gemm_plan.bucket(m), nb=gemm_plan.bucket(5000),
                    kb=gemm_plan.bucket(4000), variant="coop_256x128_c1", ms=1.0, **kw)

    path = tmp_path / "user.json"
    path.write_text(json.dumps([row(3000, swizzle=5, raster="along_m"), row(3000, swizzle=None),
                                row(3000, swizzle="4"), row(3000, swizzle=2.0), row(3000, swizzle=True),
                                row(12000, swizzle=2, raster="along_n")]))
    assert gemm_plan.choose_schedule(12000, 5000, 4000, 132) == ("coop_256x128_c1", 2, "along_n")
    assert gemm_plan.choose_schedule(3000, 5000, 4000, 132) == gemm_plan.Schedule(
        gemm_plan.choose(3000, 5000, 4000, 132))  # the model's, with the default schedule
    assert gemm_plan.lookup(132, 3000, 5000, 4000) is None


def test_fp8_rows_take_schedules_of_their_own_configurations(tmp_path):
    rows = [dict(m=16384, n=28672, k=8192, dtype="float8_e4m3fn", scaling="tensor", sm_count=132,
                 variants_ms={"fp8_coop_128x128_c1x2": 7.7, "fp8_coop_128x192_c2": 7.9},
                 schedules_ms={"fp8_coop_128x128_c1x2/s8/along_n": 6.5,
                               "coop_128x256_c2/s2/along_m": 1.0})]  # a bf16 name in an FP8 row: ignored
    bench = tmp_path / "gemm_w1.json"
    bench.write_text(json.dumps(rows))
    (row,) = gemm_plan.rows_from_bench([str(bench)])
    assert (row["kind"], row["variant"], row["swizzle"], row["raster"]) == ("fp8_tensor", "fp8_coop_128x128_c1x2", 8,
                                                                           "along_n")
    gemm_plan.write_table([row])
    assert gemm_plan.choose_scaled_schedule(16384, 28672, 8192, 132, "tensor") == ("fp8_coop_128x128_c1x2", 8,
                                                                                  "along_n")
    assert gemm_plan.choose_scaled(16384, 28672, 8192, 132, "tensor") == "fp8_coop_128x128_c1x2"
    # the row-wise kind has no row: the model's configuration with the default schedule
    assert gemm_plan.choose_scaled_schedule(16384, 28672, 8192, 132, "row")[1:] == (1, "heuristic")
    # nor does bf16 read the FP8 row
    assert gemm_plan.choose_schedule(16384, 28672, 8192, 132)[1:] == (1, "heuristic")


def test_a_plan_takes_a_callers_knobs_and_lists_its_other_schedules():
    plan = gemm_plan.Schedule("coop_128x256_c2", 4, "along_m")
    assert plan.overridden() == plan
    assert plan.overridden(swizzle=2) == ("coop_128x256_c2", 2, "along_m")
    assert plan.overridden(variant="coop_128x256_c2", raster="along_n") == ("coop_128x256_c2", 4, "along_n")
    # another configuration than the plan's: the default walk, then the caller's knobs
    assert plan.overridden(variant="coop_256x128_c1") == ("coop_256x128_c1", 1, "heuristic")
    assert plan.overridden(variant="coop_256x128_c1", swizzle=8) == ("coop_256x128_c1", 8, "heuristic")
    others = gemm_plan.Schedule("coop_128x256_c2").others()
    assert len(others) == len(gemm_plan.SWIZZLES) * len(gemm_plan.RASTERS) - 1
    assert ("coop_128x256_c2", 1, "heuristic") not in others and len(set(others)) == len(others)
    assert gemm_plan.tile_walk_error(None, None) is None and gemm_plan.tile_walk_error(8, "along_n") is None
    assert "swizzle" in gemm_plan.tile_walk_error(3, None) and "raster" in gemm_plan.tile_walk_error(1, "diagonal")
