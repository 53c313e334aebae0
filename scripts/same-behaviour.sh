#!/usr/bin/env bash
# Proof that a refactoring left training unchanged: runs every toy config (configs/toy*.yaml) for a few
# iterations with their fixed seeds, then compares two such sets of runs byte for byte.
#
#   scripts/same-behaviour.sh run  OUT [BIN]   # BIN defaults to bin/drmas; OUT must not exist
#   scripts/same-behaviour.sh diff A B          # exit 1 on any difference, naming it
#   NEW_KEYS='^(ppo_kl/agent/|…)' scripts/same-behaviour.sh diff A B   # metric keys B's binary added,
#                                                                    # left out of both sides
#
# Compared: metrics.jsonl without its timing and process figures (time/*, perf/*), every checkpoint's
# weights and optimizer state (*.safetensors: the tensors' names, shapes, dtypes and bytes, not the
# header's free-form __metadata__; optim.json), warmup.json and trainer.json without wall-clock
# fields (seconds, saved). toy-math also runs data-parallel (--nproc 2), sharded (dist.shard optimizer and
# gradients), with its optimizer offloaded, and one step off (rollout.max_staleness 1) on a managed replica in
# float64, so every parallel strategy, the offload path and the rollout pipeline are covered.
set -euo pipefail

mode=${1:?usage: same-behaviour.sh run OUT [BIN] | diff A B}
case $mode in
run)
	out=${2:?OUT}
	bin=${3:-bin/drmas}
	[ ! -e "$out" ] || { echo "same-behaviour: $out exists; pick a new folder" >&2; exit 2; }
	mkdir -p "$out"
	short=(--set run.steps=3 --set run.save_every=3 --set warmup.steps=3 --set run.test_freq=0 --set run.max_minutes=0)
	for f in configs/toy*.yaml; do
		name=$(basename "$f" .yaml)
		"$bin" train --config "$f" --force --set "run.dir=$out/$name" "${short[@]}" </dev/null >"$out/$name.log" 2>&1 ||
			{ echo "same-behaviour: $f failed, see $out/$name.log" >&2; exit 1; }
		echo "ran $f"
	done
	"$bin" train --config configs/toy-math.yaml --nproc 2 --force --set "run.dir=$out/toy-math-nproc2" "${short[@]}" \
		</dev/null >"$out/toy-math-nproc2.log" 2>&1 || { echo "same-behaviour: --nproc 2 failed, see $out/toy-math-nproc2.log" >&2; exit 1; }
	echo "ran configs/toy-math.yaml --nproc 2"
	# The parallel strategies and offload: ZeRO-1 and ZeRO-2 on two ranks, and the optimizer on the host.
	extra=("shard-optimizer --nproc 2 --set dist.shard=optimizer" "shard-gradients --nproc 2 --set dist.shard=gradients"
		"offload --set models.0.optim.offload=cpu" "shard-offload --nproc 2 --set dist.shard=optimizer --set models.0.optim.offload=cpu"
		"pipeline-managed --set rollout.max_staleness=1 --set models.0.rollout.engine=managed --set algorithm.rollout_correction.mode=tis --set models.0.dtype=float64")
	for e in "${extra[@]}"; do
		read -r name args <<<"$e"
		# shellcheck disable=SC2086
		"$bin" train --config configs/toy-math.yaml $args --force --set "run.dir=$out/toy-math-$name" "${short[@]}" \
			</dev/null >"$out/toy-math-$name.log" 2>&1 || { echo "same-behaviour: $name failed, see $out/toy-math-$name.log" >&2; exit 1; }
		echo "ran configs/toy-math.yaml $args"
	done
	;;
diff)
	# tensors prints a safetensors file's tensor table (without __metadata__) and a digest of its data.
	tensors() {
		python3 -c 'import sys, json, struct, hashlib
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
print(json.dumps(h, sort_keys=True)); print(hashlib.sha256(b[8 + n:]).hexdigest())' "$1"
	}
	a=${2:?A}
	b=${3:?B}
	bad=0
	new_keys=${NEW_KEYS:-^\$}
	strip_metrics='with_entries(select((.key|startswith("time/")|not) and (.key|startswith("perf/")|not) and (.key|test($new)|not)))'
	strip_json='del(.seconds, .saved)'
	for runa in "$a"/*/; do
		run=$(basename "$runa")
		runb="$b/$run"
		[ -d "$runb" ] || { echo "only in $a: $run"; bad=1; continue; }
		if ! cmp -s <(jq -cS --arg new "$new_keys" "$strip_metrics" "$runa/metrics.jsonl") <(jq -cS --arg new "$new_keys" "$strip_metrics" "$runb/metrics.jsonl"); then
			echo "differ: $run/metrics.jsonl"; bad=1
		fi
		files=$(cd "$runa" && find . -name '*.safetensors' -o -name optim.json -o -name warmup.json -o -name trainer.json | sort)
		[ -n "$files" ] || { echo "no checkpoint files in $runa"; bad=1; }
		for f in $files; do
			if [ ! -f "$runb/$f" ]; then echo "only in $a: $run/$f"; bad=1; continue; fi
			case $f in
			*.safetensors) cmp -s <(tensors "$runa/$f") <(tensors "$runb/$f") || { echo "differ: $run/$f"; bad=1; } ;;
			*) cmp -s <(jq -S "$strip_json" "$runa/$f") <(jq -S "$strip_json" "$runb/$f") || { echo "differ: $run/$f"; bad=1; } ;;
			esac
		done
		echo "compared $run: metrics.jsonl and $(echo "$files" | wc -l) checkpoint files"
	done
	[ $bad = 0 ] && echo "same-behaviour: identical" || { echo "same-behaviour: DIFFERENT"; exit 1; }
	;;
*) echo "usage: same-behaviour.sh run OUT [BIN] | diff A B" >&2; exit 2 ;;
esac
