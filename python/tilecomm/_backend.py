"""Registration with torch.distributed, and the set-up of one group.

Set-up runs once per process group, off the hot path: agree on settings (rank
0's win), create and exchange the shared-memory segments (and, between hosts,
the TCP listeners' addresses) through the c10d Store, connect, hand every
algorithm's schedule and the decision table to the engine, then start its
progress threads.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import secrets
import socket
import time
from datetime import timedelta
from types import SimpleNamespace

import torch._C._distributed_c10d as _c10d
import torch.distributed as dist

from tilecomm import algorithms, cuda_model, executor_model, nvshmem, selector, settings, topology

log = logging.getLogger("tilecomm")
_registered = False


def register():
    global _registered
    if _registered:
        return
    try:
        from tilecomm import _C  # noqa: PLC0415  (needs torch.distributed imported first)

        has_cuda = bool(getattr(_C, "HAS_CUDA", False))
    except ImportError:  # not built: create() reports it
        has_cuda = False
    # A build with the CUDA parts serves CUDA tensors too: "tilecomm" alone maps both devices.
    devices = ["cpu", "cuda"] if has_cuda else ["cpu"]
    dist.Backend.register_backend("tilecomm", create, extended_api=True, devices=devices)
    _registered = True


def _agree(store, key, rank, make):
    """Rank 0 computes make() and every rank returns rank 0's value."""
    if rank == 0:
        value = make()
        store.set(key, json.dumps(value))
        return value
    value = json.loads(store.get(key).decode())
    store.add(key + "/read", 1)
    return value


def _until_read(store, key, world, seconds=10.0):
    """Waits (bounded) until every other rank has read rank 0's `key`: a rank 0 that raises
    next may take the Store down with its process."""
    deadline = time.monotonic() + seconds
    while store.add(key + "/read", 0) < world - 1 and time.monotonic() < deadline:
        time.sleep(0.01)


@functools.cache
def _warn_unknown_settings():
    """Once per process: TILECOMM_* variables that are no setting, which are ignored (docs/env.md)."""
    for name, near in settings.unknown():
        hint = f"; did you mean {near}?" if near else ""
        log.warning("tilecomm: %s is not a tilecomm setting and is ignored%s (the settings: docs/env.md)", name, hint)


def _spin_ns(cfg, world):
    if cfg["TILECOMM_SPIN_NS"] >= 0:
        return cfg["TILECOMM_SPIN_NS"]
    return 2000 if world <= len(os.sched_getaffinity(0)) else 0


def create(opts, pg_options=None):
    """Backend creator for ``Backend.register_backend(..., extended_api=True)``."""
    from tilecomm import _C  # noqa: PLC0415  (needs torch.distributed imported first)

    store, rank, world = opts.store, opts.group_rank, opts.group_size
    timeout = opts.timeout if isinstance(opts.timeout, timedelta) else timedelta(seconds=1800)
    timeout_ms = max(1, int(timeout.total_seconds() * 1000))
    # Keys are per creation: a group name can be reused after destroy_process_group.
    gen = (store.add("tilecomm/creations", 1) - 1) // world
    pre = f"tilecomm/{gen}/"

    # Host labels first: rank 0 needs the layout to price topology-aware algorithms.
    me = topology.machine_id()
    store.set(pre + f"host/{rank}", json.dumps([settings.value("TILECOMM_HOSTNAME") or me, me]))

    loaded = {}  # rank 0: the profile make_config used

    def make_config():
        cfg = settings.resolve()
        _warn_unknown_settings()
        hosts = [json.loads(store.get(pre + f"host/{r}").decode()) for r in range(world)]
        labels = [label for label, _ in hosts]
        links = topology.links(hosts, cfg["TILECOMM_TRANSPORT"])
        if _debug_info(cfg):
            _enable_info_log()
        forced = selector.parse_forced(cfg["TILECOMM_ALGO"])
        path = cfg["TILECOMM_PROFILE"]
        try:
            profile = loaded["profile"] = selector.load_profile(path or None)
        except ValueError as e:
            raise ValueError(f"TILECOMM_PROFILE: {e}") from None
        topo = topology.Topology(tuple(labels), links)
        tables = selector.build_tables(world, forced, profile, topo.layout, topo.domains)
        profile_info = selector.describe_profile(profile, path or None)
        # The job token every TCP connection must present (Note [TCP frames]).
        token = secrets.token_hex(32)
        # How the host's GPUs are joined (NVML, no CUDA context); used at the first direct CUDA call.
        gpus = list(topology.host_gpu_links()) if getattr(_C, "HAS_CUDA", False) else []
        cuda = _cuda_thresholds(cfg, profile, world)
        cuda["allgather_ll_bytes"] = allgather_ll_bytes(cfg)
        cuda["allgather_register_ll_bytes"] = allgather_register_ll_bytes(cfg, profile, world)
        cuda["register_bytes"] = register_bytes(cfg, forced)
        if getattr(_C, "HAS_CUDA", False):
            cuda["nvshmem_algorithms"] = _nvshmem_config(cfg, forced, profile, world, len(set(topo.domains)) == 1)
            # Only where the executor can run: one shared-memory domain, at most MAX_RANKS ranks.
            one = len(set(topo.domains)) == 1 and world <= executor_model.MAX_RANKS
            cuda["executor_tables"] = executor_model.build_tables(world, forced, profile, topo.layout) if one else {}
        return {"settings": cfg, "labels": labels, "links": links, "token": token, "tables": tables,
                "profile": profile_info, "gpu_links": gpus, "cuda": cuda}

    try:
        agreed = _agree(store, pre + "config", rank, make_config)
    except ValueError as e:  # rank 0's bad setting; tell the others before raising
        store.set(pre + "config", json.dumps({"error": str(e)}))
        _until_read(store, pre + "config", world)
        raise
    if "error" in agreed:
        raise ValueError(agreed["error"])
    cfg = agreed["settings"]

    engine = _C.Engine(
        rank,
        world,
        slots=cfg["TILECOMM_SHM_SLOTS"],
        slot_bytes=cfg["TILECOMM_SHM_SLOT_BYTES"],
        tcp_slots=cfg["TILECOMM_TCP_SLOTS"],
        tcp_frame_bytes=cfg["TILECOMM_TCP_FRAME_BYTES"],
        spin_ns=_spin_ns(cfg, world),
        yields=cfg["TILECOMM_YIELDS"],
        sleep_us=cfg["TILECOMM_SLEEP_US"],
        timeout_ms=timeout_ms,
    )
    topo = topology.Topology(tuple(agreed["labels"]), agreed["links"])
    mine = topo.links_from(rank)
    addr, port = "", 0
    if topology.TCP in mine:
        ifname = settings.value("TILECOMM_SOCKET_IFNAME")
        addr = _C.interface_address(ifname) if ifname else _address_reaching(store)
        port = engine.listen(addr)
    store.set(pre + f"peer/{rank}", json.dumps([engine.segment_name(), os.getpid(), addr, port]))
    peers = [json.loads(store.get(pre + f"peer/{r}").decode()) for r in range(world)]
    engine.connect(
        [topology.LINK_IDS[k] for k in mine],
        [name for name, _, _, _ in peers],
        [pid for _, pid, _, _ in peers],
        [a for _, _, a, _ in peers],
        [p for _, _, _, p in peers],
        bytes.fromhex(agreed["token"]),
        timeout_ms,
    )
    # Unlink once every peer has mapped our segment: nothing outlives the job.
    if store.add(pre + "mapped", 1) == world:
        store.set(pre + "mapped_all", "1")
    store.wait([pre + "mapped_all"])
    engine.unlink_own()

    topology.record(opts.group_id, topo)
    for algo in algorithms.ALGORITHMS:
        if algo.direct:
            scheds = []
        else:
            s = algo.schedule(world, topo.layout)
            scheds = [s.for_rank(v) for v in range(world)] if algo.rooted else [s.for_rank(rank)]
        engine.add_algorithm(algo.id, algo.name, algo.coll_id, algo.rooted, algo.direct, scheds)
    for coll, table in agreed["tables"].items():
        engine.set_table(algorithms.COLLECTIVES.index(coll), [tuple(e) for e in table])
    if _debug_info(cfg) and rank == 0:
        log.info("tilecomm world=%d topology: %s", world, topo)
        log.info("tilecomm world=%d profile: %s", world, agreed["profile"])
        if _C.HAS_CUDA:
            log.info("tilecomm world=%d CUDA kernels (bytes; per peer memory): %s; LL all_gather up to %d (a "
                     "registered output from %d)", world, {m: agreed["cuda"][m] for m in cuda_model.MEMORIES},
                     agreed["cuda"]["allgather_ll_bytes"], agreed["cuda"]["allgather_register_ll_bytes"] + 1)
            nv = agreed["cuda"]["nvshmem_algorithms"]
            if nv["lib"]:
                log.info("tilecomm world=%d NVSHMEM algorithms offered (%s); pull from (bytes per rank): all_gather "
                         "%s, reduce_scatter %s", world, nv["lib"], nv["all_gather_pull_bytes"],
                         nv["reduce_scatter_pull_bytes"])
            else:
                log.info("tilecomm world=%d NVSHMEM algorithms not offered: %s", world, nv["why"])
        _log_tables(world, agreed["tables"])
        if _C.HAS_CUDA:
            for m, tables in agreed["cuda"]["executor_tables"].items():
                _log_tables(world, tables, f"CUDA schedule executor over {m}: ")
        # Once per (collective, size class) in use, the engine logs the choice and its predicted time.
        for coll, table in agreed["tables"].items():
            notes = selector.size_class_notes(coll, world, table, loaded["profile"], topo.layout, topo.domains)
            engine.set_notes(algorithms.COLLECTIVES.index(coll), notes)
    engine.start()
    pg = _C.ProcessGroupTilecomm(engine, timeout_ms, store)
    if _C.HAS_CUDA:  # CUDA tensors; devices and peer-transport handles go through the Store on first use
        # GPUs reach each other's memory only inside a shared-memory domain (one host):
        # a group with TCP links stages every CUDA operation through pinned host memory.
        one_domain = len(set(topo.domains)) == 1
        if agreed["cuda"]["nvshmem_algorithms"]["lib"]:  # NVSHMEM's bootstrap: the group is on this host
            os.environ.setdefault("NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME", "lo")
        pg.set_cuda(
            store,
            pre,
            cfg["TILECOMM_CUDA_ALLREDUCE"],
            max(0, cfg["TILECOMM_CUDA_IPC_BYTES"]) if one_domain else 0,
            [agreed["cuda"][m]["two_shot_bytes"] for m in cuda_model.MEMORIES],
            timeout_ms,
            proto=cfg["TILECOMM_PROTO"],
            ll_bytes=[agreed["cuda"][m]["ll_bytes"] for m in cuda_model.MEMORIES],
            allgather_ll_bytes=agreed["cuda"]["allgather_ll_bytes"],
            transport="host_mapped" if cfg["TILECOMM_TRANSPORT"] == "host_mapped" else "auto",
            fence=cfg["TILECOMM_CUDA_FENCE"],
            gpu_links=[tuple(x) for x in agreed["gpu_links"]],
            nvshmem=agreed["cuda"]["nvshmem_algorithms"],
            register_bytes=agreed["cuda"]["register_bytes"],
            allgather_register_ll_bytes=agreed["cuda"]["allgather_register_ll_bytes"],
            p2p=cfg["TILECOMM_CUDA_P2P"],
            executor_tables=[[[tuple(e) for e in agreed["cuda"]["executor_tables"].get(m, {}).get(c, [])]
                              for c in algorithms.COLLECTIVES] for m in executor_model.MEMORIES],
        )
    return pg


class Options(_c10d.Backend.Options):
    """A tilecomm group's options, as its backend's ``options`` gives them: dist.split_group
    deep-copies them for the child group (c10d's own Options cannot be copied)."""

    def __init__(self, timeout_ms: int, group_name: str = ""):
        super().__init__("tilecomm", timedelta(milliseconds=timeout_ms))
        self.group_name = group_name

    def __deepcopy__(self, memo):
        return Options(self._timeout // timedelta(milliseconds=1), self.group_name)


def split(store, rank, world, timeout_ms, group_name):
    """The backend of a group split from a tilecomm group (Note [Splitting] in
    csrc/backend/process_group.hpp): `rank` of `world` ranks, set up through `store` (the parent's
    set-up Store under a prefix naming the child's ranks) exactly as create() sets up a new group."""
    opts = SimpleNamespace(store=store, group_rank=rank, group_size=world, group_id=group_name,
                           timeout=timedelta(milliseconds=timeout_ms))
    return create(opts)


def register_bytes(cfg, forced) -> list:
    """[all_reduce, all_gather, all_to_all, captured all_reduce]: from which size the CUDA kernels work
    on registered tensors (0: never). Registered outputs replace no all_gather algorithm that
    TILECOMM_ALGO forces (CPU or CUDA); all_to_all registers only with TILECOMM_CUDA_ALLTOALL=registered;
    an all_reduce captured in a CUDA graph registers from TILECOMM_CUDA_CAPTURE_REGISTER_BYTES where that
    is smaller (and not 0)."""
    size = max(0, cfg["TILECOMM_CUDA_REGISTER_BYTES"])
    captured = max(0, cfg["TILECOMM_CUDA_CAPTURE_REGISTER_BYTES"])
    return [size, 0 if forced.get("all_gather") or forced.get("cuda:all_gather") else size,
            size if cfg["TILECOMM_CUDA_ALLTOALL"] == "registered" else 0,
            min(size, captured) if size and captured else size]


def allgather_ll_bytes(cfg) -> int:
    """The largest all_gather (bytes per rank) that runs the LL kernel with TILECOMM_PROTO=auto:
    TILECOMM_LL_BYTES where set (>= 0), else the whole LL buffer. all_reduce's crossover does not apply:
    above the LL limit all_gather runs NVSHMEM's block kernels, the schedule executor or staging, which
    over GPU memory measured slower than LL up to the LL buffer (docs/selector.md). Outputs that register
    leave LL earlier (allgather_register_ll_bytes)."""
    return cfg["TILECOMM_LL_BYTES"] if cfg["TILECOMM_LL_BYTES"] >= 0 else cuda_model.LL_MAX_BYTES


def allgather_register_ll_bytes(cfg, profile, world) -> int:
    """Above this all_gather size (bytes per rank) an output that registers runs the push into the
    registered outputs instead of LL: TILECOMM_LL_BYTES where set (>= 0), else the CUDA model's
    crossover at this world size (cuda_model.allgather_register_ll_bytes)."""
    if cfg["TILECOMM_LL_BYTES"] >= 0:
        return cfg["TILECOMM_LL_BYTES"]
    return cuda_model.allgather_register_ll_bytes(profile, world)


def _cuda_thresholds(cfg, profile, world) -> dict:
    """Per peer memory, the CUDA kernels' size thresholds: the CUDA model's crossovers at this world
    size, where TILECOMM_LL_BYTES / TILECOMM_CUDA_TWO_SHOT_BYTES do not set them (>= 0)."""
    out = cuda_model.thresholds(profile, world)
    for limits in out.values():
        if cfg["TILECOMM_LL_BYTES"] >= 0:
            limits["ll_bytes"] = cfg["TILECOMM_LL_BYTES"]
        if cfg["TILECOMM_CUDA_TWO_SHOT_BYTES"] >= 0:
            limits["two_shot_bytes"] = cfg["TILECOMM_CUDA_TWO_SHOT_BYTES"]
    return out


def _nvshmem_config(cfg, forced, profile, world, one_domain) -> dict:
    """The group's NVSHMEM settings (rank 0's): the library (or why none), forced kernels, and from which
    size pull replaces push (the CUDA model's crossovers at this world size)."""
    from tilecomm import _C  # noqa: PLC0415

    lib, why = nvshmem.offered(cfg, one_domain, bool(getattr(_C, "HAS_NVSHMEM", False)))
    staging = cfg["TILECOMM_NVSHMEM_BYTES"]
    if lib and staging < 256 * world:  # a piece carries at least 256 bytes of each rank's block
        lib, why = "", f"TILECOMM_NVSHMEM_BYTES={staging} is below 256 bytes per rank ({256 * world})"
    out = {"lib": lib, "why": why, "bytes": max(0, staging), "data": cfg["TILECOMM_NVSHMEM_DATA"],
           "all_gather": forced.get("cuda:all_gather", ""), "reduce_scatter": forced.get("cuda:reduce_scatter", "")}
    out.update(cuda_model.nvshmem_thresholds(profile, world))
    return out


def _address_reaching(store) -> str:
    """This host's address on the route to the c10d Store's host (else: of the host's own name)."""
    host = None
    while store is not None and host is None:
        host = getattr(store, "host", None)
        store = getattr(store, "underlying_store", None)
    targets = [host] if host else []
    for target in targets + [socket.gethostname()]:
        try:
            family, _, _, _, sockaddr = socket.getaddrinfo(target, 9, type=socket.SOCK_DGRAM)[0]
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect(sockaddr)  # UDP: picks the route, sends nothing
                return s.getsockname()[0]
        except OSError:
            continue
    return "127.0.0.1"


def _debug_info(cfg):
    return cfg["TILECOMM_DEBUG"].upper() == "INFO"


def _enable_info_log():
    """TILECOMM_DEBUG=INFO shows tilecomm's INFO records: on stderr unless the application set up logging."""
    log.setLevel(logging.INFO)
    if not log.handlers and not logging.getLogger().handlers:
        log.addHandler(logging.StreamHandler())


def _log_tables(world, tables, where=""):
    for coll, table in tables.items():
        parts = [
            f"[{lo}, {'inf' if hi is None else hi}] B -> {algo.name}" for lo, hi, algo in selector.table_ranges(table)
        ]
        log.info("tilecomm world=%d %s%s: %s", world, where, coll, "; ".join(parts))


__all__ = ["register", "create"]
