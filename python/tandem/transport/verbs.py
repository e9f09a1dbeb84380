"""RDMA verbs backend: setup through pyverbs, planning in C++ (tandem._C.verbs.WrPlanner).

Where the boundary sits, and why (docs/transports.md):

* pyverbs (Python) owns every verbs resource: it picks the NIC nearest the GPU, the port and a RoCE v2 GID,
  opens the context, creates the PD, CQ and RC QPs, registers the GPU heap (dmabuf first, then the
  nvidia-peermem path), exchanges QP numbers / GIDs / rkeys through the bootstrap store and drives
  INIT -> RTR -> RTS. pyverbs exposes no raw handles to C++, so whoever creates a QP must also post to it.
* C++ decides what to post (tandem/transport/verbs_plan.h): WRITE + ordered inline flag WRITE (or fenced
  FETCH_ADD), batching, signaling intervals, send-queue depth, QP per (peer, channel), and which tickets a
  completion retires. That logic is unit-tested without a NIC.

pyverbs is an optional extra (`pip install tandem[verbs]`); a missing pyverbs or a machine without an RDMA
device is a clear TandemError when this backend is asked for, never an import failure of tandem.

The posting loop is tandem.transport.verbs_proxy (VerbsProxy + PyverbsDriver, LoopbackDriver for tests).

What has run: the planner's tests, the NIC-selection logic and the proxy loop over the loopback driver (CPU).
What has never run here: anything that touches a NIC (no RDMA device, not even soft-RoCE, exists on the machines this was built on).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import UNSUPPORTED, TandemError


def require_pyverbs():
    """Import pyverbs or raise TandemError explaining how to get it."""
    try:
        import pyverbs  # noqa: F401
        import pyverbs.device  # noqa: F401
    except ImportError as e:
        raise TandemError(
            "tandem: the RDMA verbs backend needs pyverbs (pip install 'tandem[verbs]'; PyPI's pyverbs 59 builds "
            "with cython<3.1 and needs rdma-core >= 59's libibverbs at run time; Debian's python3-pyverbs serves "
            f"Debian's own python3). Import failed: {e}. Use the TCP backend instead (the default).",
            UNSUPPORTED, "verbs.import") from e
    return pyverbs


@dataclass(frozen=True)
class NicInfo:
    name: str            # e.g. mlx5_0
    pci_path: str        # resolved sysfs path of the device, e.g. /sys/devices/pci0000:00/0000:00:01.0/0000:03:00.0
    ports: tuple         # ((port, active, link_layer, roce_v2_gid_index or None), ...)


def pci_distance(a: str, b: str) -> int:
    """Hops between two PCI devices through their common ancestor in the sysfs tree (smaller = closer)."""
    pa = [x for x in a.split("/") if x]
    pb = [x for x in b.split("/") if x]
    common = 0
    for x, y in zip(pa, pb):
        if x != y:
            break
        common += 1
    return (len(pa) - common) + (len(pb) - common)


def select_nic(gpu_pci_path: str | None, nics: list[NicInfo]) -> tuple[NicInfo, int, int]:
    """The NIC nearest the GPU (PCI distance; name as tie-break) with an active port and a RoCE v2 GID (or an
    InfiniBand port): returns (nic, port, gid_index)."""
    usable = []
    for nic in nics:
        for port, active, link, gid in nic.ports:
            if not active:
                continue
            if link == "Ethernet" and gid is None:
                continue
            usable.append((nic, port, gid if gid is not None else 0))
    if not usable:
        raise TandemError("tandem: no RDMA device with an active port (and a RoCE v2 GID) was found", UNSUPPORTED,
                          "verbs.select")
    if gpu_pci_path:
        usable.sort(key=lambda u: (pci_distance(gpu_pci_path, u[0].pci_path), u[0].name, u[1]))
    else:
        usable.sort(key=lambda u: (u[0].name, u[1]))
    return usable[0]


def gpu_pci_path(device_index: int) -> str | None:
    """sysfs path of a CUDA device, from its PCI bus id (None if unknown)."""
    try:
        import torch

        p = torch.cuda.get_device_properties(device_index)
        bus = f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
        path = os.path.realpath(f"/sys/bus/pci/devices/{bus}")
        return path if os.path.exists(path) else None
    except Exception:  # noqa: BLE001 - best effort: no GPU, no sysfs
        return None


def discover() -> list[NicInfo]:
    """Every RDMA device pyverbs sees, with its ports (needs pyverbs and a device)."""
    require_pyverbs()
    import pyverbs.device as d
    from pyverbs.enums import IBV_PORT_ACTIVE

    devices = d.get_device_list()
    if not devices:
        raise TandemError("tandem: pyverbs found no RDMA device on this machine", UNSUPPORTED, "verbs.discover")
    out = []
    for dev in devices:
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        ctx = d.Context(name=name)
        attr = ctx.query_device()
        ports = []
        for port in range(1, attr.phys_port_cnt + 1):
            pa = ctx.query_port(port)
            link = "Ethernet" if pa.link_layer == 2 else "InfiniBand"
            gid_index = None
            if link == "Ethernet":
                for i in range(pa.gid_tbl_len):
                    try:
                        ent = ctx.query_gid_ex(port, i)
                    except Exception:  # noqa: BLE001 - empty table slots raise
                        continue
                    if getattr(ent, "gid_type", None) == 1:  # IBV_GID_TYPE_ROCE_V2
                        gid_index = i
                        break
            ports.append((port, pa.state == IBV_PORT_ACTIVE, link, gid_index))
        out.append(NicInfo(name, os.path.realpath(f"/sys/class/infiniband/{name}/device"), tuple(ports)))
        ctx.close()
    return out


def choose_device(cuda_device: int = 0) -> tuple[NicInfo, int, int]:
    """pyverbs discovery + selection for a rank on `cuda_device`."""
    return select_nic(gpu_pci_path(cuda_device), discover())


def planner(local: dict, peers: dict, **options):
    """The C++ work-request planner (see the module docstring)."""
    from .._native import native

    return native().verbs.WrPlanner(local, peers, options)
