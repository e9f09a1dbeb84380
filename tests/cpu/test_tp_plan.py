"""mode="auto"'s SM plan (tandem.ops.tp_plan): the tuned table wins over the cost model, keys bucket by powers of
two, a table from `tandem tune` round-trips, and the cost model's choices follow its inputs."""

from __future__ import annotations

import json
import os

import pytest

tp_plan = pytest.importorskip("tandem.ops.tp_plan")


def test_tuned_entry_wins_over_the_model(tmp_path, monkeypatch):
    path = tmp_path / "tune.json"
    monkeypatch.setenv("TANDEM_TP_TUNE_FILE", str(path))
    shape = ("gemm_rs", 4, 33, 16384, 8192, 1024)
    model_mode, model_blocks, _ = tp_plan.model(*shape)
    forced = ("fused", 12) if model_mode == "unfused" else ("unfused", 0)
    tp_plan.write_table([dict(op="gemm_rs", world=4, sms=33, m=16384, n=8192, k=1024, mode=forced[0],
                              comm_blocks=forced[1], ms=1.0)])
    assert tp_plan.choose(*shape) == forced
    # the same bucket (nearest power of two) hits the entry; another SM count or world does not
    assert tp_plan.choose("gemm_rs", 4, 33, 15000, 8192, 1100) == forced
    assert tp_plan.choose("gemm_rs", 2, 33, 16384, 8192, 1024) != forced or tp_plan.model(
        "gemm_rs", 2, 33, 16384, 8192, 1024)[:2] == forced
    assert tp_plan.lookup("gemm_rs", 4, 66, 16384, 8192, 1024) is None


def test_an_entry_at_a_nearby_sm_count_stands_in_for_a_missing_one(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_TP_TUNE_FILE", str(tmp_path / "tune.json"))
    monkeypatch.setattr(tp_plan, "SHIPPED", "/nonexistent/shipped.json")
    shape = dict(m=16384, n=8192, k=1024)
    tp_plan.write_table([dict(op="gemm_rs", world=4, sms=32, mode="fused", comm_blocks=8, ms=1.0, **shape),
                         dict(op="gemm_rs", world=4, sms=40, mode="unfused", comm_blocks=0, ms=1.0, **shape),
                         dict(op="ag_gemm", world=4, sms=26, mode="pipelined", comm_blocks=0, ms=1.0, **shape)])
    at = lambda op, sms: tp_plan.lookup(op, 4, sms, 16384, 8192, 1024)  # noqa: E731
    assert at("gemm_rs", 32) == ("fused", 8) and at("gemm_rs", 40) == ("unfused", 0)  # exact keys
    assert at("gemm_rs", 26) == ("fused", 6)  # 32 is closest; 8 blocks are more than a quarter of 26 SMs
    assert at("gemm_rs", 35) == ("fused", 8) and at("gemm_rs", 37) == ("unfused", 0)  # the closer count
    assert at("gemm_rs", 36) == ("unfused", 0)  # a tie: the larger count
    assert at("gemm_rs", 23) is None and at("gemm_rs", 60) is None  # beyond a third more or less: none
    assert at("ag_gemm", 32) == ("pipelined", 0) and at("ag_gemm", 20) == ("pipelined", 0)
    assert tp_plan.lookup("gemm_rs", 2, 32, 16384, 8192, 1024) is None  # another world never stands in
    assert tp_plan.lookup("gemm_rs", 4, 32, 1024, 8192, 1024) is None  # nor a shape 4 buckets away


def test_an_entry_of_a_nearby_shape_stands_in_before_the_model(tmp_path, monkeypatch):
    # No exact entry and none at a nearby SM count: the closest entry of the same op and world whose M/N/K buckets
    # are each within NEAR_SHAPE_BUCKETS (2) of the problem's wins over the cost model; farther ones do not count.
    path = tmp_path / "tp_tune.json"
    monkeypatch.setenv("TANDEM_TP_TUNE_FILE", str(path))
    monkeypatch.setattr(tp_plan, "SHIPPED", "/nonexistent/shipped.json")
    rows = [dict(op="gemm_rs", world=2, sms=66, m=16384, n=8192, k=4096, mode="pipelined", comm_blocks=0, ms=1.0),
            dict(op="gemm_rs", world=2, sms=66, m=1024, n=8192, k=4096, mode="fused", comm_blocks=30, ms=1.0),
            dict(op="ag_gemm", world=2, sms=66, m=16384, n=8192, k=4096, mode="unfused", comm_blocks=0, ms=1.0)]
    tp_plan.write_table(rows, str(path))
    # M 8192: one bucket from the first entry, three from the second: the first's mode
    assert tp_plan.lookup("gemm_rs", 2, 66, 8192, 8192, 4096) == ("pipelined", 0)
    assert tp_plan.choose("gemm_rs", 2, 66, 8192, 8192, 4096) == ("pipelined", 0)
    # M 2048: one bucket from the second entry (fused, its blocks kept within a quarter of the SMs: 16)
    assert tp_plan.lookup("gemm_rs", 2, 66, 2048, 8192, 4096) == ("fused", 16)
    # N 28672 (bucket 15) and M 8192: 1 + 2 buckets from the first entry, each within 2: still the first
    assert tp_plan.lookup("gemm_rs", 2, 66, 8192, 28672, 4096) == ("pipelined", 0)
    # K 512 is three buckets below every entry: no stand-in, the model decides
    assert tp_plan.lookup("gemm_rs", 2, 66, 16384, 8192, 512) is None
    want = tp_plan.model("gemm_rs", 2, 66, 16384, 8192, 512)[:2]
    assert tp_plan.choose("gemm_rs", 2, 66, 16384, 8192, 512) == want
    # another world or op never stands in
    assert tp_plan.lookup("gemm_rs", 4, 32, 16384, 8192, 4096) is None
    assert tp_plan.lookup("gemm_ar", 2, 66, 16384, 8192, 4096) is None


def test_write_table_merges_and_replaces(tmp_path):
    path = str(tmp_path / "t.json")
    row = dict(op="ag_gemm", world=2, sms=66, m=8192, n=4096, k=8192, mode="fused", comm_blocks=4, ms=2.0)
    tp_plan.write_table([row], path)
    tp_plan.write_table([dict(row, comm_blocks=8, ms=1.5), dict(row, op="gemm_ar", mode="unfused", comm_blocks=0)],
                        path)
    rows = json.load(open(path))
    assert len(rows) == 2
    by_op = {r["op"]: r for r in rows}
    assert by_op["ag_gemm"]["comm_blocks"] == 8 and by_op["gemm_ar"]["mode"] == "unfused"


def test_model_follows_its_rates(monkeypatch):
    monkeypatch.setenv("TANDEM_TP_TUNE_FILE", "/nonexistent/tune.json")
    monkeypatch.setattr(tp_plan, "SHIPPED", "/nonexistent/shipped.json")
    shape = ("gemm_rs", 4, 33, 16384, 8192, 1024)
    # (across nodes: the pipelined mode is not a candidate there; test_pipelined_is_a_one_node_candidate)
    monkeypatch.setattr(tp_plan, "model", __import__("functools").partial(tp_plan.model, nodes=2))
    # a nearly free collective: fusing only costs the GEMM SMs, so unfused
    monkeypatch.setitem(tp_plan.ROLE_GBS_PER_SM, "gemm_rs", 1000.0)
    monkeypatch.setattr(tp_plan, "MEMORY_GBS", 1e6)
    assert tp_plan.model(*shape)[0] == "unfused"
    # a collective bound by memory, not by SMs, about as long as the GEMM: overlapping it pays, on the fewest
    # comm SMs that reach the memory rate
    monkeypatch.setitem(tp_plan.ROLE_GBS_PER_SM, "gemm_rs", 40.0)
    monkeypatch.setattr(tp_plan, "MEMORY_GBS", 400.0)
    mode, blocks, t = tp_plan.model(*shape)
    assert mode == "fused" and blocks == 4, (mode, blocks, t)  # 4 x 40 GB/s > 400 / 4 ranks
    # a very slow role cannot hide anything: the collective on every SM after the GEMM wins
    monkeypatch.setitem(tp_plan.ROLE_GBS_PER_SM, "gemm_rs", 0.1)
    assert tp_plan.model(*shape)[0] == "unfused"
    assert tp_plan.choose("gemm_rs", 1, 132, 16384, 8192, 1024) == ("unfused", 0)  # world 1: the plain GEMM


def test_pipelined_is_a_one_node_candidate(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_TP_TUNE_FILE", "/nonexistent/tune.json")
    monkeypatch.setattr(tp_plan, "SHIPPED", "/nonexistent/shipped.json")
    shape = ("gemm_rs", 4, 33, 16384, 8192, 1024)
    # off in the model until measured: a table entry is the way in
    monkeypatch.setattr(tp_plan, "SYNC_STEP_US", 1.0)
    assert tp_plan.model(*shape, nodes=1)[0] != "pipelined"
    monkeypatch.setattr(tp_plan, "PIPELINED_IN_MODEL", True)
    # cheap sync steps: the GEMM alone plus a piece per ring step beats every SM split on one node ...
    assert tp_plan.model(*shape, nodes=1)[0] == "pipelined"
    assert tp_plan.choose(*shape, nodes=1) == ("pipelined", 0)
    # ... is never chosen across nodes ...
    assert tp_plan.model(*shape, nodes=2)[0] != "pipelined"
    assert tp_plan.choose(*shape, nodes=2)[0] != "pipelined"
    # ... and loses when each step costs more than the whole collective
    monkeypatch.setattr(tp_plan, "SYNC_STEP_US", 1e5)
    assert tp_plan.model(*shape, nodes=1)[0] != "pipelined"
    # a tuned entry naming it is used on one node and skipped across nodes
    path = tmp_path / "tune.json"
    monkeypatch.setenv("TANDEM_TP_TUNE_FILE", str(path))
    tp_plan.write_table([dict(op="gemm_rs", world=4, sms=33, m=16384, n=8192, k=1024, mode="pipelined",
                              comm_blocks=0, ms=1.0)])
    assert tp_plan.choose(*shape, nodes=1) == ("pipelined", 0)
    assert tp_plan.choose(*shape, nodes=2) == tp_plan.model(*shape, nodes=2)[:2]
    # ... and when the caller restricted the SMs (sm_count): pipelined would use them all
    assert tp_plan.choose(*shape, nodes=1, pipelined=False) == tp_plan.model(*shape, pipelined=False)[:2]
    assert tp_plan.choose(*shape, nodes=1, pipelined=False)[0] != "pipelined"



def test_collective_bytes():
    # RS at world 4: 4 partial chunks read + 1 written; AR adds 3 chunks copied (read + written)
    chunk = 4096 * 8192 * 2
    assert tp_plan.collective_bytes("gemm_rs", 4, 16384, 8192, 1024) == 5 * chunk
    assert tp_plan.collective_bytes("gemm_ar", 4, 16384, 8192, 1024) == 5 * chunk + 6 * chunk
    assert tp_plan.collective_bytes("ag_gemm", 4, 16384, 8192, 4096) == 2 * 16384 * 4096 * 2


def _bench_json(path, world, sms, rows, as_list=False):
    rows = [dict(op=op, m=m, n=n, k=k, world=world, sm_count=sms, fused_ms=f, unfused_ms=u, pipelined_ms=p)
            for op, m, n, k, f, u, p in rows]
    # bench tp writes a list of rows, each with its run's meta; files written before 2026-12-04 16:40 wrap them
    data = [dict(r, run={"commit": "abc1234"}) for r in rows] if as_list else \
        {"meta": {"commit": "abc1234"}, "data": {"rows": rows}}
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("as_list", [False, True])
def test_tune_from_bench_takes_the_fastest_mode_and_the_ranks_k(tmp_path, monkeypatch, as_list):
    from tandem import tune

    monkeypatch.setattr(tp_plan, "SHIPPED", "/nonexistent/shipped.json")
    src = _bench_json(tmp_path / "tp_w4.json", 4, 32, as_list=as_list, rows=[
        ("ag_gemm", 16384, 7168, 8192, 18.0, 13.4, 12.5),   # pipelined fastest
        ("gemm_rs", 16384, 8192, 28672, 25.9, 12.8, 13.5),  # unfused fastest; the op sees K / 4 = 7168
        ("gemm_ar", 256, 8192, 28672, 1.5, None, 1.4),      # a mode that did not run (None) is not a candidate
    ])
    rows = tune.rows_from_bench([src])
    assert [(r["op"], r["k"], r["mode"]) for r in rows] == [("ag_gemm", 8192, "pipelined"), ("gemm_rs", 7168, "unfused"),
                                                           ("gemm_ar", 7168, "pipelined")]
    assert rows[0]["source"] == "bench tp_w4.json abc1234" and rows[1]["candidates"]["fused:0"] == 25.9
    out = str(tmp_path / "table.json")
    assert tune.main(["--from-bench", src, "--out", out]) == 0
    monkeypatch.setenv("TANDEM_TP_TUNE_FILE", out)
    assert tp_plan.choose("ag_gemm", 4, 32, 16384, 7168, 8192) == ("pipelined", 0)
    assert tp_plan.choose("gemm_rs", 4, 32, 16384, 8192, 7168) == ("unfused", 0)
    # across nodes the pipelined entry is skipped for the model
    assert tp_plan.choose("ag_gemm", 4, 32, 16384, 7168, 8192, nodes=2)[0] != "pipelined"


def test_tune_from_bench_merges_runs_of_one_shape_by_median(tmp_path, monkeypatch):
    # one shape in three runs: run 3 alone would choose fused (its noise); the medians choose pipelined
    from tandem import tune

    monkeypatch.setattr(tp_plan, "SHIPPED", "/nonexistent/shipped.json")
    runs = [(9.9, 8.0, 6.2), (10.0, 7.9, 6.3), (5.9, 8.9, 7.8)]
    paths = [_bench_json(tmp_path / f"run{i}.json", 2, 66, as_list=True,
                         rows=[("gemm_rs", 8192, 28672, 8192, f, u, p), ("ag_gemm", 4096, 1024, 1024, 1.0, 2.0, None)])
             for i, (f, u, p) in enumerate(runs)]
    rows = tune.rows_from_bench(paths)
    assert [(r["op"], r["mode"], r["runs"]) for r in rows] == [("gemm_rs", "pipelined", 3), ("ag_gemm", "fused", 3)]
    rs = rows[0]
    assert rs["k"] == 4096 and rs["candidates"] == {"fused:0": 9.9, "unfused:0": 8.0, "pipelined:0": 6.3}
    assert rs["ms"] == 6.3 and rs["source"] == "bench run0.json abc1234; bench run1.json abc1234; bench run2.json abc1234"
    # two runs: the mean of the two; a mode missing from one run counts its other run alone
    two = tune.rows_from_bench(paths[1:])
    assert two[0]["candidates"]["pipelined:0"] == pytest.approx(7.05) and two[0]["mode"] == "pipelined"
    # a single file keeps its own choice (run 3: fused)
    assert tune.rows_from_bench(paths[2:])[0]["mode"] == "fused"


def test_a_table_rewritten_by_another_process_is_read_again(tmp_path, monkeypatch):
    monkeypatch.setattr(tp_plan, "SHIPPED", "/nonexistent/shipped.json")
    path = tmp_path / "tune.json"
    monkeypatch.setenv("TANDEM_TP_TUNE_FILE", str(path))
    row = dict(op="gemm_rs", world=2, sms=40, m=4096, n=4096, k=4096, mb=12, nb=12, kb=12, comm_blocks=0, ms=1.0)
    path.write_text(json.dumps([dict(row, mode="unfused")]))
    assert tp_plan.lookup("gemm_rs", 2, 40, 4096, 4096, 4096) == ("unfused", 0)
    path.write_text(json.dumps([dict(row, mode="pipelined")]))
    os.utime(path, (1, 1))  # a different mtime, as a rewrite a second later has
    monkeypatch.setattr(tp_plan, "RECHECK_S", 0.0)
    assert tp_plan.lookup("gemm_rs", 2, 40, 4096, 4096, 4096) == ("pipelined", 0)


def test_the_shipped_table_holds_the_measured_best_mode_of_each_bench_shape(monkeypatch):
    # tp_tune_h200.json comes from docs/results/tp_w{2,4}.json (tandem tune --from-bench): at every bench row,
    # auto's choice is the mode the benchmark measured fastest in that run
    import pathlib

    from tandem import tune

    root = pathlib.Path(__file__).resolve().parents[2]
    sources = [str(root / "docs" / "results" / f"tp_w{w}.json") for w in (2, 4)]
    # the table shipped for the GPU model the runs were made on (docs/results holds the latest run)
    from tandem.ops import _tune_table

    device = json.loads(pathlib.Path(sources[0]).read_text())[0]["run"]["device"]
    monkeypatch.setattr(_tune_table, "_device_name", lambda: device)
    shipped = json.loads(pathlib.Path(_tune_table.device_table(tp_plan.SHIPPED)).read_text())
    by_key = {(r["op"], r["world"], r["sms"], r["mb"], r["nb"], r["kb"]): r["mode"] for r in shipped}
    rows = tune.rows_from_bench(sources)
    assert len(rows) >= 40
    for r in rows:
        assert by_key[tp_plan.key(r["op"], r["world"], r["sms"], r["m"], r["n"], r["k"])] == r["mode"], r


def test_the_h200_tables_rows_from_the_interleaved_runs_hold_their_measured_best_mode():
    # tp_tune_h200.json's rows of 2026-12-07 19:00 come from the H200's interleaved bench tp runs kept in
    # docs/results/bench_rounds (tandem tune --from-bench over all five, merged by median)
    import pathlib

    from tandem import tune

    root = pathlib.Path(__file__).resolve().parents[2]
    sources = sorted(str(p) for p in (root / "docs" / "results" / "bench_rounds").glob("*_tp_w*.json"))
    assert len(sources) == 5
    shipped = json.loads((root / "python" / "tandem" / "ops" / "tp_tune_h200.json").read_text())
    by_key = {(r["op"], r["world"], r["sms"], r["mb"], r["nb"], r["kb"]): r["mode"] for r in shipped}
    rows = tune.rows_from_bench(sources)
    assert len(rows) == 12
    for r in rows:
        assert by_key[tp_plan.key(r["op"], r["world"], r["sms"], r["m"], r["n"], r["k"])] == r["mode"], r


def test_fused_split_follows_the_shape_and_the_table(tmp_path, monkeypatch):
    monkeypatch.setattr(tp_plan, "SHIPPED", "/nonexistent/shipped.json")
    monkeypatch.setenv("TANDEM_TP_TUNE_FILE", str(tmp_path / "none.json"))
    for op in ("ag_gemm", "gemm_rs", "gemm_ar"):
        for world, sms in ((2, 66), (3, 33), (4, 32)):
            for m, n, k in ((64, 64, 64), (1024, 4096, 8192), (16384, 8192, 1024), (256, 8192, 7168)):
                c = tp_plan.fused_split(op, world, sms, m * world, n, k)
                assert c % 2 == 0 and 2 <= c <= max(2, sms // 4), (op, world, m, n, k, c)
    # tiny problems keep the fewest comm SMs; a large reduction gets more than the old fixed sixteenth (2 at 32)
    assert tp_plan.fused_split("gemm_rs", 2, 66, 64, 64, 64) == 2
    assert tp_plan.fused_split("gemm_rs", 4, 32, 16384, 8192, 1024) >= 4
    # a tuned fused entry wins over the model; an unfused one leaves the split to the model
    path = tmp_path / "t.json"
    row = dict(op="gemm_rs", world=4, sms=32, m=16384, n=8192, k=1024, mb=14, nb=13, kb=10, ms=1.0)
    path.write_text(json.dumps([dict(row, mode="fused", comm_blocks=12)]))
    monkeypatch.setenv("TANDEM_TP_TUNE_FILE", str(path))
    monkeypatch.setattr(tp_plan, "RECHECK_S", 0.0)
    assert tp_plan.fused_split("gemm_rs", 4, 32, 16384, 8192, 1024) == 12
    path.write_text(json.dumps([dict(row, mode="unfused", comm_blocks=0)]))
    import os
    os.utime(path, (2, 2))
    assert tp_plan.fused_split("gemm_rs", 4, 32, 16384, 8192, 1024) >= 4


def test_fused_grid_shrinks_only_for_rs_and_ar_on_a_gpu_shared_by_four_or_more(monkeypatch):
    monkeypatch.delenv("TANDEM_TP_FUSED_SMS", raising=False)
    # world 4 under MPS (32 SMs a rank): GEMM+RS/AR on 28, AG+GEMM on the whole share
    assert tp_plan.fused_grid_sms("gemm_rs", 32, 4) == 28
    assert tp_plan.fused_grid_sms("gemm_ar", 32, 4) == 28
    assert tp_plan.fused_grid_sms("ag_gemm", 32, 4) == 32
    assert tp_plan.fused_grid_sms("gemm_rs", 33, 4) == 28  # 7/8 of 33 is 28.9: even, rounded down
    # one rank a GPU, or two sharing one: the share
    assert tp_plan.fused_grid_sms("gemm_rs", 132, 1) == 132
    assert tp_plan.fused_grid_sms("gemm_rs", 66, 2) == 66
    # the override: a grid (never beyond the share), or 0 for the share
    monkeypatch.setenv("TANDEM_TP_FUSED_SMS", "24")
    assert tp_plan.fused_grid_sms("ag_gemm", 32, 4) == 24
    assert tp_plan.fused_grid_sms("gemm_rs", 16, 1) == 16
    monkeypatch.setenv("TANDEM_TP_FUSED_SMS", "0")
    assert tp_plan.fused_grid_sms("gemm_rs", 32, 4) == 32


def test_the_shipped_table_is_the_gpu_models_own(monkeypatch, tmp_path):
    """An H100 reads <name>_h100.json where one is shipped, anything else (and an H100 without one) the H200's;
    the planners look up through device_table."""
    from tandem.ops import _tune_table, gemm_plan

    h200 = tmp_path / "tp_tune_h200.json"
    h100 = tmp_path / "tp_tune_h100.json"
    h200.write_text("[]")
    for name, want in (("NVIDIA H100 80GB HBM3", h100), ("NVIDIA H200", h200), ("NVIDIA A100-SXM4-80GB", h200),
                       ("", h200)):
        monkeypatch.setattr(_tune_table, "_device_name", lambda n=name: n)
        if want == h100:
            assert _tune_table.device_table(str(h200)) == str(h200)  # not shipped yet: the H200's
            h100.write_text("[]")
        assert _tune_table.device_table(str(h200)) == str(want), name
    # a path of another form (a test's stand-in) is taken as it is
    assert _tune_table.device_table("/nonexistent/shipped.json") == "/nonexistent/shipped.json"
    # the shipped tables: one per model, both naming the same kinds of rows
    for mod in (tp_plan, gemm_plan):
        assert mod.SHIPPED.endswith("_h200.json")
        monkeypatch.setattr(_tune_table, "_device_name", lambda: "NVIDIA H100 80GB HBM3")
        assert _tune_table.device_table(mod.SHIPPED).endswith("_h100.json")
    # and the lookup goes through it: a row only the H100's table has is found on an H100, not on an H200
    monkeypatch.setattr(tp_plan, "table_path", lambda: str(tmp_path / "user.json"))
    monkeypatch.setattr(tp_plan, "SHIPPED", str(h200))
    tp_plan._TABLES.clear()
    h100.write_text(json.dumps([dict(op="gemm_rs", world=4, sms=32, mb=14, nb=13, kb=12, mode="pipelined",
                                     comm_blocks=0, ms=1.0)]))
    monkeypatch.setattr(_tune_table, "_device_name", lambda: "NVIDIA H100 80GB HBM3")
    assert tp_plan.lookup("gemm_rs", 4, 32, 16384, 8192, 4096) == ("pipelined", 0)
    monkeypatch.setattr(_tune_table, "_device_name", lambda: "NVIDIA H200")
    assert tp_plan.lookup("gemm_rs", 4, 32, 16384, 8192, 4096) is None


def test_a_ticket_entry_is_auto_s_plan_on_one_node_and_sets_the_launch_fields(tmp_path, monkeypatch):
    # A table row of mode "ticket" (GEMM+RS/AR by tickets; comm_blocks = its rounds) is what auto runs on one node;
    # across nodes the entry is skipped for the model, which never picks "ticket" itself.
    monkeypatch.setattr(tp_plan, "SHIPPED", "/nonexistent/shipped.json")
    monkeypatch.setenv("TANDEM_TP_TUNE_FILE", str(tmp_path / "tune.json"))
    shape = dict(m=16384, n=8192, k=1024)
    tp_plan.write_table([dict(op="gemm_rs", world=4, sms=32, mode="ticket", comm_blocks=4, ms=2.0, **shape),
                         dict(op="gemm_ar", world=4, sms=32, mode="ticket", comm_blocks=1, ms=3.0, **shape)])
    assert tp_plan.choose("gemm_rs", 4, 32, 16384, 8192, 1024) == ("ticket", 4)
    assert tp_plan.choose("gemm_ar", 4, 32, 16384, 8192, 1024) == ("ticket", 1)
    assert tp_plan.lookup("gemm_rs", 4, 30, 16384, 8192, 1024) == ("ticket", 4)  # a nearby count: rounds as they are
    tp_plan.write_table([dict(op="ag_gemm", world=4, sms=32, mode="ticket", comm_blocks=1, ms=2.0, **shape)])
    assert tp_plan.choose("ag_gemm", 4, 32, 16384, 8192, 1024)[0] != "ticket"  # (a hand-made row: AG has no tickets)
    across = tp_plan.choose("gemm_rs", 4, 32, 16384, 8192, 1024, nodes=2)
    assert across[0] != "ticket" and across == tp_plan.model("gemm_rs", 4, 32, 16384, 8192, 1024, nodes=2,
                                                            pipelined=False)[:2]
    tp = pytest.importorskip("tandem.ops.tp")
    # the launch: the fused kernel, no reduce role, the ticket kernel chosen by the call's own fields
    assert tp.plan_launch_fields(("ticket", 4), 0) == (True, 0, {"ticket": 1, "ticket_rounds": 4})
    assert tp.plan_launch_fields(("ticket", 0), 6) == (True, 0, {"ticket": 1, "ticket_rounds": 1})
    assert tp.plan_launch_fields(("fused", 8), 0) == (True, 8, {})
    assert tp.plan_launch_fields(("fused", 8), 4) == (True, 4, {})  # the caller's comm_blocks first
    assert tp.plan_launch_fields(("unfused", 0), 0) == (False, 0, {})
    assert tp.plan_launch_fields(None, 2) == (None, 2, {})


def test_tune_from_bench_tables_the_ticket_column(tmp_path, monkeypatch):
    # bench tp --ticket's ticket_ms is a candidate like the modes' columns; fastest, it is tabled as mode "ticket"
    # with 1 round (the column ran without rounds)
    from tandem import tune

    monkeypatch.setattr(tp_plan, "SHIPPED", "/nonexistent/shipped.json")
    path = tmp_path / "tp_w4.json"
    rows = [dict(op="gemm_rs", m=16384, n=8192, k=4096, world=4, sm_count=32, fused_ms=4.0, unfused_ms=2.6,
                 pipelined_ms=3.0, ticket_ms=2.1, run={"commit": "abc1234"}),
            dict(op="gemm_ar", m=16384, n=8192, k=4096, world=4, sm_count=32, fused_ms=5.6, unfused_ms=3.4,
                 pipelined_ms=3.7, ticket_ms=5.8, run={"commit": "abc1234"}),
            # 4 rounds recorded: tabled with them; another knob beside it, or a column the kernel did not run: skipped
            dict(op="gemm_rs", m=8192, n=4096, k=8192, world=4, sm_count=32, fused_ms=1.6, unfused_ms=1.3,
                 pipelined_ms=1.4, ticket_ms=1.1, ticket_ran=True, ticket_rounds=4,
                 ticket_knobs={"TANDEM_RS_TICKET_ROUNDS": "4"}, run={"commit": "abc1234"}),
            dict(op="gemm_ar", m=8192, n=4096, k=8192, world=4, sm_count=32, fused_ms=2.1, unfused_ms=1.4,
                 pipelined_ms=1.5, ticket_ms=1.0, ticket_ran=True, ticket_knobs={"TANDEM_RS_ORDER": "common"},
                 run={"commit": "abc1234"}),
            dict(op="gemm_ar", m=2048, n=8192, k=28672, world=4, sm_count=32, fused_ms=3.1, unfused_ms=1.8,
                 pipelined_ms=2.4, ticket_ms=1.0, ticket_ran=False, run={"commit": "abc1234"})]
    path.write_text(json.dumps(rows))
    got = tune.rows_from_bench([str(path)])
    assert [(r["op"], r["mode"], r["comm_blocks"]) for r in got] == [
        ("gemm_rs", "ticket", 1), ("gemm_ar", "unfused", 0), ("gemm_rs", "ticket", 4), ("gemm_ar", "unfused", 0),
        ("gemm_ar", "unfused", 0)]
    assert got[0]["candidates"] == {"fused:0": 4.0, "unfused:0": 2.6, "pipelined:0": 3.0, "ticket:1": 2.1}
    assert "ticket:4" in got[2]["candidates"] and not any("ticket" in c for c in got[3]["candidates"])
    out = str(tmp_path / "table.json")
    assert tune.main(["--from-bench", str(path), "--out", out]) == 0
    monkeypatch.setenv("TANDEM_TP_TUNE_FILE", out)
    assert tp_plan.choose("gemm_rs", 4, 32, 16384, 8192, 1024) == ("ticket", 1)
