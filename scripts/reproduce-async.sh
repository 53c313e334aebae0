#!/usr/bin/env bash
# Does training on rollouts generated ahead (rollout.max_staleness K) learn as the synchronous loop
# does? (issue #38, docs/async.md). The toy math team (configs/toy-math-team.yaml) and the toy search
# team (configs/toy-search-team.yaml), every model's rollouts on one managed drmas serve replica
# (models[].rollout: {engine: managed, replicas: 1, threads: 1}), in four arms:
#
#   k0       K = 0: rollout, then update (the engines' log-probs unused)
#   k1-tis   K = 1 (one step off) with token-level truncated importance weights, C = 2
#   k4       K = 4, no correction
#   k4-tis   K = 4 with TIS, C = 2
#
# Everything else is each config's (seeds, data, warm-up, estimator), so each comparison changes one
# thing. Each run is evaluated (avg@8 on 64 held-out questions, the trained weights on the CPU);
# scripts/async_report.py writes the report (final avg@8 per arm, the 2-SE verdict against k0, the
# correction metrics) and the plot of validation-free training reward and correction weights.
# A run's samples are a function of its seeds (the schedule is fixed), so the figures do not depend on
# the machine's load; the wall time does.
#
#   bash scripts/reproduce-async.sh                 # 2 teams × 4 arms × seeds 1–5 (40 runs)
#   SEEDS="1 2" ARMS="k0 k1-tis" TEAMS=math bash scripts/reproduce-async.sh
#   REPORT_ONLY=1 bash scripts/reproduce-async.sh    # redo the report and plot from $OUT's runs
#   DOCS=docs/async bash scripts/reproduce-async.sh  # also publish the report and the plot there
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-bin/drmas}
OUT=${OUT:-runs/async}
JOBS=${JOBS:-2}
SEEDS=${SEEDS:-"1 2 3 4 5"}
TEAMS=${TEAMS:-"math search"}
ARMS=${ARMS:-"k0 k1-tis k4 k4-tis"}
K=${K:-8}          # eval samples per question
LIMIT=${LIMIT:-64} # eval questions
REPORT_ONLY=${REPORT_ONLY:-}

log() { echo "reproduce-async: $(date -u +%H:%M:%S) $*" >&2; }
began=$(date +%s)
commit=$(git describe --always --dirty 2>/dev/null || echo unknown) # the tree the runs start from
mkdir -p "$OUT"
config_of() { echo "configs/toy-$1-team.yaml"; }
steps_of() { case $1 in math) echo 150 ;; search) echo 120 ;; esac; }
models_of() { case $1 in math) echo 2 ;; search) echo 3 ;; esac; }

# arm_sets ARM prints the arm's --set flags, one per line.
arm_sets() {
  case $1 in
    k0) echo rollout.max_staleness=0 ;;
    k1-tis) printf '%s\n' rollout.max_staleness=1 'algorithm.rollout_correction={mode: tis, threshold: 2}' ;;
    k4) echo rollout.max_staleness=4 ;;
    k4-tis) printf '%s\n' rollout.max_staleness=4 'algorithm.rollout_correction={mode: tis, threshold: 2}' ;;
    *) echo "unknown arm $1" >&2; return 1 ;;
  esac
}

# One job = one (team, arm, seed): train, evaluate.
job() {
  local team arm seed cfg dir steps s i
  IFS=$'\t' read -r team arm seed <<< "$1"
  cfg=$(config_of "$team"); dir="$OUT/$team-$arm-s$seed"; steps=$(steps_of "$team")
  local sets=()
  while read -r s; do sets+=(--set "$s"); done < <(arm_sets "$arm")
  for ((i = 0; i < $(models_of "$team"); i++)); do sets+=(--set "models.$i.rollout={engine: managed, replicas: 1, threads: 1}"); done
  log "train $team $arm seed $seed"
  $BIN train --config "$cfg" --force --log-level warn --set run.dir="$dir" --set run.seed="$seed" \
    --set toy.seed="$seed" --set run.steps="$steps" --set run.threads=1 --set run.max_minutes=0 \
    --set run.test_freq=0 --set run.save_every=0 --set run.keep_last=1 "${sets[@]}" \
    > "$dir.log" 2>&1 || { log "FAILED: $dir (see $dir.log)"; return 0; }
  [ -d "$dir/step-$steps" ] || { log "no final checkpoint: $dir"; return 0; }
  $BIN eval --config "$cfg" --checkpoint "$dir/step-$steps" --k "$K" --limit "$LIMIT" --json \
    --set run.seed=1 --set toy.seed="$seed" --log-level warn > "$dir/eval.json" 2>> "$dir.log" || log "eval failed: $dir"
}

# The essential comparison (k0, k1-tis) first, then K = 4.
for arm in $ARMS; do
  arm_sets "$arm" > /dev/null
  for team in $TEAMS; do
    for seed in $SEEDS; do printf '%s\t%s\t%s\n' "$team" "$arm" "$seed"; done
  done
done > "$OUT/jobs.tsv"
# shellcheck source=scripts/queue.sh
source scripts/queue.sh
if [ -z "$REPORT_ONLY" ]; then
  log "$(wc -l < "$OUT/jobs.tsv") runs, $JOBS at a time"
  run_jobs "$JOBS" "$OUT/jobs.tsv" job
fi

wall=$(( ($(date +%s) - began + 30) / 60 ))
if [ -n "$REPORT_ONLY" ]; then
  wall=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["wall_min"])' "$OUT/meta.json")
  commit=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["commit"])' "$OUT/meta.json")
  JOBS=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["jobs"])' "$OUT/meta.json")
fi
printf '{"seeds": [%s], "teams": "%s", "arms": "%s", "k": %s, "limit": %s, "jobs": %s, "cores": %s, "wall_min": %s, "commit": "%s", "date": "%s"}\n' \
  "$(echo $SEEDS | tr ' ' ',')" "$TEAMS" "$ARMS" "$K" "$LIMIT" "$JOBS" "$(nproc)" "$wall" \
  "$commit" "$(date -u +%Y-%m-%d)" > "$OUT/meta.json"
python3 scripts/async_report.py "$OUT" > "$OUT/report.md"
if [ -n "${DOCS:-}" ]; then
  mkdir -p "$DOCS"; cp "$OUT/report.md" "$OUT"/*.svg "$DOCS/" 2>/dev/null || true
fi
log "report: $OUT/report.md ($wall min)"
echo "$OUT/report.md"
