"""Registration with torch.distributed, and the set-up of one group.

Set-up runs once per process group, off the hot path: agree on settings (rank
0's win), create and exchange the shared-memory segments through the c10d
Store, hand every algorithm's schedule and the decision table to the engine,
then start its progress threads.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from datetime import timedelta

import torch.distributed as dist

from tilecomm import algorithms, selector, settings

log = logging.getLogger("tilecomm")
_registered = False


def register():
    global _registered
    if _registered:
        return
    dist.Backend.register_backend("tilecomm", create, extended_api=True, devices=["cpu"])
    _registered = True


def _host_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _agree(store, key, rank, make):
    """Rank 0 computes make() and every rank returns rank 0's value."""
    if rank == 0:
        value = make()
        store.set(key, json.dumps(value))
        return value
    return json.loads(store.get(key).decode())


def _spins(cfg, world):
    if cfg["TILECOMM_SPINS"] >= 0:
        return cfg["TILECOMM_SPINS"]
    return 64 if world <= (os.cpu_count() or 1) else 0


def create(opts, pg_options=None):
    """Backend creator for ``Backend.register_backend(..., extended_api=True)``."""
    from tilecomm import _C  # noqa: PLC0415  (needs torch.distributed imported first)

    store, rank, world = opts.store, opts.group_rank, opts.group_size
    timeout = opts.timeout if isinstance(opts.timeout, timedelta) else timedelta(seconds=1800)
    timeout_ms = max(1, int(timeout.total_seconds() * 1000))
    # Keys are per creation: a group name can be reused after destroy_process_group.
    gen = (store.add("tilecomm/creations", 1) - 1) // world
    pre = f"tilecomm/{gen}/"

    def make_config():
        cfg = settings.resolve()
        forced = selector.parse_forced(cfg["TILECOMM_ALGO"])
        tables = selector.build_tables(world, forced)
        return {"settings": cfg, "tables": tables}

    try:
        agreed = _agree(store, pre + "config", rank, make_config)
    except ValueError as e:  # rank 0's bad setting; tell the others before raising
        store.set(pre + "config", json.dumps({"error": str(e)}))
        raise
    if "error" in agreed:
        raise ValueError(agreed["error"])
    cfg = agreed["settings"]

    engine = _C.Engine(
        rank,
        world,
        slots=cfg["TILECOMM_SHM_SLOTS"],
        slot_bytes=cfg["TILECOMM_SHM_SLOT_BYTES"],
        spins=_spins(cfg, world),
        yields=cfg["TILECOMM_YIELDS"],
        sleep_us=cfg["TILECOMM_SLEEP_US"],
        timeout_ms=timeout_ms,
    )
    store.set(pre + f"peer/{rank}", json.dumps([engine.segment_name(), os.getpid(), _host_id()]))
    peers = [json.loads(store.get(pre + f"peer/{r}").decode()) for r in range(world)]
    hosts = sorted({h for _, _, h in peers})
    if len(hosts) > 1:
        raise RuntimeError(
            f"tilecomm: this group spans {len(hosts)} hosts, but this version only connects ranks on one host "
            "(shared memory); the TCP transport is not available yet"
        )
    engine.connect([n for n, _, _ in peers], [pid for _, pid, _ in peers])
    # Unlink once every peer has mapped our segment: nothing outlives the job.
    if store.add(pre + "mapped", 1) == world:
        store.set(pre + "mapped_all", "1")
    store.wait([pre + "mapped_all"])
    engine.unlink_own()

    for algo in algorithms.ALGORITHMS:
        if algo.direct:
            scheds = []
        else:
            s = algo.schedule(world)
            scheds = [s.for_rank(v) for v in range(world)] if algo.rooted else [s.for_rank(rank)]
        engine.add_algorithm(algo.id, algo.name, algo.coll_id, algo.rooted, algo.direct, scheds)
    for coll, table in agreed["tables"].items():
        engine.set_table(algorithms.COLLECTIVES.index(coll), [tuple(e) for e in table])
    if cfg["TILECOMM_DEBUG"].upper() == "INFO" and rank == 0:
        _log_tables(world, agreed["tables"])
    engine.start()
    return _C.ProcessGroupTilecomm(engine, timeout_ms)


def _log_tables(world, tables):
    names = {a.id: a.name for a in algorithms.ALGORITHMS}
    for coll, table in tables.items():
        lo, parts = 0, []
        for hi, aid in table:
            parts.append(f"[{lo}, {'inf' if hi == selector.MAX_BYTES else hi}] B -> {names[aid]}")
            lo = hi + 1
        log.info("tilecomm world=%d %s: %s", world, coll, "; ".join(parts))


__all__ = ["register", "create"]
