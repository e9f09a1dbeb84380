"""The kernels layer's typed bindings (python/bindings/kernels.cc), on the CPU: every op's Args class holds what
is set in it (device addresses as ints, the nested plan and shape structs by reference), dtype codes are checked,
one Mode enum names the launches, and a launch that cannot run raises the TandemError of its real status (here the
GEMM core's can_implement, which needs no GPU)."""

import pytest

from tandem.errors import INVALID_ARGUMENT, TandemError
from tests.conftest import native_kernels

ADDR = 0x7F00_0000_1230  # an address above 2**32, 16-byte aligned

# class -> (int fields, address fields, nested struct fields {name: {field: value}})
CLASSES = {
    "GemmArgs": (dict(m=3, n=16, k=24, lda=24, ldb=16, ldd=16, ldc=16, sm_count=5, max_swizzle=4),
                 ("a", "b", "c", "d"), {}),
    "AgGemmArgs": (dict(m_local=8, n=16, k=24, ldb=16, ldc=16), ("a_local", "b", "c", "workspace"),
                   dict(plan=dict(sm_count=32, comm_blocks=6))),
    "GemmRsArgs": (dict(m=8, n=16, k=24, lda=24, ldb=16), ("a", "b", "out", "workspace"),
                   dict(plan=dict(sm_count=32, comm_blocks=4))),
    "GemmArArgs": (dict(m=8, n=16, k=24, lda=24, ldb=16), ("a", "b", "out", "workspace"),
                   dict(plan=dict(sm_count=66, comm_blocks=8))),
    "DispatchArgs": ({}, ("x", "topk_ids", "w", "y", "layout", "workspace", "rows"),
                     dict(plan=dict(sm_count=32, comm_blocks=2),
                          shape=dict(tokens=5, max_tokens=7, hidden=64, inter=32, topk=2, experts_per_rank=3))),
    "CombineArgs": (dict(dim=64), ("z", "topk_weights", "topk_ids", "out", "layout", "workspace"),
                    dict(plan=dict(sm_count=32), shape=dict(tokens=5, max_tokens=7, topk=2, experts_per_rank=3))),
    "SwigluArgs": (dict(capacity=300, inter=136, sm_count=132), ("y", "received", "out"), {}),
    "GroupedGemmArgs": (dict(experts=5, n=520, k=264, sm_count=132, cluster_rows=1),
                        ("a", "w", "d", "expert_rows", "expert_offset", "workspace"), {}),
    "RingArgs": ({}, ("q", "k", "v", "o", "lse", "workspace"),
                 dict(plan=dict(sm_count=32, comm_blocks=2, kv_slots=4),
                      shape=dict(batch=2, seq_local=64, heads_q=8, heads_kv=2, head_dim=128, causal=True))),
}


@pytest.fixture(scope="module")
def K():
    return native_kernels("Mode", *CLASSES)


@pytest.mark.parametrize("name", sorted(CLASSES))
def test_args_hold_what_is_set(K, name):
    ints, addresses, nested = CLASSES[name]
    x = getattr(K, name)()
    for i, (f, v) in enumerate(ints.items()):
        setattr(x, f, v)
    for i, f in enumerate(addresses):
        setattr(x, f, ADDR + 16 * i)
    for struct, fields in nested.items():
        for f, v in fields.items():
            setattr(getattr(x, struct), f, v)  # the nested struct by reference: set in place
    x.dtype = 1
    assert x.dtype == 1
    assert {f: getattr(x, f) for f in ints} == ints
    assert [getattr(x, f) for f in addresses] == [ADDR + 16 * i for i in range(len(addresses))]
    for struct, fields in nested.items():
        assert {f: getattr(getattr(x, struct), f) for f in fields} == fields, struct
    with pytest.raises(TandemError) as ei:
        x.dtype = 7
    assert ei.value.status == INVALID_ARGUMENT


def test_gemm_ar_args_are_gemm_rs_args_with_an_algorithm(K):
    x = K.GemmArArgs()
    assert isinstance(x, K.GemmRsArgs)
    assert x.algo == K.ArAlgo.AUTO
    x.algo = K.ArAlgo.TWO_SHOT
    assert x.algo == K.ArAlgo.TWO_SHOT


def test_one_mode_enum(K):
    assert sorted(K.Mode.__members__) == ["DISPATCH", "FUSED", "GATHER", "REDUCE", "UNFUSED", "WAIT"]


def test_launches_take_args_and_a_mode(K):
    # the signatures the ops call (pybind11's first docstring line)
    for fn, words in ((K.ag_gemm, ("Communicator", "AgGemmArgs", "Mode")),
                      (K.gemm_rs, ("Communicator", "GemmRsArgs", "Mode")),
                      (K.gemm_ar, ("Communicator", "GemmArArgs", "Mode")),
                      (K.moe_dispatch_gemm, ("Communicator", "DispatchArgs", "Mode")),
                      (K.moe_combine, ("Communicator", "CombineArgs")),
                      (K.ring_attention, ("Communicator", "RingArgs")),
                      (K.gemm, ("GemmArgs",))):
        first = fn.__doc__.splitlines()[0]
        assert all(w in first for w in words), first
    # one can_implement and one workspace_size, overloaded per Args
    for name in ("AgGemmArgs", "GemmRsArgs", "GemmArArgs", "DispatchArgs", "CombineArgs", "RingArgs", "GemmArgs"):
        assert name in K.can_implement.__doc__ and name in K.workspace_size.__doc__, name


def test_a_launch_that_cannot_run_raises_its_status(K):
    x = K.GemmArgs()  # M = N = K = 0, null addresses
    assert K.can_implement(x) == "M, N and K must be positive"
    with pytest.raises(TandemError, match="M, N and K must be positive") as ei:
        K.gemm(x, 0, 0)
    assert (ei.value.status, ei.value.op) == (INVALID_ARGUMENT, "gemm")
    x.m, x.n, x.k, x.lda, x.ldb, x.ldd = 16, 16, 16, 16, 16, 16
    x.a, x.b, x.d = ADDR, ADDR, ADDR + 8  # D misaligned
    assert "16-byte aligned" in K.can_implement(x)


def test_the_swiglu_launch_checks_before_it_touches_the_gpu(K):
    # moe_swiglu (moe.h: SwigluArgs): its checks come before any CUDA call, so they run here
    x = K.SwigluArgs()
    x.capacity, x.inter = 300, 0
    with pytest.raises(TandemError, match="inter must be a positive multiple of 8") as ei:
        K.moe_swiglu(x, 0)
    assert (ei.value.status, ei.value.op) == (INVALID_ARGUMENT, "moe_swiglu")
    x.inter = 136
    with pytest.raises(TandemError, match="null pointer"):
        K.moe_swiglu(x, 0)
    x.y, x.out, x.received = ADDR, ADDR + 8, ADDR  # out misaligned
    with pytest.raises(TandemError, match="16-byte aligned"):
        K.moe_swiglu(x, 0)
    x.capacity, x.out = 0, ADDR + 16  # no rows: nothing to launch
    K.moe_swiglu(x, 0)


def test_the_grouped_gemm_launch_checks_before_it_touches_the_gpu(K):
    # moe_grouped_gemm (moe.h: GroupedGemmArgs): its checks come before any CUDA call, so they run here
    x = K.GroupedGemmArgs()
    assert x.cluster_rows == 2 and K.moe_grouped_gemm_workspace_size(x) == 0  # no experts: nothing to size
    with pytest.raises(TandemError, match=r"experts must be in \[1, 4096\]") as ei:
        K.moe_grouped_gemm(x, 0)
    assert (ei.value.status, ei.value.op) == (INVALID_ARGUMENT, "moe_grouped_gemm")
    x.experts, x.n, x.k = 5, 520, 260  # K not a multiple of 8
    with pytest.raises(TandemError, match="N and K must be positive multiples of 8"):
        K.moe_grouped_gemm(x, 0)
    x.k = 264
    with pytest.raises(TandemError, match="null pointer"):
        K.moe_grouped_gemm(x, 0)
    x.a, x.w, x.d, x.expert_rows, x.expert_offset, x.workspace = ADDR, ADDR, ADDR + 8, ADDR, ADDR, ADDR
    with pytest.raises(TandemError, match="16-byte aligned"):  # d
        K.moe_grouped_gemm(x, 0)
    x.d = ADDR + 16
    with pytest.raises(TandemError, match="128-byte aligned"):  # the workspace (ADDR is 16-byte aligned only)
        K.moe_grouped_gemm(x, 0)
    x.workspace, x.cluster_rows = ADDR - 0x30, 3
    with pytest.raises(TandemError, match="cluster_rows must be 1 or 2"):
        K.moe_grouped_gemm(x, 0)
    # the workspace: the per-expert arrays and CUTLASS's 1 MiB, growing with the experts
    x.cluster_rows = 1
    small = K.moe_grouped_gemm_workspace_size(x)
    x.experts = 4096
    assert small > 1 << 20 and K.moe_grouped_gemm_workspace_size(x) > small
    x.experts = 4097
    assert K.moe_grouped_gemm_workspace_size(x) == 0


def test_a_gemm_configuration_that_cannot_run_raises_its_status(K):
    # gemm_variant / gemm_variant_occupancy throw like every launch (they answered '' or a reason before, which the
    # op re-raised as a CUDA failure): an unknown configuration is INVALID_ARGUMENT, found before any CUDA call
    x = K.GemmArgs()
    x.m, x.n, x.k, x.lda, x.ldb, x.ldd = 16, 16, 16, 16, 16, 16
    x.a, x.b, x.d = ADDR, ADDR, ADDR
    with pytest.raises(TandemError, match="unknown GEMM variant 'no_such_configuration'") as ei:
        K.gemm_variant("no_such_configuration", x, 0)
    assert (ei.value.status, ei.value.op) == (INVALID_ARGUMENT, "gemm")
    with pytest.raises(TandemError, match="unknown GEMM variant") as ei:
        K.gemm_variant_occupancy("no_such_configuration", x)
    assert ei.value.status == INVALID_ARGUMENT


def test_the_arrival_schedule_is_a_typed_class(K):
    s = K.ArrivalSchedule()
    s.flags, s.epoch, s.chunk_rows, s.chunks, s.first_chunk, s.source_of_chunk0 = ADDR, 2**40 + 3, 256, 4, 3, 1
    assert (s.flags, s.epoch, s.chunk_rows, s.chunks, s.first_chunk, s.source_of_chunk0) == (
        ADDR, 2**40 + 3, 256, 4, 3, 1)
    assert "schedule" in K.gemm_with_arrivals.__doc__
