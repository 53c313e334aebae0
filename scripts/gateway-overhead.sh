#!/usr/bin/env bash
# What does the gateway cost? Trains the toy math team (configs/toy-math.yaml) with its built-in
# orchestra and through the gateway with a runner making the same calls (scripts/mathrunner; or the
# Python/TypeScript example runners, same team), one after the other, ROUNDS times each, and prints
# the median iteration and rollout times, their ratio (gateway / built-in; the issue's target is
# ≤ 1.25 for the iteration) and where the gateway's rollout time goes: time/gateway/generation (some
# call generating), time/gateway/http (the endpoint serving calls, none generating: decoding,
# answering, gathering the episodes' calls) and time/gateway/runner (no call in the endpoint: the
# runner's own code and its HTTP round trips), docs/gateway.md "Overhead".
#
#   scripts/gateway-overhead.sh [--rounds 3] [--steps 30] [--runner go|python|typescript] [--out runs/gateway-overhead]
#
# Run it alone on the machine: the figures are wall-clock. With the defaults about 5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 steps=30 runner=go out=runs/gateway-overhead bin=bin/drmas port=${RUNNER_PORT:-18124}
while [ $# -gt 0 ]; do
	case $1 in
	--rounds) rounds=$2; shift 2 ;;
	--steps) steps=$2; shift 2 ;;
	--runner) runner=$2; shift 2 ;;
	--out) out=$2; shift 2 ;;
	--bin) bin=$2; shift 2 ;;
	*) echo "usage: $0 [--rounds N] [--steps N] [--runner go|python|typescript] [--out DIR] [--bin BIN]" >&2; exit 2 ;;
	esac
done
[ -x "$bin" ] || { echo "gateway-overhead: $bin not found (make build)" >&2; exit 2; }
case $runner in
go) go build -o bin/mathrunner ./scripts/mathrunner; cmd='command: bin/mathrunner' ;;
python) cmd='command: python3, args: [examples/python/runner.py]' ;;
typescript) bash scripts/openai-node.sh; cmd='command: node, args: [examples/typescript/runner.mjs], env: {NODE_PATH: .cache/openai-node/node_modules}' ;;
*) echo "gateway-overhead: --runner go, python or typescript" >&2; exit 2 ;;
esac
rm -rf "$out"
mkdir -p "$out"
common=(--config configs/toy-math.yaml --set "run.steps=$steps" --set run.max_minutes=0 --set run.test_freq=0 --set run.save_every=0
	--set run.dump_every=0 --set warmup.steps=40)
gateway="orchestra={type: gateway, runner: {url: \"http://127.0.0.1:$port\", $cmd, concurrency: 256}}"
for r in $(seq 1 "$rounds"); do
	"$bin" train "${common[@]}" --set "run.dir=$out/builtin-$r" </dev/null >"$out/builtin-$r.log" 2>&1 ||
		{ echo "gateway-overhead: built-in round $r failed, see $out/builtin-$r.log" >&2; exit 1; }
	"$bin" train "${common[@]}" --set "run.dir=$out/gateway-$r" --set "$gateway" </dev/null >"$out/gateway-$r.log" 2>&1 ||
		{ echo "gateway-overhead: gateway round $r failed, see $out/gateway-$r.log" >&2; exit 1; }
	echo "round $r done"
done
python3 - "$out" "$rounds" "$runner" <<'PY'
import json, statistics, sys
out, rounds, runner = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def med(arm, key):
    v = []
    for r in range(1, rounds + 1):
        with open(f"{out}/{arm}-{r}/metrics.jsonl") as f:
            v += [json.loads(l).get(key) for l in f]
    v = [x for x in v[1:] if x is not None]  # the first iteration warms caches up
    return statistics.median(v) if v else float("nan")
it_b, it_g = med("builtin", "time/iteration"), med("gateway", "time/iteration")
ro_b, ro_g = med("builtin", "time/rollout"), med("gateway", "time/rollout")
print(f"runner: {runner}; medians over {rounds} runs per arm, seconds")
print(f"{'':24} {'built-in':>9} {'gateway':>9} {'ratio':>6}")
print(f"{'time/iteration':24} {it_b:9.3f} {it_g:9.3f} {it_g / it_b:6.2f}")
print(f"{'time/rollout':24} {ro_b:9.3f} {ro_g:9.3f} {ro_g / ro_b:6.2f}")
print(f"{'time/update':24} {med('builtin', 'time/update'):9.3f} {med('gateway', 'time/update'):9.3f}")
for k in ("generation", "http", "runner"):
    print(f"{'time/gateway/' + k:24} {'':9} {med('gateway', 'time/gateway/' + k):9.3f}")
print(f"iteration ratio {it_g / it_b:.2f}: " + ("within" if it_g / it_b <= 1.25 else "OVER") + " the 1.25 target")
PY
