#!/usr/bin/env bash
# Does the toy math team learn the same through the gateway as built in? Trains configs/toy-math.yaml
# with its built-in math orchestra and as a gateway runner making the same calls (scripts/mathrunner,
# pkg/gateway/mathrunner), seeds 1..N each, a fixed number of iterations (run.max_minutes off, so both
# train as many), validating avg@8 on 64 questions every 60 iterations; then prints each seed's final
# val/avg@8, the two means with their standard errors, and whether they are within 2 SE of each other
# (docs/gateway.md "Equivalence"). Also says how many seeds' runs were identical, metric for metric.
#
#   scripts/gateway-equivalence.sh [--seeds 5] [--steps 360] [--out runs/gateway-equivalence] [--bin bin/drmas]
#
# Alone on the 2-core machine the full sweep (5 seeds × 2 × 360 iterations) takes about 30 minutes;
# --seeds 1 --steps 60 about 2. Runs one training at a time. A seed whose two runs exist is not rerun.
set -euo pipefail
cd "$(dirname "$0")/.."
seeds=5 steps=360 out=runs/gateway-equivalence bin=bin/drmas port=${RUNNER_PORT:-18124}
while [ $# -gt 0 ]; do
	case $1 in
	--seeds) seeds=$2; shift 2 ;;
	--steps) steps=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--bin) bin=$2; shift 2 ;;
	*) echo "usage: $0 [--seeds N] [--steps N] [--out DIR] [--bin BIN]" >&2; exit 2 ;;
	esac
done
[ -x "$bin" ] || { echo "gateway-equivalence: $bin not found (make build)" >&2; exit 2; }
(( steps % 60 == 0 )) || { echo "gateway-equivalence: --steps must be a multiple of 60 (the validation interval)" >&2; exit 2; }
mkdir -p "$out" bin
go build -o bin/mathrunner ./scripts/mathrunner
common=(--config configs/toy-math.yaml --set "run.steps=$steps" --set run.max_minutes=0 --set run.test_freq=60
	--set run.val_k=8 --set run.val_limit=64 --set run.save_every=0 --set run.dump_every=0)
gateway="orchestra={type: gateway, runner: {url: \"http://127.0.0.1:$port\", command: bin/mathrunner, concurrency: 256}}"
for seed in $(seq 1 "$seeds"); do
	for arm in builtin gateway; do
		dir=$out/$arm-seed$seed
		if [ -f "$dir/metrics.jsonl" ] && [ "$(wc -l <"$dir/metrics.jsonl")" -ge "$steps" ]; then
			echo "have $dir"; continue
		fi
		extra=()
		[ $arm = gateway ] && extra=(--set "$gateway")
		start=$(date +%s)
		"$bin" train "${common[@]}" --set "run.seed=$seed" --set "run.dir=$dir" --force "${extra[@]}" </dev/null >"$dir.log" 2>&1 ||
			{ echo "gateway-equivalence: $arm seed $seed failed, see $dir.log" >&2; exit 1; }
		echo "ran $arm seed $seed ($(( $(date +%s) - start )) s)"
	done
done
python3 - "$out" "$seeds" <<'PY'
import json, math, sys
out, seeds = sys.argv[1], int(sys.argv[2])
def rows(arm, seed):
    with open(f"{out}/{arm}-seed{seed}/metrics.jsonl") as f:
        return [json.loads(l) for l in f]
def final(rs):
    vals = [r["val/avg@8"] for r in rs if r.get("val/avg@8") is not None]
    return vals[-1]
def same(a, b):
    strip = lambda r: {k: v for k, v in r.items() if not k.startswith(("time/", "perf/", "rollout/gateway/"))}
    return len(a) == len(b) and all(strip(x) == strip(y) for x, y in zip(a, b))
b, g, identical = [], [], 0
print(f"{'seed':>4}  {'built-in avg@8':>14}  {'gateway avg@8':>13}  identical run")
for s in range(1, seeds + 1):
    rb, rg = rows("builtin", s), rows("gateway", s)
    b.append(final(rb)); g.append(final(rg))
    identical += same(rb, rg)
    print(f"{s:>4}  {b[-1]:>14.4f}  {g[-1]:>13.4f}  {'yes' if same(rb, rg) else 'no'}")
def mse(x):
    m = sum(x) / len(x)
    sd = math.sqrt(sum((v - m) ** 2 for v in x) / (len(x) - 1)) if len(x) > 1 else float("nan")
    return m, sd / math.sqrt(len(x))
(mb, sb), (mg, sg) = mse(b), mse(g)
se = math.hypot(sb, sg)
print(f"mean  {mb:.4f} ± {sb:.4f}  {mg:.4f} ± {sg:.4f}  (± one standard error over {seeds} seeds)")
print(f"difference {mg - mb:+.4f}; 2 SE of the difference {2 * se:.4f}: " +
      ("within" if abs(mg - mb) <= 2 * se or mg == mb else "NOT within") + f"; identical runs {identical}/{seeds}")
PY
