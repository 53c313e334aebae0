#!/usr/bin/env bash
# Does the tool toy team learn to use its tool? (issue #41, docs/tools.md) Trains configs/toy-tool-team.yaml
# on each seed, evaluates the checkpoint after the format warm-up (step-0) and the last one with
# `drmas eval` (avg@8 on 64 held-out questions), reads the tool calls from the final evaluation's
# transcripts, draws seed 1's curves with `drmas plot`, and writes $OUT/report.md.
#
#   bash scripts/reproduce-tools.sh                 # seeds 1 2 3, 400 iterations each, two at a time
#   SEEDS=1 STEPS=40 bash scripts/reproduce-tools.sh
#   EXTRA_SETS="--set algorithm.kl.coef=0.3" OUT=runs/tools-kl bash scripts/reproduce-tools.sh   # a variant
#   REPORT_ONLY=1 DOCS=docs/tools bash scripts/reproduce-tools.sh   # redo the plot and the report from $OUT's runs
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=${BIN:-bin/drmas}
OUT=${OUT:-runs/tools}
SEEDS=${SEEDS:-"1 2 3"}
STEPS=${STEPS:-400}
CFG=configs/toy-tool-team.yaml
K=8
LIMIT=64

log() { echo "reproduce-tools: $(date -u +%H:%M:%S) $*" >&2; }
began=$(date +%s)
mkdir -p "$OUT"
job() {
  local seed=$1 dir="$OUT/s$1" ck
  log "train seed $seed"
  $BIN train --config "$CFG" --force --log-level warn --set run.dir="$dir" --set run.seed="$seed" --set toy.seed="$seed" \
    --set run.steps="$STEPS" --set run.max_minutes=0 --set run.save_every="$STEPS" --set run.keep_last=0 ${EXTRA_SETS:-} > "$dir.log" 2>&1 \
    || { log "FAILED: $dir (see $dir.log)"; return 0; }
  for ck in 0 "$STEPS"; do
    $BIN eval --config "$CFG" --checkpoint "$dir/step-$ck" --k "$K" --limit "$LIMIT" --json --set toy.seed="$seed" \
      --out "$dir/eval-step-$ck.jsonl" --log-level warn > "$dir/eval-step-$ck.json" 2>> "$dir.log" || log "eval failed: $dir step $ck"
  done
}
printf '%s\n' $SEEDS > "$OUT/jobs.tsv"
# shellcheck source=scripts/queue.sh
source scripts/queue.sh
[ -n "${REPORT_ONLY:-}" ] || run_jobs "${JOBS:-2}" "$OUT/jobs.tsv" job
first=${SEEDS%% *}
$BIN plot "$OUT/s$first" -o "$OUT/curves-s$first.png" > /dev/null
wall=$(( ($(date +%s) - began + 30) / 60 ))
if [ -n "${REPORT_ONLY:-}" ]; then wall=$(cat "$OUT/wall_min" 2>/dev/null || echo "?"); else echo "$wall" > "$OUT/wall_min"; fi
python3 - "$OUT" "$STEPS" "$wall" "$SEEDS" > "$OUT/report.md" <<'EOF'
import json, os, statistics as st, sys
out, steps, wall, seeds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
def load(p):
    try:
        return json.load(open(p))
    except (OSError, ValueError):
        return None
def tools(p):
    """Over the transcript's calls: the share of trajectories whose first call used the tool with the
    question's own key, and the share of tool calls that failed."""
    trajs, right, uses, failed = {}, 0, 0, 0
    try:
        lines = [json.loads(l) for l in open(p)]
    except (OSError, ValueError):
        return None, None
    for l in lines:
        trajs.setdefault(l["traj_uid"], []).append(l)
    for calls in trajs.values():
        first = calls[0]
        for u in first.get("tools") or []:
            uses += 1
            failed += bool(u.get("error"))
        ok = [u for u in first.get("tools") or [] if not u.get("error")]
        key = None
        if ok:
            key = json.loads(json.dumps(ok[0].get("arguments") or {})).get("key")
        q = first["prompt"].rstrip("?")
        right += key is not None and q.endswith(key)
    return right / max(len(trajs), 1), failed / max(uses, 1)
rows = []
print(f"# Does the tool toy team learn to use its tool?\n")
print(f"`bash scripts/reproduce-tools.sh`: configs/toy-tool-team.yaml, {steps} iterations, seeds {', '.join(seeds)}; "
      f"{wall} min on this machine. avg@8 on 64 held-out questions after the format warm-up (step 0) and at the end; "
      f"'asks its key': the share of evaluation trajectories whose first call used `lookup` with the question's "
      f"own key; 'failed': the share of tool calls that failed (malformed, bad arguments, unknown key).\n")
print("| seed | avg@8 after warm-up | avg@8 final | asks its key: warm-up → final | failed tool calls: warm-up → final |")
print("|---|---|---|---|---|")
for s in seeds:
    a0 = load(os.path.join(out, f"s{s}", "eval-step-0.json"))
    a1 = load(os.path.join(out, f"s{s}", f"eval-step-{steps}.json"))
    k0, f0 = tools(os.path.join(out, f"s{s}", "eval-step-0.jsonl"))
    k1, f1 = tools(os.path.join(out, f"s{s}", f"eval-step-{steps}.jsonl"))
    fmt = lambda x: "–" if x is None else f"{x:.3f}"
    v0, v1 = (a0 or {}).get("avg_at_k"), (a1 or {}).get("avg_at_k")
    rows.append((v0, v1))
    print(f"| {s} | {fmt(v0)} | {fmt(v1)} | {fmt(k0)} → {fmt(k1)} | {fmt(f0)} → {fmt(f1)} |")
ok = [(a, b) for a, b in rows if a is not None and b is not None]
if len(ok) >= 2:
    d = [b - a for a, b in ok]
    se = st.stdev(d) / len(d) ** 0.5
    print(f"\nGain final − warm-up: {st.mean(d):+.3f} ± {st.stdev(d):.3f} (mean ± sd over {len(d)} seeds; 2 SE {2 * se:.3f}): "
          + ("**held** (the gain exceeds 2 SE)" if st.mean(d) > 2 * se else "not distinguishable from 0 by the 2-SE rule"))
curve = {}
for s in seeds:
    try:
        for l in open(os.path.join(out, f"s{s}", "metrics.jsonl")):
            r = json.loads(l)
            if isinstance(r.get("val/avg@8"), (int, float)):
                curve.setdefault(s, {})[r["step"]] = r["val/avg@8"]
    except (OSError, ValueError):
        pass
steps_seen = sorted({k for c in curve.values() for k in c})
if steps_seen:
    print("\nValidation avg@8 during training (`val/avg@8`, every `run.test_freq` iterations):\n")
    print("| seed | " + " | ".join(map(str, steps_seen)) + " |")
    print("|---|" + "---|" * len(steps_seen))
    for s in seeds:
        print(f"| {s} | " + " | ".join(f"{curve.get(s, {}).get(x):.3f}" if x in curve.get(s, {}) else "–" for x in steps_seen) + " |")
print(f"\nSeed {seeds[0]}'s curves (`drmas plot`): [curves-s{seeds[0]}.png](curves-s{seeds[0]}.png).")
EOF
if [ -n "${DOCS:-}" ]; then mkdir -p "$DOCS"; cp "$OUT/report.md" "$OUT/curves-s$first.png" "$DOCS/"; fi
log "report: $OUT/report.md ($wall min)"
echo "$OUT/report.md"
