"""Tensor-parallel fused ops: torch.ops.tandem.ag_gemm, torch.ops.tandem.gemm_rs and torch.ops.tandem.gemm_ar.

    ag_gemm(a_local, b):  all_gather(a_local) @ b      a_local (M/W x K) per rank, b (K x N)  -> (M x N)
    gemm_rs(a, b):        reduce_scatter(a @ b)         a (M x K), b (K x N)                  -> (M/W x N)
    gemm_ar(a, b):        all_reduce(a @ b)             a (M x K), b (K x N)                  -> (M x N), the
                          same bytes on every rank (fixed reduction order, owners' rows gathered)

Every rank of the communicator calls the op with the same shapes, in the same order (it is a collective).
The communicator reaches the op as an integer handle (`register(comm)`), because torch.library ops take
tensors and scalars only. Modes: "fused" (one role-specialized kernel), "unfused" (tandem's all-gather or
reduction kernel next to the plain GEMM, one after the other), "auto" (the measured choice, AUTO_RULES below;
world 1 is the plain GEMM). The workspace (symmetric heap) is made on the first call for
a shape and reused: make that first call before capturing a CUDA graph (allocation is collective and not
capturable); replays are safe (epochs live on the device).
"""

from __future__ import annotations

import itertools

import torch

from .._native import native
from ..errors import TandemError, invalid
from .gemm import _DTYPES, gemm as _plain_gemm

# The crossover, measured (docs/results.md, one H200 under MPS, 2026-12-03, commit a03d283 at world 4 and the
# AG poll-sleep sweep at world 2), as fused/unfused speed (M x N x K of the layer):
#   AG+GEMM  1.58x at 8192x4096x8192, 1.03x at 16384x8192x4096, 0.95x at 1024x4096x8192 (w4); 1.59x at the
#            first shape per rank at w2 (diag)                          -> fused from M*N*K >= 2**38
#   GEMM+RS  1.00x, 0.95x, 1.52x (w4); 1.10x, 1.03x (w2)                -> fused
#   GEMM+AR  1.10x, 1.03x, 0.89x (8 MiB output, w4); 1.07x, 1.02x (w2)  -> fused above 8 MiB of output
# Few points, one GPU shared by all ranks: a multi-GPU machine will move these. mode="fused"/"unfused" force.
AUTO_RULES = {
    "ag_gemm": lambda m, n, k: m * n * k >= 2**38,
    "gemm_rs": lambda m, n, k: True,
    "gemm_ar": lambda m, n, k: m * n * 2 > (8 << 20),
}


def auto_fused(op: str, m: int, n: int, k: int) -> bool:
    """What mode="auto" picks for the layer problem M x N x K (the measured rule above)."""
    return bool(AUTO_RULES[op](m, n, k))

_COMMS: dict[int, object] = {}
_WORKSPACES: dict[tuple, torch.Tensor] = {}


_NEXT_TOKEN = itertools.count(1)


def _token(comm) -> int:
    """A number this communicator owns for its lifetime (id() can be reused by a later object once this one is
    gone, which would hand a new communicator a destroyed one's workspaces)."""
    t = getattr(comm, "_tandem_op_token", None)
    if t is None:
        t = next(_NEXT_TOKEN)
        comm._tandem_op_token = t
    return t


def register(comm) -> int:
    """The handle of `comm` for the ops (idempotent)."""
    h = _token(comm)
    _COMMS[h] = comm
    return h


def _comm(handle: int, op: str):
    c = _COMMS.get(int(handle))
    if c is None:
        raise invalid(f"unknown communicator handle {handle} (tandem.ops.tp.register(comm) first)", op)
    return c


_LOADED: set = set()


def _preload(op, rank, loaders):
    # Load the op's kernels before its first launch: with lazy module loading, a kernel's first launch behind a
    # running kernel that waits for proxy traffic can hold that traffic up until the device timeout (seen on the
    # H200: the unfused AG's GEMM behind its copy kernel). `loaders`: names of the bindings' preload functions
    # (tp_gemm.h, moe.h, ring_attention.h: preload_kernels), each called once per process.
    for name in loaders:
        if name not in _LOADED:
            err = getattr(native().kernels, name)()
            if err:
                raise TandemError(f"tandem: {op}: loading the kernels failed: {err}", 5, op, rank)
            _LOADED.add(name)


def _workspace(comm, key: tuple, nbytes: int, loaders=("preload_kernels",)) -> torch.Tensor:
    ws = _WORKSPACES.get(key)
    if ws is None:
        if torch.cuda.is_current_stream_capturing():
            raise invalid("the first call for a shape allocates the workspace (collective) and cannot be captured: "
                          "run the op once before capturing", key[0], comm.rank)
        _preload(key[0], comm.rank, loaders)
        ws = comm.zeros(nbytes, torch.uint8)
        torch.cuda.synchronize()
        comm.barrier()  # nobody may signal into a workspace before its owner zeroed it
        _WORKSPACES[key] = ws
    return ws


def release_workspaces(comm=None):
    """Free the cached workspaces (of `comm`, or all). Collective: call on every rank."""
    for k in [k for k in _WORKSPACES if comm is None or k[1] == _token(comm)]:
        del _WORKSPACES[k]


def _check_matrix(t, name, op, rank):
    if not isinstance(t, torch.Tensor):
        raise invalid(f"{name} must be a torch.Tensor, got {type(t).__name__}", op, rank)
    if not t.is_cuda:
        raise invalid(f"{name} must be a CUDA tensor, got device {t.device}", op, rank)
    if t.dim() != 2:
        raise invalid(f"{name} must be 2-D, got shape {tuple(t.shape)}", op, rank)
    if t.dtype not in _DTYPES:
        raise invalid(f"{name} must be bfloat16 or float16, got {t.dtype}", op, rank)
    if t.stride(1) != 1 or t.stride(0) % 8 or t.data_ptr() % 16:
        raise invalid(f"{name} must have contiguous, 16-byte aligned rows (strides {t.stride()})", op, rank)


def _validate(comm, a, b, op):
    rank = comm.rank
    _check_matrix(a, "a", op, rank)
    _check_matrix(b, "b", op, rank)
    if a.dtype != b.dtype:
        raise invalid(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}", op, rank)
    dev = torch.device("cuda", comm.device)
    if a.device != dev or b.device != dev:
        raise invalid(f"a and b must be on the communicator's device {dev}, got {a.device} and {b.device}", op, rank)
    if a.shape[1] != b.shape[0]:
        raise invalid(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}", op, rank)
    if 0 in a.shape or b.shape[1] == 0:
        raise invalid(f"empty problem a {tuple(a.shape)}, b {tuple(b.shape)}", op, rank)
    if a.shape[1] % 8 or b.shape[1] % 8:
        raise invalid(f"K ({a.shape[1]}) and N ({b.shape[1]}) must be multiples of 8 (16-byte rows for TMA)", op, rank)


def _stream(dev):
    return torch.cuda.current_stream(dev).cuda_stream


def _check_mode(mode, op, rank):
    if mode not in ("auto", "fused", "unfused"):
        raise invalid(f"mode must be 'auto', 'fused' or 'unfused', got {mode!r}", op, rank)


def _check_blocks(comm_blocks, op, rank):
    if comm_blocks < 0 or comm_blocks % 2:
        raise invalid(f"comm_blocks must be 0 (heuristic) or a positive even number, got {comm_blocks}", op, rank)


def _check_nodes(comm, op):
    # Across nodes the kernels route every chunk between ranks of one local index: nodes must be groups of
    # consecutive ranks of one size (emulated nodes always are; so are the usual launchers' layouts).
    n = comm.native
    if n.num_nodes > 1 and n.uniform_ranks_per_node == 0:
        raise TandemError(f"tandem: {op}: the nodes are not groups of consecutive ranks of one size (local ranks "
                          f"{list(n.local_ranks)} of world {comm.world_size}); relaunch with ranks grouped by node",
                          9, op, comm.rank)


def _ag(comm, a_local, b, mode, comm_blocks, sm_count):
    op = "ag_gemm"
    _check_nodes(comm, op)
    _validate(comm, a_local, b, op)
    _check_mode(mode, op, comm.rank)
    _check_blocks(comm_blocks, op, comm.rank)
    if not a_local.is_contiguous():
        raise invalid(f"a_local must be contiguous (strides {a_local.stride()})", op, comm.rank)
    world = comm.world_size
    m_local, k = a_local.shape
    n = b.shape[1]
    K = native().kernels
    key = ("ag_gemm", _token(comm), m_local, k, a_local.dtype)
    ws = _workspace(comm, key, K.ag_gemm_workspace_size(comm.native, m_local, k))
    off = K.ag_gemm_gathered_offset(comm.native, m_local, k)
    gathered = ws[off:off + world * m_local * k * a_local.element_size()].view(a_local.dtype).view(world * m_local, k)
    c = torch.empty((world * m_local, n), dtype=a_local.dtype, device=a_local.device)
    dt = _DTYPES[a_local.dtype]
    args = (dt, m_local, n, k, a_local.data_ptr(), b.data_ptr(), b.stride(0), c.data_ptr(), c.stride(0),
            ws.data_ptr(), int(sm_count), int(comm_blocks))
    if mode == "auto" and not auto_fused("ag_gemm", world * m_local, n, k):
        mode = "unfused"
    if mode in ("auto", "fused"):
        why = K.ag_gemm(comm.native, "check", *args, 0)
        if why and mode == "fused":
            raise invalid(f"the fused kernel cannot run this problem: {why}", op, comm.rank)
        if not why:
            err = K.ag_gemm(comm.native, "fused", *args, _stream(a_local.device))
            if err:
                raise TandemError(f"tandem: ag_gemm: {err}", 5, op, comm.rank)
            return c, gathered
    m = world * m_local
    gws_bytes = K.gemm_workspace_size(m, n, k, dt)
    # allocated before the all-gather runs: nothing on this thread should wait on the device meanwhile
    gws = torch.empty(max(gws_bytes, 1), dtype=torch.uint8, device=a_local.device)
    err = K.ag_gemm(comm.native, "gather", *args, _stream(a_local.device))
    if err:
        raise TandemError(f"tandem: ag_gemm (all-gather): {err}", 5, op, comm.rank)
    err = K.gemm(m, n, k, dt, gathered.data_ptr(), k, b.data_ptr(), b.stride(0), c.data_ptr(), c.stride(0), 1.0,
                 int(sm_count) or comm.sm_count, gws.data_ptr(), _stream(a_local.device))
    if err:
        raise TandemError(f"tandem: ag_gemm (GEMM): {err}", 5, op, comm.rank)
    return c, gathered


_AR_ALGOS = {"auto": 0, "one_shot": 1, "two_shot": 2}


def _rs(comm, a, b, mode, comm_blocks, sm_count, op="gemm_rs", algo="auto"):
    _validate(comm, a, b, op)
    _check_mode(mode, op, comm.rank)
    _check_blocks(comm_blocks, op, comm.rank)
    world = comm.world_size
    m, k = a.shape
    n = b.shape[1]
    if m % world:
        raise invalid(f"M ({m}) must be a multiple of the world size ({world})", op, comm.rank)
    _check_nodes(comm, op)
    if op == "gemm_ar" and algo == "one_shot" and comm.native.num_nodes > 1:
        raise invalid("the one-shot all-reduce reads every partial by load/store: one node only (use two_shot)",
                      op, comm.rank)
    K = native().kernels
    key = (op, _token(comm), m, n, a.dtype)
    ws = _workspace(comm, key, K.gemm_rs_workspace_size(comm.native, m, n))
    out_rows = m if op == "gemm_ar" else m // world
    out = torch.empty((out_rows, n), dtype=a.dtype, device=a.device)
    if op == "gemm_ar":  # algo was checked by the op

        def run(*xs):
            return K.gemm_ar(*xs, _AR_ALGOS[algo])
    else:
        run = K.gemm_rs
    args = (_DTYPES[a.dtype], m, n, k, a.data_ptr(), a.stride(0), b.data_ptr(), b.stride(0), out.data_ptr(),
            ws.data_ptr(), int(sm_count), int(comm_blocks))
    if mode == "auto" and not auto_fused(op, m, n, k * world):
        mode = "unfused"
    chosen = "unfused" if mode == "unfused" else "fused"
    if mode in ("auto", "fused"):
        why = run(comm.native, "check", *args, 0)
        if why and mode == "fused":
            raise invalid(f"the fused kernel cannot run this problem: {why}", op, comm.rank)
        chosen = "unfused" if why else "fused"
    err = run(comm.native, chosen, *args, _stream(a.device))
    if err:
        raise TandemError(f"tandem: {op}: {err}", 5, op, comm.rank)
    return out


@torch.library.custom_op("tandem::ag_gemm", mutates_args=())
def ag_gemm_op(a_local: torch.Tensor, b: torch.Tensor, comm: int, mode: str = "auto", comm_blocks: int = 0,
               sm_count: int = 0) -> torch.Tensor:
    c = _comm(comm, "ag_gemm")
    if c.world_size == 1:
        _validate(c, a_local, b, "ag_gemm")
        _check_mode(mode, "ag_gemm", c.rank)
        _check_blocks(comm_blocks, "ag_gemm", c.rank)
        return _plain_gemm(a_local, b)
    return _ag(c, a_local, b, mode, comm_blocks, sm_count)[0]


@ag_gemm_op.register_fake
def _(a_local, b, comm, mode="auto", comm_blocks=0, sm_count=0):
    world = _comm(comm, "ag_gemm").world_size
    return a_local.new_empty((a_local.shape[0] * world, b.shape[1]))


@torch.library.custom_op("tandem::gemm_rs", mutates_args=())
def gemm_rs_op(a: torch.Tensor, b: torch.Tensor, comm: int, mode: str = "auto", comm_blocks: int = 0,
               sm_count: int = 0) -> torch.Tensor:
    c = _comm(comm, "gemm_rs")
    if c.world_size == 1:
        _validate(c, a, b, "gemm_rs")
        _check_mode(mode, "gemm_rs", c.rank)
        _check_blocks(comm_blocks, "gemm_rs", c.rank)
        return _plain_gemm(a, b)
    return _rs(c, a, b, mode, comm_blocks, sm_count)


@gemm_rs_op.register_fake
def _(a, b, comm, mode="auto", comm_blocks=0, sm_count=0):
    world = _comm(comm, "gemm_rs").world_size
    return a.new_empty((a.shape[0] // world, b.shape[1]))


@torch.library.custom_op("tandem::gemm_ar", mutates_args=())
def gemm_ar_op(a: torch.Tensor, b: torch.Tensor, comm: int, mode: str = "auto", comm_blocks: int = 0,
               sm_count: int = 0, algo: str = "auto") -> torch.Tensor:
    c = _comm(comm, "gemm_ar")
    if algo not in _AR_ALGOS:
        raise invalid(f"algo must be one of {sorted(_AR_ALGOS)}, got {algo!r}", "gemm_ar", c.rank)
    if c.world_size == 1:
        _validate(c, a, b, "gemm_ar")
        _check_mode(mode, "gemm_ar", c.rank)
        _check_blocks(comm_blocks, "gemm_ar", c.rank)
        return _plain_gemm(a, b)
    return _rs(c, a, b, mode, comm_blocks, sm_count, op="gemm_ar", algo=algo)


@gemm_ar_op.register_fake
def _(a, b, comm, mode="auto", comm_blocks=0, sm_count=0, algo="auto"):
    return a.new_empty((a.shape[0], b.shape[1]))


def ag_gemm(comm, a_local, b, *, mode: str = "auto", comm_blocks: int = 0, sm_count: int = 0,
            return_gathered: bool = False):
    """all_gather(a_local) @ b. With return_gathered, also the gathered A: a view into the op's workspace,
    valid until the next ag_gemm call of the same shape on this communicator (clone it to keep it)."""
    if not return_gathered:
        return torch.ops.tandem.ag_gemm(a_local, b, register(comm), mode, comm_blocks, sm_count)
    if comm.world_size == 1:
        _validate(comm, a_local, b, "ag_gemm")
        _check_mode(mode, "ag_gemm", comm.rank)
        return _plain_gemm(a_local, b), a_local
    return _ag(comm, a_local, b, mode, comm_blocks, sm_count)


def gemm_rs(comm, a, b, *, mode: str = "auto", comm_blocks: int = 0, sm_count: int = 0):
    """reduce_scatter(a @ b): this rank's M/W rows of the sum over ranks."""
    return torch.ops.tandem.gemm_rs(a, b, register(comm), mode, comm_blocks, sm_count)


def gathered_buffer(comm, m_local: int, k: int, dtype=torch.bfloat16):
    """This rank's slice of the AG workspace's gathered A (rows [rank m_local, ...)): write A_local there and pass
    it as a_local to run the all-gather in place (no local copy)."""
    K = native().kernels
    key = ("ag_gemm", _token(comm), m_local, k, dtype)
    ws = _workspace(comm, key, K.ag_gemm_workspace_size(comm.native, m_local, k))
    off = K.ag_gemm_gathered_offset(comm.native, m_local, k)
    esize = torch.empty((), dtype=dtype).element_size()
    g = ws[off:off + comm.world_size * m_local * k * esize].view(dtype).view(comm.world_size * m_local, k)
    return g[comm.rank * m_local:(comm.rank + 1) * m_local]


def gemm_ar(comm, a, b, *, mode: str = "auto", comm_blocks: int = 0, sm_count: int = 0, algo: str = "auto"):
    """all_reduce(a @ b): the M x N sum over ranks, bit-identical on every rank. algo: "one_shot" (every rank
    reduces every row: small outputs), "two_shot" (reduce-scatter then all-gather of the reduced rows) or
    "auto" (two-shot: one-shot lost at every measured size on the H200, see tp_gemm.h); both give the same
    bits."""
    return torch.ops.tandem.gemm_ar(a, b, register(comm), mode, comm_blocks, sm_count, algo)
