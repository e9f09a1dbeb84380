"""AllGather+GEMM, GEMM+ReduceScatter and GEMM+AllReduce (torch.ops.tandem.ag_gemm / gemm_rs / gemm_ar) at world
1, 2, 4 (MPS ranks)."""

import pytest

pytestmark = pytest.mark.gpu
W = "tests.gpu.workers_tp"

# (M_local, N, K); 100: not a tile multiple; 1024 x 4096: enough tiles for the full persistent grid (every SM busy)
AG_SHAPES = [(256, 1024, 1024), (512, 520, 1032), (100, 256, 512), (1024, 4096, 1024)]
RS_SHAPES = [(256, 1024, 1024), (300, 520, 1032), (1024, 4096, 1024)]  # (M / world, N, K_local); AR too


@pytest.mark.parametrize("world", [1, 2, 4])
def test_ag_gemm_and_gemm_rs_match_torch(run_ranks, world):
    res = run_ranks(f"{W}:correctness", world, ag_shapes=AG_SHAPES, rs_shapes=RS_SHAPES,
                    dtypes=["bfloat16", "float16"], modes=["auto", "fused", "unfused"], timeout_s=300)
    for r in res:
        assert len(r["ag"]) == 2 * (2 * 3 * 4 - 2) and len(r["rs"]) == 2 * 3 * 3 and len(r["ar"]) == 2 * 3 * 3 * 2
        for c in r["ag"]:
            assert c["wrong"] == 0 and c["gathered_wrong"] == 0, c
        for c in r["rs"]:
            assert c["wrong"] == 0, c  # bit-exact against the kernel's own summation order
            assert c["rel"] < 1e-2, c  # and close to the exact fp32 sum
        for c in r["ar"]:
            assert c["wrong"] == 0 and c["rel"] < 1e-2 and c["rows"] == c["shape"][0], c
    # all-reduce: every rank holds the same bytes, case by case
    for i in range(len(res[0]["ar"])):
        assert len({r["ar"][i]["digest"] for r in res}) == 1, (i, [r["ar"][i] for r in res])
        if world > 1:
            assert r["fused_ragged"] == 3  # the fused kernel refuses M_local % 256 != 0 with a clear error


@pytest.mark.parametrize("world", [2, 4])
def test_1000_launches_identical_and_cuda_graph_replay(run_ranks, world):
    res = run_ranks(f"{W}:repeat_and_graph", world, launches=1000, m_local=256, n=512, k=512, timeout_s=300)
    for r in res:
        assert r["same_ag"] == 1000 and r["same_rs"] == 1000 and r["same_ar"] == 1000 and r["same_ar1"] == 1000, r
        assert r["ag_ok"] and r["rs_ok"] and r["ar_ok"], r
        assert r["graph_ok"] == [True, True, True], r
    assert len({r["ar_digest"] for r in res}) == 1


@pytest.mark.parametrize("world", [1, 2])
def test_bad_input_is_rejected_before_launch(run_ranks, world):
    res = run_ranks(f"{W}:rejects", world)
    for r in res:
        assert all(v == 3 for v in r.values()), r


@pytest.mark.parametrize("ranks_per_node", [2, 1])
def test_tp_ops_across_emulated_nodes(run_ranks, ranks_per_node):
    # world 4 as 2 nodes x 2 ranks, and as 4 nodes x 1 rank: traffic between nodes goes through the CPU proxy (TCP)
    res = run_ranks(f"{W}:emulated_nodes", 4, ranks_per_node=ranks_per_node,
                    ag_shapes=[(256, 512, 512), (512, 1024, 2048)],
                    rs_shapes=[(256, 512, 1024), (300, 520, 1032)], launches=20, timeout_s=240)
    for r in res:
        assert r["has_proxy"] and r["num_nodes"] == 4 // ranks_per_node, r
        assert r["ranks_per_node"] == ranks_per_node, r
        assert len(r["ag"]) == 4 and len(r["rs"]) == 4 and len(r["ar"]) == 4, r
        for c in r["ag"]:
            assert c["wrong"] == 0 and c["gathered_wrong"] == 0, c
        for c in r["rs"] + r["ar"]:
            assert c["wrong"] == 0 and c["rel"] < 1e-2, c
        assert r["repeat_same"] == dict(rs=20, ar=20, ag=20), r
        assert r["one_shot_refused"] == 3, r
    for i in range(4):  # every rank holds the same all-reduced bytes
        assert len({r["ar"][i]["digest"] for r in res}) == 1, i
