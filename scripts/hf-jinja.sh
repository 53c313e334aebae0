#!/bin/bash
# Installs Hugging Face's own JavaScript Jinja implementation (npm `@huggingface/jinja`, the engine
# transformers.js renders chat templates with) into .cache/hf-jinja/ (ignored by git), for the test
# that compares pkg/policy/tokenizer's chat-template renders with it byte for byte
# (TestChatTemplateHFJinja, which runs pkg/policy/tokenizer/testdata/hf_jinja_render.cjs).
# Without npm it says so and exits 0: that test then skips. Run twice, it does nothing the second time.
# Usage: scripts/hf-jinja.sh [DEST]   (default .cache/hf-jinja; the test reads DRMAS_HF_JINJA, else
# that default)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.cache/hf-jinja}
version=0.5.13

if [ -f "$dest/.version" ] && [ "$(cat "$dest/.version")" = "$version" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "hf-jinja: npm not found; the @huggingface/jinja comparison of chat templates will skip" >&2
  exit 0
fi
mkdir -p "$dest"
echo "hf-jinja: npm install @huggingface/jinja@$version" >&2
(cd "$dest" && npm install --no-save --ignore-scripts --no-audit --no-fund --loglevel=error --prefix . "@huggingface/jinja@$version" >&2)
echo "$version" > "$dest/.version"
echo "hf-jinja: installed @huggingface/jinja@$version in $dest" >&2
