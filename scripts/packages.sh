# The Debian packages the tests need, one list for scripts/test.sh and scripts/fresh-check.sh.
# - dataset-fashion-mnist: the Fashion-MNIST files the reader is tested on;
# - openmpi-bin, libopenmpi-dev: mpirun and the headers/libraries of `--features mpi`;
# - libclang-dev: libclang.so, which the `mpi` crate's bindgen loads to read mpi.h.
# shellcheck disable=SC2034
PACKAGES=(dataset-fashion-mnist openmpi-bin libopenmpi-dev libclang-dev)
