"""Shows how the selector decides: ``python -m tilecomm.explain``.

    python -m tilecomm.explain --collective all_reduce --world-size 8 [--hosts 2] [--size 1MB] [--profile profile.json]

Prints the decision table of a collective (or of all) at a world size (on
``--hosts`` hosts of consecutive ranks, as equal as can be; shared memory inside
a host, TCP between): byte ranges and the algorithm picked in each. With ``--size``, also every candidate
algorithm with its predicted time split into the latency, bandwidth and
reduction terms, fastest first, the table's pick marked. The profile is
``--profile``, else TILECOMM_PROFILE, else the shipped default.

``--device cuda`` shows the tables of the GPU's schedule executor instead (over
``--memory``, cuda_ipc by default; ``executor_model``), and with ``--size`` every
scheduled candidate's prediction split into its call, round, step and byte terms.
"""

from __future__ import annotations

import argparse
import sys

from tilecomm import _backend, algorithms, bench, executor_model, selector, settings

_UNITS = [(1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")]
_DTYPES = sorted({str(d).replace("torch.", "") for d in bench.DTYPES.values()})


def format_bytes(n: int) -> str:
    """Exact: "64 KiB" when n is a whole number of a unit, else "65537 B"."""
    for size, unit in _UNITS:
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def range_line(lo: int, hi, name: str) -> str:
    """One size range of a table: "  0 B .. 8 KiB   <name>" (hi None: unbounded)."""
    span = f"{format_bytes(lo)} .. {'inf' if hi is None else format_bytes(hi)}"
    return f"  {span:<28} {name}"


def host_layout(world: int, hosts: int) -> tuple[int, ...]:
    """Host index per rank: consecutive ranks, hosts as equal as can be (the first ones one larger)."""
    sizes = [world // hosts + (h < world % hosts) for h in range(hosts)]
    return tuple(h for h, n in enumerate(sizes) for _ in range(n))


def table_lines(collective: str, world: int, profile, layout=None) -> list[str]:
    table = selector.build_table(collective, world, {}, profile, layout, layout)
    where = "" if layout is None else f" on {len(set(layout))} hosts"
    lines = [f"{collective}, world size {world}{where} (decision table, float32):"]
    lines += [range_line(lo, hi, algo.name) for lo, hi, algo in selector.table_ranges(table)]
    return lines


def candidate_lines(collective: str, world: int, nbytes: int, dtype: str, profile, layout=None) -> list[str]:
    picked = selector.lookup(selector.build_table(collective, world, {}, profile, layout, layout), nbytes)
    rows = []
    for a in algorithms.for_collective(collective):
        pr = selector.predict_algo(a, world, nbytes, profile, dtype, layout)
        rows.append((pr.total_s, a.id, a, pr, selector.correction(profile, world, a.name)))
    rows.sort(key=lambda r: (r[0], r[1]))
    lines = [
        f"{collective} of {format_bytes(nbytes)} ({nbytes} B), world size {world}"
        + ("" if layout is None else f" on {len(set(layout))} hosts")
        + f", {dtype}; predicted us:",
        f"  {'':2}{'algorithm':<34}{'total':>11}{'latency':>11}{'bandwidth':>11}{'reduction':>11}  corrections",
    ]
    for total, _, a, pr, (c_lat, c_bw) in rows:
        mark = "*" if a.id == picked.id else ""
        lines.append(
            f"  {mark:<2}{a.name:<34}{total * 1e6:>11.2f}{pr.latency_s * 1e6:>11.2f}"
            f"{pr.bandwidth_s * 1e6:>11.2f}{pr.reduction_s * 1e6:>11.2f}  latency {c_lat:.3g}, bandwidth {c_bw:.3g}"
        )
    lines.append("  * = the decision table's pick")
    if rows[0][2].id != picked.id:
        lines.append(
            f"  note: with {dtype}'s gamma the model prefers {rows[0][2].name}, but decision tables are by byte "
            "size and built with float32's gamma (docs/selector.md)"
        )
    return lines


def executor_lines(collective: str, world: int, memory: str, profile) -> list[str]:
    consts = executor_model.constants(profile)[memory]
    table = executor_model.build_table(collective, world, {}, consts)
    lines = [f"{collective}, world size {world}, CUDA tensors (schedule executor over {memory}):"]
    lines += [range_line(lo, hi, algo.name) for lo, hi, algo in selector.table_ranges(table)]
    if collective in _DIRECT_FIRST:
        lines.append(f"  note: {_DIRECT_FIRST[collective]}")
    return lines


def direct_lines(world: int, memory: str, profile, cfg, nbytes=None) -> list[str]:
    """all_reduce's direct kernels over `memory`: the sizes each runs at (the CUDA model's crossovers,
    or TILECOMM_LL_BYTES / TILECOMM_CUDA_TWO_SHOT_BYTES), and with nbytes every kernel's prediction."""
    from tilecomm import _backend, cuda_model  # noqa: PLC0415

    t = _backend._cuda_thresholds(cfg, profile, world)[memory]
    ll, two = min(t["ll_bytes"], cuda_model.LL_MAX_BYTES), t["two_shot_bytes"]  # LL: at most its buffer
    ranges = []
    if ll > 0:
        ranges.append((0, ll, "allreduce_one_shot_ll"))
    if two > ll + 1 or two == cuda_model.NEVER:
        ranges.append((ll + 1 if ll else 0, None if two == cuda_model.NEVER else two - 1, "allreduce_one_shot"))
    if two != cuda_model.NEVER:
        ranges.append((max(two, ll + 1 if ll else 0), None, "allreduce_two_shot"))
    lines = [f"all_reduce, world size {world}, CUDA tensors (direct kernels over {memory}, "
             f"TILECOMM_CUDA_ALLREDUCE=auto):"]
    lines += [range_line(*r) for r in ranges]
    for key in ("TILECOMM_CUDA_ALLREDUCE", "TILECOMM_PROTO"):
        if cfg[key] != "auto":
            lines.append(f"  note: {key}={cfg[key]} is set; groups would not follow these ranges (docs/env.md)")
    if memory == "cuda_ipc" and cfg["TILECOMM_CUDA_REGISTER_BYTES"] > 0:
        lines.append(f"  from {format_bytes(cfg['TILECOMM_CUDA_REGISTER_BYTES'])} the two-shot on registered tensors "
                     "(TILECOMM_CUDA_REGISTER_BYTES; not priced by the model)")
        eager, _, _, captured = _backend.register_bytes(cfg, {})
        if captured < eager:
            lines.append(f"  captured in a CUDA graph, from {format_bytes(captured)} "
                         "(TILECOMM_CUDA_CAPTURE_REGISTER_BYTES)")
    if nbytes is not None:
        consts = cuda_model.constants(profile)
        kernels = [k for k, v in cuda_model.KERNELS.items() if v.collective == "all_reduce"]
        lines += ["", f"all_reduce of {format_bytes(nbytes)} ({nbytes} B), world size {world}, direct kernels over "
                      f"{memory}; predicted us (CUDA model):"]
        for k in sorted(kernels, key=lambda k: cuda_model.predict(k, world, nbytes, consts, memory)):
            lines.append(f"    {k:<34}{cuda_model.predict(k, world, nbytes, consts, memory) * 1e6:>9.2f}")
        if nbytes > cuda_model.LL_MAX_BYTES:
            lines.append(f"  (LL runs up to its buffer, {format_bytes(cuda_model.LL_MAX_BYTES)})")
    return lines


def nvshmem_lines(collective: str, world: int, profile, nbytes=None) -> list[str]:
    """all_gather's and reduce_scatter's NVSHMEM kernels (where a group offers them): from which size
    pull replaces push (cuda_model.nvshmem_thresholds), and with nbytes (per rank's block) each
    kernel's prediction, latency and bandwidth parts with its corrections at this world size."""
    from tilecomm import cuda_model  # noqa: PLC0415

    short = collective.replace("_", "")
    push, pull = f"{short}_nvshmem_push", f"{short}_nvshmem_pull"
    n = cuda_model.nvshmem_thresholds(profile, world)[f"{collective}_pull_bytes"]
    ranges = [(0, None, pull)] if n == 0 else [(0, None, push)] if n == cuda_model.NEVER else \
        [(0, n - 1, push), (n, None, pull)]
    lines = [f"{collective}, world size {world}, CUDA tensors (NVSHMEM's kernels, where a group offers them; "
             "bytes per rank):"]
    lines += [range_line(*r) for r in ranges]
    if nbytes is not None:
        consts = cuda_model.constants(profile)
        lines += ["", f"{collective} of {format_bytes(nbytes)} ({nbytes} B) per rank, world size {world}, NVSHMEM's "
                      "kernels; predicted us (CUDA model):",
                  f"    {'kernel':<34}{'total':>9}{'latency':>9}{'bytes':>9}  corrected"]
        for k in sorted((push, pull), key=lambda k: cuda_model.predict(k, world, nbytes, consts, "nvshmem")):
            lat, bw = cuda_model.parts(k, world, nbytes, consts, "nvshmem")
            f = cuda_model.correction(k, world, consts, "nvshmem")
            note = f"x{f['latency']:.3g} / x{f['bandwidth']:.3g}" if f else "none at this world size"
            lines.append(f"    {k:<34}{(lat + bw) * 1e6:>9.2f}{lat * 1e6:>9.2f}{bw * 1e6:>9.2f}  {note}")
    return lines


# Where a direct kernel runs a CUDA collective before the executor (docs/env.md has the settings).
_DIRECT_FIRST = {
    "all_reduce": "the direct kernels above run it unless TILECOMM_CUDA_ALLREDUCE=scheduled",
    "all_gather": "the LL, registered and NVSHMEM kernels run it where they apply",
    "reduce_scatter": "the NVSHMEM kernels run it where they apply",
}


def executor_candidate_lines(collective: str, world: int, nbytes: int, memory: str, profile) -> list[str]:
    consts = executor_model.constants(profile)[memory]
    picked = selector.lookup(executor_model.build_table(collective, world, {}, consts), nbytes)
    rows = []
    for a in executor_model.candidates(collective):
        parts = executor_model.parts(a, world, nbytes, consts)
        rows.append((sum(parts), a.id, a, parts, executor_model.features(a, world)))
    rows.sort(key=lambda r: (r[0], r[1]))
    lines = [f"{collective} of {format_bytes(nbytes)} ({nbytes} B), world size {world}, schedule executor over "
             f"{memory}; predicted us:",
             f"  {'':2}{'algorithm':<34}{'total':>9}{'call':>9}{'rounds':>9}{'steps':>9}{'bytes':>9}"
             "  (rounds, steps, wire)"]
    for total, _, a, parts, (rounds, wire, steps) in rows:
        mark = "*" if a.id == picked.id else ""
        c_lat, c_bw = executor_model.correction(consts, world, a)
        fitted = f", corrected x{c_lat:.3g} / x{c_bw:.3g}" if (c_lat, c_bw) != (1.0, 1.0) else ""
        lines.append(f"  {mark:<2}{a.name:<34}{total * 1e6:>9.2f}" + "".join(f"{x * 1e6:>9.2f}" for x in parts)
                     + f"  ({rounds}, {steps}, {wire:.3g}{fitted})")
    lines.append("  * = the executor's decision table's pick; corrected: the algorithm's latency (call, rounds, "
                 "steps) and bandwidth factors at this world size")
    return lines


def build_parser():
    ap = argparse.ArgumentParser(prog="python -m tilecomm.explain", description=__doc__.split("\n\n")[0])
    ap.add_argument("--collective", required=True, choices=algorithms.COLLECTIVES + ["all"])
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--hosts", type=int, default=1, help="hosts the ranks span (consecutive ranks per host)")
    ap.add_argument("--size", type=bench.parse_size, help="also break down every candidate at this size (e.g. 1MB)")
    ap.add_argument("--dtype", default=selector.TABLE_DTYPE, choices=_DTYPES, help="dtype for --size's reduction term")
    ap.add_argument("--profile", help="profile JSON (default: TILECOMM_PROFILE, else the shipped default)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="cuda: the GPU schedule executor's tables (broadcast, reduce, gather, scatter, ...)")
    ap.add_argument("--memory", default="cuda_ipc", choices=executor_model.MEMORIES,
                    help="with --device cuda: the GPUs' peer memory")
    return ap


def main(argv=None):
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.world_size < 1:
        ap.error("--world-size must be >= 1")
    if args.hosts < 1 or args.hosts > args.world_size:
        ap.error("--hosts must be between 1 and the world size")
    if args.size is not None and args.size < 0:
        ap.error("--size must be >= 0")
    cfg = settings.resolve()
    path = args.profile if args.profile is not None else cfg["TILECOMM_PROFILE"]
    try:
        profile = selector.load_profile(path or None)
    except ValueError as e:
        ap.error(str(e))
    out = [f"profile: {selector.describe_profile(profile, path or None)}"]
    layout = host_layout(args.world_size, args.hosts) if args.hosts > 1 else None
    if cfg["TILECOMM_ALGO"]:
        out.append(f"note: TILECOMM_ALGO={cfg['TILECOMM_ALGO']!r} is set; groups would use the algorithms it forces")
    if args.device == "cuda":
        if args.hosts > 1:
            ap.error("--device cuda: CUDA tensors of groups across hosts are staged through host memory")
        colls = executor_model.COLLECTIVES if args.collective == "all" else [args.collective]
        if args.collective not in executor_model.COLLECTIVES + ("all",):
            ap.error(f"--device cuda: {args.collective} does not run on the schedule executor")
        if args.world_size > executor_model.MAX_RANKS:
            ap.error(f"--device cuda: groups of over {executor_model.MAX_RANKS} ranks stage CUDA tensors "
                     "through host memory")
        for coll in colls:
            if coll == "all_reduce":
                out += [""] + direct_lines(args.world_size, args.memory, profile, cfg, args.size)
            if coll in ("all_gather", "reduce_scatter"):
                out += [""] + nvshmem_lines(coll, args.world_size, profile, args.size)
            out += [""] + executor_lines(coll, args.world_size, args.memory, profile)
            if args.size is not None:
                out += [""] + executor_candidate_lines(coll, args.world_size, args.size, args.memory, profile)
        print("\n".join(out))
        return 0
    colls = algorithms.COLLECTIVES if args.collective == "all" else [args.collective]
    for coll in colls:
        out.append("")
        out += table_lines(coll, args.world_size, profile, layout)
        if args.size is not None:
            out.append("")
            out += candidate_lines(coll, args.world_size, args.size, args.dtype, profile, layout)
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
