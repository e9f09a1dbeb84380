"""MoE dispatch + grouped GEMM and combine (torch.ops.tandem.moe_dispatch_gemm / moe_combine) at world 1, 2, 4 (MPS
ranks) and across emulated nodes, against torch references (routed rows, per-expert matmul, weighted combine)."""

import pytest

pytestmark = pytest.mark.gpu
W = "tests.gpu.workers_moe"

# (routing, k): uniform; one hot expert in every token's first slot; only even experts used (odd ones empty)
CASES = [("uniform", 2), ("skewed", 3), ("empty", 2)]


def _check(res, n_cases):
    for r in res:
        assert len(r) == n_cases, r
        for c in r:
            assert c["wrong_layout"] == 0 and c["wrong_y"] == 0 and c["wrong_out"] == 0, c


@pytest.mark.parametrize("world", [1, 2, 4])
def test_moe_dispatch_gemm_and_combine_match_torch(run_ranks, world):
    # odd token counts that differ per rank, one rank without tokens at world > 1; H 256, I 520 (not a tile
    # multiple), 4 experts per rank
    counts = [37, 0, 53, 129][:world] if world > 1 else [37]
    res = run_ranks(f"{W}:correctness", world, counts=counts, hidden=256, inter=520, epr=4, cases=CASES,
                    dtypes=["bfloat16", "float16"], timeout_s=240)
    _check(res, 2 * len(CASES) * 2)
    assert any(c["received"] > 0 for r in res for c in r)


@pytest.mark.parametrize("world", [2, 4])
def test_moe_repeated_launches_and_cuda_graph(run_ranks, world):
    res = run_ranks(f"{W}:repeat_and_graph", world, counts=[200, 150, 64, 257][:world], hidden=512, inter=256,
                    epr=3, k=4, launches=20, timeout_s=240)
    for r in res:
        assert r["same"] == 20 and r["graph_ok"] == [True, True, True], r


@pytest.mark.parametrize("world", [1, 2])
def test_moe_bad_input_is_rejected_before_launch(run_ranks, world):
    res = run_ranks(f"{W}:rejects", world)
    for r in res:
        assert all(v == 3 for v in r.values()), r


def test_moe_across_emulated_nodes(run_ranks):
    # 2 emulated nodes x 2 ranks: rows for experts on the other node travel through the CPU proxy (TCP)
    res = run_ranks(f"{W}:correctness", 4, ranks_per_node=2, counts=[21, 40, 0, 33], hidden=128, inter=256, epr=2,
                    cases=[("uniform", 2), ("skewed", 2)], timeout_s=240)
    _check(res, 2 * 2)
