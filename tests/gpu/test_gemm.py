"""The Hopper GEMM core (torch.ops.tandem.gemm) against torch on structured and random data."""

import math
import pytest

pytestmark = pytest.mark.gpu
W = "tests.gpu.workers_gemm"


def test_gemm_matches_torch_on_structured_and_random_data(run_ranks):
    shapes = [(128, 256, 64), (1000, 1024, 1000), (257, 520, 1032), (4096, 4096, 4096), (8192, 3584, 512)]
    (res,) = run_ranks(f"{W}:check", 1, shapes=shapes, dtypes=["bfloat16", "float16"])
    assert len(res) == 2 * len(shapes)
    for r in res:
        assert r["wrong"] == 0, r  # exact on structured data: no misplaced row, column or K slice
        assert r["rel"] < 1e-2, r


def test_gemm_is_deterministic_and_graph_capturable(run_ranks):
    (r,) = run_ranks(f"{W}:repeat_and_graph", 1, m=2048, n=2048, k=1024, launches=1000)
    assert r["same"] == r["launches"]
    assert r["graph_ok"]
    assert all(r["swizzle_same"].values()), r
    assert r["swizzle_3"] == 3, r
    assert len(r["raster_same"]) == 6 and all(r["raster_same"].values()), r
    assert r["raster_refused"] == 3, r


def test_threads_calling_one_signature_get_their_own_products(run_ranks):
    # one prepared launcher per signature, shared by threads: each call's addresses must reach its own launch
    (r,) = run_ranks(f"{W}:threads_sharing_a_signature", 1, m=1024, n=1024, k=1024, calls=300)
    assert not r["errors"], r
    assert r["wrong"] == [0, 0], r


def test_gemm_rejects_bad_input_before_launch(run_ranks):
    (r,) = run_ranks(f"{W}:rejects", 1)
    assert all(v == 3 for v in r.values()), r  # INVALID_ARGUMENT, not a launch


def test_arrival_scheduler_waits_for_chunks_and_times_out_cleanly(run_ranks):
    (r,) = run_ranks(f"{W}:arrivals", 1, chunk_rows=512, chunks=4, n=1024, k=1024, hold_s=0.3)
    assert not r["done_early"] and r["waited_ms"] > 250, r  # no tile before its chunk arrived
    assert r["wrong"] == 0, r
    assert r["err"] is not None and r["err"]["status_name"] == "timeout" and r["err"]["op"] == "wait_until", r
    assert r["timeout_elapsed"] < 2.0 + 3.0, r  # bounded by the communicator timeout, no hang


def _cluster_ctas(variant: str) -> int:
    """CTAs in a variant's cluster, from its name's last part ("_c2": 2, "_c1x2": 2, "_c4x2": 8)."""
    return math.prod(int(v) for v in variant.rsplit("_c", 1)[1].split("x"))


def test_gemm_variants_match_torch(run_ranks):
    # The measurement configurations (tools/diag/gemm_mps.py) must compute the same product as the core before
    # their timings mean anything: structured data exactly, random data within bf16 rounding; ragged shapes and
    # persistent grids of 2, 32 (a world-4 MPS share) and the whole GPU (0).
    shapes = [(128, 256, 64), (1000, 1024, 1000), (257, 520, 1032), (4096, 2048, 1024)]
    # The split-K / stream-K ones sum fp32 partial tiles in the workspace (filled with garbage first: run() must
    # zero what it relies on); structured data keeps every partial sum exact, so they too must match exactly, and a
    # rerun must give the same bits (the deterministic reduction).
    from tandem.ops import gemm_plan

    (r,) = run_ranks(f"{W}:variants", 1, shapes=shapes, sm_counts=[2, 32, 0])
    # every configuration of gemm_variants_sm90.cu (the planner names exactly those: test_gemm_plan.py), the
    # swapped ones (D^T = B^T A^T) with ragged M among them
    assert len(r["rows"]) == len(gemm_plan.CONFIGS) * len(shapes) * 3
    for row in r["rows"]:
        if row["sm_count"] and row["sm_count"] < _cluster_ctas(row["variant"]):
            # a grid smaller than one cluster: refused before any launch, as the caller's error (3), naming it
            assert row["err"] and row["err"][0] == 3 and "cluster" in row["err"][1], row
            continue
        assert not row["err"], row
        assert row["wrong"] == 0, row
        assert row["rel"] < 1e-2, row
        assert row["rerun_same"], row
    # leading dimensions past the row length: the same product, and D's padding untouched, in every configuration
    assert len(r["strided"]) == len(gemm_plan.CONFIGS)
    for row in r["strided"]:
        assert not row["err"] and row["wrong"] == 0 and row["pad_written"] == 0, row
    # refusals raise TandemError with the launcher's status: INVALID_ARGUMENT (3), not a CUDA failure (5)
    assert r["unknown"][0] == 3 and "unknown GEMM variant" in r["unknown"][1], r["unknown"]
    assert r["no_workspace"][0] == 3 and "workspace" in r["no_workspace"][1], r["no_workspace"]


def test_scaled_gemm_matches_torch_scaled_mm(run_ranks):
    # FP8 e4m3 with tensor-wise and row-wise scales, bf16 out: exact on structured data (a misplaced row, column,
    # K slice or scale changes values), and on random data as close to fp64 as torch._scaled_mm is
    shapes = [(128, 128, 128), (1000, 1024, 1008), (257, 528, 1040), (4096, 4096, 4096), (100, 8192, 2048)]
    (res,) = run_ranks(f"{W}:scaled", 1, shapes=shapes)
    assert len(res) == 2 * len(shapes)
    for r in res:
        assert r["wrong"] == 0, r
        assert r["rel_vs_fp64"] < 2 * r["scaled_mm_rel_vs_fp64"] + 1e-3, r
        assert r["rel_vs_scaled_mm"] < 1e-2, r


def test_every_scaled_gemm_configuration_matches(run_ranks):
    # The FP8 configurations the op may choose (cooperative 128x128 in 2x1 / 1x1 / 1x2 clusters, ping-pong 64x128,
    # split-K in 2 and stream-K, cooperative 128x192 in 2x1 / 1x1 clusters, ping-pong 64x192): exact on structured
    # data (every partial sum exact in fp32, so the split ones too), within bf16 rounding of torch._scaled_mm on
    # random data, the same bits on a rerun; ragged M and N (no N here is a multiple of 192), small M
    from tandem.ops import gemm_plan

    shapes = [(128, 128, 128), (257, 528, 1040), (64, 4096, 8192), (1000, 1024, 2048)]
    (r,) = run_ranks(f"{W}:scaled_configs", 1, shapes=shapes)
    assert len(r["rows"]) == len(gemm_plan.SCALED_CONFIGS) * 2 * len(shapes)
    wide = []
    for row in r["rows"]:
        assert row["wrong"] == 0, row
        assert row["rel_vs_scaled_mm"] < 1e-2, row
        assert row["rerun_same"], row
        # the unsplit configurations promote and sum each element's K loop in the same order. The 128-wide ones run
        # the default's wgmma (m64n128k32): the same bits. The 192-wide ones run m64n192k32, and no document says
        # that a wider wgmma sums an element's k32 products in the same order: they are held to one bf16 rounding
        # step of the default (relative to the output's largest magnitude; a misplaced or dropped product is far
        # more, and the structured data above is exact), and the rows record whether they were identical
        if row["split"]:
            continue
        if gemm_plan.SCALED_CONFIGS[row["config"]][1] == 192:
            assert row["same_as_core"] or row["max_rel_vs_core"] <= 2.0 ** -7, row
            wide.append(row["same_as_core"])
        else:
            assert row["same_as_core"], row
    assert wide, "no 192-wide configuration ran"
    print(f"192-wide configurations bit-identical to the default at {sum(wide)} of {len(wide)} rows")
    assert r["refused"] == 3 and r["refused_swizzle"] == 3 and r["refused_raster"] == 3, r
    # every configuration with two other tile schedules: exact on structured data, and where unsplit the bits of
    # its default schedule on random data (a stream-K split may cut K elsewhere when the walk changes)
    assert len(r["schedules"]) == len(gemm_plan.SCALED_CONFIGS) * 2 * 2 * len(shapes)
    for row in r["schedules"]:
        assert row["wrong"] == 0, row
        assert row["split"] or row["same_bits"], row


def test_scaled_gemm_is_deterministic_and_graph_capturable(run_ranks):
    (r,) = run_ranks(f"{W}:scaled_repeat_and_graph", 1, m=2048, n=2048, k=1024, launches=200)
    assert r["same"] == r["launches"] and r["graph_ok"], r


def test_scaled_gemm_rejects_bad_input_before_launch(run_ranks):
    (r,) = run_ranks(f"{W}:scaled_rejects", 1)
    assert all(v == 3 for v in r.values()), r  # INVALID_ARGUMENT, not a launch


def test_gemm_op_runs_every_configuration_it_may_choose(run_ranks):
    shapes = [(1000, 1024, 1000), (257, 520, 1032), (4096, 2048, 1024)]
    from tandem.ops import gemm_plan

    (r,) = run_ranks(f"{W}:op_variants", 1, shapes=shapes)
    # every configuration with three tile schedules, then the op
    assert len(r["rows"]) == (len(gemm_plan.CONFIGS) * 3 + 1) * len(shapes)
    for row in r["rows"]:
        assert row["wrong"] == 0 and row["same"], row
    assert r["refused"] == {"unknown": 3, "fp16 variant": 3}, r


def test_gemm_ops_through_their_cpp_dispatcher_kernels(run_ranks):
    # torch.ops.tandem.gemm / scaled_gemm's C++ kernels for torch's CUDA key (tandem.ops._dispatcher; built by the
    # package build where torch is importable, or tools/build_torch_ops.sh, as tools/device_suite.sh does): a
    # signature's first call plans through Python, later calls do not. Same bits as the Python implementation;
    # bad input is TandemError INVALID_ARGUMENT on a signature's first call and on a cached one (a misaligned view)
    shapes = [(128, 256, 64), (1000, 1024, 1000), (257, 520, 1032), (777, 4104, 4096)]
    (r,) = run_ranks(f"{W}:cpp_path", 1, shapes=shapes)
    if "rows" not in r:
        pytest.skip(f"the C++ dispatcher kernels are not installed here: {r['path']}")
    assert r["path"].startswith("C++"), r["path"]
    assert len(r["rows"]) == 4 * len(shapes)
    for row in r["rows"]:
        assert row["same_as_python"] and row["same_again"], row
        assert row["rel"] < 1e-2, row
    assert r["errors"] and all(v == 3 for v in r["errors"].values()), r["errors"]
    assert r["graph_same"], r
