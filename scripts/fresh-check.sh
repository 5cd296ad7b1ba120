#!/usr/bin/env bash
# Reproduces a fresh machine here: purges the Debian packages scripts/test.sh installs (and
# whatever they pulled in), then runs the README's test command from a clean clone of HEAD
# with an empty target directory and an empty CARGO_HOME (so crates are fetched as on a new
# machine), and prints the wall time of both README commands.
# Needs root (it removes packages). Usage: scripts/fresh-check.sh [--keep-clone]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "error: fresh-check removes packages: run it as root" >&2; exit 1; }
# shellcheck source=scripts/packages.sh
. scripts/packages.sh
repo=$(pwd)
clone=$(mktemp -d /tmp/dptrain-fresh.XXXXXX)
keep=${1:-}
cleanup() { [ "$keep" = --keep-clone ] || rm -rf "$clone"; }
trap cleanup EXIT

echo "== purging ${PACKAGES[*]}"
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq "${PACKAGES[@]}" >/dev/null 2>&1 || true
DEBIAN_FRONTEND=noninteractive apt-get autoremove -y -qq >/dev/null 2>&1 || true
for p in "${PACKAGES[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    echo "error: $p is still installed after the purge" >&2; exit 1
  fi
done
echo "== clean clone of $(git rev-parse --short HEAD) in $clone (empty target/, empty CARGO_HOME: crates are fetched as on a new machine)"
git clone -q "$repo" "$clone/dptrain"
cd "$clone/dptrain"
export CARGO_HOME="$clone/cargo-home"
mkdir -p "$CARGO_HOME"
t0=$(date +%s)
cargo run --release -- train
t1=$(date +%s)
./scripts/test.sh
t2=$(date +%s)
echo "== README main command (cargo run --release -- train), build included: $((t1 - t0)) s"
echo "== README test command (./scripts/test.sh), after it in the same clone: $((t2 - t1)) s"
echo "== fresh-check: green"
