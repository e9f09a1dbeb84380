"""Lifetimes on the Python side, on the CPU (issue 20): use after destroy(), symmetric tensors alive at destroy(),
and the ops' registry holding communicators weakly.

The Communicator wraps a fake native communicator here (Communicator._wrap): every call into it after its
destroy() is recorded as a violation (on a GPU that would be a use of a released communicator: garbage or a
crash), and torch.as_tensor is replaced by a holder that keeps the buffer the way a torch tensor does (views share
it), so empty/zeros/peer_view run their real code without CUDA.
"""

from __future__ import annotations

import gc
import warnings
import weakref

import pytest

torch = pytest.importorskip("torch")

from tandem.errors import INVALID_ARGUMENT, TandemError  # noqa: E402
from tandem.transport import Communicator  # noqa: E402

pytestmark = pytest.mark.timeout(60)

RANK = 1


class FakeNative:
    """The attributes and calls of tandem._C.Communicator that the Python layer uses."""

    def __init__(self, rank=RANK, world=2):
        self._rank, self._world = rank, world
        self.heap_base, self._heap_bytes = 0x7F0000000000, 1 << 20
        self.next = 0
        self.freed = []
        self.destroy_calls = 0
        self.violations = []  # calls made after destroy()
        self.events = []

    def _use(self, what):
        if self.destroy_calls:
            self.violations.append(what)
            raise RuntimeError(f"fake native: {what} after destroy")

    def __getattr__(self, name):  # the plain properties
        table = dict(rank=self._rank, world=self._world, node=0, num_nodes=1, local_ranks=[0, 1],
                     local_rank=self._rank, device=0, sm_count=132, heap_kind="vmm", heap_bytes=self._heap_bytes,
                     has_proxy=False, timeout_s=30.0, aborted=False)
        if name not in table:
            raise AttributeError(name)
        self._use(name)
        return table[name]

    def alloc(self, nbytes, align, verify):
        self._use("alloc")
        p = self.heap_base + self.next
        self.next += -(-nbytes // align) * align
        return p

    def free(self, ptr):
        self._use("free")
        self.freed.append(ptr)
        self.events.append("free")

    def peer_ptr(self, ptr, peer):
        self._use("peer_ptr")
        return ptr + (1 << 32) * (peer + 1)

    def error_info(self):
        self._use("error_info")
        return None

    def async_error(self):
        self._use("async_error")
        return None

    def abort(self):
        self._use("abort")

    def host_barrier(self):
        self._use("host_barrier")

    def destroy(self):
        self.destroy_calls += 1
        self.events.append("destroy")


class FakeTensor:
    """Holds the buffer like a torch tensor made by torch.as_tensor; views share it (as views share storage)."""

    _DTYPES = {"<f4": torch.float32, "|u1": torch.uint8, "<i2": torch.int16, "<i4": torch.int32,
               "<i8": torch.int64, "<f2": torch.float16, "|i1": torch.int8, "<f8": torch.float64, "|b1": torch.bool}

    def __init__(self, buf, dtype=None):
        cai = buf.__cuda_array_interface__
        self.buf = buf
        self.shape = cai["shape"]
        self.dtype = dtype or self._DTYPES[cai["typestr"]]
        self._ptr = cai["data"][0]

    def view(self, dtype):
        return FakeTensor(self.buf, dtype)

    def data_ptr(self):
        return self._ptr

    def element_size(self):
        return torch.empty((), dtype=self.dtype).element_size()

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def zero_(self):
        return self


class FakeDLPackTensor:
    """What torch.from_dlpack makes of a peer view's capsule, as far as lifetimes go: it holds the capsule (and so
    the capsule's owner, the peer buffer) until it is freed; views share it."""

    def __init__(self, capsule, dtype=torch.uint8):
        self.capsule = capsule
        self.dtype = dtype

    def view(self, what):
        return FakeDLPackTensor(self.capsule, what if isinstance(what, torch.dtype) else self.dtype)


class FakeTorch:
    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def as_tensor(obj, device=None):
        return FakeTensor(obj)

    @staticmethod
    def from_dlpack(capsule):
        return FakeDLPackTensor(capsule)


@pytest.fixture
def made():
    """make() -> (communicator, its fake native); checks afterwards that nothing reached a destroyed native."""
    natives = []

    def make():
        n = FakeNative()
        natives.append(n)
        return Communicator._wrap(n, FakeTorch()), n

    yield make
    for n in natives:
        assert n.violations == [], f"native calls after destroy: {n.violations}"
        assert n.destroy_calls <= 1


def _uses(comm, x):
    """Every public method and property of a Communicator, as (what, call)."""
    props = ["native", "rank", "world_size", "node", "num_nodes", "local_ranks", "local_rank", "device", "sm_count",
             "heap_kind", "heap_bytes", "has_proxy", "timeout_s", "aborted"]
    calls = [(p, lambda p=p: getattr(comm, p)) for p in props]
    calls += [
        ("empty", lambda: comm.empty((4,), torch.float32)),
        ("zeros", lambda: comm.zeros(4, torch.float32)),
        ("offset_of", lambda: comm.offset_of(x)),
        ("peer_view", lambda: comm.peer_view(x, 0)),
        ("check", comm.check),
        ("async_error", comm.async_error),
        ("synchronize", comm.synchronize),
        ("abort", comm.abort),
        ("barrier", comm.barrier),
        ("__enter__", comm.__enter__),
    ]
    return calls


def test_every_use_after_destroy_raises_naming_rank_and_op(made):
    comm, n = made()
    x = comm.empty((8,), torch.float32)
    comm.offset_of(x)  # alive: works
    del x
    comm.destroy()
    assert comm.destroyed and n.destroy_calls == 1
    y = FakeTensor(type("B", (), {"__cuda_array_interface__": {"shape": (8,), "typestr": "<f4",
                                                                "data": (n.heap_base, False)}})())
    for what, call in _uses(comm, y):
        with pytest.raises(TandemError, match=rf"^tandem: rank {RANK}: .*: communicator destroyed$") as ei:
            call()
        e = ei.value
        assert (e.status, e.rank) == (INVALID_ARGUMENT, RANK), what
        assert e.op and e.op in str(e), what
    comm.destroy()  # idempotent
    assert n.destroy_calls == 1
    assert "destroyed" in repr(comm)


def test_destroy_defers_the_release_while_symmetric_tensors_live(made):
    comm, n = made()
    x = comm.empty((16,), torch.bfloat16)  # allocated as int16, reinterpreted: a view that holds the buffer
    z = comm.zeros(4, torch.float32)
    p = comm.peer_view(x, 0)
    with pytest.warns(ResourceWarning, match=rf"rank {RANK}: destroy: 3 symmetric tensor\(s\) still alive"):
        comm.destroy()
    with pytest.raises(TandemError, match="communicator destroyed"):
        comm.empty(4, torch.float32)
    assert n.destroy_calls == 0  # x, z and p still point into the mapped heap: it must stay mapped
    del x, z
    gc.collect()
    assert n.destroy_calls == 0 and len(n.freed) == 2  # p (a peer view) still holds the mapping
    del p
    gc.collect()
    assert n.destroy_calls == 1
    assert n.events == ["free", "free", "destroy"]  # every allocation returned before the release


def test_destroy_without_tensors_releases_at_once_and_quietly(made):
    comm, n = made()
    x = comm.empty((4,), torch.float32)
    del x
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        comm.destroy()
    assert n.destroy_calls == 1 and len(n.freed) == 1


def test_garbage_collected_communicator_releases_after_its_last_tensor(made):
    comm, n = made()
    x = comm.empty((4,), torch.float32)
    ref = weakref.ref(comm)
    del comm
    gc.collect()
    assert ref() is None  # the tensor holds the heap mapping, not the Communicator
    assert n.destroy_calls == 0
    del x
    gc.collect()
    assert n.destroy_calls == 1

    comm2, n2 = made()
    del comm2
    gc.collect()
    assert n2.destroy_calls == 1


# ---- the ops' registry ------------------------------------------------------------------------------------------
@pytest.fixture
def tp():
    from tandem.ops import tp as tp_mod

    return tp_mod


class _Runtime:  # tandem.ops._runtime, imported when first used (as the tp fixture imports tp)
    def __getattr__(self, name):
        from tandem.ops import _runtime

        return getattr(_runtime, name)


rt = _Runtime()


def _fake_workspace(tp, comm, op="gemm_rs"):
    # what rt.workspace stores (it needs CUDA to make one): a symmetric tensor under (op, token, ...)
    key = (op, rt.token(comm), 64, 64, torch.bfloat16)
    rt._WORKSPACES[key] = comm.zeros(1024, torch.uint8)
    return key


def _cpu(*shape, dtype=torch.bfloat16):
    return torch.zeros(shape, dtype=dtype)


def _op_calls(h):
    """Every torch op of tandem that takes a communicator handle, called with CPU tensors and handle h."""
    import tandem.ops  # noqa: F401 - registers the ops

    ops = torch.ops.tandem
    return [
        ("ag_gemm", lambda: ops.ag_gemm(_cpu(8, 8), _cpu(8, 8), h)),
        ("gemm_rs", lambda: ops.gemm_rs(_cpu(8, 8), _cpu(8, 8), h)),
        ("gemm_ar", lambda: ops.gemm_ar(_cpu(8, 8), _cpu(8, 8), h)),
        ("moe_dispatch_gemm", lambda: ops.moe_dispatch_gemm(_cpu(4, 8), _cpu(4, 1, dtype=torch.int32),
                                                              _cpu(1, 8, 8), h)),
        ("moe_combine", lambda: ops.moe_combine(_cpu(4, 8), _cpu(16, dtype=torch.int32),
                                                _cpu(4, 1, dtype=torch.int32), _cpu(4, 1, dtype=torch.float32), h)),
        ("ring_attention", lambda: ops.ring_attention(_cpu(1, 8, 2, 64), _cpu(1, 8, 2, 64), _cpu(1, 8, 2, 64), h)),
    ]


def test_registry_does_not_keep_a_communicator_alive(made, tp):
    comm, n = made()
    h = tp.register(comm)
    assert tp.register(comm) == h  # idempotent
    key = _fake_workspace(tp, comm)
    ref = weakref.ref(comm)
    del comm
    gc.collect()
    assert ref() is None, "the ops' registry keeps the communicator alive"
    assert h not in rt._COMMS and key not in rt._WORKSPACES
    assert n.destroy_calls == 1 and len(n.freed) == 1  # its workspace went, then its heap
    for op, call in _op_calls(h):
        with pytest.raises(TandemError, match=rf"unknown communicator handle {h}") as ei:
            call()
        assert (ei.value.status, ei.value.op) == (INVALID_ARGUMENT, op)


def test_ops_with_a_destroyed_communicator_raise(made, tp):
    comm, n = made()
    h = tp.register(comm)
    key = _fake_workspace(tp, comm)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its workspaces are dropped by destroy(): nothing defers the release
        comm.destroy()
    assert key not in rt._WORKSPACES and n.destroy_calls == 1
    for op, call in _op_calls(h):
        with pytest.raises(TandemError, match=rf"^tandem: rank {RANK}: {op}: communicator handle {h} belongs to a "
                                              "destroyed communicator$") as ei:
            call()
        assert (ei.value.status, ei.value.op, ei.value.rank) == (INVALID_ARGUMENT, op, RANK)
    # the Python entry points register the communicator again: same answer
    a = _cpu(8, 8)
    with pytest.raises(TandemError, match="destroyed communicator"):
        tp.gemm_rs(comm, a, a)
    with pytest.raises(TandemError, match="destroyed communicator"):  # the op's own path (no dispatcher)
        tp.ag_gemm(comm, a, a, return_gathered=True)
    comm2, _ = made()
    assert tp.register(comm2) != h  # a later communicator never gets a dead one's handle


def test_release_workspaces_keeps_other_communicators(made, tp):
    c1, n1 = made()
    c2, n2 = made()
    k1, k2 = _fake_workspace(tp, c1), _fake_workspace(tp, c2)
    tp.release_workspaces(c1)
    assert k1 not in rt._WORKSPACES and k2 in rt._WORKSPACES and len(n1.freed) == 1 and not n2.freed
    c1.destroy()
    c2.destroy()
    assert k2 not in rt._WORKSPACES and n1.destroy_calls == n2.destroy_calls == 1
