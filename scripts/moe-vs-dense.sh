#!/usr/bin/env bash
# Does the toy mixture-of-experts team learn like its dense counterpart? (issue #53, docs/real-models.md)
# configs/toy-math-moe.yaml (Qwen3-MoE, 4 experts of 128 features, top-2, routing replay) against the
# same config with num_experts 0 — the dense Qwen3 block of transformers' qwen3_moe with one MLP of 256
# features: the same active parameters a token (the router's 256 aside), the same data, seeds, warm-up
# and training. A third arm, "one", is the control: one expert of 256 features, top-1 (its weight is
# always 1), the dense model exactly (TestOneExpertTrainsAsDense) but through the whole mixture-of-experts
# path and from other random draws of the same initialisation — how far two arms that are the same
# model differ by the seeds alone. Each run trains STEPS iterations (no time limit), then its final
# checkpoint is evaluated on LIMIT held-out questions with K samples each (avg@K, pass@K), as
# scripts/reproduce.sh does; the table gives each arm's mean ± standard error over the seeds, how many
# seeds passed avg@K 0.6 (a run that answers from the first operand alone gets about half), and the
# difference to dense.
#
#   bash scripts/moe-vs-dense.sh                           # seeds 1–3, 240 iterations, the config's lr
#   SEEDS="$(seq 1 10)" STEPS=360 LR=5e-4 ARMS="moe dense one" bash scripts/moe-vs-dense.sh
#   SEEDS="1" STEPS=20 bash scripts/moe-vs-dense.sh         # a smoke run
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin/drmas}
OUT=${OUT:-runs/moe-vs-dense}
SEEDS=${SEEDS:-"1 2 3"}
STEPS=${STEPS:-240}
ARMS=${ARMS:-"moe dense"}
K=${K:-8}
LIMIT=${LIMIT:-64}
CFG=configs/toy-math-moe.yaml
mkdir -p "$OUT"
for seed in $SEEDS; do
  for arm in $ARMS; do
    dir="$OUT/$arm-s$seed"
    case $arm in
      moe) extra=() ;;
      dense) extra=(--set models.0.init.num_experts=0) ;;
      one) extra=(--set models.0.init.num_experts=1 --set models.0.init.num_experts_per_tok=1 --set models.0.init.moe_intermediate_size=256) ;;
      *) echo "unknown arm $arm (moe, dense, one)" >&2; exit 2 ;;
    esac
    [ -n "${LR:-}" ] && extra+=(--set models.0.optim.lr="$LR")
    echo "$(date +%T) train $arm seed $seed" >&2
    $BIN train --config "$CFG" --force --log-level warn --set run.dir="$dir" --set run.seed="$seed" --set toy.seed="$seed" \
      --set run.steps="$STEPS" --set run.max_minutes=0 --set run.test_freq=0 --set run.save_every=0 "${extra[@]}" > "$dir.log" 2>&1
    ck=$(ls -d "$dir"/step-* | sed 's/.*step-//' | sort -n | tail -1)
    $BIN eval --config "$CFG" --checkpoint "$dir/step-$ck" --k "$K" --limit "$LIMIT" --json --set run.seed=1 \
      --set toy.seed="$seed" "${extra[@]}" --log-level warn > "$dir/eval.json" 2>> "$dir.log"
  done
done
python3 - "$OUT" "$K" "$ARMS" $SEEDS <<'PY'
import json, math, sys, statistics
out, k, arms, seeds = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4:]
def stat(xs):
    m = statistics.mean(xs)
    se = statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else float("nan")
    return m, se
rows = {}
for arm in arms:
    evs = [json.load(open(f"{out}/{arm}-s{s}/eval.json")) for s in seeds]
    last = []
    for s in seeds:
        rs = [json.loads(l) for l in open(f"{out}/{arm}-s{s}/metrics.jsonl")]
        tail = rs[-max(1, len(rs) // 10):]
        last.append(statistics.mean(r["reward/mean"] for r in tail))
    rows[arm] = {"avg": [e["avg_at_k"] for e in evs], "pass": [e["pass_at_k"] for e in evs], "reward": last}
print(f"| arm | seeds | avg@{k} | pass@{k} | train reward, last 10% | seeds past avg@{k} 0.6 |")
print("|---|---|---|---|---|---|")
for arm, r in rows.items():
    cells = [f"{m:.3f} ± {se:.3f}" for m, se in (stat(r[x]) for x in ("avg", "pass", "reward"))]
    print(f"| {arm} | {len(seeds)} | " + " | ".join(cells) + f" | {sum(a > 0.6 for a in r['avg'])} |")
for arm in arms:
    if arm == "dense" or "dense" not in rows:
        continue
    d = [a - b for a, b in zip(rows[arm]["avg"], rows["dense"]["avg"])]
    ma, sa = stat(rows[arm]["avg"])
    md, sd = stat(rows["dense"]["avg"])
    print(f"\navg@{k}, {arm} − dense per seed: {', '.join(f'{x:+.3f}' for x in d)}; "
          f"mean {ma - md:+.3f} ± {math.hypot(sa, sd):.3f} (SE; the arms' draws are independent, so unpaired)")
PY
