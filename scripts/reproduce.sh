#!/usr/bin/env bash
# Reproduces the paper's finding on a CPU: trains the toy search team with global GRPO and with
# Dr. MAS (same seeds), compares their per-agent gradient norms (inspect-grads, with a plot) and
# their validation success (eval), and writes a markdown report. About 20 minutes on 2 cores.
#   SEEDS="1 2" STEPS=250 CONFIG=configs/toy-search.yaml OUT=runs/reproduce bash scripts/reproduce.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin/drmas}
CONFIG=${CONFIG:-configs/toy-search.yaml}
SEEDS=${SEEDS:-"1 2"}
OUT=${OUT:-runs/reproduce}
MINUTES=${MINUTES:-5}          # wall-time cap per training run
K=${K:-8}                      # eval samples per question
LIMIT=${LIMIT:-64}             # eval questions
EXTRA=${EXTRA:-}               # extra --set flags for every run, e.g. "--set run.steps=100"
SKIP_TRAIN=${SKIP_TRAIN:-}     # 1: reuse the runs already in $OUT (redo the comparison and the report)
mkdir -p "$OUT"
log() { echo "reproduce: $*" >&2; }

for seed in $SEEDS; do
  [ -n "$SKIP_TRAIN" ] && break
  for norm in grpo drmas; do
    dir="$OUT/$norm-seed$seed"
    log "training $norm, seed $seed -> $dir (at most $MINUTES min)"
    # shellcheck disable=SC2086
    $BIN train --config "$CONFIG" --force --log-level warn \
      --set run.dir="$dir" --set run.seed="$seed" --set toy.seed="$seed" \
      --set algorithm.normalization.preset="$norm" --set run.max_minutes="$MINUTES" $EXTRA
  done
done

runs=(); labels=()
for norm in grpo drmas; do
  for seed in $SEEDS; do runs+=("$OUT/$norm-seed$seed"); labels+=(--label "$norm-s$seed"); done
done
log "comparing gradient norms"
$BIN inspect-grads "${runs[@]}" "${labels[@]}" --plot "$OUT/grad-norms.png" > "$OUT/inspect-grads.txt"
$BIN inspect-grads "${runs[@]}" "${labels[@]}" --json > "$OUT/inspect-grads.json"

log "evaluating the final checkpoints (k=$K, $LIMIT questions)"
for r in "${runs[@]}"; do
  ck=$(ls -d "$r"/step-* | sed 's/.*step-//' | sort -n | tail -1)
  $BIN eval --config "$CONFIG" --checkpoint "$r/step-$ck" --k "$K" --limit "$LIMIT" --json \
    --set run.seed=1 --log-level warn > "$r/eval.json"
done

python3 - "$OUT" "$K" $SEEDS <<'PY' > "$OUT/report.md" || bash -c "echo 'python3 missing: see $OUT/*.txt' > $OUT/report.md"
import json, sys, os, statistics as st
out, k, seeds = sys.argv[1], sys.argv[2], sys.argv[3:]
insp = json.load(open(os.path.join(out, "inspect-grads.json")))
print("# Dr. MAS vs GRPO on the toy search team\n")
print(f"Seeds: {' '.join(seeds)}. Each run: `configs/toy-search.yaml`, at most the configured steps or the time cap.\n")
print("The paper (Qwen2.5-7B, non-shared, search): Dr. MAS +15.2% avg@16 and +13.1% pass@16 over GRPO;")
print("under GRPO the search agent's gradient norm spikes above 80, then turns NaN. Below: what this run measured.\n")
print("## Validation after training (eval, k=%s)\n" % k)
print("| run | avg@k | pass@k | searcher calls/traj |")
print("|---|---|---|---|")
res = {}
for norm in ("grpo", "drmas"):
    for s in seeds:
        r = json.load(open(os.path.join(out, f"{norm}-seed{s}", "eval.json")))
        calls = next((a["calls_per_traj"] for a in r["agents"] if a["agent"] == "searcher"), float("nan"))
        res.setdefault(norm, []).append((r["avg_at_k"], r["pass_at_k"]))
        print(f"| {norm} seed {s} | {r['avg_at_k']:.3f} | {r['pass_at_k']:.3f} | {calls:.2f} |")
for norm, v in res.items():
    print(f"| **{norm} mean** | {st.mean(x[0] for x in v):.3f} | {st.mean(x[1] for x in v):.3f} | |")
print("\n## Pre-clip gradient norms per agent (inspect-grads)\n")
print("| run | agent | median | p95 | max | spikes | non-finite | mean inflation |")
print("|---|---|---|---|---|---|---|---|")
def f(x):
    return "–" if x is None else (f"{x:.3g}" if isinstance(x, float) else str(x))
for run in insp.get("runs", []):
    for a in run.get("agents", []):
        print(f"| {run.get('label')} | {a.get('name') or a.get('agent')} | {f(a.get('median'))} | {f(a.get('p95'))} | {f(a.get('max'))} | {f(a.get('spikes'))} | {f(a.get('nonfinite'))} | {f(a.get('inflation'))} |")
print("\n![per-agent gradient norms](grad-norms.png)\n")
print("Full tables: `inspect-grads.txt`; per-run metrics: `<run>/metrics.jsonl`.")
PY
log "report: $OUT/report.md (plot: $OUT/grad-norms.png)"
echo "$OUT/report.md"
