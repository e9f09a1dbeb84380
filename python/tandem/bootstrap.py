"""Bootstrap over torch.distributed's store.

Resolution order for a store: the one passed in; the default process group's store (after
torch.distributed.init_process_group, e.g. under torchrun); else a TCPStore built from MASTER_ADDR/MASTER_PORT
with RANK/WORLD_SIZE (as set by torchrun and by `python -m tandem.launch`).
"""

from __future__ import annotations

import datetime
import os

from .errors import TandemError, invalid


def _env_int(name: str) -> int | None:
    v = os.environ.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise invalid(f"environment variable {name}={v!r} is not an integer", "bootstrap") from None


_env_stores: dict = {}


def resolve(store=None, rank: int | None = None, world_size: int | None = None, timeout_s: float = 300.0):
    """Return (store, rank, world_size)."""
    try:
        import torch.distributed as dist
    except ImportError as e:  # pragma: no cover
        raise TandemError(f"tandem: bootstrap needs torch.distributed ({e})", 9, "bootstrap") from e

    if store is None and dist.is_available() and dist.is_initialized():
        store = dist.distributed_c10d._get_default_store()
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    if rank is None:
        rank = _env_int("RANK")
    if world_size is None:
        world_size = _env_int("WORLD_SIZE")
    if rank is None or world_size is None:
        if store is None:
            rank, world_size = 0, 1  # a single process with nothing set up: world of one
        else:
            raise invalid("rank and world_size must be given with an explicit store", "bootstrap")
    if world_size < 1 or not 0 <= rank < world_size:
        raise invalid(f"rank {rank} is not in a world of {world_size}", "bootstrap", rank)
    if store is None:
        if world_size == 1:
            store = dist.HashStore()
        else:
            addr = os.environ.get("MASTER_ADDR")
            port = _env_int("MASTER_PORT")
            if addr is None or port is None:
                raise invalid(
                    "no store: pass one, initialize torch.distributed, or set MASTER_ADDR/MASTER_PORT "
                    "(python -m tandem.launch and torchrun do)",
                    "bootstrap",
                    rank,
                )
            # One TCPStore per process and address: a second communicator must not start a second server on
            # the same port.
            key = (addr, port, world_size, rank)
            if key not in _env_stores:
                _env_stores[key] = dist.TCPStore(
                    addr,
                    port,
                    world_size,
                    is_master=(rank == 0),
                    timeout=datetime.timedelta(seconds=timeout_s),
                    wait_for_workers=False,
                )
            store = _env_stores[key]
    return store, rank, world_size
