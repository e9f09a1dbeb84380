"""Training with the fused TP ops (issue 24): tandem.nn's column-then-row MLP block against the same model on one
rank with the full weights, forward and every gradient, at worlds 1-4 (MPS ranks)."""

import pytest

pytestmark = pytest.mark.gpu
W = "tests.gpu.workers_train"

# Relative error bounds (Frobenius), tandem in bf16/fp16 against the fp32 reference: every op rounds its output
# once (forward: the column product, its bias add and GELU, the row product's partials and the reduced sum;
# backward: the same count again), each rounding at most the unit roundoff (bf16 2^-8, fp16 2^-11) relative,
# accumulation in fp32. About ten roundings in a chain give ~10 x u / sqrt(their independence) in norm: 2e-2 for
# bf16 and 4e-3 for fp16 leave room for that and fail on a misplaced or missing term (an error of order 1).
BOUND = {"bfloat16": 2e-2, "float16": 4e-3}


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_tp_mlp_matches_one_rank_with_the_full_weights(run_ranks, world):
    # tokens a rank: 136 (not a multiple of the 128-row tile: the unfused AG path) and 256; d 256, f 768 (f / world
    # = 768, 384, 256, 192); sequence parallel (RS, the row bias's gradient summed over the ranks) and not (AR);
    # eager, torch.compile (fullgraph), activation checkpointing and a CUDA graph of forward + backward
    cases = [(136, 256, 768, "bfloat16", True, "eager"), (256, 256, 768, "bfloat16", True, "eager"),
             (256, 256, 768, "float16", True, "eager"), (136, 256, 768, "bfloat16", False, "eager"),
             (256, 256, 768, "bfloat16", True, "compile"), (256, 256, 768, "bfloat16", True, "checkpoint"),
             (256, 256, 768, "bfloat16", True, "graph")]
    res = run_ranks(f"{W}:mlp_grads", world, cases=cases, timeout_s=400)
    for r in res:
        assert len(r["cases"]) == len(cases)
        for c in r["cases"]:
            bound = BOUND[c["case"][3]]
            errs = {k: v for k, v in c.items() if k != "case"}
            assert all(v < bound for v in errs.values()), c
        # the wgrad GEMM on a side stream beside the dgrad's GEMM+RS changes no bit of any gradient
        assert r["overlap_diff"] == {"dx": 0, "dw_col": 0, "db_col": 0, "dw_row": 0, "db_row": 0}, r["overlap_diff"]
        assert r["roundtrip"] == {"col_weight": True, "col_bias": True, "row_weight": True}, r["roundtrip"]
        expected = {"x without the sequence shard's width": 3, "row input of the wrong width": 3,
                    "a weight of another shard shape": 3}
        if world > 1:
            expected.update({"out_features not a multiple of the world": 3})
        assert r["refused"] == expected, r["refused"]
