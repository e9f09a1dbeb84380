"""The ops' shared input checks (tandem.ops._runtime: check_tensor, check_mode, check_comm_blocks), which tp, moe
and attention call before anything is allocated. CPU tensors stand in for the device (device=cpu)."""

import pytest
import torch

from tandem.errors import INVALID_ARGUMENT, TandemError
from tandem.ops import _runtime as rt

CPU = torch.device("cpu")


def _raises(match, fn, *args, **kw):
    with pytest.raises(TandemError, match=match) as ei:
        fn(*args, **kw)
    assert ei.value.status == INVALID_ARGUMENT and ei.value.op == "op_x" and ei.value.rank == 3
    return ei.value


def test_check_tensor_names_the_first_problem():
    good = torch.zeros(4, 16, dtype=torch.bfloat16)
    rt.check_tensor(good, "a", "op_x", 3, dims=2, device=CPU)
    rt.check_tensor(good, "a", "op_x", 3, dims=2, device=CPU, layout="contiguous")
    _raises(r"^tandem: op_x: a must be a torch.Tensor, got list$", rt.check_tensor, [1], "a", "op_x", 3,
            dims=2)
    _raises("a must be a CUDA tensor, got device cpu", rt.check_tensor, good, "a", "op_x", 3, dims=2)
    _raises(r"a must be on the communicator's device cuda:0, got cpu", rt.check_tensor, good, "a", "op_x", 3, dims=2,
            device=torch.device("cuda", 0))
    _raises(r"q must be 4-D \(b, s\), got shape \(4, 16\)", rt.check_tensor, good, "q", "op_x", 3, dims=4,
            device=CPU, dims_doc=" (b, s)")
    _raises("a must be bfloat16 or float16, got torch.float32", rt.check_tensor, good.float(), "a", "op_x", 3,
            dims=2, device=CPU)


def test_check_tensor_layouts():
    base = torch.zeros(8, 64, dtype=torch.float16)
    # a column slice: rows still contiguous, row stride a multiple of 8 elements, 16-byte aligned start
    cols = base[:, 8:40]
    rt.check_tensor(cols, "b", "op_x", 3, dims=2, device=CPU)
    _raises(r"b must be contiguous and 16-byte aligned \(strides \(64, 1\)", rt.check_tensor, cols, "b", "op_x", 3,
            dims=2, device=CPU, layout="contiguous")
    # rows not contiguous (a transpose), and a start that is not 16-byte aligned
    _raises(r"b must have contiguous, 16-byte aligned rows \(strides \(1, 64\)\)", rt.check_tensor, base.t(), "b",
            "op_x", 3, dims=2, device=CPU)
    _raises("b must have contiguous, 16-byte aligned rows", rt.check_tensor, base[:, 1:33], "b", "op_x", 3, dims=2,
            device=CPU)
    # a row stride that is not a multiple of 8 elements (rows of 12 halves: 24 bytes)
    odd = torch.zeros(4, 12, dtype=torch.float16)
    _raises("b must have contiguous, 16-byte aligned rows", rt.check_tensor, odd, "b", "op_x", 3, dims=2, device=CPU)
    rt.check_tensor(odd, "b", "op_x", 3, dims=2, device=CPU, layout="contiguous")


def test_check_mode_and_comm_blocks():
    rt.check_mode("fused", ("auto", "fused", "unfused"), "op_x", 3)
    _raises(r"mode must be 'auto', 'fused' or 'unfused', got 'fast'$", rt.check_mode, "fast",
            ("auto", "fused", "unfused"), "op_x", 3)
    _raises(r"mode must be 'auto', 'fused', 'unfused' or 'pipelined', got None$", rt.check_mode, None,
            ("auto", "fused", "unfused", "pipelined"), "op_x", 3)
    for ok in (0, 2, 16):
        rt.check_comm_blocks(ok, "op_x", 3)
    for bad in (-2, 3):
        _raises(f"comm_blocks must be 0 \\(heuristic\\) or a positive even number, got {bad}$",
                rt.check_comm_blocks, bad, "op_x", 3)
