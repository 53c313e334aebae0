#!/usr/bin/env bash
# The ablation study (issue #43, docs/ablations.md): is Dr. MAS's effect the normalization, the
# agents' unequal call counts, or something harder clipping or a KL controller would also give? The
# Dr. MAS reference code's post-paper ablations, on the dial team (configs/toy-dial.yaml, one model per
# agent, and configs/toy-dial-shared.yaml, one shared model) at p_wrong:p_right 0.75:0.25 and 1:0:
#
#   grpo         GRPO (preset grpo)
#   drmas        Dr. MAS (preset drmas)
#   role         Dr. MAS without the σ division (preset role-baseline: s − μ_k; run_math_no_std_norm.sh)
#   grpo-bal     GRPO + loss balancing by invocation frequency (balance_loss_by_agent_freq)
#   drmas-bal    Dr. MAS + the same balancing
#   grpo-clip0.5, grpo-clip0.2, grpo-clip0.1
#                GRPO with the gradient clip at 0.5/0.2/0.1 instead of the configs' 1.0: per agent
#                (agents[].train.grad_clip) with one model per agent, as run_math_gradclip_*.sh set
#                it per agent's actor; the shared model's own clip (models[].optim.grad_clip) with one
#                shared model, where a per-agent clip is not defined
#   grpo-akl     GRPO + the adaptive KL-in-reward controller with the reference's settings
#                (run_math_adaptive_kl.sh: kl_penalty kl = k1, kl_coef 0.001, target_kl 0.1, horizon 10000)
#
# Every arm keeps everything else of the configs (the KL loss, the 1.0 clip where it is not the
# arm, seeds, data, warm-up), so each comparison changes one thing. Each run is evaluated (avg@8 on
# 64 held-out questions) and read by `drmas inspect-grads`; scripts/ablation_report.py writes the report
# (tables and the 2-SE verdicts); `drmas inspect-grads --plot` draws seed 1's gradient norms.
#
#   bash scripts/reproduce-ablations.sh            # 2 dials × 2 layouts × 9 arms × seeds 1–5 (180 runs)
#   SEEDS="1 2" ARMS="grpo drmas" bash scripts/reproduce-ablations.sh
#   REPORT_ONLY=1 bash scripts/reproduce-ablations.sh   # redo the plots and the report from $OUT's runs
#   DOCS=docs/ablations bash scripts/reproduce-ablations.sh   # also publish the report and the plots there
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-bin/drmas}
OUT=${OUT:-runs/ablations}
JOBS=${JOBS:-2}
SEEDS=${SEEDS:-"1 2 3 4 5"}
DIALS=${DIALS:-"0.75:0.25 1:0"}
ARMS=${ARMS:-"grpo drmas role grpo-bal drmas-bal grpo-clip0.5 grpo-clip0.2 grpo-clip0.1 grpo-akl"}
STEPS=${STEPS:-100}
K=${K:-8}          # eval samples per question
LIMIT=${LIMIT:-64} # eval questions
REPORT_ONLY=${REPORT_ONLY:-}

log() { echo "reproduce-ablations: $(date -u +%H:%M:%S) $*" >&2; }
began=$(date +%s)
mkdir -p "$OUT"
config_of() { case $1 in sep) echo configs/toy-dial.yaml ;; shared) echo configs/toy-dial-shared.yaml ;; esac; }

# arm_sets ARM LAYOUT prints the arm's --set flags, one per line.
arm_sets() {
  local arm=$1 layout=$2 c
  case $arm in
    grpo) echo algorithm.normalization.preset=grpo ;;
    drmas) echo algorithm.normalization.preset=drmas ;;
    role) echo algorithm.normalization.preset=role-baseline ;;
    grpo-bal) printf '%s\n' algorithm.normalization.preset=grpo algorithm.balance_loss_by_agent_freq=true ;;
    drmas-bal) printf '%s\n' algorithm.normalization.preset=drmas algorithm.balance_loss_by_agent_freq=true ;;
    grpo-clip*)
      c=${arm#grpo-clip}
      echo algorithm.normalization.preset=grpo
      if [ "$layout" = sep ]; then printf '%s\n' "agents.0.train.grad_clip=$c" "agents.1.train.grad_clip=$c"
      else echo "models.0.optim.grad_clip=$c"; fi ;;
    grpo-akl) printf '%s\n' algorithm.normalization.preset=grpo algorithm.kl_in_reward.coef=0.001 \
      algorithm.kl_in_reward.type=k1 algorithm.kl_in_reward.controller=adaptive \
      algorithm.kl_in_reward.target=0.1 algorithm.kl_in_reward.horizon=10000 ;;
    *) echo "unknown arm $arm" >&2; return 1 ;;
  esac
}

# One job = one (dial, layout, arm, seed): train, evaluate, read the norms.
job() {
  local dial layout arm seed pw pr cfg dir s
  IFS=$'\t' read -r dial layout arm seed <<< "$1"
  IFS=: read -r pw pr <<< "$dial"
  cfg=$(config_of "$layout"); dir="$OUT/$layout-$pw-$pr-$arm-s$seed"
  local dialset=(--set orchestra.dial.p_wrong="$pw" --set orchestra.dial.p_right="$pr")
  local armset=(); while read -r s; do armset+=(--set "$s"); done < <(arm_sets "$arm" "$layout")
  log "train $layout p_wrong=$pw p_right=$pr $arm seed $seed"
  $BIN train --config "$cfg" --force --log-level warn --set run.dir="$dir" --set run.seed="$seed" \
    --set toy.seed="$seed" --set run.steps="$STEPS" --set run.threads=1 --set run.max_minutes=0 \
    --set run.test_freq=0 --set run.save_every=0 --set run.keep_last=1 "${dialset[@]}" "${armset[@]}" \
    > "$dir.log" 2>&1 || { log "FAILED: $dir (see $dir.log)"; return 0; }
  [ -d "$dir/step-$STEPS" ] || { log "no final checkpoint: $dir"; return 0; }
  $BIN eval --config "$cfg" --checkpoint "$dir/step-$STEPS" --k "$K" --limit "$LIMIT" --json "${dialset[@]}" \
    --set run.seed=1 --set toy.seed="$seed" --log-level warn > "$dir/eval.json" 2>> "$dir.log" || log "eval failed: $dir"
  $BIN inspect-grads "$dir" --json > "$dir/inspect.json" 2>> "$dir.log" || log "inspect failed: $dir"
}

for dial in $DIALS; do
  for layout in sep shared; do
    for arm in $ARMS; do
      arm_sets "$arm" "$layout" > /dev/null
      for seed in $SEEDS; do printf '%s\t%s\t%s\t%s\n' "$dial" "$layout" "$arm" "$seed"; done
    done
  done
done > "$OUT/jobs.tsv"
# shellcheck source=scripts/queue.sh
source scripts/queue.sh
if [ -z "$REPORT_ONLY" ]; then
  log "$(wc -l < "$OUT/jobs.tsv") runs, $JOBS at a time"
  run_jobs "$JOBS" "$OUT/jobs.tsv" job
fi

# The plots, drawn by drmas: the first seed's per-agent gradient norms, every arm, per dial and layout.
first=${SEEDS%% *}
for dial in $DIALS; do
  IFS=: read -r pw pr <<< "$dial"
  for layout in sep shared; do
    runs=(); labels=()
    for arm in $ARMS; do
      d="$OUT/$layout-$pw-$pr-$arm-s$first"
      [ -s "$d/metrics.jsonl" ] || continue
      runs+=("$d"); labels+=(--label "$arm")
    done
    [ ${#runs[@]} -gt 0 ] || continue
    $BIN inspect-grads "${runs[@]}" "${labels[@]}" --plot "$OUT/norms-$layout-$pw-$pr.png" --log-y \
      > "$OUT/norms-$layout-$pw-$pr.txt" 2>> "$OUT/plot.log" || log "plot failed: $layout $dial"
  done
done

wall=$(( ($(date +%s) - began + 30) / 60 ))
[ -z "$REPORT_ONLY" ] || wall=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["wall_min"])' "$OUT/meta.json")
printf '{"seeds": [%s], "dials": "%s", "arms": "%s", "steps": %s, "k": %s, "limit": %s, "jobs": %s, "cores": %s, "wall_min": %s, "commit": "%s", "date": "%s"}\n' \
  "$(echo $SEEDS | tr ' ' ',')" "$DIALS" "$ARMS" "$STEPS" "$K" "$LIMIT" "$JOBS" "$(nproc)" "$wall" \
  "$(git describe --always --dirty 2>/dev/null || echo unknown)" "$(date -u +%Y-%m-%d)" > "$OUT/meta.json"
python3 scripts/ablation_report.py "$OUT" > "$OUT/report.md"
if [ -n "${DOCS:-}" ]; then  # DOCS=docs/ablations: publish the report and the plots there
  mkdir -p "$DOCS"; cp "$OUT/report.md" "$OUT"/norms-*.png "$DOCS/"
fi
log "report: $OUT/report.md ($wall min)"
echo "$OUT/report.md"
