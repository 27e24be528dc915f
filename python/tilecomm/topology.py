"""Which ranks of a group share a host, found once per group through the c10d Store.

Each rank publishes its host label: ``TILECOMM_HOSTNAME`` when set (several
values on one machine simulate several hosts), else the machine's hostname and
boot id. Hosts are numbered in order of their lowest rank; the layout (host
index per rank) is what topology-aware schedules take. ``tilecomm.topology(group)``
returns what a group found.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Topology:
    labels: tuple[str, ...]  # host label of every rank
    transport: str  # how ranks reach each other

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


_GROUPS: dict[str, Topology] = {}


def record(group_name: str, topo: Topology) -> None:
    _GROUPS[group_name] = topo


def topology(group=None) -> Topology:
    """The topology a tilecomm group found (default: the world group)."""
    import torch.distributed as dist  # noqa: PLC0415

    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        raise RuntimeError("tilecomm.topology: no default process group; call init_process_group first")
    name = pg.group_name
    if name not in _GROUPS:
        raise ValueError(f"tilecomm.topology: group {name!r} has no tilecomm backend")
    return _GROUPS[name]
