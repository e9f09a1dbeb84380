"""tandem.transport: the communicator and its symmetric tensors.

    comm = tandem.transport.Communicator()            # bootstrap over torch.distributed's store
    x = comm.empty((1024, 1024), torch.bfloat16)      # symmetric: same offset on every rank (collective)
    y = comm.peer_view(x, peer=1)                     # the peer's copy, load/store reachable
    ...launch kernels with the device handle (C++: Communicator::device_comm())...
    comm.synchronize()                                # device sync + raise TandemError on device errors
    comm.destroy()                                    # then every method raises TandemError ("destroyed")

Lifetimes. Symmetric tensors (empty/zeros/peer_view) hold the heap mapping (a _Lifetime), not the Communicator:
the heap is released by destroy() or when the Communicator is garbage-collected, but never while such a
tensor is alive: then the release waits for the last one (torch cannot be made to raise on a tensor's use, and
a tensor pointing at unmapped memory would fault or corrupt whatever is mapped there next).
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import warnings
import weakref

from .._native import native
from ..bootstrap import resolve
from ..errors import INVALID_ARGUMENT, TandemError, invalid

__all__ = ["Communicator"]

_VERBS_COMMS = itertools.count()
# Communicators are made collectively in the same order on every rank (as the C++ side's tags assume): the count
# names this one's keys in the store for the ops' agreement steps (tandem.ops._runtime.agree_on_key).
_OP_COMMS = itertools.count()

_HEAP_KINDS = ("auto", "vmm", "ipc")


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover
        raise TandemError(f"tandem.transport needs torch ({e})", 9, "import") from e
    return torch


# The launchers' names for a process's rank on its host: torchrun, Open MPI, MPICH/Intel MPI (Hydra), Slurm.
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID")


def default_device(device_count: int, current: int, environ=None) -> int:
    """The CUDA device of a Communicator made without `device`: TANDEM_DEVICE, else the host-local rank that the
    launcher exported (LOCAL_RANK_VARIABLES, in that order) modulo the visible devices, else the current device.
    Without any of them every rank of a host would take the same GPU, so under mpirun or srun the local rank
    must come from the launcher's own variable."""
    env = os.environ if environ is None else environ
    if env.get("TANDEM_DEVICE") not in (None, ""):
        return int(env["TANDEM_DEVICE"])
    for name in LOCAL_RANK_VARIABLES:
        v = env.get(name)
        if v not in (None, ""):
            return int(v) % max(1, device_count)
    return current


def _cuda_array_interface(ptr: int, shape, typestr: str) -> dict:
    return {"shape": tuple(shape), "typestr": typestr, "data": (ptr, False), "strides": None, "version": 3}


class _Lifetime:
    """The native communicator (and so the heap mapping) until it may go: a release was asked for (destroy(), or
    the Communicator was garbage-collected) and no symmetric tensor is alive. Symmetric tensors hold this object,
    not the Communicator, so that the ops' registry can hold Communicators weakly and a dropped Communicator
    releases its heap as soon as its tensors are gone. Counts change in __init__/__del__ of the buffers, which
    may run on any thread (the last reference to a tensor can go anywhere): hence the lock."""

    def __init__(self, native, rank: int):
        self.native = native
        self.rank = rank
        self.live = 0  # symmetric tensors (heap and peer buffers) alive
        self.closing = False
        self.verbs_proxy = None
        self._lock = threading.Lock()

    def hold(self):
        with self._lock:
            self.live += 1

    def drop(self):
        with self._lock:
            self.live -= 1
            n = self._take()
        if n is not None:  # the last tensor of a destroyed communicator: release now
            try:
                n.destroy()
            except Exception:  # noqa: BLE001 - from a __del__: nowhere to report to
                pass

    def _take(self):
        if self.closing and self.live == 0 and self.native is not None:
            n, self.native = self.native, None
            return n
        return None

    def close(self) -> int:
        """Ask for the release; returns how many symmetric tensors defer it (0: released now)."""
        proxy, self.verbs_proxy = self.verbs_proxy, None
        if proxy is not None:  # before the queue it drains goes away
            proxy.stop()
        with self._lock:
            self.closing = True
            live = self.live
            n = self._take()
        if n is not None:
            n.destroy()
        return live


class _HeapBuffer:
    """Owner of one symmetric allocation; exposes it through __cuda_array_interface__ so torch can wrap it
    (the tensor keeps this object, and through it the heap mapping, alive)."""

    def __init__(self, life: _Lifetime, ptr: int, shape, typestr: str):
        self._life = life
        self.ptr = ptr
        life.hold()  # before anything that can raise: __del__ drops it
        self.__cuda_array_interface__ = _cuda_array_interface(ptr, shape, typestr)

    def __del__(self):
        life = self._life
        n = life.native  # never None here: this buffer's hold keeps it
        try:
            if n is not None:
                n.free(self.ptr)
        except Exception:  # noqa: BLE001 - from a __del__
            pass
        finally:
            life.drop()


def _native_property(name: str, attr: str | None = None, convert=None, doc: str | None = None):
    op = f"Communicator.{name}"

    def get(self):
        v = getattr(self._live(op), attr or name)
        return convert(v) if convert is not None else v

    return property(get, doc=doc)


class Communicator:
    """A group of ranks with a symmetric heap each (collective constructor).

    Args:
        store: a torch.distributed Store; default: the default process group's, else a TCPStore from
            MASTER_ADDR/MASTER_PORT (see tandem.bootstrap).
        rank, world_size: default from the process group or RANK/WORLD_SIZE.
        heap_bytes: symmetric heap per rank.
        timeout_s: bound of every device wait (a dead peer becomes a TandemError after this long) and of setup.
        device: CUDA device index; default TANDEM_DEVICE, else LOCAL_RANK % device_count, else current.
        heap: "auto" (cuMem VMM over POSIX fds, cudaIpc if unavailable), "vmm" or "ipc".
        ranks_per_node: group consecutive ranks into emulated nodes of this size (default: by host, or
            TANDEM_RANKS_PER_NODE).
        proxy_capacity: commands in flight to the CPU proxy (power of two; peers on other nodes only).
        proxy_host: IPv4 address other nodes reach this rank's proxy at (default TANDEM_PROXY_HOST, else
            127.0.0.1 for emulated nodes).
        inter_node: the proxy's backend to other nodes: "tcp" (default; needs nothing) or "verbs" (RDMA RC QPs
            through pyverbs: `pip install 'tandem[verbs]'` and an RDMA NIC; without either, a clear TandemError
            before anything is set up). The verbs path has never run on a NIC (docs/transports.md).
    """

    def __init__(
        self,
        store=None,
        rank: int | None = None,
        world_size: int | None = None,
        *,
        heap_bytes: int = 256 << 20,
        timeout_s: float = 30.0,
        device: int | None = None,
        heap: str = "auto",
        ranks_per_node: int | None = None,
        proxy_capacity: int = 4096,
        proxy_host: str | None = None,
        inter_node: str = "tcp",
    ):
        self._native = None
        self._verbs_proxy = None
        self._rank = -1  # kept for the messages after destroy()
        self._life = None
        self._destroyed = False
        self._destroy_hooks = []  # called by destroy() before the release (the ops drop their workspaces)
        torch = _torch()
        C = native()
        if heap not in _HEAP_KINDS:
            raise invalid(f"heap must be one of {_HEAP_KINDS}, got {heap!r}", "communicator.init")
        if not isinstance(heap_bytes, int) or heap_bytes < (1 << 20):
            raise invalid(f"heap_bytes must be an int >= 1 MiB, got {heap_bytes!r}", "communicator.init")
        if not isinstance(proxy_capacity, int) or proxy_capacity < 1 or proxy_capacity & (proxy_capacity - 1):
            raise invalid(f"proxy_capacity must be a power of two, got {proxy_capacity!r}", "communicator.init")
        if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
            raise invalid(f"timeout_s must be a positive number, got {timeout_s!r}", "communicator.init")
        if inter_node not in ("tcp", "verbs"):
            raise invalid(f"inter_node must be 'tcp' or 'verbs', got {inter_node!r}", "communicator.init")
        if inter_node == "verbs":
            from . import verbs

            verbs.require_pyverbs()  # a clear TandemError, before any collective setup
        if not torch.cuda.is_available():
            raise TandemError("tandem: no CUDA device is visible to this process", 9, "communicator.init")
        store, rank, world_size = resolve(store, rank, world_size)
        if device is None:
            device = default_device(torch.cuda.device_count(), torch.cuda.current_device())
        if not 0 <= device < torch.cuda.device_count():
            raise invalid(f"device {device} not in [0, {torch.cuda.device_count()})", "communicator.init", rank)
        if ranks_per_node is None:
            ranks_per_node = int(os.environ.get("TANDEM_RANKS_PER_NODE", "0"))
        if inter_node == "verbs":
            verbs.choose_device(device)  # no NIC near this GPU: a clear TandemError, still before setup
        torch.cuda.set_device(device)
        torch.cuda.init()
        import torch.distributed as dist

        kind = {"auto": C.HeapKind.AUTO, "vmm": C.HeapKind.VMM, "ipc": C.HeapKind.IPC}[heap]
        self._native = C.Communicator(
            dist.PrefixStore("tandem", store), rank, world_size, heap_bytes, float(timeout_s), device, kind,
            ranks_per_node, proxy_capacity, proxy_host or "", inter_node == "verbs",
        )
        self._adopt(self._native, torch)
        # The ops' agreement steps (every rank publishes the key of the op it is about to make a workspace for,
        # tandem.ops._runtime.agree_on_key): this communicator's own keys in the store, and a count that gives each step its
        # own keys.
        self._op_store = dist.PrefixStore(f"tandem/ops{next(_OP_COMMS)}", store)
        self._op_seq = itertools.count()
        if inter_node == "verbs" and self._native.has_proxy:
            self._start_verbs_proxy(store, device, timeout_s)

    def _adopt(self, native_comm, torch):
        """Own the constructed native communicator: its lifetime (_Lifetime) from here on."""
        self._native = native_comm
        self._torch = torch
        self._rank = native_comm.rank
        self._life = _Lifetime(native_comm, self._rank)
        # Garbage-collected without destroy(): release the heap then (deferred while its tensors live). Not at
        # interpreter exit: teardown order there is arbitrary and the process's end releases everything anyway.
        self._finalizer = weakref.finalize(self, self._life.close)
        self._finalizer.atexit = False

    @classmethod
    def _wrap(cls, native_comm, torch=None) -> "Communicator":
        """A Communicator around an existing native one, without the collective setup (the CPU tests wrap a fake
        native communicator with it)."""
        self = cls.__new__(cls)
        self._native = None
        self._verbs_proxy = None
        self._destroyed = False
        self._destroy_hooks = []
        self._adopt(native_comm, torch if torch is not None else _torch())
        return self

    def _start_verbs_proxy(self, store, device, timeout_s):
        """RC QPs to every rank on another node, and the Python proxy thread that drains the command queue
        into them (tandem.transport.verbs_proxy). Collective over the store."""
        import os as _os

        from . import verbs
        from .verbs_proxy import PyverbsDriver, VerbsProxy

        n = self._native
        local = set(n.local_ranks)
        remote = [r for r in range(n.world) if r not in local]
        fd = n.export_heap_dmabuf()
        try:
            # Communicators are made collectively in the same order on every rank: the count names this one.
            tag = f"tandem/verbs-comm-{next(_VERBS_COMMS)}"
            driver = PyverbsDriver(store=store, rank=n.rank, peers=remote, heap_ptr=n.heap_base,
                                   heap_bytes=n.heap_bytes, dmabuf_fd=fd if isinstance(fd, int) else None,
                                   cuda_device=device, timeout_s=timeout_s, tag=tag)
        finally:
            if isinstance(fd, int):
                _os.close(fd)  # the MR holds its own reference to the dmabuf
        regions, peers = driver.planner_regions()
        self._verbs_proxy = VerbsProxy(n.command_queue, verbs.planner(regions, peers), driver, rank=n.rank,
                                       timeout_s=timeout_s, on_error=lambda err: n.abort()).start()
        self._life.verbs_proxy = self._verbs_proxy  # stopped by the release, also one from garbage collection

    # ---- properties -----------------------------------------------------------------------------------
    def _live(self, op: str):
        """The native communicator, or TandemError after destroy(): raised here, before anything reaches C++ (a
        pointer or a count read from a released communicator would be garbage, not an error)."""
        n = self._native
        if n is None:
            raise TandemError(f"tandem: rank {self._rank}: {op}: communicator destroyed", INVALID_ARGUMENT, op,
                              self._rank)
        return n

    @property
    def native(self):
        """The C++ communicator (tandem._C.Communicator), for launching tandem kernels."""
        return self._live("Communicator.native")

    @property
    def destroyed(self) -> bool:
        """True after destroy() (the one attribute that does not raise then)."""
        return self._destroyed

    rank = _native_property("rank")
    world_size = _native_property("world_size", "world")
    node = _native_property("node")
    num_nodes = _native_property("num_nodes")
    local_ranks = _native_property("local_ranks", convert=list)
    local_rank = _native_property("local_rank")
    device = _native_property("device")
    sm_count = _native_property("sm_count", doc="SMs this rank may use (its MPS share)")
    ranks_on_device = _native_property("ranks_on_device",
                                       doc="ranks of this communicator on this rank's GPU, itself included")
    heap_kind = _native_property("heap_kind")
    heap_bytes = _native_property("heap_bytes")
    has_proxy = _native_property("has_proxy", doc="peers on other nodes go through the CPU proxy")
    timeout_s = _native_property("timeout_s")

    # ---- symmetric tensors ----------------------------------------------------------------------------
    def empty(self, shape, dtype, *, align: int = 256, verify: bool = True):
        """A tensor in the symmetric heap (collective: same shapes in the same order on every rank).

        With verify, the ranks compare offsets through the store and raise if they differ (a rank allocated
        or freed out of step). Freed when the last reference goes away; free in the same order on all ranks.
        """
        n = self._live("heap.alloc")
        torch = self._torch
        if isinstance(shape, int):
            shape = (shape,)
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise invalid(f"negative dimension in {shape}", "heap.alloc", self.rank)
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = math.prod(shape) * itemsize
        typestr = _typestr(torch, dtype)  # before the allocation: an unsupported dtype must not leak heap space
        ptr = n.alloc(max(nbytes, 1), align, verify)
        buf = _HeapBuffer(self._life, ptr, shape, typestr)
        t = torch.as_tensor(buf, device=f"cuda:{self.device}")
        if t.dtype != dtype:  # bfloat16 has no typestr: allocate as raw 16-bit and reinterpret
            t = t.view(dtype)
        return t

    def zeros(self, shape, dtype, **kw):
        t = self.empty(shape, dtype, **kw)
        t.zero_()
        return t

    def offset_of(self, t) -> int:
        """Byte offset of tensor `t` in the symmetric heap (raises if it is not in the heap)."""
        n = self._live("heap.offset_of")
        base, size = n.heap_base, n.heap_bytes
        p = t.data_ptr()
        if not base <= p < base + size:
            raise invalid("tensor is not in this communicator's symmetric heap", "heap", self.rank)
        return p - base

    def peer_view(self, t, peer: int):
        """The peer's copy of symmetric tensor `t` (same shape/dtype), mapped here; raises if the peer has no
        load/store path (another node)."""
        self._live("peer_view")
        if not 0 <= peer < self.world_size:
            raise invalid(f"peer {peer} not in [0, {self.world_size})", "peer_view", self.rank)
        self.offset_of(t)
        p = self.native.peer_ptr(t.data_ptr(), peer)
        if p == 0:
            raise TandemError(
                f"tandem: rank {self.rank}: peer_view: peer {peer} is on another node (no load/store path)",
                4, "peer_view", self.rank, peer,
            )
        torch = self._torch
        holder = _PeerBuffer(self._life, p, tuple(t.shape), t.element_size())
        # Through DLPack, which names the device: from a __cuda_array_interface__ torch would take the device of
        # the memory (the peer's GPU, across NVLink) and then copy to this one, and writes would miss the peer.
        nbytes = t.numel() * t.element_size()
        raw = torch.from_dlpack(native()._dlpack_bytes(p, nbytes, self.device, holder))
        return raw.view(t.dtype).view(tuple(t.shape))

    # ---- errors, teardown -------------------------------------------------------------------------------
    def check(self):
        """Raise TandemError if a device-side error (timeout, bad address) was recorded, a local peer process
        died (status PEER_EXITED, naming it), or the communicator was aborted."""
        err = self._live("check").error_info()
        if err is not None:
            raise TandemError(err["message"], err["status"], err["op"], err["rank"], err["peer"])
        if self._verbs_proxy is not None:
            self._verbs_proxy.check()

    def async_error(self):
        """The first recorded device error as a dict, or None; does not synchronize."""
        return self._live("async_error").async_error()

    def synchronize(self):
        """Wait for this rank's device work, then raise any recorded device error."""
        self._torch.cuda.synchronize(self._live("synchronize").device)
        self.check()

    def abort(self):
        """Stop every device wait of this communicator now (they return 'aborted'); sticky."""
        self._live("abort").abort()

    @property
    def aborted(self) -> bool:
        return self._live("aborted").aborted

    def barrier(self):
        """Host-side barrier through the store (no device work)."""
        self._live("barrier").host_barrier()

    def destroy(self):
        """Synchronize and release the heap; idempotent. Afterwards every method and property raises TandemError
        ("communicator destroyed"), except destroy() and `destroyed`.

        The ops' workspaces of this communicator (tandem.ops) are dropped first. Symmetric tensors of yours that
        are still alive (empty/zeros/peer_view, and views of them) keep the heap mapped: the release waits until
        the last of them is freed (a ResourceWarning says how many), so no tensor ever points at unmapped memory.
        Do not use them after destroy(): their contents are no longer defined and their ranks no longer
        synchronize. Free them (del) before destroy() on every rank to release the heap at once and in step
        (for cudaIpc heaps and the CPU proxy the release meets the peers)."""
        if self._destroyed or self._life is None:
            return
        self._destroyed = True
        try:
            hooks, self._destroy_hooks = self._destroy_hooks, []
            for fn in hooks:
                fn()
        finally:
            self._native = None  # from here every method raises
            self._verbs_proxy = None
            live = self._finalizer()  # _Lifetime.close, once (None if it ran already)
        if live:
            warnings.warn(f"tandem: rank {self._rank}: destroy: {live} symmetric tensor(s) still alive; the heap "
                          "stays mapped until the last is freed (do not use them)", ResourceWarning, stacklevel=2)

    def __enter__(self):
        self._live("Communicator.__enter__")
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __repr__(self):
        if self._native is None:
            return f"Communicator(rank={self._rank}, destroyed)"
        return (
            f"Communicator(rank={self.rank}, world={self.world_size}, node={self.node}/{self.num_nodes}, "
            f"device={self.device}, sms={self.sm_count}, heap={self.heap_kind}:{self.heap_bytes >> 20}MiB)"
        )


class _PeerBuffer:
    """A peer's copy of a symmetric tensor, mapped here: holds the mapping (the _Lifetime) like _HeapBuffer, frees
    nothing."""

    def __init__(self, life: _Lifetime, ptr, shape, itemsize):
        self._life = life
        life.hold()  # before anything that can raise: __del__ drops it
        # raw integers of the element size, reinterpreted by .view(dtype)
        self.__cuda_array_interface__ = _cuda_array_interface(
            ptr, shape, {1: "|u1", 2: "<i2", 4: "<i4", 8: "<i8"}[itemsize])

    def __del__(self):
        self._life.drop()


def _typestr(torch, dtype) -> str:
    table = {
        torch.float32: "<f4",
        torch.float64: "<f8",
        torch.float16: "<f2",
        torch.bfloat16: "<i2",  # no typestr for bf16: allocated as int16 and reinterpreted
        torch.int8: "|i1",
        torch.uint8: "|u1",
        torch.int16: "<i2",
        torch.int32: "<i4",
        torch.int64: "<i8",
        torch.bool: "|b1",
    }
    if dtype not in table:
        raise invalid(f"dtype {dtype} is not supported in the symmetric heap", "heap.alloc")
    return table[dtype]
