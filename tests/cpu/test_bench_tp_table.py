"""bench tp's table and plot agree on their columns (a column added to the rows must not shift the plot's series
onto the wrong numbers)."""

from __future__ import annotations

from tandem.bench import common, tp


def test_plot_takes_each_series_from_its_named_column(monkeypatch, tmp_path):
    row = [f"v{i}" for i in range(len(tp.COLUMNS))]
    row[0], row[1] = "16384x8192x4096", "gemm_rs"
    for i, name in enumerate(tp.COLUMNS):
        if name.endswith(" ms"):
            row[i] = str(float(i))  # each timing column holds its own index
    seen = {}
    monkeypatch.setattr(common, "grouped_bars", lambda path, labels, series, ylabel, title: seen.update(series))
    tp.plot([row], 4, str(tmp_path / "p.png"))
    assert set(seen) == {"fused", "unfused", "pipelined", "auto", "naive", "cuBLAS alone"}
    for name, values in seen.items():
        assert values == [float(tp.COLUMNS.index(f"{name} ms"))], name



def test_ring_columns_are_their_own():
    # --ring appends its columns after the table's own (and --fp8's): none may reuse a name the plot looks up
    assert len(set(tp.RING_COLUMNS)) == 3 and not set(tp.RING_COLUMNS) & set(tp.COLUMNS)
