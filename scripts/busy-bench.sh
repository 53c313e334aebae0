#!/usr/bin/env bash
# Speed beside other work (issue #52, docs/performance.md "A busy machine"): the 64 + 64 training and
# generation bench alone, then with one busy low-priority process per core beside it (nice 19 spin
# loops: what a gateway runner, a tool server or a managed replica does to the trainer), under each
# OpenMP wait policy. Prints each case's train tokens/s and generation tokens/s and their ratios to
# the same policy alone. BUSY=drmas makes the busy work one other drmas process at nice 19 instead (a
# training step loop with its own OpenMP threads: what a managed replica or a second trainer is).
# Run it alone on the machine.
#
#   bash scripts/busy-bench.sh                 # tiny preset, batch 16, 3 repeats a case
#   PRESET=small REPEATS=1 bash scripts/busy-bench.sh
#   BUSY=drmas POLICIES=default bash scripts/busy-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin/drmas}
PRESET=${PRESET:-tiny}
REPEATS=${REPEATS:-3}
CORES=$(nproc)
POLICIES=${POLICIES:-"default passive spin0"}
bench() { # policy -> "train_tokens_per_s gen_tokens_per_s" (medians of REPEATS)
  local env=()
  case $1 in
  passive) env=(OMP_WAIT_POLICY=PASSIVE) ;;
  spin0) env=(GOMP_SPINCOUNT=0) ;;
  default) env=(DRMAS_OMP_WAIT_POLICY=) ;;
  esac
  for _ in $(seq "$REPEATS"); do
    env "${env[@]}" "$BIN" bench --preset "$PRESET" --batch 16 --prompt-len 64 --response-len 64 --steps 3 --json --log-level warn |
      python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["train_tokens_per_s"], r["gen_tokens_per_s"])'
  done | python3 -c 'import sys, statistics as s; rows=[list(map(float, l.split())) for l in sys.stdin]; print(s.median(r[0] for r in rows), s.median(r[1] for r in rows))'
}
busy_pids=()
start_busy() {
  if [ "${BUSY:-spin}" = drmas ]; then
    nice -n 19 "$BIN" bench --preset small --batch 16 --prompt-len 64 --response-len 64 --steps 100000 --no-generate --log-level error >/dev/null 2>&1 &
    busy_pids+=($!)
    sleep 5 # past its start-up
    return
  fi
  for _ in $(seq "$CORES"); do nice -n 19 bash -c 'while :; do :; done' & busy_pids+=($!); done
}
stop_busy() { kill "${busy_pids[@]}" 2>/dev/null || true; wait "${busy_pids[@]}" 2>/dev/null || true; busy_pids=(); }
trap stop_busy EXIT
declare -A alone
busy="$CORES nice-19 spinners"
[ "${BUSY:-spin}" = drmas ] && busy="a nice-19 drmas training loop"
printf '| policy | alone: train tok/s | gen tok/s | busy (%s): train tok/s | gen tok/s | train ratio | gen ratio |\n|---|---|---|---|---|---|---|\n' "$busy"
for p in $POLICIES; do
  read -r at ag < <(bench "$p")
  start_busy
  read -r bt bg < <(bench "$p")
  stop_busy
  python3 -c "import sys; at,ag,bt,bg=map(float,sys.argv[2:]); print(f'| {sys.argv[1]} | {at:.0f} | {ag:.0f} | {bt:.0f} | {bg:.0f} | {bt/at:.2f} | {bg/ag:.2f} |')" "$p" "$at" "$ag" "$bt" "$bg"
done
