"""bench gemm's summary: the op against its baseline, and each shape's best configuration against the baseline
timed as the configurations are (bf16: single calls; FP8: 20 calls back to back), never mixed."""

import json
import pathlib

from tandem.bench.gemm import summary_lines


def _row(dtype, scaling, tandem, base, base20, variants):
    return dict(dtype=dtype, scaling=scaling, tandem_ms=tandem, baseline_ms=base, baseline_ms_inner20=base20,
                variants_ms=variants)


def test_best_configurations_are_compared_like_for_like():
    data = [_row("bfloat16", "none", 2.0, 1.0, 0.5, {"a": 1.0, "b": 4.0, "c": None}),
            _row("float8_e4m3fn", "row", 2.0, 1.0, 0.5, {"x": 1.0, "y": None})]
    lines = summary_lines(data)
    assert "bfloat16/none: geometric mean baseline/tandem 0.500 over 1 shapes" in lines[0]
    assert "(baseline_ms) 1.000 over 1 shapes" in lines[1]  # bf16 configurations: single calls
    assert "float8_e4m3fn/row: geometric mean baseline/tandem 0.500" in lines[2]
    assert "(baseline_ms_inner20) 0.500 over 1 shapes" in lines[3]  # FP8 configurations: 20-call times


def test_the_recorded_fp8_sweep_gives_the_corrected_ratios():
    # docs/results/gemm_w1_fp8.json (H100, df0cc50): the figures docs/results.md reports
    path = pathlib.Path(__file__).resolve().parents[2] / "docs" / "results" / "gemm_w1_fp8.json"
    lines = summary_lines(json.loads(path.read_text()))
    best = {line.split(":")[0]: line for line in lines if "best configuration" in line}
    assert "0.891 over 24 shapes" in best["float8_e4m3fn/tensor"], best
    assert "0.990 over 24 shapes" in best["float8_e4m3fn/row"], best


def test_plot_writes_one_chart_per_kind_from_a_recorded_sweep(tmp_path, capsys):
    import pytest

    pytest.importorskip("matplotlib")
    from tandem.bench.gemm import main, plot

    rows = [dict(_row("bfloat16", "none", 2.0, 1.0, 0.5, {"a": 1.0}), m=1, n=2, k=3, baseline="cuBLAS",
                 schedules_ms={"a/s2/along_m": 0.9}),
            dict(_row("float8_e4m3fn", "row", 2.0, 1.0, 0.5, {"x": 1.0}), m=4, n=5, k=6, baseline="torch._scaled_mm"),
            dict(_row("float8_e4m3fn", "tensor", 2.0, 1.0, 0.5, {}), m=4, n=5, k=6, baseline="torch._scaled_mm",
                 run=dict(device="test GPU", commit="abcdef0123"))]
    paths = plot(rows, str(tmp_path / "plots"))
    assert sorted(p.rsplit("/", 1)[1] for p in paths) == ["gemm_w1_bfloat16_none.png", "gemm_w1_float8_e4m3fn_row.png",
                                                           "gemm_w1_float8_e4m3fn_tensor.png"]
    recorded = tmp_path / "gemm_w1.json"
    recorded.write_text(json.dumps(rows))
    assert main(["--plot-from", str(recorded)]) == 0
    out = capsys.readouterr().out
    assert "bfloat16/none: best configuration per shape, baseline/configuration (baseline_ms) 1.000" in out, out
    assert (tmp_path / "gemm_w1_float8_e4m3fn_row.png").exists()
    assert "bfloat16/none: best configuration and tile schedule per shape (baseline_ms) 1.111" in out, out


def test_tile_schedules_get_a_line_of_their_own():
    with_schedules = dict(_row("bfloat16", "none", 2.0, 1.0, 0.5, {"a": 1.0}), schedules_ms={"a/s4/along_m": 0.8,
                                                                                             "a/s2/along_n": None})
    lines = summary_lines([with_schedules, _row("bfloat16", "none", 2.0, 1.0, 0.5, {"a": 2.0})])
    assert "best configuration per shape, baseline/configuration (baseline_ms) 0.707 over 2 shapes" in lines[1]
    # 1/0.8 and 1/2.0: geometric mean sqrt(0.625)
    assert "best configuration and tile schedule per shape (baseline_ms) 0.791 over 2 shapes" in lines[2], lines
    assert len(summary_lines([_row("bfloat16", "none", 2.0, 1.0, 0.5, {"a": 1.0})])) == 2  # no schedules: no line
