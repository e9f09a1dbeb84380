"""Tensor- and sequence-parallel linear layers on tandem's fused TP ops (issue 24), Megatron's layout:

    ColumnParallelLinear   x: this rank's rows of the sequence (tokens/W, in)  ->  every token, this rank's
                           columns (tokens, out/W):  Y = AG(x) W_c + b_c          (tandem.ops.ag_gemm)
    RowParallelLinear      x: every token, this rank's columns of the input (tokens, in/W)  ->
                           sequence_parallel=True:  this rank's rows (tokens/W, out):  Y = RS(x W_r)  (gemm_rs)
                           sequence_parallel=False: every row (tokens, out):           Y = AR(x W_r) + b (gemm_ar)

A column layer followed by a row layer (an MLP, attention's projections) exchanges nothing between them. Both
take their gradients from the ops' autograd (tandem.ops.tp_autograd): the backward's collectives are tandem's
fused ops too.

Weights are stored as the ops take them, (in_features, out_features) row-major shards -- the transpose of
torch.nn.Linear's (out, in) -- so no transpose is made per call. `from_linear` shards a torch.nn.Linear and
`to_linear` gathers one back (collective). A layer built with `seed` holds exactly the shard of the torch.nn.Linear
that torch.manual_seed(seed) then torch.nn.Linear(in, out, bias) would make on one GPU (built on the CPU in fp32,
then cast), so a TP model starts from the same weights as its single-GPU reference; seed=None draws the
shard on the device at the same scale (no full matrix on the CPU: large layers, benchmarks).
"""

from __future__ import annotations

import math

import torch

import tandem.ops  # noqa: F401 - registers torch.ops.tandem.* and their autograd
from .errors import invalid
from .ops import _runtime as rt

__all__ = ["ColumnParallelLinear", "RowParallelLinear"]


def _full_linear(in_features, out_features, bias, seed):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return torch.nn.Linear(in_features, out_features, bias=bias, dtype=torch.float32)


def _device_init(rows, cols, fan_in, dtype, device):
    """A shard drawn on the device (seed=None): uniform in +-1/sqrt(fan_in), torch.nn.Linear's scale, with no
    full matrix on the CPU (for benchmarks and for layers too large to build whole)."""
    bound = 1.0 / math.sqrt(fan_in)
    return torch.empty(rows, cols, dtype=torch.float32, device=device).uniform_(-bound, bound).to(dtype)


def _shard_size(total, world, what, op, rank):
    if total % world:
        raise invalid(f"{what} ({total}) must be a multiple of the world size ({world})", op, rank)
    return total // world


def _shard_mismatch(name, got, want, sharded_dim, full, world, sharded) -> str:
    msg = f"{name} must be {want} (this rank's shard of a layer over {world} ranks), got {got}"
    if sharded and len(got) == len(want) and all(g == w for i, (g, w) in enumerate(zip(got, want)) if i != sharded_dim):
        n = got[sharded_dim]
        if n and full % n == 0 and full // n != world:
            msg += f": a shard for a world of {full // n}, not {world}"
    return msg


class _ShardedLinear(torch.nn.Module):
    """What the two TP layers share: their parameters must have this rank's shard shapes (`_shards`: name ->
    shape, name -> the dimension split over the ranks, and the split dimension's whole size). A parameter replaced
    by hand with another shape is an error before any launch (forward), and a checkpoint of other shard shapes is
    tandem's error on load_state_dict instead of torch's size mismatch; both name the world size it would fit."""

    _OP = ""

    def _shards(self):
        raise NotImplementedError

    def _check_shard_shapes(self, tensors: dict, prefix: str = ""):
        shapes, sharded, full = self._shards()
        for name, want in shapes.items():
            t = tensors.get(name)
            if t is None or tuple(t.shape) == want:
                continue
            raise invalid(_shard_mismatch(prefix + name, tuple(t.shape), want, sharded.get(name, 0), full,
                                          self.comm.world_size, name in sharded), self._OP, self.comm.rank)

    def _check_params(self):
        self._check_shard_shapes({name: getattr(self, name) for name in self._shards()[0]})

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        self._check_shard_shapes({name: state_dict.get(prefix + name) for name in self._shards()[0]}, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


class ColumnParallelLinear(_ShardedLinear):
    """Y = AG(x) W + b on this rank's output columns; see the module docstring. mode, comm_blocks, sm_count: the
    op's (tandem.ops.ag_gemm)."""

    def __init__(self, comm, in_features: int, out_features: int, bias: bool = True, *, seed: int | None = 0,
                 dtype=torch.bfloat16, device=None, mode: str = "auto", comm_blocks: int = 0, sm_count: int = 0):
        super().__init__()
        op = "ColumnParallelLinear"
        self.comm, self.mode, self.comm_blocks, self.sm_count = comm, mode, comm_blocks, sm_count
        self._handle = rt.register(comm)  # the ops' communicator handle, made here: forward only reads it (compile)
        self.in_features, self.out_features = in_features, out_features
        world, rank = comm.world_size, comm.rank
        self.out_local = _shard_size(out_features, world, "out_features", op, rank)
        device = device if device is not None else torch.device("cuda", comm.device)
        if seed is None:
            self.weight = torch.nn.Parameter(_device_init(in_features, self.out_local, in_features, dtype, device))
            self.bias = (torch.nn.Parameter(_device_init(1, self.out_local, in_features, dtype, device)[0])
                         if bias else None)
            return
        full = _full_linear(in_features, out_features, bias, seed)
        cols = slice(rank * self.out_local, (rank + 1) * self.out_local)
        self.weight = torch.nn.Parameter(full.weight.detach()[cols].t().contiguous().to(dtype=dtype, device=device))
        self.bias = (torch.nn.Parameter(full.bias.detach()[cols].to(dtype=dtype, device=device)) if bias else None)

    _OP = "ColumnParallelLinear"

    def _shards(self):
        """This rank's parameters' shapes, split dimensions (the output columns) and the whole out_features."""
        return ({"weight": (self.in_features, self.out_local), "bias": (self.out_local,)}, {"weight": 1, "bias": 0},
                self.out_features)

    def forward(self, x):
        if x.dim() != 2 or x.shape[1] != self.in_features:
            raise invalid(f"x must be (tokens / world, {self.in_features}): this rank's rows of the sequence, got "
                          f"{tuple(x.shape)}", "ColumnParallelLinear", self.comm.rank)
        self._check_params()
        y = torch.ops.tandem.ag_gemm(x, self.weight, self._handle, self.mode, self.comm_blocks, self.sm_count)
        return y if self.bias is None else y + self.bias

    @classmethod
    def from_linear(cls, comm, linear: torch.nn.Linear, **kw):
        """This rank's shard of `linear` (every rank passes the same weights)."""
        m = cls(comm, linear.in_features, linear.out_features, linear.bias is not None, **dict(kw, seed=None))
        cols = slice(comm.rank * m.out_local, (comm.rank + 1) * m.out_local)
        with torch.no_grad():
            m.weight.copy_(linear.weight[cols].t())
            if m.bias is not None:
                m.bias.copy_(linear.bias[cols])
        return m

    def to_linear(self) -> torch.nn.Linear:
        """The whole layer as a torch.nn.Linear on every rank (collective: the column shards are gathered)."""
        h = rt.register(self.comm)
        with torch.no_grad():
            w = torch.ops.tandem.all_gather_rows(self.weight.t().contiguous(), h)  # (out, in)
            lin = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                                  dtype=w.dtype, device=w.device)
            lin.weight.copy_(w)
            if self.bias is not None:
                b = self.bias.reshape(-1, 1).expand(-1, 8).contiguous()  # rows of 16 bytes for the gather
                lin.bias.copy_(torch.ops.tandem.all_gather_rows(b, h)[:, 0])
        return lin


class RowParallelLinear(_ShardedLinear):
    """Y = RS(x W) (sequence_parallel) or AR(x W) + b on this rank's input columns; see the module docstring.

    With sequence_parallel=True the bias is replicated but each rank adds it to its own rows only: its gradient
    is summed over the ranks in the backward (torch.ops.tandem.sp_bias_add: the ranks' row sums gathered, then
    added in rank order), so every rank's bias gets the same, whole gradient."""

    def __init__(self, comm, in_features: int, out_features: int, bias: bool = True, *, sequence_parallel: bool = True,
                 seed: int | None = 0, dtype=torch.bfloat16, device=None, mode: str = "auto", comm_blocks: int = 0,
                 sm_count: int = 0):
        super().__init__()
        op = "RowParallelLinear"
        self.comm, self.mode, self.comm_blocks, self.sm_count = comm, mode, comm_blocks, sm_count
        self._handle = rt.register(comm)
        self.in_features, self.out_features, self.sequence_parallel = in_features, out_features, sequence_parallel
        world, rank = comm.world_size, comm.rank
        self.in_local = _shard_size(in_features, world, "in_features", op, rank)
        device = device if device is not None else torch.device("cuda", comm.device)
        if seed is None:
            self.weight = torch.nn.Parameter(_device_init(self.in_local, out_features, in_features, dtype, device))
            self.bias = (torch.nn.Parameter(_device_init(1, out_features, in_features, dtype, device)[0])
                         if bias else None)
            return
        full = _full_linear(in_features, out_features, bias, seed)
        rows = slice(rank * self.in_local, (rank + 1) * self.in_local)
        self.weight = torch.nn.Parameter(full.weight.detach()[:, rows].t().contiguous().to(dtype=dtype, device=device))
        self.bias = torch.nn.Parameter(full.bias.detach().to(dtype=dtype, device=device)) if bias else None

    _OP = "RowParallelLinear"

    def _shards(self):
        """This rank's parameters' shapes, split dimensions (the weight's input rows; the bias is whole) and the
        whole in_features."""
        return {"weight": (self.in_local, self.out_features), "bias": (self.out_features,)}, {"weight": 0}, \
            self.in_features

    def forward(self, x):
        if x.dim() != 2 or x.shape[1] != self.in_local:
            raise invalid(f"x must be (tokens, {self.in_local}): every token, this rank's {self.in_local} of the "
                          f"{self.in_features} input columns, got {tuple(x.shape)}", "RowParallelLinear",
                          self.comm.rank)
        self._check_params()
        h = self._handle
        if self.sequence_parallel:
            y = torch.ops.tandem.gemm_rs(x, self.weight, h, self.mode, self.comm_blocks, self.sm_count)
            return y if self.bias is None else torch.ops.tandem.sp_bias_add(y, self.bias, h)
        y = torch.ops.tandem.gemm_ar(x, self.weight, h, self.mode, self.comm_blocks, self.sm_count)
        return y if self.bias is None else y + self.bias

    @classmethod
    def from_linear(cls, comm, linear: torch.nn.Linear, **kw):
        """This rank's shard of `linear` (every rank passes the same weights)."""
        m = cls(comm, linear.in_features, linear.out_features, linear.bias is not None, **dict(kw, seed=None))
        rows = slice(comm.rank * m.in_local, (comm.rank + 1) * m.in_local)
        with torch.no_grad():
            m.weight.copy_(linear.weight[:, rows].t())
            if m.bias is not None:
                m.bias.copy_(linear.bias)
        return m

    def to_linear(self) -> torch.nn.Linear:
        """The whole layer as a torch.nn.Linear on every rank (collective: the row shards are gathered)."""
        h = rt.register(self.comm)
        with torch.no_grad():
            w_t = torch.ops.tandem.all_gather_rows(self.weight.contiguous(), h)  # (in, out)
            lin = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                                  dtype=w_t.dtype, device=w_t.device)
            lin.weight.copy_(w_t.t())
            if self.bias is not None:
                lin.bias.copy_(self.bias)
        return lin

