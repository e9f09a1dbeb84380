"""FP8 GEMM with scales (issue 23, part 2), what runs without a GPU: the typed arguments and the adapter's
checks (scaled_gemm.h), the op's input checks before any launch (tandem.ops.gemm.scaling_of, on fake CUDA
tensors), and its fake implementation (shapes and dtype for torch.compile). tests/gpu/test_gemm.py runs it
against torch._scaled_mm."""

import pytest
import torch

from tandem.errors import INVALID_ARGUMENT, TandemError

pytestmark = pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="this torch has no float8_e4m3fn")


def _kernels():
    from tests.conftest import native_kernels

    return native_kernels("ScaledGemmArgs", "scaled_gemm")


def _args(K, **over):
    x = K.ScaledGemmArgs()
    fields = dict(m=256, n=512, k=1024, lda=1024, ldb=1024, ldd=512, a=1 << 20, b=2 << 20, d=3 << 20,
                  scale_a=4 << 20, scale_b=5 << 20, scaling=K.Scaling.ROW, sm_count=0)
    fields.update(over)
    for name, v in fields.items():
        setattr(x, name, v)
    return x


def test_args_hold_what_is_set_and_a_good_problem_passes():
    K = _kernels()
    x = _args(K, sm_count=7)
    assert (x.m, x.n, x.k, x.lda, x.ldb, x.ldd, x.sm_count) == (256, 512, 1024, 1024, 1024, 512, 7)
    assert (x.a, x.b, x.d, x.scale_a, x.scale_b) == (1 << 20, 2 << 20, 3 << 20, 4 << 20, 5 << 20)
    assert x.scaling == K.Scaling.ROW
    assert K.can_implement(x) == ""
    assert K.can_implement(_args(K, scaling=K.Scaling.TENSOR)) == ""


def test_every_configuration_the_plan_names_is_bound():
    # gemm_plan.SCALED_CONFIGS names scaled_gemm.h's ScaledConfig values (the binding's upper-cased); one each
    from tandem.ops import gemm_plan

    K = _kernels()
    bound = {name.lower(): int(v) for name, v in K.ScaledConfig.__members__.items()}
    if set(bound) < set(gemm_plan.SCALED_CONFIGS):
        pytest.skip("tandem._C was built before the 128x192 FP8 configurations (python/bindings/kernels.cc): rebuild")
    assert set(bound) == set(gemm_plan.SCALED_CONFIGS)
    assert sorted(bound.values()) == list(range(len(bound)))  # appended, none renumbered or skipped
    for name in gemm_plan.SCALED_CONFIGS:
        assert K.can_implement(_args(K, config=getattr(K.ScaledConfig, name.upper()))) == "", name


@pytest.mark.parametrize("over, words", [
    (dict(k=1000, lda=1000, ldb=1000), "multiples of 16"),
    (dict(lda=1032), "multiples of 16"),
    (dict(n=500, ldd=500), "multiples of 8"),
    (dict(a=(1 << 20) + 8), "16-byte aligned"),
    (dict(scale_b=(5 << 20) + 4), "scale_a and scale_b must be 16-byte aligned"),
    (dict(scale_a=0), "non-null"),
    (dict(m=0), "positive"),
    (dict(ldb=512), "at least"),
])
def test_the_adapter_refuses_what_it_cannot_run(over, words):
    K = _kernels()
    why = K.can_implement(_args(K, **over))
    assert words in why, why


def test_a_launch_that_cannot_run_raises_its_status():
    K = _kernels()
    with pytest.raises(TandemError) as e:
        K.scaled_gemm(_args(K, m=0), 0, 0)
    assert e.value.status == INVALID_ARGUMENT  # before anything is launched


def _fake():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def _inputs(m=256, n=512, k=1024, scaling="row"):
    a = torch.empty(m, k, device="cuda", dtype=torch.float8_e4m3fn)
    b = torch.empty(n, k, device="cuda", dtype=torch.float8_e4m3fn).t()
    if scaling == "row":
        return a, b, torch.empty(m, 1, device="cuda"), torch.empty(1, n, device="cuda")
    return a, b, torch.empty((), device="cuda"), torch.empty((), device="cuda")


def test_the_op_names_the_scaling_and_its_fake_gives_bf16_m_by_n():
    import tandem.ops  # noqa: F401
    from tandem.ops.gemm import scaling_of

    with _fake():
        assert scaling_of(*_inputs(scaling="row")) == "row"
        assert scaling_of(*_inputs(scaling="tensor")) == "tensor"
        out = torch.ops.tandem.scaled_gemm(*_inputs(300, 520, 1040))
        assert tuple(out.shape) == (300, 520) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("change, words", [
    (lambda a, b, sa, sb: (a.to(torch.bfloat16), b, sa, sb), "a must be float8_e4m3fn"),
    (lambda a, b, sa, sb: (a, torch.empty(b.shape, device="cuda", dtype=b.dtype), sa, sb), "column-major"),
    (lambda a, b, sa, sb: (torch.empty(a.shape[1], a.shape[0], device="cuda", dtype=a.dtype).t(), b, sa, sb),
     "row-major"),
    (lambda a, b, sa, sb: (a, b, sa.to(torch.float16), sb), "scale_a must be float32"),
    (lambda a, b, sa, sb: (a, b, sa, torch.empty((), device="cuda")), "scales must be one float32 each"),
    (lambda a, b, sa, sb: (a, b, torch.empty(a.shape[0], device="cuda"), sb), "(M, 1)"),
    (lambda a, b, sa, sb: (torch.empty(a.shape[0], 1008, device="cuda", dtype=a.dtype), b, sa, sb),
     "inner dimensions differ"),
    (lambda a, b, sa, sb: (a, b, sa.cpu(), sb), "scale_a must be a CUDA tensor"),
])
def test_bad_input_is_refused_before_launch(change, words):
    from tandem.ops.gemm import scaling_of

    with _fake():
        args = change(*_inputs())
        with pytest.raises(TandemError) as e:
            scaling_of(*args)
    assert words in str(e.value) and e.value.status == INVALID_ARGUMENT, str(e.value)


def test_k_and_n_alignment_are_refused_before_launch():
    from tandem.ops.gemm import scaling_of

    with _fake():
        with pytest.raises(TandemError, match="multiples of 16"):
            scaling_of(*_inputs(256, 512, 1000))
        with pytest.raises(TandemError, match="multiple of 8"):
            scaling_of(*_inputs(256, 500, 1024))
