#!/usr/bin/env bash
# Rollouts ahead of training, measured: the toy math team with its rollouts on one managed drmas serve
# replica (one libtorch thread) and the trainer on one thread, at rollout.max_staleness 0 (rollout, then
# update) and 1 (the next rollout generated while this iteration trains), run back to back, alternating,
# (OMP_NUM_THREADS=1: the trainer's matrix products on one thread too, as the replica's threads: 1 sets)
# ROUNDS times. Prints each run's mean iteration time over iterations 2..STEPS (the first one also
# generates the rollouts ahead) with the split the metrics record — rollout, update, waiting for the
# rollout generated meanwhile, weight sync — and the ratio K=1 / K=0 of each round. Run it alone on the
# machine: timing with other work on the cores is meaningless.
#
#   scripts/pipeline-bench.sh [BIN]          # BIN defaults to bin/drmas; ROUNDS=3 STEPS=8 by default
set -euo pipefail
bin=${1:-bin/drmas}
rounds=${ROUNDS:-3}
steps=${STEPS:-8}
out=$(mktemp -d "${TMPDIR:-/tmp}/drmas-pipeline.XXXXXX")
sets=(--set "run.steps=$steps" --set run.save_every=0 --set run.test_freq=0 --set run.max_minutes=0 --set run.threads=1
	--set warmup.steps=10 --set algorithm.batch_size=${BATCH:-16} --set algorithm.group_size=${GROUP:-16} --set algorithm.ppo_mini_update_num=1 ${EXTRA_SETS:-}
	--set agents.0.sampling.max_new_tokens=${NEW_TOKENS:-24} --set agents.1.sampling.max_new_tokens=${NEW_TOKENS:-24}
	--set 'models.0.rollout={engine: managed, replicas: 1, threads: 1}' --set 'algorithm.rollout_correction={mode: tis, threshold: 2}')
mean() { # mean of a metric over iterations 2..steps
	jq -s --arg k "$2" '[.[1:][] | .[$k] // 0] | add / length' "$1/metrics.jsonl"
}
echo "round  K  iteration_s  rollout_s  update_s  wait_s  weight_sync_s"
for r in $(seq 1 "$rounds"); do
	declare -A it
	for k in 0 1; do
		dir="$out/r$r-k$k"
		OMP_NUM_THREADS=1 "$bin" train --config configs/toy-math.yaml --force --set "run.dir=$dir" --set "rollout.max_staleness=$k" "${sets[@]}" \
			</dev/null >"$dir.log" 2>&1 || { echo "pipeline-bench: K=$k failed, see $dir.log" >&2; exit 1; }
		it[$k]=$(mean "$dir" time/iteration)
		printf '%5d  %d  %11.3f  %9.3f  %8.3f  %6.3f  %13.3f\n' "$r" "$k" "${it[$k]}" "$(mean "$dir" time/rollout)" \
			"$(mean "$dir" time/update)" "$(mean "$dir" time/rollout_wait)" "$(mean "$dir" time/weight_sync)"
	done
	echo "round $r: K=1 / K=0 = $(jq -n "${it[1]} / ${it[0]}")"
done
echo "runs kept in $out"
