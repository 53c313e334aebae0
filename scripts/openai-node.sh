#!/bin/bash
# Installs the official OpenAI Node SDK (npm `openai`, 6.x) into .cache/openai-node/ (ignored by git),
# for the test that drives `drmas serve` with a real client (cmd/drmas: TestServeOpenAINodeSDK, which
# runs scripts/openai-sdk-check.cjs) and for the gateway's TypeScript example (examples/typescript,
# which finds it through NODE_PATH=.cache/openai-node/node_modules) and its test
# (TestGatewayOpenAINodeSDK). Without npm it says so and exits 0: those tests then skip.
# Run twice, it does nothing the second time.
# Usage: scripts/openai-node.sh [DEST]   (default .cache/openai-node; the test reads DRMAS_OPENAI_NODE,
# else that default)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.cache/openai-node}
version=6.30.1

if [ -f "$dest/.version" ] && [ "$(cat "$dest/.version")" = "$version" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "openai-node: npm not found; the OpenAI Node SDK test of drmas serve will skip" >&2
  exit 0
fi
mkdir -p "$dest"
echo "openai-node: npm install openai@$version" >&2
(cd "$dest" && npm install --no-save --ignore-scripts --no-audit --no-fund --loglevel=error --prefix . "openai@$version" >&2)
echo "$version" > "$dest/.version"
echo "openai-node: installed openai@$version in $dest" >&2
