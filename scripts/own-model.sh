#!/bin/bash
# Runs the README's "Your own model and data" walkthrough unchanged on a toy folder: its team.yaml
# and its commands, read from README.md, in a temporary folder holding a toy Hugging Face model
# folder (my-model/: the toy tokenizer and a one-step checkpoint of configs/toy-math.yaml's model)
# and a small GSM8K-shaped data set (data/train.jsonl, data/test.jsonl). A few iterations: the
# config's keys are lowered through DRMAS_* variables, which the walkthrough's commands read as
# every drmas command does. Checks that the dry run measured the prompts, a checkpoint was written
# and eval reported avg@4. make test runs it (about 15 s on 2 cores).
# Usage: scripts/own-model.sh   (after make build: uses bin/drmas)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
[ -x bin/drmas ] || { echo "own-model: bin/drmas not built (make build)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The toy model folder: a one-step run's checkpoint is a Hugging Face folder.
bin/drmas train --config configs/toy-math.yaml --set run.dir="$tmp/init" --set run.steps=1 --set warmup.steps=0 \
  --set run.save_every=1 --set run.test_freq=0 --set run.max_minutes=0 --set run.threads=1 >"$tmp/init.log" 2>&1 ||
  { cat "$tmp/init.log" >&2; exit 1; }
mkdir -p "$tmp/walk/my-model" "$tmp/walk/data"
for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
  cp "$tmp/init/step-1/small/$f" "$tmp/walk/my-model/"
done
# GSM8K-shaped records: a question and an answer ending in "#### N".
for split in train:32 test:8; do
  name=${split%:*} n=${split#*:}
  for ((i = 0; i < n; i++)); do
    a=$(((i * 7 + ${#name}) % 10)) b=$(((i * 3 + 1) % 10))
    printf '{"question": "%d + %d", "answer": "%d + %d = %d\\n#### %d"}\n' $a $b $a $b $((a + b)) $((a + b))
  done >"$tmp/walk/data/$name.jsonl"
done

# The walkthrough's blocks: the yaml fence and the sh fence after the README's marker.
awk '/scripts\/own-model.sh/ {on = 1; next} on && /^```yaml$/ {inb = 1; next} inb && /^```$/ {exit} inb' README.md >"$tmp/walk/team.yaml"
awk '/scripts\/own-model.sh/ {on = 1; next} on && /^```sh$/ {inb = 1; next} inb && /^```$/ {exit} inb' README.md >"$tmp/walk/walkthrough.sh"
[ -s "$tmp/walk/team.yaml" ] && [ -s "$tmp/walk/walkthrough.sh" ] || { echo "own-model: the README's walkthrough blocks were not found" >&2; exit 1; }
ln -s "$repo/bin" "$tmp/walk/bin"

cd "$tmp/walk"
export DRMAS_RUN_STEPS=2 DRMAS_RUN_SAVE_EVERY=1 DRMAS_RUN_TEST_FREQ=2 DRMAS_RUN_VAL_K=2 DRMAS_RUN_THREADS=1 \
  DRMAS_ALGORITHM_BATCH_SIZE=2 DRMAS_ALGORITHM_GROUP_SIZE=2 \
  DRMAS_AGENTS_0_SAMPLING_MAX_NEW_TOKENS=16 DRMAS_AGENTS_1_SAMPLING_MAX_NEW_TOKENS=8
bash -euo pipefail walkthrough.sh >out.log 2>&1 || { cat out.log >&2; echo "own-model: the walkthrough failed" >&2; exit 1; }
fail() { cat out.log >&2; echo "own-model: $1" >&2; exit 1; }
grep -q '^# prompts measured on the data' out.log || fail "the dry run printed no measured prompts"
grep -q '^#   solver (m): longest first-turn prompt [0-9]' out.log || fail "no measured prompt for the solver"
[ -f runs/my-team/step-2/manifest.json ] || fail "no checkpoint runs/my-team/step-2"
grep -qE '^ +average +8 ' out.log || fail "eval reported no average over the 8 test questions"
echo "own-model: the README walkthrough ran (dry run, 2 iterations, eval) on a toy folder"
