#!/usr/bin/env bash
# Runs the whole test suite from a fresh clone. Installs what the tests need first:
# the Debian package with Fashion-MNIST (the reader is tested on the real files).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || need+=(dataset-fashion-mnist)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "installing ${need[*]}"
    (apt-get update -qq || true) >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "missing packages: ${need[*]}; install them with: sudo apt-get install ${need[*]}" >&2
    exit 1
  fi
fi

cargo fmt --all -- --check
cargo clippy --release --all-targets -- -D warnings
cargo test --release
