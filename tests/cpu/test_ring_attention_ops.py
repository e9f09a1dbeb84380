"""torch.ops.tandem.ring_attention on the CPU (no GPU needed): the op's registration, the sequence layouts (contiguous
and zigzag) against ring_attention.h's global_row, input validation, and the native bindings' signatures."""

import types

import pytest
import torch

import tandem.ops  # noqa: F401  (registers the ops)
from tandem.errors import INVALID_ARGUMENT, TandemError
from tandem.ops import attention, tp


def global_row(seq_local, causal, world, rank, j):
    """ring_attention.h's global_row, transcribed: the reference for the Python helpers."""
    if not causal:
        return rank * seq_local + j
    c = seq_local // 2
    return rank * c + j if j < c else (2 * world - 1 - rank) * c + (j - c)


def test_op_is_registered_with_its_schema():
    schema = str(torch.ops.tandem.ring_attention.default._schema)
    assert schema.startswith("tandem::ring_attention(Tensor q, Tensor k, Tensor v, SymInt comm, bool causal=False, "
                             "float softmax_scale=0., SymInt comm_blocks=0, SymInt sm_count=0, SymInt kv_slots=0) -> "
                             "(Tensor, Tensor)"), \
        schema


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_shards_hold_the_rows_global_row_names_and_round_trip(world, causal):
    for seq_local in (2, 6, 200):
        seq = seq_local * world
        # every element holds its global row, so a shard shows where its rows came from
        x = torch.arange(seq).view(1, seq, 1, 1).expand(2, seq, 3, 4).contiguous()
        shards = []
        for rank in range(world):
            s = attention.shard_sequence(x, rank, world, causal=causal)
            assert s.shape == (2, seq_local, 3, 4) and s.is_contiguous()
            want = torch.tensor([global_row(seq_local, causal, world, rank, j) for j in range(seq_local)])
            assert torch.equal(s[0, :, 0, 0], want), (rank, s[0, :, 0, 0], want)
            assert torch.equal(s, want.view(1, -1, 1, 1).expand_as(s))
            assert torch.equal(attention.local_positions(seq_local, world, rank, causal=causal), want)
            shards.append(s)
        gathered = attention.zigzag_unshard(shards, world) if causal else torch.cat(shards, 1)
        assert torch.equal(gathered, x)


def test_zigzag_gives_every_rank_the_same_causal_work():
    world, seq_local = 4, 64
    work = [int((attention.local_positions(seq_local, world, r, causal=True) + 1).sum()) for r in range(world)]
    assert len(set(work)) == 1, work  # keys each rank's rows see under the mask


def test_shard_helpers_reject_sequences_that_do_not_split():
    x = torch.zeros(1, 10, 2, 64)
    for fn, args in ((attention.zigzag_shard, (x, 0, 3)), (attention.contiguous_shard, (x, 0, 3)),
                     (attention.zigzag_shard, (x, 2, 2)), (attention.zigzag_unshard, ([x], 2))):
        with pytest.raises(TandemError) as ei:
            fn(*args)
        assert ei.value.status == INVALID_ARGUMENT


def _qkv(b=2, s_l=64, hq=8, hkv=2, d=64, dtype=torch.bfloat16):
    return (torch.zeros(b, s_l, hq, d, dtype=dtype), torch.zeros(b, s_l, hkv, d, dtype=dtype),
            torch.zeros(b, s_l, hkv, d, dtype=dtype))


def _validate(q, k, v, causal=False, softmax_scale=0.0, comm_blocks=0, sm_count=0):
    # the op's own checks with the CPU standing in for the communicator's device
    return attention.validate(q, k, v, causal=causal, softmax_scale=softmax_scale, comm_blocks=comm_blocks,
                              sm_count=sm_count, device=torch.device("cpu"))


def test_validation_accepts_good_input():
    assert _validate(*_qkv(), causal=True) == (2, 64, 8, 2, 64)
    assert _validate(*_qkv(b=1, s_l=77, hq=4, hkv=1, d=128, dtype=torch.float16)) == (1, 77, 4, 1, 128)


def test_validation_rejects_bad_input():
    q, k, v = _qkv()
    t = torch.zeros
    misaligned = torch.zeros(q.numel() + 8, dtype=q.dtype)[1:1 + q.numel()].view(q.shape)
    cases = {
        "float32": (q.float(), k.float(), v.float()),
        "mixed_dtype": (q, k.half(), v),
        "kv_seq_differs": (q, k[:, :32].contiguous(), v[:, :32].contiguous()),
        "kv_batch_differs": (q, k[:1].contiguous(), v[:1].contiguous()),
        "k_v_shapes_differ": (q, k, t(2, 64, 4, 64, dtype=q.dtype)),
        "head_dim_96": _qkv(d=96),
        "hkv_not_dividing_hq": _qkv(hkv=3),
        "non_contiguous": (t(2, 8, 64, 64, dtype=q.dtype).transpose(1, 2), k, v),
        "misaligned": (misaligned, k, v),
        "three_d": (q[0], k[0], v[0]),
        "empty_seq": (q[:, :0], k[:, :0], v[:, :0]),
        "not_a_tensor": (q, k, "v"),
    }
    for name, (a, b, c) in cases.items():
        with pytest.raises(TandemError) as ei:
            _validate(a, b, c)
        assert ei.value.status == INVALID_ARGUMENT and ei.value.op == "ring_attention", name
    for kw in (dict(causal=True), dict(softmax_scale=-1.0), dict(softmax_scale=float("nan")),
               dict(softmax_scale=float("inf")), dict(comm_blocks=-2), dict(sm_count=-1)):
        with pytest.raises(TandemError) as ei:
            _validate(*_qkv(s_l=63), **kw)
        assert ei.value.status == INVALID_ARGUMENT, kw


def test_op_and_wrapper_reject_before_reaching_the_kernels():
    # a stand-in communicator (the op reads only rank, world_size and device before validating): CPU tensors are
    # not on its device, and the op says so without touching the native module or a GPU
    comm = types.SimpleNamespace(rank=0, world_size=2, device=0)
    q, k, v = _qkv()
    with pytest.raises(TandemError, match="communicator's device cuda:0") as ei:
        torch.ops.tandem.ring_attention(q, k, v, tp.register(comm), True)
    assert ei.value.status == INVALID_ARGUMENT
    with pytest.raises(TandemError, match="softmax_scale"):
        attention.ring_attention(comm, q, k, v, softmax_scale=0.0)
    with pytest.raises(TandemError, match="unknown communicator handle"):
        torch.ops.tandem.ring_attention(q, k, v, 10 ** 9)


