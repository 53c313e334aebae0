#!/bin/bash
# One prepared check of drmas on a GPU machine (an H200 with PyTorch installed, no internet, no Go).
#
#   scripts/device-check.sh pack        # here, with Go and the module cache: writes .device/go-toolchain.tar.xz
#                                       # (this machine's Go, packed by shared/device/pack-go.sh, or
#                                       # PACK_GO=path/to/pack-go.sh), .device/go-test-tools.tar.xz (go vet and
#                                       # test2json, which go test needs) and .device/vendor.tar.xz (go mod vendor)
#   scripts/device-check.sh             # on the GPU machine, from the repository root, with .device/ carried
#   DEVICE=cpu scripts/device-check.sh  # dry run on a CPU machine: every step, on the CPU
#
# Steps: unpack Go and the vendored modules; find libtorch (LIBTORCH, else the PyTorch install's torch/);
# scripts/torchsetup builds gotch against it (ops that libtorch lacks become stubs); build bin/drmas; run
# the device tests of pkg/policy (golden logits in float32 and bfloat16, generation, AdamW steps, memory
# over 200 iterations); create a random ~0.5B model (Qwen2.5-0.5B's config.json) and benchmark a training
# step and generation in bfloat16 (MFU against the H200's dense bf16 peak); one training step of a random
# Qwen3-4B at 4 × (8,192 + 4,096) tokens with checkpointing (peak device memory against the memory plan,
# tokens/s, MFU); the NCCL data-parallel check
# when the build has one; then one summary (also written to $OUT/device-check.txt when OUT is set).
# Sized for 8 minutes of GPU time; each step has its own time limit. Exit status: 0 when every step
# that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dev=${DEVICE:-cuda}
peak_tflops=${PEAK_TFLOPS:-989} # H200 SXM dense bf16 (NVIDIA's datasheet: 1,979 with 2:4 sparsity)
mkdir -p .device

if [ "${1:-}" = pack ]; then
	set -e
	pack=${PACK_GO:-$root/../shared/device/pack-go.sh}
	[ -f "$pack" ] || { echo "pack-go.sh not found at $pack: set PACK_GO" >&2; exit 1; }
	bash "$pack" .device
	# go test needs the vet tool (also with -vet=off), which pack-go.sh leaves out: a small archive beside it.
	goroot=$(go env GOROOT)
	tar -C "$(dirname "$goroot")" -cf - $(cd "$(dirname "$goroot")" && ls go/pkg/tool/*/vet go/pkg/tool/*/test2json) | xz -T0 -6 >.device/go-test-tools.tar.xz
	rm -rf .device/vendor-tmp
	# -e: packages that scripts/torchsetup writes into gotch (drmasc10d) exist only after set-up; they are
	# added to vendor/modules.txt on the device, once torchsetup has made them.
	GOWORK=off GOFLAGS=-mod=mod go mod vendor -e -o .device/vendor-tmp/vendor 2>&1 | grep -v '^\s' | grep -v drmasc10d || true
	tar -C .device/vendor-tmp -cf - vendor | xz -T0 -6 >.device/vendor.tar.xz
	rm -rf .device/vendor-tmp
	ls -l .device/*.tar.xz
	echo "carry .device/ (go-toolchain, go-test-tools and vendor archives) to the device; run scripts/device-check.sh there"
	exit 0
fi

summary=()
failed=0
note() { summary+=("$(printf '%-10s %-5s %s' "$1" "$2" "$3")"); }
log=.device/logs
mkdir -p "$log"
# step NAME LIMIT_S CMD...: runs CMD with a time limit, its output in .device/logs/NAME.log.
step() {
	local name=$1 limit=$2
	shift 2
	local t0=$SECONDS
	echo "=== $name (limit ${limit}s): $*" >&2
	timeout "$limit" "$@" >"$log/$name.log" 2>&1
	local rc=$?
	tail -n 25 "$log/$name.log" >&2
	step_s=$((SECONDS - t0))
	if [ $rc -ne 0 ]; then
		failed=1
		note "$name" FAIL "rc=$rc after ${step_s}s (log: $log/$name.log)"
	fi
	return $rc
}
finish() {
	{
		echo
		echo "=== drmas device check: DEVICE=$dev, $(date -u +%Y-%m-%dT%H:%MZ), ${SECONDS}s"
		printf '%s\n' "${summary[@]}"
	} | tee .device/summary.txt
	rm -rf vendor # made from .device/vendor.tar.xz each run; left behind it would change local builds
	if [ -n "${OUT:-}" ]; then
		mkdir -p "$OUT" && cp .device/summary.txt "$OUT/device-check.txt" && cp -r "$log" "$OUT/logs"
	fi
	exit $failed
}

# --- Go and the vendored modules -------------------------------------------------------------------
if [ -f .device/go-toolchain.tar.xz ]; then # the packed Go, also in a dry run, so that it is what gets tried
	[ -x .device/go/bin/go ] || tar -C .device -xJf .device/go-toolchain.tar.xz
	[ -f .device/go-test-tools.tar.xz ] && tar -C .device -xJf .device/go-test-tools.tar.xz
	export GOROOT=$root/.device/go PATH=$root/.device/go/bin:$PATH
fi
if ! command -v go >/dev/null; then
	note setup FAIL "no Go: run 'scripts/device-check.sh pack' where Go is and carry .device/"
	failed=1
	finish
fi
if [ ! -f .device/vendor.tar.xz ]; then
	note setup FAIL "no .device/vendor.tar.xz: run 'scripts/device-check.sh pack' and carry .device/"
	failed=1
	finish
fi
rm -rf vendor && tar -xJf .device/vendor.tar.xz # a pristine copy every run: torchsetup patches gotch below
export GOFLAGS=-mod=vendor GOWORK=off GOTOOLCHAIN=local GOPROXY=off GOCACHE=${GOCACHE:-$root/.device/gocache}
note setup ok "$(go version | cut -d' ' -f3-4), vendored modules"

# --- libtorch ----------------------------------------------------------------------------------------
if [ -z "${LIBTORCH:-}" ] && [ "$dev" != cpu ]; then
	LIBTORCH=$(python3 -c 'import torch, os; print(os.path.dirname(torch.__file__))' 2>/dev/null)
fi
if [ -n "${LIBTORCH:-}" ]; then
	pyinfo=$(python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")' 2>/dev/null)
	note libtorch ok "${LIBTORCH} (${pyinfo:-no python torch})"
else
	note libtorch ok "the system's (Debian libtorch-dev)"
fi
export LIBTORCH=${LIBTORCH:-}
for tool in gcc g++; do
	command -v $tool >/dev/null || {
		note setup FAIL "no $tool: cgo and scripts/torchsetup need a C/C++ compiler"
		failed=1
		finish
	}
done

# --- gotch against this libtorch, then drmas ---------------------------------------------------------
[ -f go.work ] && cp go.work .device/go.work.saved # torchsetup writes go.work; GOWORK=off ignores it here
if step torchsetup 420 env DRMAS_GOTCH_SRC=vendor/github.com/sugarme/gotch go run ./scripts/torchsetup -out .device/torch; then
	stubs=$(wc -l <.device/torch/missing-ops.txt 2>/dev/null || echo 0)
	note torchsetup ok "${step_s}s; $stubs wrapper functions stubbed (.device/torch/missing-ops.txt)"
	rm -rf vendor/github.com/sugarme/gotch && cp -r .device/torch/gotch vendor/github.com/sugarme/gotch
	# Packages torchsetup added to gotch (the c10d shim) join the vendored module's package list.
	for d in vendor/github.com/sugarme/gotch/*/; do
		pkg=github.com/sugarme/gotch/$(basename "$d")
		ls "$d"*.go >/dev/null 2>&1 && ! grep -qx "$pkg" vendor/modules.txt &&
			sed -i "s#^github.com/sugarme/gotch\$#&\n$pkg#" vendor/modules.txt
	done
fi
if [ -f .device/go.work.saved ]; then mv .device/go.work.saved go.work; else rm -f go.work; fi
[ $failed = 0 ] || finish
if step build 600 go build -o bin/drmas ./cmd/drmas; then
	note build ok "${step_s}s; $(bin/drmas version 2>/dev/null | tr '\n' ';')"
else
	finish
fi

# --- the device tests --------------------------------------------------------------------------------
iters=200
[ "$dev" = cpu ] && iters=${DRMAS_DEVICE_ITERS:-60}
if step tests 300 env DRMAS_TEST_DEVICE=$dev DRMAS_DEVICE_ITERS=$iters go test ./pkg/policy -run 'TestDevice' -count=1 -v; then
	note tests ok "${step_s}s: golden logits f32 ≤ 1e-3, bf16 ≤ 0.1·max|ref|; greedy = CPU; AdamW lowers loss; memory flat over $iters"
fi
grep -E 'max \|Δ\||losses on|resident' "$log/tests.log" | sed 's/^ *device_test.go:[0-9]*: /           /' | while read -r l; do echo "$l"; done >.device/test-figures.txt
while read -r l; do summary+=("           $l"); done <.device/test-figures.txt

# --- a ~0.5B random model in bfloat16: training step and generation -----------------------------------
batch=16 plen=256 rlen=256 steps=3
[ "$dev" = cpu ] && batch=2 plen=16 rlen=8 steps=1
rm -rf .device/qwen2.5-0.5b
if step init 300 bin/drmas roundtrip --config configs/models/qwen2.5-0.5b.json --out .device/qwen2.5-0.5b \
	--dtype bfloat16 --batch 1 --prompt-len 4 --response-len 2 --json; then
	note init ok "${step_s}s: random Qwen2.5-0.5B (config as published), saved, loaded bit-exact on the CPU"
	if step bench 300 bin/drmas bench --model .device/qwen2.5-0.5b --device "$dev" --dtype bfloat16 \
		--batch $batch --prompt-len $plen --response-len $rlen --steps $steps --json; then
		line=$(python3 - "$log/bench.log" "$peak_tflops" "$dev" <<-'EOF'
			import sys
			sys.path.insert(0, "scripts")
			from benchlog import bench_result
			r = bench_result(sys.argv[1])
			peak = float(sys.argv[2]) * 1e3
			mfu = "MFU train %.1f%%, generate %.2f%% of %s TFLOP/s" % (100 * r["train_gflops"] / peak, 100 * r["gen_gflops"] / peak, sys.argv[2]) \
			    if sys.argv[3] != "cpu" else "%.0f%% of the CPU's matmul GFLOP/s" % (100 * r["train_gflops"] / r["matmul_gflops"])
			print("%d params bf16, batch %d×(%d+%d): train %.0f ms/step, %.0f tok/s, %.0f GFLOP/s; generate %.0f tok/s, %.1f ms/step; %s" % (
			    r["params"], r["batch"], r["prompt_len"], r["response_len"], r["train_ms_per_step"], r["train_tokens_per_s"],
			    r["train_gflops"], r["gen_tokens_per_s"], r["decode_ms_per_step"], mfu))
		EOF
		)
		note bench ok "$line"
	fi
fi

# --- a Qwen3-4B-shaped random model in bfloat16: one training step at the paper's math lengths ------
# 4 × (8,192 + 4,096) tokens with gradient checkpointing (configs/math-qwen.yaml's micro-batch is 2; the
# paper's is 4), the trainer's AdamW with float32 master weights: peak device memory (nvidia-smi, every
# 100 ms) against the memory plan's peak for the same step, tokens/s and MFU (model FLOPs: 6·P per token
# plus causal attention, 6·L·T²·H·D per sequence, against the bf16 peak).
largs=(--config configs/models/qwen3-4b/config.json --batch 4 --prompt-len 8192 --response-len 4096)
[ "$dev" = cpu ] && largs=(--preset long --batch 1 --prompt-len 256 --response-len 768)
smi=""
if [ "$dev" != cpu ] && command -v nvidia-smi >/dev/null; then
	nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 100 >.device/long-smi.txt 2>/dev/null &
	smi=$!
fi
if step long 420 bin/drmas bench "${largs[@]}" --device "$dev" --dtype bfloat16 --steps 1 --no-generate --checkpointing --json; then
	[ -n "$smi" ] && kill "$smi" 2>/dev/null
	line=$(python3 - "$log/long.log" "$peak_tflops" "$dev" .device/long-smi.txt <<-'EOF'
		import json, os, sys
		sys.path.insert(0, "scripts")
		from benchlog import bench_result
		r = bench_result(sys.argv[1])
		B, T = r["batch"], r["prompt_len"] + r["response_len"]
		sec = r["train_ms_per_step"] / 1000
		c = json.load(open("configs/models/qwen3-4b/config.json")) if sys.argv[3] != "cpu" else None
		if c:
		    L, H, D = c["num_hidden_layers"], c["num_attention_heads"], c["head_dim"]
		    P = r["params"] - c["vocab_size"] * c["hidden_size"]  # the embedding lookup is no product
		    flops = 6 * P * B * T + 6 * L * B * T * T * H * D
		    mfu = "MFU %.1f%% of %s TFLOP/s" % (100 * flops / sec / (float(sys.argv[2]) * 1e12), sys.argv[2])
		else:
		    mfu = "CPU"
		mem = "peak RSS %.0f MiB" % r["train_peak_rss_mb"]
		if os.path.exists(sys.argv[4]) and os.path.getsize(sys.argv[4]) > 0:
		    used = [float(x) for x in open(sys.argv[4]).read().split() if x.strip()]
		    mem = "peak device memory %.0f MiB (nvidia-smi, whole GPU)" % max(used)
		print("%.2fB params bf16, %d×(%d+%d) tokens, checkpointing, %s attention: %.1f s/step, %.0f tok/s, %s; %s, plan %.0f MiB" % (
		    r["params"] / 1e9, B, r["prompt_len"], r["response_len"], r.get("attention", "?"), sec, B * T / sec, mfu, mem, r["plan_peak_mb"]))
	EOF
	)
	note long ok "$line"
fi
[ -n "$smi" ] && kill "$smi" 2>/dev/null

# === dist: NCCL data-parallel check ====================================================================
# pkg/dist's NCCL test (rendezvous, all-reduce, broadcast, all-gather, barrier; world size 1, and 2 ranks
# when two GPUs are visible), then a 2-iteration toy-math training as one rank of a world-size-1 group on
# NCCL, the same under PyTorch's torchrun, and with --nproc 2 when two GPUs exist.
ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
if ! bin/drmas train --help 2>/dev/null | grep -q -- '--nproc'; then
	note dist SKIP "no data-parallel training in this build"
elif [ "$dev" = cpu ]; then
	note dist SKIP "DEVICE=cpu: NCCL needs a GPU (the Gloo path is covered by go test ./pkg/dist ./cmd/drmas)"
elif ! grep -q DRMAS_WITH_NCCL .device/torch/gotch/libtch/drmas_c10d_config.h 2>/dev/null; then
	failed=1
	note dist FAIL "the c10d shim was built without NCCL: see $log/torchsetup.log"
elif step dist-nccl 120 env DRMAS_TEST_DEVICE=cuda go test ./pkg/dist -run 'TestDeviceNCCL' -count=1 -v; then
	note dist-nccl ok "${step_s}s: $(grep -o 'NCCL collectives passed with [0-9] rank(s)' "$log/dist-nccl.log")"
	targs=(train --config configs/toy-math.yaml --device cuda --set run.steps=2 --set warmup.steps=2
		--set run.test_freq=0 --set run.max_minutes=0 --set dist.backend=nccl --force)
	if step dist-train1 120 env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 \
		bin/drmas "${targs[@]}" --set run.dir=.device/dist-1; then
		note dist-train1 ok "${step_s}s: world size 1 on NCCL, $(wc -l <.device/dist-1/metrics.jsonl) iterations logged"
	fi
	# PyTorch's own launcher: its agent serves the store and the ranks join it (TORCHELASTIC_USE_AGENT_STORE).
	if step dist-torchrun 120 python3 -m torch.distributed.run --standalone --nproc-per-node "$((ngpu >= 2 ? 2 : 1))" \
		--no-python bin/drmas "${targs[@]}" --set run.dir=.device/dist-tr; then
		note dist-torchrun ok "${step_s}s: torchrun --standalone, $((ngpu >= 2 ? 2 : 1)) rank(s) on NCCL, $(wc -l <.device/dist-tr/metrics.jsonl) iterations logged"
	fi
	if [ "$ngpu" -ge 2 ] && step dist-train2 180 bin/drmas "${targs[@]}" --set run.dir=.device/dist-2 --nproc 2; then
		comm=$(python3 -c 'import json,sys; m=[json.loads(l) for l in open(sys.argv[1])]; print("%.3f" % m[-1].get("time/comm", float("nan")))' .device/dist-2/metrics.jsonl)
		note dist-train2 ok "${step_s}s: 2 ranks on NCCL, time/comm ${comm}s in the last iteration"
	elif [ "$ngpu" -lt 2 ]; then
		note dist-train2 SKIP "one GPU: 2 NCCL ranks need two"
	fi
	# dist.shard: parameters (pkg/train/fsdp.go) on NCCL: 2 ranks whose weights are sharded unit by unit
	# train as 2 ranks with whole weights do (bit for bit on Gloo: cmd/drmas TestParameterShardingFeatures);
	# here metrics within 1e-5 and weights within 1e-5, and each rank's state half the whole.
	if [ "$ngpu" -ge 2 ]; then
		pargs=("${targs[@]}" --set run.steps=3 --set warmup.steps=4 --set algorithm.kl.coef=0 --set algorithm.entropy_coef=0.01
			--set run.save_every=3 --nproc 2)
		if step dist-shard-none 180 bin/drmas "${pargs[@]}" --set run.dir=.device/shard-none &&
			step dist-shard-params 240 bin/drmas "${pargs[@]}" --set dist.shard=parameters --set run.dir=.device/shard-params; then
			if verdict=$(python3 - .device/shard-none .device/shard-params <<-'EOF'
				import glob, json, os, struct, sys
				a, b = sys.argv[1], sys.argv[2]
				rows = lambda d: [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))]
				worst = 0.0
				for x, y in zip(rows(a), rows(b)):
				    for k, v in x.items():
				        if k.startswith(("time/", "perf/")) or v is None or y.get(k) is None:
				            continue
				        worst = max(worst, abs(v - y[k]) / max(1.0, abs(v)))
				def tensors(path):
				    raw = open(path, "rb").read()
				    n = struct.unpack("<Q", raw[:8])[0]
				    head, data = json.loads(raw[8:8 + n]), raw[8 + n:]
				    return {k: struct.unpack("<%df" % ((e[1] - e[0]) // 4), data[e[0]:e[1]])
				            for k, e in ((k, v["data_offsets"]) for k, v in head.items() if k != "__metadata__" and v["dtype"] == "F32")}
				wd = 0.0
				for f in glob.glob(os.path.join(a, "step-3", "*", "model.safetensors")):
				    ta, tb = tensors(f), tensors(f.replace(a, b, 1))
				    wd = max([wd] + [max(abs(p - q) for p, q in zip(ta[k], tb[k])) for k in ta])
				state = lambda d: sum(v for k, v in rows(d)[-1].items() if k.startswith(("perf/weights_mb/", "perf/grads_mb/", "perf/optim_mb/")))
				ratio = state(b) / max(state(a), 1e-9)
				print("metrics within %.2g, weights within %.2g, state per rank %.2f× the whole" % (worst, wd, ratio))
				sys.exit(0 if worst <= 1e-5 and wd <= 1e-5 and ratio <= 0.6 else 1)
				EOF
			); then
				note shard-nccl ok "2 ranks, dist.shard parameters vs none on NCCL: $verdict"
			else
				failed=1
				note shard-nccl FAIL "2 ranks, dist.shard parameters vs none on NCCL: $verdict"
			fi
		fi
	else
		note shard-nccl SKIP "one GPU: parameter sharding on NCCL needs two ranks, so two GPUs (Gloo: go test ./cmd/drmas -run TestParameterSharding)"
	fi
fi
# === end dist ==========================================================================================

finish
