#!/usr/bin/env bash
# Reproduction of the paper's claims on the CPU toy teams (issues #17 and #18): trains every row of
# the table below for each seed, evaluates the final checkpoints, counts gradient spikes, measures
# the counterfactual gradient ratio on non-shared checkpoints, and writes $OUT/report.md with
# scripts/reproduce_report.py.
#
#   bash scripts/reproduce.sh            # every row, seeds 1–5 (27 min on 2 cores; ≤ 45 min)
#   bash scripts/reproduce.sh --quick    # primary rows, seed 1 only (≤ 15 min on 2 cores)
#   SEEDS="1 2" OUT=runs/rep JOBS=1 bash scripts/reproduce.sh
#   SKIP_TRAIN=1 bash scripts/reproduce.sh   # redo eval, inspection and the report from $OUT's runs
#   ONLY='^search-sep-' bash scripts/reproduce.sh  # (re)run only the rows whose id matches; the report reads every row in $OUT
#
# Two trainings run at a time (JOBS), each pinned to its own core (scripts/queue.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK=${QUICK:-}
[ "${1:-}" = "--quick" ] && QUICK=1
BIN=${BIN:-bin/drmas}
OUT=${OUT:-runs/reproduce}
JOBS=${JOBS:-2}
K=${K:-8}                    # eval samples per question
LIMIT=${LIMIT:-64}           # eval questions
MATH_STEPS=${MATH_STEPS:-150}
SEARCH_STEPS=${SEARCH_STEPS:-120}
CF_BATCHES=${CF_BATCHES:-4}  # counterfactual rollout batches per checkpoint
SKIP_TRAIN=${SKIP_TRAIN:-}
ONLY=${ONLY:-}               # extended regular expression on row ids: run only those rows
if [ -n "$QUICK" ]; then SEEDS=${SEEDS:-1}; else SEEDS=${SEEDS:-"1 2 3 4 5"}; fi

log() { echo "reproduce: $(date -u +%H:%M:%S) $*" >&2; }
began=$(date +%s)
commit=$(git describe --always --dirty 2>/dev/null || echo unknown)  # the checkout as the run starts
mkdir -p "$OUT"

# The rows: id, task, models, reward, estimator, group (primary | role | extra), extra --set flags.
# Primary: team outcome reward only (the paper's reward), both toys, one model per agent (non-shared)
# and one shared model. Secondary: role rewards (per-call GRPO vs Dr. MAS: the same per-call scores,
# only the baseline differs), AT-GRPO, the per-agent guard (clip) on GRPO (issue #18), and one LoRA
# adapter per agent on a shared frozen base with Dr. MAS (issue #27).
MATH_SEP=configs/toy-math-team.yaml
MATH_SHARED=configs/toy-math-team-shared.yaml
SEARCH_SEP=configs/toy-search-team.yaml
SEARCH_SHARED=configs/toy-search-team-shared.yaml
MATH_LORA=configs/toy-math-lora.yaml
SEARCH_LORA=configs/toy-search-lora.yaml
ROLE="--set agents.0.reward.role_weight=0.5 --set agents.1.reward.role_weight=0.5"
GUARD="--set algorithm.guard.window=20 --set algorithm.guard.factor=5"
{
  printf '# id\ttask\tmodels\treward\testimator\tgroup\textra\n'
  for setting in math-sep:toy-math:non-shared math-shared:toy-math:shared \
                 search-sep:toy-search:non-shared search-shared:toy-search:shared; do
    IFS=: read -r prefix task models <<< "$setting"
    for est in grpo grpo-call drmas; do
      printf '%s-%s\t%s\t%s\tteam\t%s\tprimary\t\n' "$prefix" "$est" "$task" "$models" "$est"
    done
  done
  if [ -z "$QUICK" ]; then
    for est in grpo-call drmas; do
      printf 'search-sep-role-%s\ttoy-search\tnon-shared\trole 0.5 (verifier, searcher)\t%s\trole\t%s\n' "$est" "$est" "$ROLE"
    done
    printf 'search-sep-at-grpo\ttoy-search\tnon-shared\tteam\tat-grpo\textra\t\n'
    printf 'search-sep-grpo-guard-clip\ttoy-search\tnon-shared\tteam\tgrpo\textra\t%s\n' "$GUARD --set algorithm.guard.action=clip"
    # LoRA per agent (issue #27): one adapter per agent on one frozen toy base (docs/lora.md).
    for setting in math-lora:toy-math search-lora:toy-search; do
      IFS=: read -r prefix task <<< "$setting"
      printf '%s-drmas\t%s\tLoRA per agent\tteam\tdrmas\tlora\t\n' "$prefix" "$task"
    done
  fi
} > "$OUT/rows.tsv"

config_of() {  # row id -> config file
  case $1 in
    math-sep-*) echo $MATH_SEP ;; math-shared-*) echo $MATH_SHARED ;;
    search-sep-*) echo $SEARCH_SEP ;; search-shared-*) echo $SEARCH_SHARED ;;
    math-lora-*) echo $MATH_LORA ;; search-lora-*) echo $SEARCH_LORA ;;
  esac
}
steps_of() { case $1 in math-*) echo "$MATH_STEPS" ;; *) echo "$SEARCH_STEPS" ;; esac; }

# One job = one row and seed: train, evaluate the final checkpoint, count spikes.
job() {
  local id=$1 est=$2 seed=$3 extra=$4 cfg dir
  cfg=$(config_of "$id"); dir="$OUT/$id-s$seed"
  if [ -z "$SKIP_TRAIN" ]; then
    log "train $id seed $seed"
    # shellcheck disable=SC2086
    $BIN train --config "$cfg" --force --log-level warn --set run.dir="$dir" --set run.seed="$seed" \
      --set toy.seed="$seed" --set algorithm.normalization.preset="$est" --set run.steps="$(steps_of "$id")" \
      --set run.threads=1 --set run.max_minutes=0 --set run.test_freq=0 --set run.save_every=0 $extra \
      > "$dir.log" 2>&1 || { log "FAILED: $id seed $seed (see $dir.log)"; return 0; }
  fi
  local ck; ck=$(ls -d "$dir"/step-* 2>/dev/null | sed 's/.*step-//' | sort -n | tail -1) || true
  [ -n "$ck" ] || { log "no checkpoint: $dir"; return 0; }
  $BIN eval --config "$cfg" --checkpoint "$dir/step-$ck" --k "$K" --limit "$LIMIT" --json \
    --set run.seed=1 --set toy.seed="$seed" --log-level warn > "$dir/eval.json" 2>> "$dir.log" || log "eval failed: $dir"
  $BIN inspect-grads "$dir" --label "$id-s$seed" --json > "$dir/inspect.json" 2>> "$dir.log" || log "inspect failed: $dir"
}

# Counterfactual on a non-shared final checkpoint: measured |g_grpo|²/|g_drmas|² vs the logged statistics.
cf_job() {
  local id=$1 seed=$2 cfg dir ck
  cfg=$(config_of "$id"); dir="$OUT/$id-s$seed"
  ck=$(ls -d "$dir"/step-* 2>/dev/null | sed 's/.*step-//' | sort -n | tail -1) || true
  [ -n "$ck" ] || { log "no checkpoint for the counterfactual: $dir"; return 0; }
  log "counterfactual $id seed $seed"
  $BIN inspect-grads --config "$cfg" --checkpoint "$dir/step-$ck" --batches "$CF_BATCHES" --json \
    --set run.seed="$seed" --set toy.seed="$seed" --log-level warn > "$OUT/cf-$id-s$seed.json" 2>> "$dir.log" \
    || log "counterfactual failed: $dir"
}

# The job lists: one line per (row, seed), the longer toy-search jobs first. The queues take the
# next job as they free up; the counterfactuals read the checkpoints the trainings write, so they
# run after all of them.
for want in search math; do
  while IFS=$'\t' read -r id _ _ _ est _ extra; do
    case $id in "$want"-*) ;; *) continue ;; esac
    [ -z "$ONLY" ] || [[ $id =~ $ONLY ]] || continue
    for seed in $SEEDS; do printf '%s\t%s\t%s\t%s\n' "$id" "$est" "$seed" "$extra"; done
  done < "$OUT/rows.tsv"
done > "$OUT/.jobs-train"
for seed in $SEEDS; do
  for est in grpo drmas; do
    for id in search-sep-$est math-sep-$est; do
      if [ -z "$ONLY" ] || [[ $id =~ $ONLY ]]; then printf '%s\t%s\n' "$id" "$seed"; fi
    done
  done
done > "$OUT/.jobs-cf"
train_line() { local id est seed extra; IFS=$'\t' read -r id est seed extra <<< "$1"; job "$id" "$est" "$seed" "$extra"; }
cf_line() { local id seed; IFS=$'\t' read -r id seed <<< "$1"; cf_job "$id" "$seed"; }
# shellcheck source=scripts/queue.sh
source scripts/queue.sh
run_jobs "$JOBS" "$OUT/.jobs-train" train_line
run_jobs "$JOBS" "$OUT/.jobs-cf" cf_line

# Per-agent gradient norms of the non-shared search rows, GRPO against Dr. MAS (first seed).
first=${SEEDS%% *}
$BIN inspect-grads "$OUT/search-sep-grpo-s$first" "$OUT/search-sep-drmas-s$first" --label grpo --label drmas \
  --plot "$OUT/grad-norms.png" > "$OUT/inspect-grads.txt" 2>> "$OUT/inspect-grads.log" || log "plot failed"

wall=$(( ($(date +%s) - began + 30) / 60 ))
printf '{"seeds": [%s], "steps": {"toy-math": %s, "toy-search": %s}, "k": %s, "limit": %s, "cf_batches": %s, "jobs": %s, "cores": %s, "quick": %s, "wall_min": %s, "commit": "%s", "date": "%s"}\n' \
  "$(echo $SEEDS | tr ' ' ',')" "$MATH_STEPS" "$SEARCH_STEPS" "$K" "$LIMIT" "$CF_BATCHES" "$JOBS" "$(nproc)" \
  "$([ -n "$QUICK" ] && echo true || echo false)" "$wall" "$commit" \
  "$(date -u +%Y-%m-%d)" > "$OUT/meta.json"
python3 scripts/reproduce_report.py "$OUT" > "$OUT/report.md"
if [ -n "${DOCS:-}" ]; then  # DOCS=docs/reproduce: publish the report and plot there
  mkdir -p "$DOCS"; cp "$OUT/report.md" "$DOCS/${QUICK:+quick-}report.md"
  [ -f "$OUT/grad-norms.png" ] && cp "$OUT/grad-norms.png" "$DOCS/${QUICK:+quick-}grad-norms.png"
  cp "$OUT/inspect-grads.txt" "$DOCS/${QUICK:+quick-}inspect-grads.txt"
fi
log "report: $OUT/report.md ($wall min)"
echo "$OUT/report.md"
