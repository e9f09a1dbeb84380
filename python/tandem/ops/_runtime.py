"""The ops' shared runtime: what ag_gemm/gemm_rs/gemm_ar (tp.py), the MoE ops (moe.py) and ring attention
(attention.py) all need, so that each of those files holds only its own op.

* the communicator registry: torch.library ops take integers, so a communicator reaches an op as a handle
  (register), held weakly, with a token that ties every cached workspace to the communicator's lifetime;
* the agreement step: the first call of an op key on a communicator checks that every rank has the same key
  (op_key, agree) before anything is allocated or launched;
* the workspace cache: symmetric buffers made on a key's first call (collective), zeroed, with the kernels they
  need loaded first (preload);
* prepared calls: what an op decided on the first call of a call signature (checks passed, plan, agreement,
  workspace, launch arguments), so that later calls with that signature only launch (the host path is what small
  problems wait for: docs/results.md, issue 21);
* op definition (define_op): the ops are torch.library ops defined by schema, which dispatches in about a third
  of the host time of torch.library.custom_op's wrapper (measured 6.5-8 us against 18 us a call on the CPU
  machine, torch 2.13);
* the small shared helpers: the current stream's handle, the tensor checks every op starts with.
"""

from __future__ import annotations

import functools
import itertools
import weakref

import torch

from .._native import native
from ..errors import INVALID_ARGUMENT, TandemError, invalid

# Handle -> communicator, weakly: the registry must not keep a communicator (and its heap) alive. The workspaces
# (keys: (op, token, ...)) hold the heap mapping, not the communicator (transport._Lifetime); they are dropped when
# their communicator is destroyed (its destroy hooks) or garbage-collected (a weakref.finalize), which lets the heap
# go. So a CUDA graph that replays these ops needs its communicator kept alive (and not destroyed) by the caller.
_COMMS: dict[int, weakref.ref] = {}
_WORKSPACES: dict[tuple, torch.Tensor] = {}
# (op, token, signature...) -> the op's launcher for that signature (see prepared()); dropped with the workspaces.
_PREPARED: dict[tuple, object] = {}
PREPARED_LIMIT = 4096  # signatures remembered at most (then the cache starts over: re-preparing is host work only)


_NEXT_TOKEN = itertools.count(1)


def token(comm) -> int:
    """A number this communicator owns for its lifetime (id() can be reused by a later object once this one is
    gone, which would hand a new communicator a destroyed one's workspaces). Every workspace key has it, so the
    first call ties the ops' state of `comm` to its lifetime."""
    t = getattr(comm, "_tandem_op_token", None)
    if t is None:
        t = next(_NEXT_TOKEN)
        comm._tandem_op_token = t
        try:
            gone = weakref.finalize(comm, _forget, t)  # collected: its registry entry and workspaces go
            gone.atexit = False  # at exit the process's end releases everything; no teardown-order surprises
        except TypeError:  # a stand-in without weak references (tests' namespaces): registered strongly below
            pass
        hooks = getattr(comm, "_destroy_hooks", None)
        if hooks is not None:  # destroy(): its workspaces go first, so that the heap can be released at once
            hooks.append(functools.partial(_drop_workspaces, t))
    return t


def _drop_workspaces(token: int):
    # list(): a snapshot taken without running Python code, so a finalizer run by the garbage collector in between
    # cannot change the dict under the loop
    for k in list(_WORKSPACES):
        if k[1] == token:
            _WORKSPACES.pop(k, None)
    for k in list(_PREPARED):  # their launchers hold the workspaces
        if k[1] == token:
            _PREPARED.pop(k, None)


def _forget(token: int):
    _COMMS.pop(token, None)
    _drop_workspaces(token)


def register(comm) -> int:
    """The handle of `comm` for the ops (idempotent). The registry holds `comm` weakly."""
    h = token(comm)
    if h not in _COMMS:
        try:
            _COMMS[h] = weakref.ref(comm)
        except TypeError:  # not weakly referenceable (a stand-in, never a Communicator): held as before
            _COMMS[h] = lambda: comm
    return h


def comm_from_handle(handle: int, op: str):
    ref = _COMMS.get(int(handle))
    c = ref() if ref is not None else None
    if c is None:
        raise invalid(f"unknown communicator handle {handle}: never registered, or its communicator was "
                      "garbage-collected (tandem.ops.tp.register(comm) first, and keep the communicator)", op)
    if getattr(c, "destroyed", False):
        rank = getattr(c, "_rank", -1)
        raise TandemError(f"tandem: rank {rank}: {op}: communicator handle {handle} belongs to a destroyed "
                          "communicator", INVALID_ARGUMENT, op, rank)
    return c


_LOADED: set = set()


def preload(op, rank, loaders):
    # Load the op's kernels before its first launch: with lazy module loading, a kernel's first launch behind a
    # running kernel that waits for proxy traffic can hold that traffic up until the device timeout (seen on the
    # H200: the unfused AG's GEMM behind its copy kernel). `loaders`: names of the bindings' preload functions
    # (tp_gemm.h, moe.h, ring_attention.h: preload_kernels), each called once per process.
    for name in loaders:
        if name not in _LOADED:
            try:
                getattr(native().kernels, name)()
            except TandemError as e:  # e names the loader; say which op needed it
                raise TandemError(f"tandem: rank {rank}: {op}: loading its kernels failed ({e})", e.status, op,
                                  rank) from None
            _LOADED.add(name)


# ---- ranks agree, or it is an error ---------------------------------------------------------------------------
# A call whose op key (op_key: everything that sizes or lays out the workspace, or decides what the kernels exchange)
# is new on this communicator first takes an agreement step: every rank publishes its key in the communicator's
# store (Communicator._op_store, keys "agree<seq>/<rank>", seq counting this communicator's steps) and reads the
# others', bounded by timeout_s. Keys that differ raise a TandemError on every rank, naming each rank's key, before
# anything is allocated or launched; the ranks stay in step and the communicator stays usable. Then the
# workspace is made (if it is new) and the key is remembered with it: later calls with the same key skip the step
# (no host cost on the hot path, nothing to do in a CUDA graph replay).
#
# Limits. A rank whose key is already agreed skips the step, so if rank 0 calls a known key and rank 1 a new one,
# rank 1 times out in the step (a TandemError after timeout_s; its communicator is then aborted: the ranks are out
# of step) and rank 0's kernel times out on the device (a TandemError from comm.check() / synchronize()). Two
# different keys that are both known already are not compared: each rank launches on its own workspace, whose
# size is the same on every rank (agreed when it was made), so nothing is written out of bounds; the peers' signals
# never come and the device waits time out (TandemError, timeout) — unless both keys share one workspace (same
# sizes, e.g. AG+GEMM with another N), in which case the kernels run with each rank's own arguments.

_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def op_key(op: str, **fields) -> tuple:
    """The key the ranks must agree on for one call of `op`: ((name, value), ...), "op" first, in the order given
    (dtypes by their short names)."""
    return (("op", op),) + tuple((k, _DTYPE_NAMES.get(v, str(v)) if isinstance(v, torch.dtype) else v)
                                 for k, v in fields.items())


def format_key(key: tuple) -> str:
    """(op=ag_gemm, m_local=512, ...)"""
    return "(" + ", ".join(f"{k}={v}" for k, v in key) + ")"


def _ranks(rs) -> str:
    return f"rank {rs[0]}" if len(rs) == 1 else "ranks " + ", ".join(str(r) for r in rs)


def disagreement(op: str, rank: int, keys: list) -> str | None:
    """None if every rank's formatted key (keys[r]) is this rank's, else the TandemError message naming each key
    and the ranks that have it."""
    if all(k == keys[rank] for k in keys):
        return None
    groups: dict = {}
    for r, k in enumerate(keys):
        groups.setdefault(k, []).append(r)
    parts = [f"{_ranks(rs)} {'has' if len(rs) == 1 else 'have'} {k}" for k, rs in groups.items()]
    return (f"tandem: rank {rank}: {op}: ranks disagree: " + ", ".join(parts) +
            " (every rank must call the op with the same shapes and options; nothing was allocated or launched)")


def _store_has(store, key) -> bool:
    try:
        return bool(store.check([key]))
    except Exception:  # noqa: BLE001 - a failing store: report the rank as missing
        return False


def _wait_keys(comm, store, keys, timeout_s) -> bool:
    """True once every key is in the store, False after timeout_s. Waits in slices: between them comm.check()
    (when the communicator has one) raises at once if a local peer exited or the communicator was aborted."""
    import datetime
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        t0 = time.monotonic()
        left = deadline - t0
        if left <= 0:
            return False
        try:
            # (at least 10 ms: a store reads a timeout that rounds to 0 ms as "no timeout")
            store.wait(keys, datetime.timedelta(seconds=max(0.01, min(left, 0.25))))
            return True
        except Exception:  # noqa: BLE001 - the store's timeout error (its type differs between stores and versions)
            pass
        check = getattr(comm, "check", None)
        if check is not None:
            try:
                check()
            except TandemError as e:
                comm._op_agree_failed = str(e)
                raise
        spent = time.monotonic() - t0
        if spent < 0.05:  # a store that fails at once (its server gone): do not spin
            time.sleep(0.05 - spent)


def agree_on_key(comm, op: str, key: tuple) -> None:
    """The agreement step (collective over the store, bounded by comm.timeout_s); raises TandemError on every rank
    if the keys differ (INVALID_ARGUMENT), or on this rank if a peer does not take the step in time (TIMEOUT)."""
    world, rank = comm.world_size, comm.rank
    if world == 1:
        return
    failed = getattr(comm, "_op_agree_failed", None)
    if failed is not None:
        raise TandemError(f"tandem: rank {rank}: {op}: an earlier agreement step of this communicator failed, the "
                          f"ranks are out of step ({failed}); make a new communicator", 2, op, rank)
    store = getattr(comm, "_op_store", None)
    if store is None:
        raise TandemError(f"tandem: rank {rank}: {op}: this communicator has no store for the ranks' agreement step",
                          10, op, rank)
    seq = next(comm._op_seq)
    mine = format_key(key)
    tag = f"agree{seq}/"
    timeout_s = float(comm.timeout_s)
    try:
        store.set(f"{tag}{rank}", mine)
    except Exception as e:  # noqa: BLE001
        raise TandemError(f"tandem: rank {rank}: {op}: the agreement step could not publish this rank's key: {e}",
                          7, op, rank) from None
    others = [r for r in range(world) if r != rank]
    if not _wait_keys(comm, store, [f"{tag}{r}" for r in others], timeout_s):
        missing = [r for r in others if not _store_has(store, f"{tag}{r}")] or others
        why = f"{_ranks(missing)} did not take agreement step {seq} within {timeout_s:g} s"
        comm._op_agree_failed = why
        try:  # a peer that reaches this step late reads this instead of a key it would agree with
            store.set(f"{tag}{rank}", f"<rank {rank} gave up waiting after {timeout_s:g} s>")
        except Exception:  # noqa: BLE001
            pass
        if hasattr(comm, "abort"):
            comm.abort()  # out of step: no later device wait of this rank may wait for a peer that will not come
        raise TandemError(
            f"tandem: rank {rank}: {op}: ranks out of step: {why} (this rank has {mine}). A rank whose key is known "
            f"already (its workspace exists) skips the step: the ranks called different ops or shapes, or a rank "
            f"stopped calling. This communicator is aborted", 1, op, rank, missing[0]) from None
    keys = []
    for r in range(world):
        v = mine if r == rank else store.get(f"{tag}{r}")
        keys.append(v.decode() if isinstance(v, bytes) else str(v))
    msg = disagreement(op, rank, keys)
    if msg is not None:
        peer = next(r for r in range(world) if keys[r] != mine)
        raise TandemError(msg, 3, op, rank, peer)


def workspace(comm, key: tuple, nbytes: int, loaders=("preload_kernels",), agree: tuple | None = None) -> torch.Tensor:
    """The op's symmetric workspace for cache key `key` (op name first), made on first use (collective). `agree`:
    the op key (op_key) of this call; one the workspace has not seen yet is agreed on first (agree_on_key), before any
    allocation. The workspace's size is part of what is agreed."""
    ws = _WORKSPACES.get(key)
    agreed = getattr(ws, "_tandem_agreed", None) if ws is not None else None
    if agree is not None and agreed is not None and agree in agreed:
        return ws
    if ws is None and torch.cuda.is_current_stream_capturing():
        raise invalid("the first call for a shape allocates the workspace (collective) and cannot be captured: "
                      "run the op once before capturing", key[0], comm.rank)
    if agree is not None:
        agree_on_key(comm, key[0], agree + (("workspace_bytes", int(nbytes)),))
    if ws is None:
        preload(key[0], comm.rank, loaders)
        ws = comm.zeros(nbytes, torch.uint8)
        torch.cuda.synchronize()
        comm.barrier()  # nobody may signal into a workspace before its owner zeroed it
        _WORKSPACES[key] = ws
    if agree is not None:
        if getattr(ws, "_tandem_agreed", None) is None:
            ws._tandem_agreed = set()  # the keys agreed for this workspace (it goes with the workspace when released)
        ws._tandem_agreed.add(agree)
    return ws


def release_workspaces(comm=None):
    """Free the cached workspaces (of `comm`, or all). Collective: call on every rank. (Communicator.destroy()
    frees its own.)"""
    if comm is not None:
        _drop_workspaces(token(comm))
        return
    _PREPARED.clear()
    _WORKSPACES.clear()
    from . import _dispatcher  # the GEMM ops' C++ kernels keep prepared calls of their own

    _dispatcher.clear_cache()


# ---- prepared calls -----------------------------------------------------------------------------------------------
# The first call of a signature (the op, the communicator's token, the options, and every input's shape, strides,
# dtype and device) takes the whole path: the checks, the plan (mode="auto"), the agreement step, the workspace, the
# kernels' own can_implement. What it decided is kept as a launcher; a later call with the same signature only
# checks what the signature does not fix (the inputs' addresses: 16-byte alignment) and launches. So a signature's
# plan is fixed at its first call: a tuned table rewritten during a job applies to signatures first called after
# it (and ranks that read different tables for one signature get the agreement step's error, as before).


def prepared(key: tuple):
    """The launcher remembered for signature `key` ((op, token, ...); token None for an op without a
    communicator), or None."""
    return _PREPARED.get(key)


def remember(key: tuple, launcher):
    if len(_PREPARED) >= PREPARED_LIMIT:
        _PREPARED.clear()
    _PREPARED[key] = launcher
    return launcher


# torch's raw current-stream getter (what its generated code calls): one C call, where
# torch.cuda.current_stream(dev).cuda_stream builds a Stream object first.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def peer_bases(comm, ws, op: str) -> list:
    """Each rank's address of workspace `ws` (a symmetric tensor) as mapped here, this rank's own included:
    resolved once per workspace (kept on it) and before a call advances any epoch, so that a failure here leaves
    the ranks in step. Raises (UNAVAILABLE) for a peer without a load/store path (another node)."""
    bases = getattr(ws, "_tandem_peer_bases", None)
    if bases is None:
        local = ws.data_ptr()
        bases = []
        for q in range(comm.world_size):
            p = local if q == comm.rank else comm.native.peer_ptr(local, q)
            if not p:
                raise TandemError(f"tandem: rank {comm.rank}: {op}: peer {q} has no load/store path", 4, op,
                                  comm.rank, q)
            bases.append(p)
        ws._tandem_peer_bases = bases
    return bases


_SIDE_STREAMS: dict = {}


def side_stream(device: torch.device, purpose: str) -> torch.cuda.Stream:
    """A side stream of `device` for one purpose (an op forks to it and joins it back before it returns), made on
    first use and kept: a CUDA graph capture must not create streams. One per purpose, so that different ops'
    side work is not ordered behind each other."""
    key = (torch.device(device), purpose)
    s = _SIDE_STREAMS.get(key)
    if s is None:
        s = _SIDE_STREAMS[key] = torch.cuda.Stream(device=device)
    return s


def stream_handle(dev):
    if _RAW_STREAM is not None:
        return _RAW_STREAM(dev.index if isinstance(dev, torch.device) else int(dev))
    return torch.cuda.current_stream(dev).cuda_stream


# ---- op definition ------------------------------------------------------------------------------------------------
_LIB = torch.library.Library("tandem", "DEF")  # kept for the process's life: the ops live as long as it does


def define_op(name: str, schema: str, impl, fake):
    """Define torch.ops.tandem.<name> with `schema` (torch's schema language, without the name), `impl` for every
    backend (the ops check their inputs' devices themselves, so a CPU tensor gets tandem's error, not the
    dispatcher's), and `fake` for torch.compile / meta tensors. Returns the op (torch.ops.tandem.<name>)."""
    _LIB.define(name + schema)
    _LIB.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake("tandem::" + name, fake, lib=_LIB)
    return getattr(torch.ops.tandem, name)



DTYPES = {torch.bfloat16: 0, torch.float16: 1}  # the ops' element types -> the kernels' dtype codes


def kernel_args(name: str, plan: dict | None = None, shape: dict | None = None, **fields):
    """One of the kernels layer's typed Args (tandem._C.kernels.<name>: GemmArgs, AgGemmArgs, GemmRsArgs,
    GemmArArgs, DispatchArgs, CombineArgs, RingArgs), its fields set by name (device addresses as ints, dtype as
    a DTYPES code); `plan` and `shape` set the fields of the nested structs of the same names."""
    x = getattr(native().kernels, name)()
    for k, v in fields.items():
        setattr(x, k, v)
    for k, v in (plan or {}).items():
        setattr(x.plan, k, v)
    for k, v in (shape or {}).items():
        setattr(x.shape, k, v)
    return x


def mode(name: str):
    """The kernels layer's Mode (FUSED, UNFUSED, GATHER, WAIT, REDUCE, DISPATCH)."""
    return getattr(native().kernels.Mode, name)


def check_on_device(comm, t, name: str, op: str):
    """`t` is a tensor on the communicator's GPU, or a clear error naming the op and rank."""
    dev = torch.device("cuda", comm.device)
    if not isinstance(t, torch.Tensor):
        raise invalid(f"{name} must be a tensor", op, comm.rank)
    if t.device != dev:
        raise invalid(f"{name} must be on the communicator's device {dev}, got {t.device}", op, comm.rank)


# ---- the ops' input checks (one place: each op names its own tensors and calls these before anything is
# allocated; the adapters' can_implement is the last guard before a launch) ----------------------------------
def check_tensor(t, name: str, op: str, rank: int, *, dims: int, device=None, dims_doc: str = "",
                 layout: str = "rows"):
    """`t` is a bf16/fp16 tensor of `dims` dimensions on `device` (None: any CUDA device), laid out for the
    kernels: layout "rows" (each row contiguous and 16-byte aligned: 2-D operands with a row stride) or
    "contiguous" (the whole tensor, 16-byte aligned). Raises INVALID_ARGUMENT naming the tensor, op and rank."""
    if not isinstance(t, torch.Tensor):
        raise invalid(f"{name} must be a torch.Tensor, got {type(t).__name__}", op, rank)
    if device is not None:
        if t.device != device:
            raise invalid(f"{name} must be on the communicator's device {device}, got {t.device}", op, rank)
    elif not t.is_cuda:
        raise invalid(f"{name} must be a CUDA tensor, got device {t.device}", op, rank)
    if t.dim() != dims:
        raise invalid(f"{name} must be {dims}-D{dims_doc}, got shape {tuple(t.shape)}", op, rank)
    if t.dtype not in DTYPES:
        raise invalid(f"{name} must be bfloat16 or float16, got {t.dtype}", op, rank)
    if layout == "rows":
        if t.stride(-1) != 1 or t.stride(0) % 8 or t.data_ptr() % 16:
            raise invalid(f"{name} must have contiguous, 16-byte aligned rows (strides {t.stride()})", op, rank)
    elif not t.is_contiguous() or t.data_ptr() % 16:
        raise invalid(f"{name} must be contiguous and 16-byte aligned (strides {t.stride()}, address "
                      f"{t.data_ptr():#x})", op, rank)


def check_matmul(a, b, op: str, rank: int = -1, device=None):
    """A (M x K) @ B (K x N) as the GEMM core takes it (the plain GEMM and the TP ops): both 2-D bf16/fp16 with
    contiguous 16-byte aligned rows, one dtype, one device (`device` if given: the communicator's), inner
    dimensions equal, nothing empty, K and N multiples of 8 (16-byte rows for TMA). INVALID_ARGUMENT otherwise."""
    check_tensor(a, "a", op, rank, dims=2)
    check_tensor(b, "b", op, rank, dims=2)
    if a.dtype != b.dtype:
        raise invalid(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}", op, rank)
    if device is not None and (a.device != device or b.device != device):
        raise invalid(f"a and b must be on the communicator's device {device}, got {a.device} and {b.device}", op,
                      rank)
    if a.device != b.device:
        raise invalid(f"a and b must be on the same device, got {a.device} and {b.device}", op, rank)
    if a.shape[1] != b.shape[0]:
        raise invalid(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}", op, rank)
    if 0 in a.shape or b.shape[1] == 0:
        raise invalid(f"empty problem a {tuple(a.shape)}, b {tuple(b.shape)}", op, rank)
    if a.shape[1] % 8 or b.shape[1] % 8:
        raise invalid(f"K ({a.shape[1]}) and N ({b.shape[1]}) must be multiples of 8 (16-byte rows for TMA)", op, rank)


def world_of_one_launcher(op: str, gemm):
    """An op of a communicator of one rank: the launcher (comm, a, b) -> its result, with `gemm` (a, b) -> A @ B
    for the op's work (nothing to exchange): an all-gather op returns (C, A) as at any world (the gathered rows are
    A itself), the others C. The caller has made the same checks as at any world."""
    if op.endswith("ag_gemm"):
        return lambda comm, a, b: (gemm(a, b), a)
    return lambda comm, a, b: gemm(a, b)


def check_mode(mode, modes: tuple, op: str, rank: int):
    """`mode` is one of the op's `modes`."""
    if mode not in modes:
        names = ", ".join(repr(m) for m in modes[:-1]) + f" or {modes[-1]!r}"
        raise invalid(f"mode must be {names}, got {mode!r}", op, rank)


def check_comm_blocks(comm_blocks, op: str, rank: int):
    """comm_blocks is 0 (the op's plan) or a positive even number (the roles take whole 2-block rows)."""
    if comm_blocks < 0 or comm_blocks % 2:
        raise invalid(f"comm_blocks must be 0 (heuristic) or a positive even number, got {comm_blocks}", op, rank)

