"""tandem.transport: the communicator and its symmetric tensors.

    comm = tandem.transport.Communicator()            # bootstrap over torch.distributed's store
    x = comm.empty((1024, 1024), torch.bfloat16)      # symmetric: same offset on every rank (collective)
    y = comm.peer_view(x, peer=1)                     # the peer's copy, load/store reachable
    ...launch kernels with the device handle (C++: Communicator::device_comm())...
    comm.synchronize()                                # device sync + raise TandemError on device errors
"""

from __future__ import annotations

import itertools
import math
import os

from .._native import native
from ..bootstrap import resolve
from ..errors import TandemError, invalid

__all__ = ["Communicator"]

_VERBS_COMMS = itertools.count()

_HEAP_KINDS = ("auto", "vmm", "ipc")


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover
        raise TandemError(f"tandem.transport needs torch ({e})", 9, "import") from e
    return torch


def _cuda_array_interface(ptr: int, shape, typestr: str) -> dict:
    return {"shape": tuple(shape), "typestr": typestr, "data": (ptr, False), "strides": None, "version": 3}


class _HeapBuffer:
    """Owner of one symmetric allocation; exposes it through __cuda_array_interface__ so torch can wrap it
    (the tensor keeps this object, and through it the communicator, alive)."""

    def __init__(self, comm: "Communicator", ptr: int, shape, typestr: str):
        self._comm = comm
        self.ptr = ptr
        self.__cuda_array_interface__ = _cuda_array_interface(ptr, shape, typestr)

    def __del__(self):
        comm = self._comm
        if comm is not None and comm._native is not None:
            try:
                comm._native.free(self.ptr)
            except Exception:
                pass


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
            env = os.environ.get("TANDEM_DEVICE")
            if env is not None:
                device = int(env)
            elif os.environ.get("LOCAL_RANK") is not None:
                device = int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count()
            else:
                device = torch.cuda.current_device()
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
        self._torch = torch
        if inter_node == "verbs" and self._native.has_proxy:
            self._start_verbs_proxy(store, device, timeout_s)

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

    # ---- properties -----------------------------------------------------------------------------------
    @property
    def native(self):
        """The C++ communicator (tandem._C.Communicator), for launching tandem kernels."""
        if self._native is None:
            raise TandemError("tandem: communicator destroyed", 3, "communicator")
        return self._native

    rank = property(lambda self: self.native.rank)
    world_size = property(lambda self: self.native.world)
    node = property(lambda self: self.native.node)
    num_nodes = property(lambda self: self.native.num_nodes)
    local_ranks = property(lambda self: list(self.native.local_ranks))
    local_rank = property(lambda self: self.native.local_rank)
    device = property(lambda self: self.native.device)
    sm_count = property(lambda self: self.native.sm_count, doc="SMs this rank may use (its MPS share)")
    heap_kind = property(lambda self: self.native.heap_kind)
    heap_bytes = property(lambda self: self.native.heap_bytes)
    has_proxy = property(lambda self: self.native.has_proxy, doc="peers on other nodes go through the CPU proxy")
    timeout_s = property(lambda self: self.native.timeout_s)

    # ---- symmetric tensors ----------------------------------------------------------------------------
    def empty(self, shape, dtype, *, align: int = 256, verify: bool = True):
        """A tensor in the symmetric heap (collective: same shapes in the same order on every rank).

        With verify, the ranks compare offsets through the store and raise if they differ (a rank allocated
        or freed out of step). Freed when the last reference goes away; free in the same order on all ranks.
        """
        torch = self._torch
        if isinstance(shape, int):
            shape = (shape,)
        shape = tuple(int(s) for s in shape)
        if any(s < 0 for s in shape):
            raise invalid(f"negative dimension in {shape}", "heap.alloc", self.rank)
        itemsize = torch.empty((), dtype=dtype).element_size()
        nbytes = math.prod(shape) * itemsize
        ptr = self.native.alloc(max(nbytes, 1), align, verify)
        buf = _HeapBuffer(self, ptr, shape, _typestr(torch, dtype))
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
        base, size = self.native.heap_base, self.native.heap_bytes
        p = t.data_ptr()
        if not base <= p < base + size:
            raise invalid("tensor is not in this communicator's symmetric heap", "heap", self.rank)
        return p - base

    def peer_view(self, t, peer: int):
        """The peer's copy of symmetric tensor `t` (same shape/dtype), mapped here; raises if the peer has no
        load/store path (another node)."""
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
        holder = _PeerBuffer(self, p, tuple(t.shape), t.element_size())
        return torch.as_tensor(holder, device=f"cuda:{self.device}").view(t.dtype)

    # ---- errors, teardown -------------------------------------------------------------------------------
    def check(self):
        """Raise TandemError if a device-side error (timeout, bad address) was recorded, a local peer process
        died (status PEER_EXITED, naming it), or the communicator was aborted."""
        err = self.native.error_info()
        if err is not None:
            raise TandemError(err["message"], err["status"], err["op"], err["rank"], err["peer"])
        if self._verbs_proxy is not None:
            self._verbs_proxy.check()

    def async_error(self):
        """The first recorded device error as a dict, or None; does not synchronize."""
        return self.native.async_error()

    def synchronize(self):
        """Wait for this rank's device work, then raise any recorded device error."""
        self._torch.cuda.synchronize(self.device)
        self.check()

    def abort(self):
        """Stop every device wait of this communicator now (they return 'aborted'); sticky."""
        self.native.abort()

    @property
    def aborted(self) -> bool:
        return self.native.aborted

    def barrier(self):
        """Host-side barrier through the store (no device work)."""
        self.native.host_barrier()

    def destroy(self):
        """Synchronize and release the heap. Symmetric tensors must not be used afterwards."""
        if self._verbs_proxy is not None:  # before the queue it drains goes away
            self._verbs_proxy.stop()
            self._verbs_proxy = None
        if self._native is not None:
            self._native.destroy()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __repr__(self):
        if self._native is None:
            return "Communicator(destroyed)"
        return (
            f"Communicator(rank={self.rank}, world={self.world_size}, node={self.node}/{self.num_nodes}, "
            f"device={self.device}, sms={self.sm_count}, heap={self.heap_kind}:{self.heap_bytes >> 20}MiB)"
        )


class _PeerBuffer:
    def __init__(self, comm, ptr, shape, itemsize):
        self._comm = comm  # keep the mapping alive
        # raw integers of the element size, reinterpreted by .view(dtype)
        self.__cuda_array_interface__ = _cuda_array_interface(
            ptr, shape, {1: "|u1", 2: "<i2", 4: "<i4", 8: "<i8"}[itemsize])


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
