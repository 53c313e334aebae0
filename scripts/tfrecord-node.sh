#!/bin/bash
# Installs an independent reader of TensorBoard event files, the npm `tfrecord` package (0.2.x: TFRecord
# framing with its CRC-32C checks; it brings protobufjs, which decodes the Event messages), into
# .cache/tfrecord-node/ (ignored by git), for pkg/tbevent's TestIndependentReader (which runs
# scripts/tbevent-check.cjs). Without npm it says so and exits 0: that test then skips.
# Run twice, it does nothing the second time.
# Usage: scripts/tfrecord-node.sh [DEST]   (default .cache/tfrecord-node; the test reads
# DRMAS_TFRECORD_NODE, else that default)
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.cache/tfrecord-node}
version=0.2.0

if [ -f "$dest/.version" ] && [ "$(cat "$dest/.version")" = "$version" ]; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "tfrecord-node: npm not found; the independent event-file reader test will skip" >&2
  exit 0
fi
mkdir -p "$dest"
echo "tfrecord-node: npm install tfrecord@$version" >&2
(cd "$dest" && npm install --no-save --ignore-scripts --no-audit --no-fund --loglevel=error --prefix . "tfrecord@$version" >&2)
echo "$version" > "$dest/.version"
echo "tfrecord-node: installed tfrecord@$version in $dest" >&2
