#!/bin/bash
# Installs the OpenAI Agents SDK (npm `@openai/agents`, with its peer `zod` and the `openai` 7.x it
# brings) into .cache/openai-agents/ (ignored by git), for examples/agents-sdk/runner.mjs and the test
# that trains through it (cmd/drmas: TestGatewayAgentsSDK). Without npm it says so and exits 0: that
# test then skips. Run twice, it does nothing the second time.
# Usage: scripts/openai-agents.sh [DEST]   (default .cache/openai-agents; the example finds it through
# NODE_PATH=DEST/node_modules, the test through DRMAS_OPENAI_AGENTS, else that default)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.cache/openai-agents}
version=0.20.0
zod=4.6.7

if [ -f "$dest/.version" ] && [ "$(cat "$dest/.version")" = "$version" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "openai-agents: npm not found; the OpenAI Agents SDK example's test will skip" >&2
  exit 0
fi
mkdir -p "$dest"
echo "openai-agents: npm install @openai/agents@$version zod@$zod" >&2
(cd "$dest" && npm install --no-save --ignore-scripts --no-audit --no-fund --loglevel=error --prefix . "@openai/agents@$version" "zod@$zod" >&2)
echo "$version" > "$dest/.version"
echo "openai-agents: installed @openai/agents@$version in $dest" >&2
