# The Debian packages the tests need, one list for scripts/test.sh and scripts/fresh-check.sh.
# - dataset-fashion-mnist: the Fashion-MNIST files the reader is tested on;
# - openmpi-bin, libopenmpi-dev: mpirun and the headers/libraries of `--features mpi`;
# - libclang-dev: libclang.so, which the `mpi` crate's bindgen loads to read mpi.h;
# - iputils-ping: ping, with which scripts/cluster.sh measures the cluster's latency.
# shellcheck disable=SC2034
PACKAGES=(dataset-fashion-mnist openmpi-bin libopenmpi-dev libclang-dev iputils-ping)
# Part of the base system, also needed by the tests, and checked (installed as root) like the
# others, but never purged by scripts/fresh-check.sh: purging them would take the machine's
# own networking tools and their dependents with them.
# - iproute2: ip and tc, with which scripts/cluster.sh builds and shapes its namespaces;
# - util-linux: unshare, which gives each of the cluster's hosts its own hostname.
# shellcheck disable=SC2034
BASE_PACKAGES=(iproute2 util-linux)
