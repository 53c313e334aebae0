#!/usr/bin/env bash
# Makes this checkout build: installs libtorch (Debian's libtorch-dev, CPU), Gloo's headers and OpenBLAS with apt when no
# LIBTORCH is given, then runs scripts/torchsetup, which patches a copy of gotch for the libtorch found.
# Idempotent: a second run does nothing and takes a few seconds.
#   LIBTORCH=/path/to/libtorch make setup     # the official libtorch zip (CPU or CUDA)
#   LIBTORCH=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))') make setup
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${LIBTORCH:-}" ]; then
  need=()
  [ -f /usr/include/torch/csrc/api/include/torch/torch.h ] || need+=(libtorch-dev)
  # c10d's ProcessGroupGloo header includes Gloo's headers (data-parallel training, pkg/dist).
  [ -f /usr/include/gloo/algorithm.h ] || need+=(libgloo-dev)
  # OpenBLAS is not optional: with Debian's reference BLAS, matmul is ~15x slower.
  dpkg -s libopenblas0-pthread >/dev/null 2>&1 || need+=(libopenblas0-pthread)
  if [ ${#need[@]} -gt 0 ]; then
    echo "setup: installing ${need[*]} with apt" >&2
    sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
  fi
fi
exec go run ./scripts/torchsetup
