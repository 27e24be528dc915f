"""Which ranks of a group share a host, and how they reach each other.

Found once per group through the c10d Store. Each rank publishes its host
label: ``TILECOMM_HOSTNAME`` when set (several values on one machine simulate
several hosts), else the machine's hostname and boot id. Hosts are numbered in
order of their lowest rank; the layout (host index per rank) is what
topology-aware schedules take. Ranks of one shared-memory domain (same label and
machine, unless ``TILECOMM_TRANSPORT=tcp``) talk through shared memory, all
others over TCP. ``tilecomm.topology(group)`` returns what a group found and
``tilecomm.stats(group)`` the traffic per link class.

GPUs: rank 0 reads from NVML (no CUDA context needed) how the host's GPUs are
joined, per pair of PCI bus ids: ``nvlink``, ``pcie`` (peer-to-peer over PCIe)
or ``none`` (no peer access). At a group's first direct CUDA call each rank
publishes its GPU's bus id, and the group picks its GPU peer transport from
that: ``cuda_ipc`` where every pair has peer access (or shares one GPU), else
``host_mapped``. ``tilecomm.gpu_topology(group)`` returns what it found.
"""

from __future__ import annotations

import functools
import socket
from dataclasses import dataclass


def machine_id() -> str:
    """hostname/boot id: two processes with equal ids share memory."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


SHM, TCP = "shm", "tcp"
LINK_IDS = {"self": 0, SHM: 1, TCP: 2}  # transport::Link


def links(hosts, mode: str) -> list[int]:
    """Shared-memory domain of every rank, from (label, machine id) per rank and TILECOMM_TRANSPORT
    (``host_mapped`` concerns GPU memory only: for the CPU links it is ``auto``)."""
    if mode == "tcp":
        return list(range(len(hosts)))
    if mode == "shm":
        machines = sorted({m for _, m in hosts})
        if len(machines) > 1:
            raise ValueError(
                f"TILECOMM_TRANSPORT=shm, but this group spans {len(machines)} machines; use auto or tcp"
            )
        return [0] * len(hosts)
    order: dict[tuple[str, str], int] = {}
    return [order.setdefault(tuple(h), len(order)) for h in hosts]


@dataclass(frozen=True)
class Topology:
    labels: tuple[str, ...]  # host label of every rank
    domains: tuple[int, ...]  # shared-memory domain of every rank: equal values talk through shared memory

    def __post_init__(self):
        object.__setattr__(self, "domains", tuple(self.domains))

    def links_from(self, rank: int) -> list[str]:
        """How `rank` reaches every rank: "self", "shm" or "tcp"."""
        mine = self.domains[rank]
        return ["self" if r == rank else SHM if d == mine else TCP for r, d in enumerate(self.domains)]

    @property
    def transport(self) -> str:
        """How ranks reach each other, in words."""
        n = len(set(self.domains))
        if n == 1:
            return "shared memory"
        if n == len(self.domains):
            return "TCP"
        return "shared memory within a domain, TCP between"

    @property
    def layout(self) -> tuple[int, ...]:
        """Host index of every rank, hosts numbered in order of their lowest rank."""
        order = {}
        for label in self.labels:
            order.setdefault(label, len(order))
        return tuple(order[label] for label in self.labels)

    @property
    def hosts(self) -> list[tuple[str, list[int]]]:
        """(label, ranks) per host, in host-index order."""
        out: dict[str, list[int]] = {}
        for r, label in enumerate(self.labels):
            out.setdefault(label, []).append(r)
        return list(out.items())

    @property
    def num_hosts(self) -> int:
        return len(set(self.labels))

    def __str__(self):
        parts = [f"{label}: ranks {','.join(map(str, ranks))}" for label, ranks in self.hosts]
        return f"{len(self.labels)} ranks on {self.num_hosts} host(s) ({'; '.join(parts)}); transport {self.transport}"


def gpu_links(nvml=None) -> list[tuple[str, str, str]]:
    """How this host's GPUs are joined, from NVML: (bus id, bus id, "nvlink" | "pcie" | "none") per
    pair. Empty when NVML (the nvidia-ml-py package, or the driver's library) is not there: the
    group then learns peer access by trying cuda_ipc."""
    if nvml is None:
        try:
            import pynvml as nvml  # noqa: PLC0415
        except ImportError:
            return []
    try:
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001  (no driver, no GPU)
        return []
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        buses = []
        for h in handles:
            bus = nvml.nvmlDeviceGetPciInfo(h).busId
            buses.append(bus.decode() if isinstance(bus, bytes) else str(bus))
        out = []
        for i in range(len(handles)):
            for j in range(i + 1, len(handles)):
                out.append((buses[i], buses[j], _p2p_kind(nvml, handles[i], handles[j])))
        return out
    except Exception:  # noqa: BLE001  (an NVML that lacks a query: say nothing rather than guess)
        return []
    finally:
        nvml.nvmlShutdown()


@functools.cache
def host_gpu_links() -> tuple[tuple[str, str, str], ...]:
    """``gpu_links()`` of this host, read from NVML once per process."""
    return tuple(gpu_links())


def _p2p_kind(nvml, a, b) -> str:
    ok = nvml.NVML_P2P_STATUS_OK
    if nvml.nvmlDeviceGetP2PStatus(a, b, nvml.NVML_P2P_CAPS_INDEX_NVLINK) == ok:
        return "nvlink"
    if nvml.nvmlDeviceGetP2PStatus(a, b, nvml.NVML_P2P_CAPS_INDEX_READ) == ok:
        return "pcie"
    return "none"


_GROUPS: dict[str, Topology] = {}


def record(group_name: str, topo: Topology) -> None:
    _GROUPS[group_name] = topo


def _group(group, what):
    import torch.distributed as dist  # noqa: PLC0415

    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        raise RuntimeError(f"tilecomm.{what}: no default process group; call init_process_group first")
    if pg.group_name not in _GROUPS:
        raise ValueError(f"tilecomm.{what}: group {pg.group_name!r} has no tilecomm backend")
    return pg


def topology(group=None) -> Topology:
    """The topology a tilecomm group found (default: the world group)."""
    return _GROUPS[_group(group, "topology").group_name]


def gpu_topology(group=None) -> dict:
    """What a tilecomm group's GPUs found at its first direct CUDA call (default: the world group):
    ``{"transport": "cuda_ipc" | "host_mapped" | "staged" | "unset", "devices": [PCI bus id per
    rank], "links": [[link from rank r to rank q]]}``, links being ``self``, ``same_gpu``,
    ``nvlink``, ``pcie``, ``none`` or ``unknown`` (no NVML). ``unset`` before the first direct
    call; ``{}`` in a build without CUDA."""
    import torch  # noqa: PLC0415

    pg = _group(group, "gpu_topology")
    try:
        be = pg._get_backend(torch.device("cuda"))
    except RuntimeError:  # the group serves no CUDA tensors
        return {}
    return be.cuda_topology() if hasattr(be, "cuda_topology") else {}


def stats(group=None) -> dict:
    """This rank's traffic in a tilecomm group (default: the world group) per link class:
    ``{"shm": {"bytes_sent", "messages_sent", "bytes_received", "messages_received"}, "tcp": {...}}``.
    Payload bytes only; counters only grow. A mailbox post counts once when sent and once per
    peer that reads it."""
    import torch  # noqa: PLC0415

    return _group(group, "stats")._get_backend(torch.device("cpu")).stats()
