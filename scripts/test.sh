#!/usr/bin/env bash
# The whole test suite, from a fresh clone: the README's test command and what CI runs.
#
# What the tests need from the machine, and nothing else:
# - the Rust toolchain with rustfmt and clippy (the machine's rustup toolchain);
# - the Debian packages in PACKAGES and BASE_PACKAGES (scripts/packages.sh). As root they are
#   installed every time (apt-get install of what is already there is a no-op); as another
#   user each is checked with `dpkg -s` and the one command that installs the missing ones is
#   printed.
# Presence is never inferred from files: a glob once matched the image's libclang-cpp14 and
# libclang-dev was never installed (issue 12). scripts/fresh-check.sh removes the PACKAGES
# and runs this script from a clean clone, to reproduce a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/packages.sh
. scripts/packages.sh
PACKAGES+=("${BASE_PACKAGES[@]}")

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
if [ "$(id -u)" = 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq "${PACKAGES[@]}" >/tmp/dptrain-apt.log 2>&1; then
    # A fresh machine may have no (or stale) package lists: refresh them once and retry.
    echo "apt-get install failed; refreshing package lists and retrying" >&2
    apt-get update -qq >>/tmp/dptrain-apt.log 2>&1 || true
    apt-get install -y -qq "${PACKAGES[@]}" >>/tmp/dptrain-apt.log 2>&1 || {
      tail -n 20 /tmp/dptrain-apt.log >&2
      echo "error: could not install ${PACKAGES[*]} (log: /tmp/dptrain-apt.log)" >&2
      exit 1
    }
  fi
  [ ${#missing[@]} -eq 0 ] || echo "installed ${missing[*]}"
elif [ ${#missing[@]} -gt 0 ]; then
  echo "error: missing Debian packages: ${missing[*]}" >&2
  echo "install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
for tool in rustfmt clippy-driver; do
  command -v "$tool" >/dev/null || {
    echo "error: $tool not found: the tests need the rustfmt and clippy components (rustup component add rustfmt clippy)" >&2
    exit 1
  }
done

cargo fmt --all -- --check
cargo clippy --release --all-targets -- -D warnings
# Every public item documented, and every intra-doc link resolving.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --release
cargo test --release
# The kernels again on the AVX2 and the portable micro-kernels (this machine may have AVX-512,
# which the run above took): against the reference backend (plain loops), Winograd against
# direct convolution, and implicit im2col against the column matrix (AVX2; the portable
# kernel builds the column matrix).
kernel_tests() {
  cargo test --release --lib backend::
  cargo test --release --test reference_backend --test winograd
}
if grep -q avx512f /proc/cpuinfo; then
  DPTRAIN_GEMM_AVX2=1 kernel_tests
fi
DPTRAIN_GEMM_PORTABLE=1 kernel_tests
# Multi-process training over MPI: the library again with the feature, then the mpirun tests
# one at a time (they time ranks out on purpose and share 2 cores).
cargo clippy --release --all-targets --features mpi -- -D warnings
cargo test --release --features mpi --test mpi -- --test-threads=1
# Across hosts: each test brings up its own cluster of network namespaces (scripts/cluster.sh,
# needs root: they fail and say why without it), trains over TCP only, and takes it down.
cargo test --release --features mpi --test cluster -- --test-threads=1
