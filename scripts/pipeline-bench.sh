#!/usr/bin/env bash
# Rollouts ahead of training, measured (issue #38, docs/async.md): the toy math team with its rollouts
# on one managed drmas serve replica (one libtorch thread, pinned to core 1: rollout.cpus) and the
# trainer on one thread of core 0 (run.threads: 1 bounds its matrix products too; taskset), at rollout.max_staleness 0 (rollout, then update)
# and 1 (the next rollout generated while this iteration trains, TIS), run back to back, alternating,
# ROUNDS times. Prints each run's mean iteration time over iterations 2..STEPS (the first one also
# generates the rollouts ahead) with the split the metrics record — rollout, update, waiting for the
# rollout generated meanwhile, weight sync — and the ratio K=1 / K=0 of each round. Run it alone on the
# machine: timing with other work on the cores is meaningless.
#
#   scripts/pipeline-bench.sh [BIN]          # BIN defaults to bin/drmas
#
# Settings (environment): ROUNDS=3 STEPS=10; the batch BATCH=4 × GROUP=16 and NEW_TOKENS=48 per agent
# (rollout and update each about half of the synchronous iteration: docs/async.md); EXTRA_SETS for
# more --set flags.
set -euo pipefail
bin=${1:-bin/drmas}
rounds=${ROUNDS:-3}
steps=${STEPS:-10}
out=$(mktemp -d "${TMPDIR:-/tmp}/drmas-pipeline.XXXXXX")
sets=(--set "run.steps=$steps" --set run.save_every=0 --set run.test_freq=0 --set run.max_minutes=0 --set run.threads=1
	--set warmup.steps=10 --set algorithm.batch_size=${BATCH:-4} --set algorithm.group_size=${GROUP:-16} --set algorithm.ppo_mini_update_num=1 ${EXTRA_SETS:-}
	--set agents.0.sampling.max_new_tokens=${NEW_TOKENS:-48} --set agents.1.sampling.max_new_tokens=${NEW_TOKENS:-48}
	--set 'models.0.rollout={engine: managed, replicas: 1, threads: 1, cpus: ["1"]}' --set 'algorithm.rollout_correction={mode: tis, threshold: 2}')
pin=""; command -v taskset > /dev/null && pin="taskset -c 0" # the trainer on core 0, the replica on core 1 (rollout.cpus)
mean() { # mean of a metric over iterations 2..steps
	jq -s --arg k "$2" '[.[1:][] | .[$k] // 0] | add / length' "$1/metrics.jsonl"
}
echo "round  K  iteration_s  rollout_s  update_s  wait_s  weight_sync_s"
for r in $(seq 1 "$rounds"); do
	declare -A it
	for k in 0 1; do
		dir="$out/r$r-k$k"
		$pin "$bin" train --config configs/toy-math.yaml --force --set "run.dir=$dir" --set "rollout.max_staleness=$k" "${sets[@]}" \
			</dev/null >"$dir.log" 2>&1 || { echo "pipeline-bench: K=$k failed, see $dir.log" >&2; exit 1; }
		it[$k]=$(mean "$dir" time/iteration)
		printf '%5d  %d  %11.3f  %9.3f  %8.3f  %6.3f  %13.3f\n' "$r" "$k" "${it[$k]}" "$(mean "$dir" time/rollout)" \
			"$(mean "$dir" time/update)" "$(mean "$dir" time/rollout_wait)" "$(mean "$dir" time/weight_sync)"
	done
	echo "round $r: K=1 / K=0 = $(jq -n "${it[1]} / ${it[0]}")"
done
echo "runs kept in $out"
