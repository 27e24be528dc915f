"""The one table of every TILECOMM_* environment variable.

Nothing else reads the environment: code asks ``resolve()`` for the values,
and ``docs/env.md`` is generated from this table (``python -m tilecomm.settings``).
Within a group, rank 0's values are used by every rank.
"""

from __future__ import annotations

import contextlib
import difflib
import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    name: str
    kind: type
    default: object
    doc: str
    choices: tuple = ()  # the accepted values, where they are few


SETTINGS = [
    Setting(
        "TILECOMM_ALGO",
        str,
        "",
        "Force algorithms. A bare name applies to every collective that has it (`ring`); "
        "`collective:name` pairs separated by `;` pick per collective "
        '(`"all_reduce:recursive_doubling;all_gather:ring"`). Full ids (`allreduce_ring`) work too. '
        "An unknown or inapplicable name is an error at init that lists the valid names. "
        "`nvshmem_push` and `nvshmem_pull` (all_gather, reduce_scatter) apply to CUDA tensors only (CPU "
        "tensors keep their table), and a CUDA call raises if NVSHMEM is not available (reduce_scatter "
        "of complex tensors, and groups of over 16 ranks, stay staged).",
    ),
    Setting(
        "TILECOMM_DEBUG",
        str,
        "",
        "`INFO` logs, once per group (rank 0; to stderr unless the application configured `logging`), "
        "the selector profile used and the decision table.",
    ),
    Setting(
        "TILECOMM_PROFILE",
        str,
        "",
        "Path of a selector profile (JSON, written by `python -m tilecomm.tune`) whose constants build the "
        "decision tables; unset: the shipped default. An unreadable or malformed file is an error at init. "
        "See [selector.md](selector.md).",
    ),
    Setting(
        "TILECOMM_HOSTNAME",
        str,
        "",
        "Host name this process reports for topology discovery (read by each process itself, not taken from "
        "rank 0); unset: the machine's hostname and boot id. Different values on one machine simulate several "
        "hosts: ranks with different names talk over TCP, as they would across machines.",
    ),
    Setting(
        "TILECOMM_TRANSPORT",
        str,
        "auto",
        "How ranks reach each other. `auto`: shared memory within a host, TCP between hosts; `tcp`: TCP between "
        "every pair (for testing, or to measure the network path on one host); `shm`: shared memory only (a "
        "group spanning machines is then an error; ranks on one machine with different `TILECOMM_HOSTNAME`s "
        "still use shared memory). GPUs of one host (CUDA builds) reach each other's memory through `cuda_ipc` "
        "when every pair has peer access (NVLink, PCIe peer-to-peer, or one GPU shared by the ranks), else "
        "through `host_mapped` (shared host memory registered with every GPU: the PCIe path); "
        "`host_mapped` forces that path for the GPUs and is `auto` for the rest.",
        ("auto", "shm", "tcp", "host_mapped"),
    ),
    Setting(
        "TILECOMM_SOCKET_IFNAME",
        str,
        "",
        "Network interface whose address TCP listens on (read by each process itself). Unset: the local "
        "address that reaches the c10d Store's host (or the address of this host's name).",
    ),
    Setting(
        "TILECOMM_TCP_SLOTS",
        int,
        8,
        "Slots (of `TILECOMM_TCP_FRAME_BYTES`) per TCP connection and direction: frames in flight to one peer.",
    ),
    Setting(
        "TILECOMM_TCP_FRAME_BYTES",
        int,
        262144,
        "Payload bytes per TCP frame (and slot): messages to peers over TCP are cut into slices of this size.",
    ),
    Setting("TILECOMM_SHM_SLOTS", int, 4, "Slots per shared-memory channel (one channel per peer and lane)."),
    Setting(
        "TILECOMM_SHM_SLOT_BYTES",
        int,
        65536,
        "Payload bytes per slot (a multiple of 64); messages are pipelined in slices of this size.",
    ),
    Setting(
        "TILECOMM_SPIN_NS",
        int,
        -1,
        "Nanoseconds a waiting rank polls before it yields its core. -1: 2000 when the host has a core per "
        "rank, else 0.",
    ),
    Setting("TILECOMM_YIELDS", int, 256, "sched_yield calls before a waiting rank sleeps on a futex."),
    Setting(
        "TILECOMM_SLEEP_US",
        int,
        20000,
        "Longest single futex sleep, in microseconds; peer liveness is checked between sleeps.",
    ),
    Setting(
        "TILECOMM_CUDA_ALLREDUCE",
        str,
        "auto",
        "How all_reduce runs on CUDA tensors (CUDA builds). `auto`: the direct `one_shot` kernel below "
        "`TILECOMM_CUDA_TWO_SHOT_BYTES`, the direct `two_shot` kernel from there (in pieces of "
        "`TILECOMM_CUDA_IPC_BYTES` when larger), and from `TILECOMM_CUDA_REGISTER_BYTES` on the two-shot kernel "
        "on registered tensors (read and written in place, no staging; staged kernels where a tensor cannot be "
        "registered); `one_shot` or `two_shot`: that kernel (in pieces); `registered`: the two-shot on registered "
        "tensors at every size over cuda_ipc (where they can be registered, also under CUDA graph capture, which "
        "registers once; elsewhere as `auto` without registration); `scheduled`: "
        "the schedule executor's decision table's algorithm (ring, tree, recursive_doubling, rabenseifner, "
        "hierarchical; "
        "`TILECOMM_ALGO` forces one) walked on the GPU by the schedule executor; `staged`: "
        "through pinned host memory and the CPU engine; `nvshmem_two_shot`: the NVSHMEM two-shot kernel at every "
        "size, which reads and writes tensors made with `tilecomm.symmetric_empty` in place and "
        "stages others through its buffers (`TILECOMM_NVSHMEM_BYTES`); a CUDA call raises if NVSHMEM is not "
        "available, and types and operations the kernels do not reduce (complex, groups of over 16 ranks) are "
        "staged. Otherwise, below `TILECOMM_LL_BYTES` the LL kernel runs instead "
        "(see `TILECOMM_PROTO`). Groups whose ranks are not all in one shared-memory domain (TCP links) stage "
        "every CUDA operation. broadcast, reduce, gather, scatter, all_reduce_coalesced, and all_gather and "
        "reduce_scatter where no LL, registered or NVSHMEM kernel runs them, run their scheduled algorithm (the "
        "executor's decision table's, or `TILECOMM_ALGO`'s) on the GPU's schedule executor; all_to_all runs as one "
        "kernel "
        "(`TILECOMM_CUDA_ALLTOALL`; the FIFO kernel where its 2 x world - 1 lanes fit the block budget); "
        "point-to-point follows `TILECOMM_CUDA_P2P`.",
        ("auto", "one_shot", "two_shot", "registered", "scheduled", "staged", "nvshmem_two_shot"),
    ),
    Setting(
        "TILECOMM_CUDA_P2P",
        str,
        "direct",
        "How send and recv move CUDA tensors (CUDA builds). `direct`: in a group on one host where no pair of "
        "GPUs is known (from NVML) to lack peer access, and without `TILECOMM_TRANSPORT=host_mapped`, the "
        "sender exports its tensor "
        "(cudaIpcGetMemHandle) and the receiver copies it from there on the GPU; the send completes once "
        "that copy has ended, and one that times out fails the group. A sender's tensor that cannot be "
        "exported (expandable segments, memory not from cudaMalloc) is sent through pinned host memory "
        "instead; where the receiver cannot open the sender's memory (no peer access, no shared IPC "
        "namespace) both sides raise. A CUDA tensor's send must then be received into a CUDA tensor "
        "(else both sides end at the group timeout). `staged`: every message goes through pinned host "
        "memory and the CPU engine.",
        ("direct", "staged"),
    ),
    Setting(
        "TILECOMM_CUDA_IPC_BYTES",
        int,
        4194304,
        "Bytes of each staging buffer of the GPU peer transport (two per rank: in GPU memory with cuda_ipc, in "
        "shared host memory with host_mapped): larger all_reduces run through the direct kernels in pieces of "
        "this size. 0: no peer transport (every CUDA operation is staged).",
    ),
    Setting(
        "TILECOMM_CUDA_ALLTOALL",
        str,
        "fifo",
        "How all_to_all runs on CUDA tensors over the GPU peer transport (CUDA builds). `fifo`: one kernel "
        "through the schedule executor's FIFOs, any splits, capturable (every byte copied twice). "
        "`registered`: over cuda_ipc, an all_to_all_single whose blocks are all of one size (splits omitted, "
        "or all equal) with at least `TILECOMM_CUDA_REGISTER_BYTES` of output registers every rank's output "
        "and stores the blocks into it in place (one copy); the others run `fifo`. With `registered` every "
        "rank must see the same: equal blocks of the same size on all ranks, or unequal ones on all, else "
        "the ranks take different kernels and the call ends at the group timeout. Not the default because "
        "torch.distributed lets ranks mix them.",
        ("fifo", "registered"),
    ),
    Setting(
        "TILECOMM_CUDA_REGISTER_BYTES",
        int,
        4194304,
        "Over cuda_ipc: all_reduce messages of at least this many bytes (with `TILECOMM_CUDA_ALLREDUCE=auto`) "
        "register the ranks' tensors (each rank's CUDA allocation exported, and opened once by every peer, "
        "cached) and run the two-shot kernel on them in place, with no staging copy; all_gather outputs of at "
        "least this many bytes that are one range (all_gather_into_tensor), above the LL limit (with "
        "`TILECOMM_PROTO=auto`, above the CUDA model's crossover with LL) and unless "
        "`TILECOMM_ALGO` forces an all_gather algorithm, are registered likewise and written in place by the push "
        "kernel; so are all_to_all_single outputs with `TILECOMM_CUDA_ALLTOALL=registered`. 0: never. Tensors "
        "that cannot be exported (expandable segments, memory not from cudaMalloc) "
        "take the other paths on every rank. Each registered call exchanges its tensors' handles through the "
        "CPU engine first (every rank waits there until all issued it), and peers keep a freed allocation "
        "mapped until its address is reused or the group ends (see docs/architecture.md).",
    ),
    Setting(
        "TILECOMM_CUDA_CAPTURE_REGISTER_BYTES",
        int,
        1048576,
        "Over cuda_ipc, with `TILECOMM_CUDA_ALLREDUCE=auto`: an all_reduce captured in a CUDA graph registers "
        "the ranks' tensors and runs the two-shot kernel on them from this many bytes (above the LL limit), "
        "where `TILECOMM_CUDA_REGISTER_BYTES` is larger (the handle exchange then runs once, at the capture, "
        "not at each replay). Every rank must capture the call: a rank that registers waits in the exchange "
        "for its peers, so a call that some ranks capture and others run eagerly fails, with a collective "
        "mismatch at a peer's next registered call or at the group timeout. 0, or "
        "`TILECOMM_CUDA_REGISTER_BYTES=0`: captured calls register as eager ones do.",
    ),
    Setting(
        "TILECOMM_CUDA_TWO_SHOT_BYTES",
        int,
        -1,
        "With `TILECOMM_CUDA_ALLREDUCE=auto`: all_reduce messages of at least this many bytes use `two_shot` "
        "instead of `one_shot`. -1: the crossover of the selector's CUDA model at the group's world size, per "
        "peer memory (cuda_ipc, host_mapped; see [selector.md](selector.md)).",
    ),
    Setting(
        "TILECOMM_PROTO",
        str,
        "auto",
        "Protocol of the direct CUDA kernels (CUDA builds). `ll`: all_reduce and all_gather of up to 1 MiB (per "
        "rank for all_gather) run the low-latency kernels (`allreduce_one_shot_ll`, `allgather_direct_ll`: each "
        "8 data bytes travel with their own flags, no separate flag round); `simple`: never (all_reduce runs as "
        "`TILECOMM_CUDA_ALLREDUCE` says, all_gather is staged); `auto`: LL up to the LL limits "
        "(`TILECOMM_LL_BYTES`; by default the CUDA model's crossover per peer memory for all_reduce, the whole "
        "LL buffer for all_gather, less for an all_gather_into_tensor output that registers: "
        "`TILECOMM_CUDA_REGISTER_BYTES`). LL "
        "never replaces an all_reduce that `TILECOMM_CUDA_ALLREDUCE=staged` stages.",
        ("auto", "ll", "simple"),
    ),
    Setting(
        "TILECOMM_CUDA_FENCE",
        str,
        "auto",
        "Scope of the fences with which the direct CUDA kernels publish flags and their end of call to peers "
        "(CUDA builds). `auto`: GPU scope when every rank of the group shares one GPU over cuda_ipc or "
        "NVSHMEM's heap (their memory is that GPU's; not with NVSHMEM's put-with-signal), system scope "
        "otherwise; `system`: always system scope.",
        ("auto", "system"),
    ),
    Setting(
        "TILECOMM_NVSHMEM",
        str,
        "auto",
        "NVSHMEM algorithms for CUDA all_gather and reduce_scatter (CUDA builds with the NVSHMEM headers). "
        "`auto`: offered where NVSHMEM's host library is found (the `nvidia-nvshmem-cu13` wheel, or "
        "`$NVSHMEM_HOME/lib`) and the group is on one host; NVSHMEM is initialised at the first call that needs "
        "it (its bootstrap listens on `lo` unless `NVSHMEM_BOOTSTRAP_UID_SOCK_IFNAME` is set). `off`: never.",
        ("auto", "off"),
    ),
    Setting(
        "TILECOMM_NVSHMEM_BYTES",
        int,
        33554432,
        "Bytes of each of the two staging buffers a group keeps on NVSHMEM's symmetric heap (never freed "
        "before the process exits); larger NVSHMEM calls run in pieces of this size / world size per rank. "
        "Below 256 bytes per rank, NVSHMEM is not offered.",
    ),
    Setting(
        "TILECOMM_NVSHMEM_DATA",
        str,
        "auto",
        "How the NVSHMEM push algorithms move data. `auto`: tilecomm's kernels store into peers through "
        "their `nvshmem_ptr` addresses where every rank has one for every peer, else NVSHMEM's "
        "put-with-signal; `put_signal`: always put-with-signal (pull algorithms, which read peers through "
        "those addresses, then become push, or raise when forced).",
        ("auto", "put_signal"),
    ),
    Setting(
        "TILECOMM_LL_BYTES",
        int,
        -1,
        "With `TILECOMM_PROTO=auto`: the largest all_reduce (bytes) or all_gather (bytes per rank) that runs "
        "the LL kernels. -1: for all_reduce, the LL/simple crossover of the selector's CUDA model at the "
        "group's world size, per peer memory; for all_gather, the whole LL buffer (over GPU memory its other "
        "kernels measured slower up to there), except that an output registered by "
        "`TILECOMM_CUDA_REGISTER_BYTES` runs the push into the registered outputs from the model's crossover "
        "with LL. At most 1 MiB (the LL buffer) takes effect.",
    ),
]

_BY_NAME = {s.name: s for s in SETTINGS}


def resolve(environ=None) -> dict:
    """Reads every setting from ``environ`` (default: the process environment)."""
    return {s.name: value(s.name, environ) for s in SETTINGS}


def unknown(environ=None) -> list[tuple[str, str | None]]:
    """TILECOMM_* variables set in ``environ`` that are no setting (a typo, or a setting renamed), each
    with the setting whose name is closest, if one is close. TILECOMM_TEST_* are the test suite's."""
    env = os.environ if environ is None else environ
    names = sorted(k for k in env if k.startswith("TILECOMM_") and k not in _BY_NAME
                   and not k.startswith("TILECOMM_TEST_"))
    tails = {name[len("TILECOMM_"):]: name for name in _BY_NAME}  # the common prefix would make all look close
    near = (difflib.get_close_matches(k[len("TILECOMM_"):], tails, n=1, cutoff=0.7) for k in names)
    return [(k, tails[m[0]] if m else None) for k, m in zip(names, near)]


def value(name: str, environ=None):
    """One setting, read by this process (for the per-process ones such as TILECOMM_HOSTNAME)."""
    s = _BY_NAME[name]
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or raw == "":
        return s.default
    try:
        v = s.kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected {s.kind.__name__}") from None
    if s.choices and v not in s.choices:
        raise ValueError(f"{name}={raw!r}: expected one of " + ", ".join(s.choices))
    return v


@contextlib.contextmanager
def overriding(values: dict):
    """Sets environment variables for a block (None unsets one; processes started inside inherit
    them), then puts back what was there."""
    saved = {k: os.environ.get(k) for k in values}
    _set(values)
    try:
        yield
    finally:
        _set(saved)


def _set(values: dict):
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def markdown() -> str:
    lines = [
        "# Environment variables",
        "",
        "Generated from `python/tilecomm/settings.py` by `python -m tilecomm.settings`; do not edit by hand.",
        "Within a process group every rank uses rank 0's values. Rank 0 warns, once per process, of a",
        "`TILECOMM_*` variable that is none of these (a typo, or a setting since renamed), naming the closest.",
        "",
        "| variable | default | meaning |",
        "| --- | --- | --- |",
    ]
    for s in SETTINGS:
        default = f"`{s.default}`" if s.default != "" else "(unset)"
        lines.append(f"| `{s.name}` | {default} | {s.doc} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
