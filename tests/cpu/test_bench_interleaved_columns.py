"""common.time_columns_ms: bench tp's columns timed interleaved in rounds (the order rotated every round), so that
drift during a run falls on every column alike; failures reported once and the column None from then on (CPU: a
fake sampler stands in for the CUDA-event timing)."""

from __future__ import annotations

import types

import pytest

common = pytest.importorskip("tandem.bench.common")


def drifting_sampler(order, base):
    """A sampler whose every timing is 1 % slower than the one before (a GPU drifting through the run); a column's
    true time is base[name]. It records (column, warmup, reps) of each call."""
    state = {"n": 0}

    def sample(fn, warmup, reps):
        name = fn()
        order.append((name, warmup, reps))
        out = []
        for _ in range(reps):
            out.append(base[name] * (1.0 + 0.01 * state["n"]))
            state["n"] += 1
        return out

    return sample


def comm(rank=0):
    return types.SimpleNamespace(rank=rank, barrier=lambda: None)


def columns(names):
    return {n: (lambda n=n: n) for n in names}


def test_rounds_rotate_the_order_and_split_the_reps():
    order = []
    base = {"a": 1.0, "b": 1.0, "c": 1.0}
    ms, spread = common.time_columns_ms(comm(), columns("abc"), warmup=3, reps=5, rounds=3,
                                        sampler=drifting_sampler(order, base))
    assert [o[0] for o in order] == list("abc" "bca" "cab")
    assert [o[1] for o in order] == [3, 3, 3, 1, 1, 1, 1, 1, 1]  # full warm-up before a column's first round only
    assert all(o[2] == 2 for o in order)  # ceil(5 / 3) timings a round
    assert set(ms) == set("abc") and all(v is not None for v in ms.values())
    assert all(s >= 1.0 for s in spread.values())


def test_interleaving_removes_most_of_the_drift_between_identical_columns():
    names = ["x", "y", "z", "w"]
    base = {n: 2.0 for n in names}
    blocked, _ = common.time_columns_ms(comm(), columns(names), warmup=0, reps=8, rounds=1,
                                        sampler=drifting_sampler([], base))
    mixed, spread = common.time_columns_ms(comm(), columns(names), warmup=0, reps=8, rounds=4,
                                           sampler=drifting_sampler([], base))

    def gap(t):
        return max(t.values()) / min(t.values())

    # one block each: the last column carries 3 x 8 timings of drift (about 1.28x the first); in rounds the
    # columns share it
    assert gap(blocked) > 1.2
    assert gap(mixed) < 1.06
    assert all(spread[n] > 1.0 for n in names)  # the drift shows in each column's spread


def test_a_failing_column_is_reported_once_and_is_none():
    logs = []
    calls = {"bad": 0}

    def bad():
        calls["bad"] += 1
        raise RuntimeError("refused: shape not supported\nmore detail")

    def sampler(fn, warmup, reps):
        fn()
        return [0.001] * reps

    cols = {"ok": lambda: None, "bad": bad}
    ms, spread = common.time_columns_ms(comm(), cols, warmup=1, reps=3, rounds=3, sampler=sampler, log=logs.append)
    assert ms["bad"] is None and spread["bad"] is None
    assert ms["ok"] == pytest.approx(1.0)
    assert calls["bad"] == 1  # not retried in later rounds: every rank skips it alike
    assert logs == ["  skipped bad: refused: shape not supported"]
    # only rank 0 prints
    logs.clear()
    common.time_columns_ms(comm(rank=1), dict(cols), warmup=1, reps=3, rounds=2, sampler=sampler, log=logs.append)
    assert logs == []


def test_inner_columns_reach_launch_samples_with_their_back_to_back_calls(monkeypatch):
    # the default sampler: launch_samples with each column's `inner` (bench gemm's *_inner20 columns), in a single
    # process (common.SINGLE: rank 0, no barrier)
    seen = []

    def fake_samples(fn, *, warmup, reps, inner=1):
        seen.append((fn(), warmup, reps, inner))
        return [0.002 * inner] * reps

    monkeypatch.setattr(common, "launch_samples", fake_samples)
    ms, _ = common.time_columns_ms(common.SINGLE, {"one": lambda: "one", "twenty": lambda: "twenty"}, warmup=5,
                                   reps=4, rounds=2, inner={"twenty": 20})
    assert seen == [("one", 5, 2, 1), ("twenty", 5, 2, 20), ("twenty", 1, 2, 20), ("one", 1, 2, 1)]
    assert ms == {"one": pytest.approx(2.0), "twenty": pytest.approx(40.0)}
