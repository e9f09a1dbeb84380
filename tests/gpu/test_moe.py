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


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_moe_dispatch_gemm_and_combine_match_torch(run_ranks, world):
    # odd token counts that differ per rank, one rank without tokens at world > 1; H 256, I 520 (not a tile
    # multiple), 4 experts per rank
    counts = [37, 0, 53, 129][:world] if world > 1 else [37]
    res = run_ranks(f"{W}:correctness", world, counts=counts, hidden=256, inter=520, epr=4, cases=CASES,
                    dtypes=["bfloat16", "float16"], timeout_s=240)
    _check(res, 2 * len(CASES) * 2)
    assert any(c["received"] > 0 for r in res for c in r)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_moe_gemm_alone_in_1x1_clusters_matches_torch_and_the_default(run_ranks, world):
    # TANDEM_MOE_GEMM_CLUSTER=1: the unfused path's grouped GEMM in 1x1 clusters, raster along M. Experts of 0 rows
    # ("empty"), of under 128 (one row tile: the case it is for) and of several row tiles (the skewed expert 0:
    # every token of every rank, up to 3 x 300 rows), N = 520 (a partial column tile); exact data against the torch
    # reference, random data bit for bit against the 2x1 kernel (same tile and K order)
    # ("empty_first": only odd experts routed, so local expert 0, the first group, has no rows on every rank)
    cases = CASES + [("empty_first", 2)]
    counts = [300, 0, 257, 129][:world] if world > 1 else [300]
    res = run_ranks(f"{W}:gemm_cluster1", world, counts=counts, hidden=256, inter=520, epr=4, cases=cases,
                    dtypes=["bfloat16", "float16"], timeout_s=240)
    for r in res:
        assert len(r) == 2 * len(cases), r
        for c in r:
            assert c["wrong_layout"] == 0 and c["wrong_y"] == 0 and c["wrong_out"] == 0, c
            assert c["ran_rows"] == 1 and c["random_rows"] == 1 and c["default_rows"] == 2, c
            # (the 1x1 output's block was NaN-filled before the call: a missed tile is not finite)
            assert c["layouts_equal"] and c["random_finite"] and c["random_differ"] == 0, c
            if c["kind"] == "empty_first":
                assert c["expert0_rows"] == 0, c
    # some expert spans more than two row tiles (skewed: expert 0 gets every token's slot 0 of every rank)
    assert any(c["max_expert_rows"] > 256 for r in res for c in r)


# (world, nodes): worlds 1-4 on one node, and world 4 as 2 emulated nodes (the proxy path)
@pytest.mark.parametrize("world,nodes", [(1, 1), (2, 1), (3, 1), (4, 1), (4, 2)])
def test_moe_dispatch_sends_a_token_once_per_rank(run_ranks, world, nodes):
    # TANDEM_MOE_DEDUP=1 (issue 26 item 2): the unfused dispatch + GEMM and the dispatch alone send each token once
    # per destination rank; k = 3 of 4 experts a rank routes most tokens to a rank twice or more. Exact data against
    # the torch reference (layout, y, combine; the received rows), and the rows put = the distinct (token, rank)
    # pairs (fewer than the (token, slot) pairs). The fused kernel sends per expert either way: still exact, and
    # it puts no unique rows. Every (rank, token) row is distinct and each launch's data new (_X_SALT): a row from
    # the wrong token, rank or launch shows; unfused three times in a row, then fused and unfused on the same
    # workspace. nodes 2: 2 emulated nodes (the proxy path, TCP), world 4 only.
    counts = [37, 0, 53, 129][:world] if world > 1 else [37]
    cases = [("uniform", 3), ("skewed", 3), ("empty", 2)]
    res = run_ranks(f"{W}:dedup", world, counts=counts, hidden=256, inter=520, epr=4, cases=cases,
                    dtypes=["bfloat16", "float16"], timeout_s=300, **({"ranks_per_node": 2} if nodes == 2 else {}))
    for r in res:
        assert len(r) == 2 * len(cases) * 6, r
        for c in r:
            if c["mode"] == "dispatch":
                assert c["wrong_rows"] == 0 and c["sent"] == c["want_sent"], c
            else:
                assert c["wrong_layout"] == 0 and c["wrong_y"] == 0 and c["wrong_out"] == 0, c
                assert c["sent"] == (c["want_sent"] if c["mode"] == "unfused" else 0), c
    # the dedup did send fewer rows than pairs somewhere (uniform k = 3 over 4 experts a rank)
    assert any(c["mode"] == "unfused" and c["sent"] < c["pairs"] for r in res for c in r)


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


@pytest.mark.parametrize("world", [2, 4])
def test_moe_duplicate_experts_and_max_tokens_that_differ_are_refused(run_ranks, world):
    # issue 20 point 3: the same expert twice in a token's top-k is refused before launch (one host sync, shared
    # with the id range check); max_tokens that differ between ranks (given, or the default: the token count) are
    # refused on every rank, naming each rank's key; afterwards an agreed call still matches torch
    timeout_s = 8
    res = run_ranks(f"{W}:disagree", world, comm_timeout_s=timeout_s, timeout_s=180)
    for r, out in enumerate(res):
        for name in ("duplicate_all", "duplicate_one", "duplicate_unfused"):
            c = out[name]
            assert c["raised"] and c["status"] == 3, (r, name, c)
            assert c["message"].startswith("tandem: moe_dispatch_gemm: the same expert twice in one token's top-k, in "), c
        assert "in 16 of 16 tokens (token 0: [0, 0])" in out["duplicate_all"]["message"], out["duplicate_all"]
        assert "in 1 of 16 tokens (token 5: [1, 1])" in out["duplicate_one"]["message"], out["duplicate_one"]
        others = "rank 1 has" if world == 2 else "ranks 1, 2, 3 have"
        for name in ("max_tokens", "max_tokens_unfused"):
            c = out[name]
            assert c["raised"] and c["status"] == 3 and c["seconds"] < timeout_s, (r, name, c)
            assert c["message"].startswith(f"tandem: rank {r}: moe_dispatch_gemm: ranks disagree: rank 0 has "
                                           "(op=moe_dispatch_gemm, max_tokens=32, "), c
            assert f", {others} (op=moe_dispatch_gemm, max_tokens=64, " in c["message"], c
        c = out["default_max_tokens"]
        assert c["raised"] and c["status"] == 3 and "ranks disagree" in c["message"], (r, c)
        assert "max_tokens=16" in c["message"] and "max_tokens=24" in c["message"], c
        a = out["agreed_after"]
        assert a["wrong_layout"] == 0 and a["wrong_y"] == 0 and a["wrong_out"] == 0, a


@pytest.mark.parametrize("mode", ["fused", "unfused"])
def test_moe_kernel_refuses_a_receive_capacity_overrun(run_ranks, mode):
    # the host check skipped (as under graph capture): duplicates that would send rank 0 twice its receive capacity.
    # The kernel sends nothing, leaves every layout empty and reports INVALID_ARGUMENT on every rank, at once
    timeout_s = 8
    res = run_ranks(f"{W}:capacity_guard", 2, comm_timeout_s=timeout_s, mode=mode, timeout_s=120)
    for r, c in enumerate(res):
        assert c["raised"] and c["status"] == 3, (r, c)
        assert c["received"] == 0 and c["capacity"] == 32, (r, c)
        assert c["seconds"] < timeout_s, (r, c)


@pytest.mark.parametrize("world", [2, 4])
def test_moe_combine_does_not_wait_for_a_late_block(run_ranks, world):
    # Rank 1's combine blocks from index 1 start 3 s late (TANDEM_MOE_COMBINE_LATE), past the 2 s communicator
    # timeout: as if they had no SM (issue 26, item 3). Its block 0 claims and sends every row, so no rank's wait
    # for done[] times out and every output is right; rank 0 is done before rank 1's late blocks start. (With a
    # fixed share of rows per block, rank 0 timed out waiting for rank 1's rows.)
    timeout_s = 2
    res = run_ranks(f"{W}:late_combine", world, counts=[37, 64, 53, 129][:world], hidden=256, inter=136, epr=2,
                    comm_timeout_s=timeout_s, rank_env={1: {"TANDEM_MOE_COMBINE_LATE": "1:3000000"}}, timeout_s=180)
    for r, c in enumerate(res):
        assert not c["raised"], (r, c)
        assert c["wrong_y"] == 0 and c["wrong_layout"] == 0 and c["wrong_out"] == 0 and c["received"] > 0, (r, c)
        assert c["late"] == ("1:3000000" if r == 1 else None), (r, c)
    assert res[1]["seconds"] >= 3.0, res[1]  # the hold took effect: rank 1 waited for its own late blocks
    assert res[0]["seconds"] < 3.0, res[0]  # rank 0 did not


@pytest.mark.parametrize("world,mode", [(2, "fused"), (4, "fused"), (2, "unfused")])
def test_moe_dispatch_does_not_wait_for_a_late_block(run_ranks, world, mode):
    # Rank 1's dispatch blocks from index 1 start 3 s late (TANDEM_MOE_DISPATCH_LATE), past the 2 s communicator
    # timeout: as if MPS had not given them an SM (issue 26, item 3). Block 0 runs: it is elected (counts, layout),
    # joins as a sender and claims every chunk of rows, so no peer's GEMM (fused) or arrival wait times out and every
    # rank's y and layout are right; rank 0 is done before rank 1's late blocks start. (With the dispatch as the
    # first comm_blocks blocks, each sending a fixed share, rank 0 waited for the late blocks' rows until the timeout.)
    timeout_s = 2
    # rank 1: 1024 tokens x 2 slots = 64 chunks of 32 pairs, more than block 0's 12 warps take in one round: a static
    # share would leave chunks to the held blocks
    res = run_ranks(f"{W}:late_dispatch", world, counts=[37, 1024, 53, 129][:world], hidden=256, inter=136, epr=2,
                    comm_timeout_s=timeout_s, mode=mode, rank_env={1: {"TANDEM_MOE_DISPATCH_LATE": "1:3000000"}},
                    timeout_s=180)
    for r, c in enumerate(res):
        assert not c["raised"], (r, c)
        assert c["wrong_y"] == 0 and c["wrong_layout"] == 0 and c["received"] > 0, (r, c)
        assert c["late"] == ("1:3000000" if r == 1 else None), (r, c)
    assert res[1]["seconds"] >= 3.0, res[1]  # the hold took effect: rank 1 waited for its own late blocks
    assert res[0]["seconds"] < 3.0, res[0]  # rank 0 did not


# The whole layer (issue 26; the unfused chain: dispatch + GEMM 1, SwiGLU, torch._grouped_mm for GEMM 2, combine)
# against the layer on one device with every expert in fp32. Bound, relative Frobenius: four bf16 roundings in a
# chain (y, the activation, z, the output) give a few x 2^-8 in norm; 2e-2 fails on a misrouted row (order one).
# gemm2 None: the op's default plan (moe_layer._gemm2_plan), which these shapes put on tandem's GEMMs in 1x1 clusters
# (an expert expects max_tokens x k / 4 <= 97 rows); "torch": torch._grouped_mm for GEMM 2 (GEMM 1 then 2x1).
@pytest.mark.parametrize("gemm2", [None, "torch"])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_moe_ffn_matches_the_layer_on_one_device(run_ranks, world, gemm2):
    counts = [37, 0, 53, 129][:world] if world > 1 else [37]
    res = run_ranks(f"{W}:ffn", world, counts=counts, hidden=256, inter=136, epr=4, gemm2=gemm2,
                    cluster=None if gemm2 is None else 2,
                    cases=[("uniform", 2), ("skewed", 3), ("empty", 2)], timeout_s=240)
    for r in res:
        for c in r["cases"]:
            assert c["finite"] and c["rel"] < 2e-2, c
            # GEMM 1's unfused kernel (world 1 runs the fused kernel, always 2x1, which leaves the record at 0)
            want_gemm1 = 0 if world == 1 else (1 if gemm2 is None else 2)
            assert c["gemm1_cluster_rows"] == want_gemm1, c
            if gemm2 is None:  # the default plan: GEMM 2 by tandem in 1x1 clusters
                assert c["last_cluster_rows"] == 1, c
            else:
                assert c["last_cluster_rows"] == 0, c
    for r in res:  # after the cases: a CUDA graph replay with new inputs equals eager
        assert r["graph_error"] is None and r["graph_same"], r


# The default plan above one row tile an expert: max_tokens 300 with k = 3 of 4 experts a rank at world 2 expects
# 225 rows an expert: GEMM 1 in 2x1 clusters, GEMM 2 by torch (no GroupedGemmArgs launch in the process)
def test_moe_ffn_default_plan_keeps_2x1_and_torch_above_one_row_tile(run_ranks):
    res = run_ranks(f"{W}:ffn", 2, counts=[300, 211], hidden=256, inter=136, epr=4,
                    cases=[("uniform", 3), ("skewed", 3)], timeout_s=240)
    for r in res:
        for c in r["cases"]:
            assert c["finite"] and c["rel"] < 2e-2, c
            assert c["gemm1_cluster_rows"] == 2 and c["last_cluster_rows"] == 0, c


def test_moe_grouped_gemm_rows_matches_torch_in_both_cluster_shapes(run_ranks):
    # tandem's grouped GEMM as its own launch (moe.h: GroupedGemmArgs; moe_ffn's GEMM 2 with TANDEM_MOE_GEMM2=tandem):
    # experts of 0 to 300 rows with unused rows between them, bit-exact against torch per expert, 2x1 and 1x1
    res = run_ranks(f"{W}:grouped_rows", 1, dtypes=["bfloat16", "float16"], timeout_s=120)
    for c in res[0]:
        assert c["wrong"] == 0 and c["differ"] == 0 and c["nonfinite"] == 0 and c["ran"] == [2, 1], c
        assert c["gaps_written"] == 0, c  # rows outside every expert are not written


# moe_ffn with GEMM 2 by tandem's grouped GEMM (TANDEM_MOE_GEMM2=tandem) in 2x1 and 1x1 clusters (the 1x1 knob also
# takes GEMM 1's unfused kernel): the same bound as the default chain
@pytest.mark.parametrize("cluster", [2, 1])
@pytest.mark.parametrize("world", [1, 2, 4])
def test_moe_ffn_with_tandems_gemm2_matches_the_layer_on_one_device(run_ranks, world, cluster):
    counts = [37, 0, 53, 129][:world] if world > 1 else [37]
    res = run_ranks(f"{W}:ffn", world, counts=counts, hidden=256, inter=136, epr=4, gemm2="tandem", cluster=cluster,
                    cases=[("uniform", 2), ("skewed", 3), ("empty", 2)], timeout_s=240)
    for r in res:
        for c in r["cases"]:
            assert c["finite"] and c["rel"] < 2e-2, c
            # GEMM 2 ran as tandem's GroupedGemmArgs launch (its own record, apart from GEMM 1's kernel), in the
            # clusters the knob names (a rank without tokens still runs it on the rows it received)
            assert c["last_cluster_rows"] == cluster, c
    for r in res:
        assert r["graph_error"] is None and r["graph_same"], r


# The same layer with GEMM 1 by the dispatch alone and torch._grouped_mm (moe_layer._GEMM1 = "torch", the issue-26
# alternative to tandem's grouped GEMM whose tiles pad every expert to 256 rows); the same bound as above.
@pytest.mark.parametrize("world", [1, 2, 4])
def test_moe_ffn_with_torchs_gemm1_matches_the_layer_on_one_device(run_ranks, world):
    counts = [37, 0, 53, 129][:world] if world > 1 else [37]
    res = run_ranks(f"{W}:ffn", world, counts=counts, hidden=256, inter=136, epr=4,
                    cases=[("uniform", 2), ("skewed", 3), ("empty", 2)], gemm1="torch", timeout_s=240)
    for r in res:
        for c in r["cases"]:
            assert c["finite"] and c["rel"] < 2e-2, c
    for r in res:
        assert r["graph_error"] is None and r["graph_same"], r


# The SwiGLU kernel between the two GEMMs (moe.h: SwigluArgs): the same bits as torch's silu(gate.float()) * up on
# the received rows, nothing written past them; received counts of none, some, all, and more than the capacity
# (clamped) or negative (none); inter a multiple of 8 but not of 16; bf16 and fp16.
def test_moe_swiglu_kernel_matches_torch_on_the_received_rows(run_ranks):
    cases = [(64, 136, 0, "bfloat16"), (64, 136, 37, "bfloat16"), (300, 1024, 300, "bfloat16"),
             (300, 1024, 5000, "bfloat16"), (300, 1024, -3, "bfloat16"), (257, 2048, 200, "float16")]
    (res,) = run_ranks(f"{W}:swiglu_kernel", 1, cases=cases)
    assert len(res) == len(cases)
    for r in res:
        assert r["differ"] == 0 and r["tail_written"] == 0 and r["op_differ"] == 0, r


# The layer's backward (issue 26 item 4: moe_ffn's registered autograd, tandem.ops.moe_backward): dx, d topk_weights,
# dW1 and dW2 against torch autograd of the fp32 reference on the gathered problem. Bound, relative Frobenius: the
# backward rounds y, a, dz, dy and dxr to bf16 and sums dx once in fp32 (the CPU run of the same schedule in bf16,
# tests/cpu/test_moe_ffn_backward.py, gives 2-5e-3); 2e-2 fails on a wrong row, slot or weight (order one). Then
# the same through torch.compile(fullgraph=True) and torch.utils.checkpoint.
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_moe_ffn_backward_matches_autograd(run_ranks, world):
    counts = [37, 0, 53, 129][:world] if world > 1 else [37]
    res = run_ranks(f"{W}:ffn_backward", world, counts=counts, hidden=256, inter=136, epr=4,
                    cases=[("uniform", 2), ("skewed", 3), ("empty", 2), ("uniform", 1)], timeout_s=420)
    for r in res:
        for c in r["cases"]:
            assert all(c["finite"]) and max(c["rel"]) < 2e-2, c
            assert c["dtypes"] == ["torch.bfloat16", "torch.float32", "torch.bfloat16", "torch.bfloat16"], c
        assert r["compile_error"] is None and max(r["compile_rel"]) < 2e-2, r
        assert r["checkpoint_error"] is None and max(r["checkpoint_rel"]) < 2e-2, r
        # frozen experts (w1, w2 or both without requires_grad): the weights' GEMMs skipped, nothing else changed
        for which, f in r["frozen"].items():
            assert f["same_dx"] and f["same_dw"] and f["same_kept"], (which, f)
            assert f["none"] == ["w1" in which, "w2" in which], (which, f)
