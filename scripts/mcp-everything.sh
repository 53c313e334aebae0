#!/bin/bash
# Installs the Model Context Protocol's reference test server, npm `@modelcontextprotocol/server-everything`
# (a real third-party MCP server with tools that echo, add, fail and run slowly), into
# .cache/mcp-everything/ (ignored by git), for pkg/tool's TestServerEverything, which starts it over stdio
# and over streamable HTTP. Without npm it says so and exits 0: that test then skips.
# Run twice, it does nothing the second time.
# Usage: scripts/mcp-everything.sh [DEST]   (default .cache/mcp-everything; the test reads
# DRMAS_MCP_EVERYTHING, else that default)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.cache/mcp-everything}
version=2026.8.31

if [ -f "$dest/.version" ] && [ "$(cat "$dest/.version")" = "$version" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "mcp-everything: npm not found; the MCP server-everything test of pkg/tool will skip" >&2
  exit 0
fi
mkdir -p "$dest"
echo "mcp-everything: npm install @modelcontextprotocol/server-everything@$version" >&2
(cd "$dest" && npm install --no-save --ignore-scripts --no-audit --no-fund --loglevel=error --prefix . "@modelcontextprotocol/server-everything@$version" >&2)
echo "$version" > "$dest/.version"
echo "mcp-everything: installed @modelcontextprotocol/server-everything@$version in $dest" >&2
