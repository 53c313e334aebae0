#!/usr/bin/env bash
# The dial study (issue #29, docs/dial.md): when does Dr. MAS matter? Trains the dial team
# (configs/toy-dial.yaml: a Helper called by the environment with probability p_wrong in episodes
# the Solver got wrong and p_right in the others) at each dial setting, with GRPO and with Dr. MAS,
# one model per agent and one shared model, on the same seeds; evaluates the final checkpoints;
# reads each run's per-agent gradient norms; measures the counterfactual ratio |g_GRPO|²/|g_DrMAS|²
# and its two logged predictors on the same checkpoints (mid-run and final) of every run; pools
# them (`drmas inspect-grads --pool`, which draws the plot); writes $OUT/report.md with
# scripts/dial_report.py.
#
#   bash scripts/reproduce-dial.sh              # 5 settings × 2 estimators × 2 model layouts × seeds 1–5
#   SEEDS="1 2" DIALS="0.5:0.5 1:0" bash scripts/reproduce-dial.sh
#   SKIP_TRAIN=1 bash scripts/reproduce-dial.sh # redo eval, inspection and the report from $OUT's runs
#   REPORT_ONLY=1 bash scripts/reproduce-dial.sh  # redo only the pooling and the report (meta.json's wall time is kept)
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-bin/drmas}
OUT=${OUT:-runs/dial}
JOBS=${JOBS:-2}
SEEDS=${SEEDS:-"1 2 3 4 5"}
DIALS=${DIALS:-"0.5:0.5 0.6:0.4 0.75:0.25 0.9:0.1 1:0"}  # p_wrong:p_right, from equal to far apart
STEPS=${STEPS:-100}
MID=${MID:-50}               # the mid-run checkpoint the counterfactual also reads
K=${K:-8}                    # eval samples per question
LIMIT=${LIMIT:-64}           # eval questions
CF_BATCHES=${CF_BATCHES:-4}  # counterfactual rollout batches per checkpoint
SKIP_TRAIN=${SKIP_TRAIN:-}
REPORT_ONLY=${REPORT_ONLY:-}

log() { echo "reproduce-dial: $(date -u +%H:%M:%S) $*" >&2; }
began=$(date +%s)
mkdir -p "$OUT"
config_of() { case $1 in sep) echo configs/toy-dial.yaml ;; shared) echo configs/toy-dial-shared.yaml ;; esac; }

# One job = one (dial, layout, estimator, seed): train, evaluate, read the norms, counterfactuals.
job() {
  local dial layout est seed pw pr cfg dir dialset ck
  IFS=$'\t' read -r dial layout est seed <<< "$1"
  IFS=: read -r pw pr <<< "$dial"
  cfg=$(config_of "$layout"); dir="$OUT/$layout-$pw-$pr-$est-s$seed"
  dialset=(--set orchestra.dial.p_wrong="$pw" --set orchestra.dial.p_right="$pr")
  if [ -z "$SKIP_TRAIN" ]; then
    log "train $layout p_wrong=$pw p_right=$pr $est seed $seed"
    $BIN train --config "$cfg" --force --log-level warn --set run.dir="$dir" --set run.seed="$seed" \
      --set toy.seed="$seed" --set algorithm.normalization.preset="$est" --set run.steps="$STEPS" \
      --set run.threads=1 --set run.max_minutes=0 --set run.test_freq=0 --set run.save_every="$MID" \
      --set run.keep_last=0 "${dialset[@]}" > "$dir.log" 2>&1 || { log "FAILED: $dir (see $dir.log)"; return 0; }
  fi
  [ -d "$dir/step-$STEPS" ] || { log "no final checkpoint: $dir"; return 0; }
  $BIN eval --config "$cfg" --checkpoint "$dir/step-$STEPS" --k "$K" --limit "$LIMIT" --json "${dialset[@]}" \
    --set run.seed=1 --set toy.seed="$seed" --log-level warn > "$dir/eval.json" 2>> "$dir.log" || log "eval failed: $dir"
  $BIN inspect-grads "$dir" --json > "$dir/inspect.json" 2>> "$dir.log" || log "inspect failed: $dir"
  for ck in "$MID" "$STEPS"; do
    [ -d "$dir/step-$ck" ] || continue
    $BIN inspect-grads --config "$cfg" --checkpoint "$dir/step-$ck" --batches "$CF_BATCHES" --json "${dialset[@]}" \
      --set run.seed="$seed" --set toy.seed="$seed" --log-level warn > "$dir/cf-step-$ck.json" 2>> "$dir.log" \
      || log "counterfactual failed: $dir step $ck"
  done
}

for dial in $DIALS; do
  for layout in sep shared; do
    for est in grpo drmas; do
      for seed in $SEEDS; do printf '%s\t%s\t%s\t%s\n' "$dial" "$layout" "$est" "$seed"; done
    done
  done
done > "$OUT/jobs.tsv"
# shellcheck source=scripts/queue.sh
source scripts/queue.sh
[ -n "$REPORT_ONLY" ] || run_jobs "$JOBS" "$OUT/jobs.tsv" job

# Pool every counterfactual report, labelled by its dial setting and layout: the table, the correlations
# (over rows and over the label × agent medians), the plot.
reports=(); labels=()
for dial in $DIALS; do
  IFS=: read -r pw pr <<< "$dial"
  for layout in sep shared; do
    for f in "$OUT/$layout-$pw-$pr"-*-s*/cf-step-*.json; do
      [ -s "$f" ] || continue
      reports+=("$f"); labels+=(--label "$dial $layout")
    done
  done
done
$BIN inspect-grads --pool "${reports[@]}" "${labels[@]}" > "$OUT/pool.txt" 2>> "$OUT/pool.log"
$BIN inspect-grads --pool "${reports[@]}" "${labels[@]}" --json > "$OUT/pool.json" 2>> "$OUT/pool.log"
# The dialled agent alone (the Solver's ratio is 1 at every setting): the plot, and each layout apart.
$BIN inspect-grads --pool "${reports[@]}" "${labels[@]}" --agent helper --plot "$OUT/ratios.png" --json \
  > "$OUT/pool-helper.json" 2>> "$OUT/pool.log"
for layout in sep shared; do
  sub=(); sublabels=(); for ((i = 0; i < ${#reports[@]}; i++)); do
    case ${reports[$i]} in "$OUT/$layout"-*) sub+=("${reports[$i]}"); sublabels+=(--label "${labels[$((2 * i + 1))]}") ;; esac
  done
  if [ ${#sub[@]} -gt 0 ]; then
    $BIN inspect-grads --pool "${sub[@]}" "${sublabels[@]}" --agent helper --json > "$OUT/pool-helper-$layout.json" 2>> "$OUT/pool.log"
  fi
done

wall=$(( ($(date +%s) - began + 30) / 60 ))
[ -z "$REPORT_ONLY" ] || wall=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["wall_min"])' "$OUT/meta.json")
printf '{"seeds": [%s], "dials": "%s", "steps": %s, "mid": %s, "k": %s, "limit": %s, "cf_batches": %s, "jobs": %s, "cores": %s, "wall_min": %s, "commit": "%s", "date": "%s"}\n' \
  "$(echo $SEEDS | tr ' ' ',')" "$DIALS" "$STEPS" "$MID" "$K" "$LIMIT" "$CF_BATCHES" "$JOBS" "$(nproc)" "$wall" \
  "$(git describe --always --dirty 2>/dev/null || echo unknown)" "$(date -u +%Y-%m-%d)" > "$OUT/meta.json"
python3 scripts/dial_report.py "$OUT" > "$OUT/report.md"
if [ -n "${DOCS:-}" ]; then  # DOCS=docs/dial: publish the report, the plot and the pooled table there
  mkdir -p "$DOCS"; cp "$OUT/report.md" "$OUT/ratios.png" "$OUT/pool.txt" "$DOCS/"
fi
log "report: $OUT/report.md ($wall min)"
echo "$OUT/report.md"
