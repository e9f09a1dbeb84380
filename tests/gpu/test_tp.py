"""AllGather+GEMM, GEMM+ReduceScatter and GEMM+AllReduce (torch.ops.tandem.ag_gemm / gemm_rs / gemm_ar) at world
1, 2, 4 (MPS ranks)."""

import pytest

pytestmark = pytest.mark.gpu
W = "tests.gpu.workers_tp"

# (M_local, N, K); 100: not a multiple of 8 (unfused only); 8, 136, 1000: multiples of 8 but not of the 128-row
# tile, so tiles straddle chunks and the last tile is partial (fused too); 1024 x 4096: enough tiles for the full
# persistent grid (every SM busy)
AG_SHAPES = [(256, 1024, 1024), (512, 520, 1032), (100, 256, 512), (1024, 4096, 1024), (8, 256, 512),
             (136, 520, 1032), (1000, 1024, 512)]
RS_SHAPES = [(256, 1024, 1024), (300, 520, 1032), (1024, 4096, 1024)]  # (M / world, N, K_local); AR too


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ag_gemm_and_gemm_rs_match_torch(run_ranks, world):
    res = run_ranks(f"{W}:correctness", world, ag_shapes=AG_SHAPES, rs_shapes=RS_SHAPES,
                    dtypes=["bfloat16", "float16"], modes=["auto", "fused", "unfused"], timeout_s=300)
    for r in res:
        assert len(r["ag"]) == 2 * (2 * 3 * len(AG_SHAPES) - 2) and len(r["rs"]) == 2 * 3 * 3 and len(r["ar"]) == 2 * 3 * 3 * 2
        for c in r["ag"]:
            assert c["wrong"] == 0 and c["gathered_wrong"] == 0, repr(c)
        for c in r["rs"]:
            assert c["wrong"] == 0, c  # bit-exact against the kernel's own summation order
            assert c["rel"] < 1e-2, c  # and close to the exact fp32 sum
        for c in r["ar"]:
            assert c["wrong"] == 0 and c["rel"] < 1e-2 and c["rows"] == c["shape"][0], c
    # all-reduce: every rank holds the same bytes, case by case
    for i in range(len(res[0]["ar"])):
        assert len({r["ar"][i]["digest"] for r in res}) == 1, (i, [r["ar"][i] for r in res])
        if world > 1:
            assert r["fused_ragged"] == 3  # the fused kernel refuses M_local % 8 != 0 with a clear error


@pytest.mark.parametrize("world", [2, 3, 4])
def test_fused_gemm_rs_and_ar_in_pieces_match_torch(run_ranks, world):
    # TANDEM_RS_PIECES=3 at M / world 1000 (4 rows of 2x1 clusters: pieces of 512 and 488 rows), 300 with N 520
    # (256 and 44 rows), 2048 (768, 768, 512); each case three launches in a row (consecutive epochs' piece flags)
    shapes = [(1000, 1024, 512), (300, 520, 1032), (2048, 512, 256)]
    res = run_ranks(f"{W}:rs_pieces", world, rs_shapes=shapes, dtypes=["bfloat16", "float16"], pieces=3, repeats=3,
                    timeout_s=300)
    for r in res:
        assert len(r["rs"]) == len(r["ar"]) == 2 * len(shapes) * 3
        for c in r["rs"]:
            assert c["wrong"] == 0 and c["rel"] < 1e-2, c
        for c in r["ar"]:
            assert c["wrong"] == 0 and c["rel"] < 1e-2 and c["rows"] == c["shape"][0], c
        # the pieces kernel ran (not the whole-chunk fallback): 2, 2 and 3 pieces a chunk at these shapes
        expected = {1000: 2, 300: 2, 2048: 3}
        for c in r["rs"] + r["ar"]:
            assert c["pieces"] == expected[c["shape"][0] // world], c
    for i in range(len(res[0]["ar"])):
        assert len({r["ar"][i]["digest"] for r in res}) == 1, i


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("swizzle", [2, 4])
def test_fused_gemm_rs_and_ar_in_pieces_with_a_swizzle_match_torch(run_ranks, world, swizzle):
    # A swizzle S makes the scheduler walk S cluster rows for each N tile; pieces then hold whole groups of S
    # rows (piece_plan). Shapes with ragged rows, N padded to whole groups (520 -> 3 tiles -> 4; 768 -> 3 -> 4)
    # and pieces asked for (3) that round up to whole groups: 2 pieces a chunk, except 1024 rows at swizzle 4 (one
    # group of 4 cluster rows: the whole-chunk fallback).
    shapes = {2: [(1000, 1024, 512), (600, 520, 1032), (2048, 512, 256)],
              4: [(2048, 1024, 256), (4096, 768, 128), (1024, 1024, 512)]}[swizzle]
    expected = {2: {1000: 2, 600: 2, 2048: 2}, 4: {2048: 2, 4096: 2, 1024: 1}}[swizzle]
    res = run_ranks(f"{W}:rs_pieces", world, rs_shapes=shapes, dtypes=["bfloat16"], pieces=3, repeats=2,
                    swizzle=swizzle, timeout_s=300)
    for r in res:
        assert len(r["rs"]) == len(r["ar"]) == len(shapes) * 2
        for c in r["rs"]:
            assert c["wrong"] == 0 and c["rel"] < 1e-2, c
        for c in r["ar"]:
            assert c["wrong"] == 0 and c["rel"] < 1e-2 and c["rows"] == c["shape"][0], c
        for c in r["rs"] + r["ar"]:
            # 1 = the whole-chunk kernel: 1024 rows are one group of 4 cluster rows (the fallback is exercised)
            assert c["pieces"] == expected[c["shape"][0] // world], c
    for i in range(len(res[0]["ar"])):
        assert len({r["ar"][i]["digest"] for r in res}) == 1, i


CLAIM_AG_SHAPES = [(1024, 4096, 512), (136, 520, 1032), (1000, 1024, 512)]
CLAIM_RS_SHAPES = [(1024, 4096, 512), (300, 520, 1032), (2048, 512, 256)]


def _check_tile_claims(res, world, dtypes, late_rank=None):
    for r in res:
        assert len(r["ag"]) == len(dtypes) * 2 * len(CLAIM_AG_SHAPES), len(r["ag"])
        for c in r["ag"]:
            assert c["claims"] and c["wrong"] == 0 and c["gathered_wrong"] == 0, c
        for c in r["rs"]:
            assert c["claims"] and c["wrong"] == 0 and c["rel"] < 1e-2, c
        for c in r["ar"]:
            assert c["claims"] and c["wrong"] == 0 and c["rows"] == c["shape"][0], c
        # the pieces kernel ran with claims where the shape has more than one piece (TANDEM_RS_PIECES=3), and the
        # joined reduction exactly where it was asked for and pieces ran
        assert any(c["pieces"] > 1 for c in r["rs"]), [c["pieces"] for c in r["rs"]]
        for c in r["rs"] + r["ar"]:
            assert c["joined"] == (c["join"] and c["pieces"] > 1), c
        assert any(c["joined"] for c in r["rs"]) and any(c["joined"] for c in r["ar"])
        for c in r["static_vs_claims"]:
            assert c["claims_ran"] == [False, True] and c["differing"] == [0, 0, 0] and c["finite"], c
    if late_rank is not None:
        assert res[late_rank]["late"] and all(r["late"] is None for q, r in enumerate(res) if q != late_rank)
    for i in range(len(res[0]["ar"])):
        assert len({r["ar"][i]["digest"] for r in res}) == 1, i


@pytest.mark.parametrize("world", [2, 3, 4])  # world 1 runs the plain GEMM (no fused kernel)
def test_fused_ops_with_tile_claims_match_torch_and_the_static_order(run_ranks, world):
    res = run_ranks(f"{W}:tile_claims", world, ag_shapes=CLAIM_AG_SHAPES, rs_shapes=CLAIM_RS_SHAPES,
                    dtypes=["bfloat16", "float16"], repeats=2, timeout_s=300)
    _check_tile_claims(res, world, ["bfloat16", "float16"])


@pytest.mark.parametrize("world", [2, 4])
def test_tile_claims_with_one_ranks_clusters_late_match_torch(run_ranks, world):
    # rank 1's GEMM clusters from row 1 of its grid start 3 ms late (TANDEM_TP_LATE): the resident cluster
    # (row 0) claims their tiles; the chunks complete by tile counts, without the blocks that computed none
    res = run_ranks(f"{W}:tile_claims", world, ag_shapes=CLAIM_AG_SHAPES, rs_shapes=CLAIM_RS_SHAPES,
                    dtypes=["bfloat16"], repeats=2, rank_env={1: {"TANDEM_TP_LATE": "1:3000"}}, timeout_s=300)
    _check_tile_claims(res, world, ["bfloat16"], late_rank=1)


_TICKET_CASES = [(2, False, {}), (2, True, {}), (3, False, {}), (3, True, {}), (4, False, {}), (4, True, {}),
                 (2, True, {"TANDEM_RS_TICKET_END_WAITERS": "1"}), (4, True, {"TANDEM_RS_TICKET_END_WAITERS": "1"}),
                 (3, False, {"TANDEM_RS_TICKET_END_WAITERS": "0"}), (2, True, {"TANDEM_RS_TICKET_DIRECT": "0"}),
                 (4, False, {"TANDEM_RS_TICKET_DIRECT": "0", "TANDEM_RS_TICKET_END_WAITERS": "0"}),
                 (4, True, {"TANDEM_RS_TICKET_ROUNDS": "4"}), (2, False, {"TANDEM_RS_TICKET_ROUNDS": "3"}),
                 (3, True, {"TANDEM_RS_TICKET_ROUNDS": "2", "TANDEM_RS_TICKET_DIRECT": "0"})]


@pytest.mark.parametrize("world,late,knobs", _TICKET_CASES,
                         ids=[f"{w}-{'late' if l else 'ontime'}-" + ("-".join(f"{k[10:]}={v}" for k, v in e.items())
                                                                     or "default") for w, l, e in _TICKET_CASES])
def test_fused_gemm_rs_and_ar_by_tickets_match_their_summation_order_and_torch(run_ranks, world, late, knobs):
    # TANDEM_RS_TICKET=1: no reduce role and no wait inside the GEMM; each tile's last rank to finish it adds every
    # rank's partial (rank order, fp32): the owner into its output, any other rank into the owner's staging,
    # flagging the tile there for the owner's end to copy. Ragged rows (300 a chunk), N not a multiple of the
    # 256-wide tile (520), K not a multiple of 64; three launches in a row with new values (the tickets and counts
    # must be back at zero); two-shot AR (every rank the same bytes); random data against the fp32 sum and the
    # default kernel. With `late`, rank 1's clusters from grid row 1 start 3 ms late (TANDEM_TP_LATE): the other
    # ranks' last arrivers reduce the tiles it finished early, it reduces those it finishes last, nobody waits.
    shapes = [(1024, 4096, 512), (300, 520, 1032), (2048, 512, 256), (4096, 4096, 256)]
    # The end phase (TANDEM_RS_TICKET_END_WAITERS): by default an eighth of the grid waits for the reduced chunks and
    # the other blocks copy what is ready and leave; "1": one block waits (every other block leaves at once, the
    # copy is all claimed units); "0": every block waits and copies a fixed share. TANDEM_RS_TICKET_DIRECT=0: the
    # owner too reduces into its staging and flags the tile, so that every tile takes the flagged copy.
    # TANDEM_RS_TICKET_ROUNDS=P: P rounds of a piece of every chunk (the shapes' chunks have 8, 3, 16 and 32 tile
    # rows, 4, 2, 8 and 16 cluster rows: fewer pieces where a chunk has fewer cluster rows, short last pieces at
    # P = 3); every launch must have run in more than one round.
    rank_env = {r: dict(knobs) for r in range(world)}
    if late:
        rank_env[1]["TANDEM_TP_LATE"] = "1:3000"
    res = run_ranks(f"{W}:rs_ticket", world, rs_shapes=shapes, dtypes=["bfloat16", "float16"], repeats=3,
                    rank_env=rank_env, timeout_s=300)
    for r in res:
        assert len(r["exact"]) == 2 * len(shapes) * 3 and len(r["random"]) == 2 * len(shapes)
        asked_rounds = int(knobs.get("TANDEM_RS_TICKET_ROUNDS", "1"))
        for c in r["exact"]:
            assert c["ticket"] and c["wrong"] == 0 and c["rel"] < 1e-2, c
            assert c["ar_ticket"] and c["ar_wrong"] == 0, c
            # rounds of whole 256-row cluster rows: P rounds of ceil(rows / P) each, so fewer where that divides
            # unevenly (4 cluster rows in 3 rounds: 2 of 2)
            clusters = ((c["shape"][0] // world + 127) // 128 + 1) // 2
            per = -(-clusters // asked_rounds)
            assert c["rounds"] == c["ar_rounds"] == (-(-clusters // per) if asked_rounds > 1 else 1), c
        for c in r["random"]:
            # one rounding of each partial and of the sum: as close to the fp32 sum as the default kernel
            assert c["ticket"] and c["finite"], c
            assert c["rel_ticket"] < 1e-2 and c["rel_default"] < 1e-2 and c["rel_ticket_vs_default"] < 1e-2, c
            assert c["ticket_again_wrong"] == 0 and c["rel_ar"] < 1e-2 and c["ar_rows_differ"] == 0, c
            # whichever rank is late (so whoever draws the last tickets), the same bits: the sum is in rank order
            assert c["late_rank_differs"] == [0] * world, c
        assert r["off_ticket"] == dict(ticket=False, wrong=0), r["off_ticket"]
    for i in range(len(res[0]["exact"])):
        assert len({r["exact"][i]["ar_digest"] for r in res}) == 1, i  # AR: the same bytes on every rank


@pytest.mark.parametrize("world,rounds", [(2, 1), (4, 4)])
def test_auto_runs_the_ticket_kernel_where_its_table_says_so(run_ranks, world, rounds):
    # A tuned table row of mode "ticket" (rounds in comm_blocks) with TANDEM_RS_TICKET unset: mode="auto" runs the
    # ticket kernel (the host's record) in those rounds, bit-exact against the ticket order and bit for bit as the
    # knob's kernel; mode="fused" beside it still runs the default kernel on its own workspace; GEMM+AR two-shot too.
    shapes = [(1024, 4096, 512), (300, 520, 1032)]
    res = run_ranks(f"{W}:rs_ticket_auto", world, rs_shapes=shapes, rounds=rounds, timeout_s=240)
    for r in res:
        assert len(r) == len(shapes)
        for c, (mr, _, _) in zip(r, shapes):
            clusters = ((mr + 127) // 128 + 1) // 2
            want = -(-clusters // -(-clusters // rounds)) if rounds > 1 else 1
            assert c["plan"] == ["ticket", rounds] and c["ran"] == [True, want] and c["ran_ar"] == [True, want], c
            assert c["wrong"] == 0 and c["ar_wrong"] == 0 and c["knob_differs"] == 0 and c["again_wrong"] == 0, c
            assert not c["default_ticket"] and c["default_wrong"] == 0, c


@pytest.mark.parametrize("late", [False, True])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_fused_gemm_rs_and_ar_as_a_ring_match_their_summation_order_and_torch(run_ranks, world, late):
    # TANDEM_RS_RING=1: no reduce role; step s's GEMM epilogue adds the right neighbour's running sum (CUTLASS's
    # source C from the peer's heap); two-shot GEMM+AR then gathers every owner's sum. Ragged rows (300 a chunk:
    # one cluster row and a part), N not a multiple of the 256-wide tile (520: a ragged C tile), K not a multiple
    # of 64; three launches in a row each (tile claims: the ring runs with claims only, and the knob with
    # TANDEM_TP_CLAIM=0 runs the default kernel); the default kernels before and after the ring on the same
    # workspaces.
    # 4096 x 4096 a chunk: 512 tiles, several a cluster at any share. With `late`, rank 1's clusters from grid row 1
    # on start 3 ms late (TANDEM_TP_LATE): with tile claims the resident cluster takes their tiles.
    shapes = [(1024, 4096, 512), (300, 520, 1032), (2048, 512, 256), (4096, 4096, 256)]
    rank_env = {1: {"TANDEM_TP_LATE": "1:3000"}} if late else None
    res = run_ranks(f"{W}:rs_ring", world, rs_shapes=shapes, dtypes=["bfloat16", "float16"], repeats=3,
                    rank_env=rank_env, timeout_s=300)
    for r in res:
        assert len(r["exact"]) == 2 * len(shapes) * 3 and len(r["random"]) == 2 * len(shapes)
        for c in r["exact"]:
            assert c["ring"] and c["wrong"] == 0 and c["rel"] < 1e-2, c
            assert c["ar_ring"] and c["ar_wrong"] == 0, c
            assert c["claims"] and c["ar_claims"], c  # the ring takes its tiles by claims only
        for c in r["random"]:
            # bf16 / fp16 rounding after each of W - 1 adds: well within 2 % of the fp32 sum's norm
            assert c["ring"] and not c["default_ring"] and c["finite"] and c["ar_rows_ok"], c
            assert c["rel_ring"] < 2e-2 and c["rel_default"] < 1e-2 and c["rel_ring_vs_default"] < 2e-2, c
            assert c["ring_again_wrong"] == 0 and c["default_again_differs"] == 0 and c["rel_ar"] < 2e-2, c
            assert c["ar_default_ring"] == [False, False] and c["ar_default_again_differs"] == 0, c
        assert all(r["ar_ring"])  # two-shot GEMM+AR runs the ring too
        assert r["off_ring"] == dict(ring=False, wrong=0), r["off_ring"]
        assert r["no_claims"] == dict(ring=False, claims=False, wrong=0), r["no_claims"]
    for i in range(len(res[0]["exact"])):
        assert len({r["exact"][i]["ar_digest"] for r in res}) == 1, i  # AR: the same bytes on every rank


@pytest.mark.parametrize("late", [False, True])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_fused_ops_in_256x128_tiles_match_torch_and_the_128x256_kernels(run_ranks, world, late):
    # TANDEM_TP_GEMM_TILE=256x128: the GEMM roles' tiles span 256 rows (a 2x1 cluster 512), so an AG tile straddles
    # up to three chunks of the ragged M_local 136, and an RS chunk of 300 rows is one cluster row; N / K not
    # multiples of the tile; GEMM+RS/AR whole and in pieces (2048 rows a chunk: 2 pieces of 2 cluster rows); with
    # `late`, rank 1's GEMM rows from row 1 on start 3 ms late and the others claim their tiles
    rank_env = {1: {"TANDEM_TP_LATE": "1:3000"}} if late else None
    rs_shapes = [(1024, 4096, 512), (300, 520, 1032), (2048, 512, 256)]
    res = run_ranks(f"{W}:gemm_tile256", world, ag_shapes=CLAIM_AG_SHAPES, rs_shapes=rs_shapes,
                    dtypes=["bfloat16", "float16"], repeats=2, rank_env=rank_env, timeout_s=300)
    for r in res:
        assert len(r["ag"]) == 2 * 2 * 2 * len(CLAIM_AG_SHAPES), len(r["ag"])
        for c in r["ag"]:
            assert c["tile_m"] == 256 and c["wrong"] == 0 and c["gathered_wrong"] == 0, c
        assert len(r["rs"]) == len(r["ar"]) == 2 * 2 * 2 * len(rs_shapes)
        for c in r["rs"] + r["ar"]:
            assert c["tile_m"] == 256 and c["wrong"] == 0 and c["rel"] < 1e-2, c
        for c in r["ar"]:
            assert c["rows"] == c["shape"][0], c
        # pieces ran where asked and the chunk has more than one piece of whole 512-row cluster rows
        assert any(c["pieces"] > 1 for c in r["rs"] if c["asked_pieces"] == 3), [c["pieces"] for c in r["rs"]]
        assert all(c["pieces"] <= 1 for c in r["rs"] + r["ar"] if c["asked_pieces"] == 0)
        assert len(r["tile256_vs_128"]) == 2 * (len(CLAIM_AG_SHAPES) + 2 * len(rs_shapes))
        for c in r["tile256_vs_128"]:
            assert c["ran"] == [128, 256] and c["rel"] < 1e-2 and c["finite"], c
    if late:
        assert res[1]["late"] and all(r["late"] is None for q, r in enumerate(res) if q != 1)


@pytest.mark.parametrize("mode", ["fused", "unfused"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_gathered_view_holds_until_this_ranks_next_launch(run_ranks, world, mode):
    res = run_ranks(f"{W}:gathered_view_outlives_peer_launches", world, m_local=512, n=1024, k=1024, mode=mode,
                    timeout_s=180)
    for r in res:
        assert r["wrong"] == [0], r  # the slow rank's view, read ~50 ms late, still holds the first launch's rows


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_fp8_gemm_rs_and_ar_match_the_fixed_order_sum(run_ranks, world):
    # FP8 e4m3 operands with tensor-wise and row-wise scales (issue 23, part 3; the unfused path): exact against
    # the owners' fixed-order fp32 sum of the bf16-rounded partials, on ragged shapes; AR identical on every rank
    shapes = [(256, 512, 512), (300, 520, 1040), (1000, 1024, 2048)]
    res = run_ranks(f"{W}:scaled_rs_ar", world, rs_shapes=shapes, timeout_s=300)
    for r in res:
        # two scalings x the two unfused GEMMs (cuBLASLt, tandem's FP8 core), each exact
        assert len(r["rs"]) == 4 * len(shapes) and len(r["ar"]) == 8 * len(shapes)
        for c in r["rs"] + r["ar"]:
            assert c["wrong"] == 0, c
            # cuBLASLt ran where asked and the shape allows it (N, K multiples of 16), tandem's core elsewhere
            m, n, k = c["shape"]
            assert c["cublas_calls"] == (1 if c["gemm"] == "cublas" and n % 16 == 0 and k % 16 == 0 else 0), c
        assert r["refused"] == {"bf16 a": 3, "mixed scales": 3,
                                "M not a multiple of the world": 3 if world > 1 else None}, r["refused"]
    for i in range(len(res[0]["ar"])):
        assert len({r["ar"][i]["digest"] for r in res}) == 1, i


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_fp8_ag_gemm_gathers_rows_and_scales_exactly(run_ranks, world):
    # FP8 e4m3 AG+GEMM (issue 23, part 3; the unfused path): the gathered rows and row scales bit for bit, the
    # product exact (exactly representable data and power-of-two scales) and equal to torch._scaled_mm on the
    # concatenated shards; ragged M_local (136, 1000), tensor-wise scales turned row-wise per shard
    shapes = [(128, 256, 256), (136, 512, 1040), (1000, 1024, 512)]
    res = run_ranks(f"{W}:scaled_ag", world, ag_shapes=shapes, timeout_s=300)
    for r in res:
        assert len(r["cases"]) == 2 * 2 * 2 * len(shapes)  # scalings x reps x unfused GEMMs
        for c in r["cases"]:
            assert c["gathered_wrong"] == 0 and c["scales_wrong"] == 0 and c["wrong"] == 0, c
            assert c["wrong_vs_scaled_mm"] in (0, None), c
            assert c["cublas_calls"] == (1 if c["gemm"] == "cublas" and c["shape"][1] % 16 == 0
                                         and c["shape"][2] % 16 == 0 else 0), c
        assert r["refused"] == {"bf16 a": 3, "mixed scales": 3, "a_local not contiguous": 3}, r["refused"]


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


@pytest.mark.parametrize("ranks_per_node,claim", [(2, None), (1, None), (2, "0")])
def test_tp_ops_across_emulated_nodes(run_ranks, ranks_per_node, claim):
    # world 4 as 2 nodes x 2 ranks, and as 4 nodes x 1 rank: traffic between nodes goes through the CPU proxy (TCP);
    # the fused GEMM roles with tile claims (the default) and with the static stride (TANDEM_TP_CLAIM=0)
    res = run_ranks(f"{W}:emulated_nodes", 4, ranks_per_node=ranks_per_node,
                    ag_shapes=[(256, 512, 512), (512, 1024, 2048)],
                    rs_shapes=[(256, 512, 1024), (300, 520, 1032)], launches=20, claim=claim, timeout_s=240)
    for r in res:
        assert r["has_proxy"] and r["num_nodes"] == 4 // ranks_per_node, r
        assert r["claims"] == [claim is None] * 4, r["claims"]
        assert r["ranks_per_node"] == ranks_per_node, r
        assert len(r["ag"]) == 4 and len(r["rs"]) == 4 and len(r["ar"]) == 4, r
        for c in r["ag"]:
            assert c["wrong"] == 0 and c["gathered_wrong"] == 0, repr(c)
        for c in r["rs"] + r["ar"]:
            assert c["wrong"] == 0 and c["rel"] < 1e-2, c
        assert r["repeat_same"] == dict(rs=20, ar=20, ag=20), r
        assert r["one_shot_refused"] == 3, r
    for i in range(4):  # every rank holds the same all-reduced bytes
        assert len({r["ar"][i]["digest"] for r in res}) == 1, i


def _keys_named(msg, op, mine, theirs, world):
    others = "rank 1 has" if world == 2 else "ranks " + ", ".join(str(r) for r in range(1, world)) + " have"
    return (f": {op}: ranks disagree: rank 0 has (op={op}, {mine}" in msg and f", {others} (op={op}, {theirs}" in msg
            and "nothing was allocated or launched" in msg)


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_that_disagree_get_an_error_on_every_rank(run_ranks, world):
    # issue 20 point 3: rank 0 with K = 1024, the others with K = 2048 (and N, mode, algo likewise): a TandemError
    # naming every rank's key on every rank, before anything is allocated or launched, fused and unfused
    timeout_s = 8
    res = run_ranks(f"{W}:disagree", world, comm_timeout_s=timeout_s, timeout_s=180)
    expect = {
        "ag_k_fused": ("ag_gemm", "m_local=256, n=512, k=1024, dtype=bf16, mode=fused",
                       "m_local=256, n=512, k=2048, dtype=bf16, mode=fused"),
        "ag_k_unfused": ("ag_gemm", "m_local=256, n=512, k=1024, dtype=bf16, mode=unfused",
                         "m_local=256, n=512, k=2048, dtype=bf16, mode=unfused"),
        "ag_n_fused": ("ag_gemm", "m_local=256, n=512, k=1024, dtype=bf16, mode=fused",
                       "m_local=256, n=1024, k=1024, dtype=bf16, mode=fused"),
        "ag_n_unfused": ("ag_gemm", "m_local=256, n=512, k=1024, dtype=bf16, mode=unfused",
                         "m_local=256, n=1024, k=1024, dtype=bf16, mode=unfused"),
        "ag_mode": ("ag_gemm", "m_local=256, n=512, k=1024, dtype=bf16, mode=fused",
                    "m_local=256, n=512, k=1024, dtype=bf16, mode=unfused"),
        "rs_n": ("gemm_rs", f"m={256 * world}, n=512, k=512", f"m={256 * world}, n=1024, k=512"),
        "ar_algo": ("gemm_ar", "comm_blocks=0, algo=one_shot", "comm_blocks=0, algo=two_shot"),
    }
    for r, out in enumerate(res):
        for name, (op, mine, theirs) in expect.items():
            c = out[name]
            assert c["raised"] and c["status"] == 3, (r, name, c)  # INVALID_ARGUMENT, never a silent result
            assert c["message"].startswith(f"tandem: rank {r}: "), (r, name, c)
            if name != "ar_algo":
                assert _keys_named(c["message"], op, mine, theirs, world), (r, name, c["message"])
            else:
                assert "algo=one_shot" in c["message"] and "algo=two_shot" in c["message"], c["message"]
            assert c["seconds"] < timeout_s, (r, name, c)  # every rank took the step: no wait for a timeout
        assert out["agreed_after_wrong"] == 0, out


def test_a_rank_out_of_step_is_an_error_within_the_timeout(run_ranks):
    # rank 0 calls a key agreed before (skips the step and launches), rank 1 a new one (takes the step): rank 1's
    # step times out (TandemError, timeout) and rank 0's device wait times out; nobody hangs or returns a result
    timeout_s = 5
    res = run_ranks(f"{W}:out_of_step", 2, comm_timeout_s=timeout_s, timeout_s=120)
    for r, out in enumerate(res):
        assert not out["first"]["raised"], out
        c = out["second"]
        assert c["raised"] and c["seconds"] < timeout_s + 15, (r, c)
        if r == 0:
            assert c["status"] in (1, 2), c  # the device wait's timeout (or abort)
        else:
            assert c["status"] == 1 and "ranks out of step: rank 0 did not take agreement step" in c["message"], c


@pytest.mark.parametrize("world", [2, 3, 4])
def test_pipelined_mode_matches_torch_repeats_and_replays(run_ranks, world):
    # mode="pipelined": cuBLAS per chunk, copy-engine pushes, stream-ordered flags (tandem.ops.tp_pipelined).
    # Ragged shapes (M_local 100 and 1000, not multiples of 8 or of a tile; K, N not powers of two).
    res = run_ranks(f"{W}:pipelined", world, ag_shapes=[(256, 1024, 1024), (100, 520, 1032), (1000, 1024, 512)],
                    rs_shapes=[(256, 1024, 1024), (300, 520, 1032), (1001, 512, 256)],
                    dtypes=["bfloat16", "float16"], launches=200, timeout_s=300)
    for r in res:
        assert len(r["ag"]) == 2 * 3 * 2 and len(r["rs"]) == 2 * 3 and len(r["ar"]) == 2 * 3, r
        for c in r["ag"]:
            assert c["wrong"] == 0 and c["gathered_wrong"] == 0, repr(c)
        for c in r["rs"] + r["ar"]:
            assert c["wrong"] == 0, c  # bit-exact against the ring's own order and roundings
            assert c["rel"] < 1e-2, c
        assert r["random_rs_rel"] < 2e-2, r  # bf16 roundings at each of W ring steps
        assert r["same"] == [200, 200, 200], r
        assert r["lone_ok"] == [True] * 4, r["lone_ok"]
        assert r["alternating"] == dict(calls=80, wrong=0), (r["alternating"], r["alternating_detail"])
        assert r["graph_ok"] == [True, True, True], r
    for i in range(len(res[0]["ar"])):  # every rank holds the same all-reduced bytes
        assert len({r["ar"][i]["digest"] for r in res}) == 1, i
