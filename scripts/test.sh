#!/usr/bin/env bash
# Runs the whole test suite from a fresh clone. Installs what the tests need first:
# the Debian package with Fashion-MNIST (the reader is tested on the real files).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || need+=(dataset-fashion-mnist)
# The MPI build (`--features mpi`): OpenMPI, its launcher, and libclang for the bindings.
command -v mpirun >/dev/null || need+=(openmpi-bin)
[ -f /usr/include/x86_64-linux-gnu/mpi.h ] || [ -f /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ] \
  || need+=(libopenmpi-dev)
compgen -G '/usr/lib/llvm-*/lib/libclang*.so*' >/dev/null || need+=(libclang-dev)
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
# Multi-process training over MPI: the library again with the feature, then the mpirun tests
# one at a time (they time ranks out on purpose and share 2 cores).
cargo clippy --release --all-targets --features mpi -- -D warnings
cargo test --release --features mpi --test mpi -- --test-threads=1
