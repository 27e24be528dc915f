#!/usr/bin/env bash
# all_reduce over shared memory, over TCP alone, and mixed (simulated hosts:
# shared memory inside a host, TCP between), for ring, Rabenseifner and
# hierarchical (and the selector's choice), 8 B to 64 MB, with the busiest
# rank's TCP bytes per call. Writes benchmarks/results/hosts_<config>.jsonl.
#
#   benchmarks/hosts.sh
set -euo pipefail
cd "$(dirname "$0")/.."
R=benchmarks/results
ARGS=(--collective all_reduce --algo ring,rabenseifner,hierarchical --backend tilecomm --link-bytes)
rm -f $R/hosts_{shm4,tcp4,2x2,2x4}.jsonl
# The sweep (16 B .. 64 MB), then 8 B on its own with more calls.
for SIZES in "-b 16 -e 64M -f 4 -n 10 -w 2" "-b 8 -e 8 -n 20 -w 5"; do
  # shellcheck disable=SC2086
  set -- $SIZES
  python -m tilecomm.bench --np 4 "${ARGS[@]}" "$@" --jsonl $R/hosts_shm4.jsonl
  TILECOMM_TRANSPORT=tcp python -m tilecomm.bench --np 4 "${ARGS[@]}" "$@" --jsonl $R/hosts_tcp4.jsonl
  python -m tilecomm.bench --np 4 --hosts 2x2 "${ARGS[@]}" "$@" --jsonl $R/hosts_2x2.jsonl
  python -m tilecomm.bench --np 8 --hosts 2x4 "${ARGS[@]}" "$@" --jsonl $R/hosts_2x4.jsonl
done
