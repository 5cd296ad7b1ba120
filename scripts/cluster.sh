#!/usr/bin/env bash
# A cluster of "hosts" on this machine, for multi-host MPI runs over real TCP (needs root).
#
#   scripts/cluster.sh up N [--name NAME] [--bandwidth B] [--host-bandwidth I=B]...
#   scripts/cluster.sh mpirun [--name NAME] MPIRUN_ARGS...   # mpirun across the hosts, TCP only
#   scripts/cluster.sh stats [--name NAME]                   # bytes each host sent and received
#   scripts/cluster.sh fail [--name NAME] I                  # host I fails: off the network, frozen
#   scripts/cluster.sh restore [--name NAME] I               # host I is back, as after a reboot
#   scripts/cluster.sh launch [--name NAME] BIN LAUNCH_ARGS... -- TRAIN_ARGS...
#                                                            # BIN launch (elastic) across the hosts
#   scripts/cluster.sh down [--name NAME]
#
# Each host is a network namespace NAME-hI (I = 1..N) with one interface, eth0, at
# SUBNET.I/24. Its veth peer, hI, is a port of the bridge br0 in a namespace of its own,
# NAME-sw (the switch), which also holds the launcher's address SUBNET.254: mpirun runs there,
# and reaches the hosts only through the bridge. Nothing is created in the machine's own
# namespace, so its interfaces, addresses and routes are never touched, no traffic can leave
# the cluster, and two clusters with different names can use the same subnet side by side.
#
# A host's link is shaped in both directions with tbf (eth0's egress is its upload, the switch
# port hI's egress its download): --bandwidth B for every host (default 1gbit; "none" leaves
# the links unshaped), --host-bandwidth I=B for host I. The kernel here has no netem, so the
# latency is whatever the network stack gives; `up` measures it with ping and prints it.
#
# `up` writes, under DIR (default /tmp/dptrain-cluster/NAME): `hostfile` (one line per host
# address, slots=1), `rsh-agent` (OpenMPI's plm_rsh_agent: runs the remote command with
# `ip netns exec` in the host's namespace) and `cluster.env` (what was made, for the other
# subcommands). `down` kills whatever still runs in the cluster's namespaces and deletes them
# (their veths, bridge and qdiscs go with them) and DIR; `up` does the same for whatever it
# had made when it fails or is interrupted. Only namespaces named NAME-sw and NAME-hI are
# ever touched.
set -euo pipefail

NAME=dpc
SUBNET=10.77.0
BANDWIDTH=1gbit
declare -A HOST_BANDWIDTH=()

die() {
  echo "cluster.sh: error: $*" >&2
  exit 1
}

usage() {
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

dir_of() { echo "${DPTRAIN_CLUSTER_DIR:-/tmp/dptrain-cluster}/$1"; }

check_name() {
  # Namespace names become file names under /run/netns, and `down` matches them by prefix.
  [[ $1 =~ ^[a-z][a-z0-9]{0,23}$ ]] ||
    die "--name '$1': use 1-24 lower-case letters and digits, starting with a letter"
}

need_root() {
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, veth pairs and tc); run it with sudo"
  command -v ip >/dev/null || die "ip not found: install the Debian package iproute2"
  command -v tc >/dev/null || die "tc not found: install the Debian package iproute2"
}

# The namespaces of cluster $1 that exist now.
namespaces_of() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-(sw|h[0-9]+)$" || true
}

# Removes everything cluster $1 made: stops the processes still inside its namespaces (mpirun,
# daemons and ranks started there; a process would keep its namespace, and the links in it,
# alive after the name is gone), then deletes the namespaces and the files.
teardown() {
  local name=$1 ns pids left i
  for ns in $(namespaces_of "$name"); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    if [ -n "$pids" ]; then
      # shellcheck disable=SC2086
      kill -TERM $pids 2>/dev/null || true
      # A frozen host's processes (`fail`) only act on TERM once continued.
      # shellcheck disable=SC2086
      kill -CONT $pids 2>/dev/null || true
      for i in $(seq 20); do
        left=$(ip netns pids "$ns" 2>/dev/null || true)
        [ -z "$left" ] && break
        [ "$i" = 10 ] && { kill -KILL $left 2>/dev/null || true; }
        sleep 0.1
      done
    fi
    ip netns del "$ns" || echo "cluster.sh: warning: could not delete namespace $ns" >&2
  done
  rm -rf "$(dir_of "$name")"
}

# tc rate "B" -> bits per second (tc's decimal units); fails on anything else.
rate_bits() {
  local b=${1,,}
  [[ $b =~ ^([0-9]+(\.[0-9]+)?)(bit|kbit|mbit|gbit|tbit)$ ]] ||
    die "bandwidth '$1': give a tc rate such as 100mbit or 1gbit, or none"
  local scale
  case ${BASH_REMATCH[3]} in
    bit) scale=1 ;; kbit) scale=1e3 ;; mbit) scale=1e6 ;; gbit) scale=1e9 ;; tbit) scale=1e12 ;;
  esac
  local bits
  bits=$(awk -v n="${BASH_REMATCH[1]}" -v s="$scale" 'BEGIN { printf "%.0f", n * s }')
  [ "$bits" -ge 1000 ] || die "bandwidth '$1': too low for tbf (give at least 1kbit)"
  echo "$bits"
}

# Shapes the egress of device $2 in namespace $1 to rate $3 (tbf).
shape() {
  local ns=$1 dev=$2 rate=$3 bits burst
  [ "${rate,,}" = none ] && return 0
  bits=$(rate_bits "$rate")
  # A bucket of 1 ms of traffic, at least 16 KiB: large enough that tbf keeps up at high rates
  # (and segments GSO packets rather than dropping them), small enough that a message of a few
  # hundred KiB still sees the rate rather than the burst.
  burst=$(awk -v b="$bits" 'BEGIN { x = b / 8 / 1000; if (x < 16384) x = 16384; printf "%.0f", x }')
  tc -n "$ns" qdisc add dev "$dev" root tbf rate "$bits"bit burst "$burst" latency 50ms
}

# Average round trip from host 1 to address $2 of cluster $1, in ms (ping, 20 echoes).
rtt_ms() {
  ip netns exec "$1-h1" ping -c 20 -i 0.01 -q -W 2 "$2" |
    awk -F'/' '/^(rtt|round-trip)/ { print $5 }'
}

cmd_up() {
  local n=${1:-}
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 250 ] ||
    die "up N: N must be a number of hosts from 1 to 250, not '${n}'"
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --name) NAME=${2:?--name needs a value}; shift 2 ;;
      --bandwidth) BANDWIDTH=${2:?--bandwidth needs a value}; shift 2 ;;
      --host-bandwidth)
        [[ ${2:-} =~ ^([0-9]+)=(.+)$ ]] || die "--host-bandwidth wants I=B (host number = rate), not '${2:-}'"
        HOST_BANDWIDTH[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
        shift 2 ;;
      *) die "up: unknown option '$1'" ;;
    esac
  done
  check_name "$NAME"
  need_root
  command -v ping >/dev/null || die "ping not found: install the Debian package iputils-ping"
  command -v unshare >/dev/null || die "unshare not found: install the Debian package util-linux"
  local i
  for i in "${!HOST_BANDWIDTH[@]}"; do
    [ "$i" -ge 1 ] && [ "$i" -le "$n" ] || die "--host-bandwidth $i=...: there are hosts 1..$n"
  done
  [ "${BANDWIDTH,,}" = none ] || rate_bits "$BANDWIDTH" >/dev/null
  for i in "${HOST_BANDWIDTH[@]}"; do [ "${i,,}" = none ] || rate_bits "$i" >/dev/null; done
  if [ -n "$(namespaces_of "$NAME")" ]; then
    die "a cluster named $NAME is already up ($(namespaces_of "$NAME" | tr '\n' ' ')); take it down with: $0 down --name $NAME"
  fi
  # From here on, anything that fails (or an interrupt) removes what was made so far.
  trap 'rc=$?; if [ $rc -ne 0 ]; then echo "cluster.sh: up failed; removing what it made" >&2; teardown "$NAME"; fi' EXIT
  trap 'exit 130' INT TERM HUP

  local dir sw ns rate
  dir=$(dir_of "$NAME")
  sw=$NAME-sw
  mkdir -p "$dir"
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" addr add "$SUBNET.254/24" dev br0
  ip -n "$sw" link set br0 up
  for i in $(seq "$n"); do
    ns=$NAME-h$i
    rate=${HOST_BANDWIDTH[$i]:-$BANDWIDTH}
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # Both ends are created inside their namespaces: nothing appears in the machine's own.
    ip link add "h$i" netns "$sw" type veth peer name eth0 netns "$ns"
    ip -n "$sw" link set "h$i" master br0
    ip -n "$sw" link set "h$i" up
    ip -n "$ns" addr add "$SUBNET.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    shape "$ns" eth0 "$rate"
    shape "$sw" "h$i" "$rate"
  done

  # The files OpenMPI needs: the hosts by address, and the rsh agent that "logs in" to one.
  for i in $(seq "$n"); do echo "$SUBNET.$i slots=1"; done >"$dir/hostfile"
  {
    echo '#!/bin/sh'
    echo "# OpenMPI's plm_rsh_agent for cluster $NAME (made by scripts/cluster.sh): called as"
    echo '# AGENT [ssh-style options] HOST COMMAND..., runs COMMAND in the host'"'"'s namespace.'
    echo 'while [ $# -gt 0 ]; do'
    echo '  case $1 in'
    echo '    -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;  # ssh options that take a value'
    echo '    -*) shift ;;'
    echo '    *) break ;;'
    echo '  esac'
    echo 'done'
    echo '[ $# -ge 2 ] || { echo "rsh-agent: usage: rsh-agent [options] HOST COMMAND..." >&2; exit 2; }'
    echo 'host=$1; shift'
    echo 'case $host in'
    for i in $(seq "$n"); do echo "  $SUBNET.$i|h$i|$NAME-h$i) ns=$NAME-h$i ;;"; done
    echo "  *) echo \"rsh-agent: no host \$host in cluster $NAME (hosts $SUBNET.1..$SUBNET.$n)\" >&2; exit 255 ;;"
    echo 'esac'
    echo '# As ssh would, hand the command to a shell on the "remote" side, with the host'"'"'s own'
    echo '# hostname (a UTS namespace): OpenMPI names its session directory and PMIx store after'
    echo '# it, and hosts sharing one would overwrite each other'"'"'s.'
    echo 'exec ip netns exec "$ns" unshare --uts /bin/sh -c '"'"'hostname "$0" && exec /bin/sh -c "$1"'"'"' "$ns" "$*"'
  } >"$dir/rsh-agent"
  chmod +x "$dir/rsh-agent"

  # The latency the stack gives (no netem to set one): round trips from host 1.
  local rtts="" target
  if [ "$n" -ge 2 ]; then
    for i in $(seq 2 "$n"); do
      target=$(rtt_ms "$NAME" "$SUBNET.$i")
      [ -n "$target" ] || die "host 1 cannot ping host $i ($SUBNET.$i)"
      rtts="$rtts h1->h$i ${target} ms,"
    done
  else
    target=$(rtt_ms "$NAME" "$SUBNET.254")
    [ -n "$target" ] || die "host 1 cannot ping the switch ($SUBNET.254)"
    rtts=" h1->switch ${target} ms,"
  fi
  rtts=${rtts%,}
  {
    echo "NAME=$NAME"
    echo "HOSTS=$n"
    echo "SUBNET=$SUBNET.0/24"
    echo "BANDWIDTH=$BANDWIDTH"
    for i in $(seq "$n"); do echo "BANDWIDTH_H$i=${HOST_BANDWIDTH[$i]:-$BANDWIDTH}"; done
    echo "RTT='${rtts# }'"
  } >"$dir/cluster.env"
  trap - EXIT INT TERM HUP

  local shaped=""
  for i in "${!HOST_BANDWIDTH[@]}"; do shaped="$shaped, host $i at ${HOST_BANDWIDTH[$i]}"; done
  echo "cluster $NAME: $n hosts ($SUBNET.1..$SUBNET.$n, namespaces $NAME-h1..$NAME-h$n) on a bridge in $sw"
  if [ "${BANDWIDTH,,}" = none ]; then
    echo "links: unshaped$shaped"
  else
    echo "links: $BANDWIDTH each way per host$shaped (tbf)"
  fi
  echo "latency (ping round trip, average of 20):$rtts"
  echo "hostfile: $dir/hostfile"
  echo "run across the hosts (TCP only) with:"
  echo "  $0 mpirun --name $NAME -np $n target/release/dptrain train --transport mpi ..."
  echo "which runs:"
  mpirun_line "$NAME" "$dir"
  echo "  ${MPIRUN[*]} -np $n ..."
}

# The mpirun command (without the program) for cluster $1 with files in $2, into MPIRUN.
mpirun_line() {
  local name=$1 dir=$2 subnet
  subnet=$(. "$dir/cluster.env" && echo "$SUBNET")
  MPIRUN=(ip netns exec "$name-sw" mpirun)
  [ "$(id -u)" = 0 ] && MPIRUN+=(--allow-run-as-root)
  # - pml ob1: the only PML that uses the BTLs below (ucx or cm would bypass them);
  # - btl tcp,self: TCP between hosts, no shared memory (vader) even though the "hosts" share a
  #   kernel; the interfaces restricted to the cluster's subnet, for data and for the daemons;
  # - bind-to none: every host's daemon sees the same cores and would pin its rank to core 0;
  # - btl_tcp eager and fragment limits of 4 MiB: above the default 64 KiB, ob1 sends by
  #   rendezvous, and a ring all-reduce between 2 hosts at 100 Mbit/s (both directions at once)
  #   then ran at half the link's rate: 295424 B took 41.0 ms, 25.0 ms with these limits (the
  #   link's rate gives 23.6). Every message of ours is a bucket's chunk, and a receiver takes
  #   one collective's messages at a time, so what MPI buffers stays bounded by the buckets.
  local limit=4194304
  MPIRUN+=(--hostfile "$dir/hostfile" --mca plm_rsh_agent "$dir/rsh-agent"
    --mca pml ob1 --mca btl tcp,self
    --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" --bind-to none
    --mca btl_tcp_eager_limit $limit --mca btl_tcp_rndv_eager_limit $limit
    --mca btl_tcp_max_send_size $limit)
}

# Reads --name from the arguments of a subcommand; the rest is left in REST.
take_name() {
  REST=()
  while [ $# -gt 0 ]; do
    case $1 in
      --name) NAME=${2:?--name needs a value}; shift 2 ;;
      *) REST=("$@"); break ;;
    esac
  done
  check_name "$NAME"
}

cmd_mpirun() {
  take_name "$@"
  need_root
  local dir
  dir=$(dir_of "$NAME")
  [ -f "$dir/cluster.env" ] || die "cluster $NAME is not up (no $dir/cluster.env); start it with: $0 up N --name $NAME"
  mpirun_line "$NAME" "$dir"
  echo "+ ${MPIRUN[*]} ${REST[*]}" >&2
  exec "${MPIRUN[@]}" "${REST[@]}"
}

cmd_stats() {
  take_name "$@"
  need_root
  local dir n i
  dir=$(dir_of "$NAME")
  [ -f "$dir/cluster.env" ] || die "cluster $NAME is not up"
  n=$(. "$dir/cluster.env" && echo "$HOSTS")
  echo "host tx_bytes rx_bytes"
  for i in $(seq "$n"); do
    echo "h$i $(ip netns exec "$NAME-h$i" cat /sys/class/net/eth0/statistics/tx_bytes)" \
      "$(ip netns exec "$NAME-h$i" cat /sys/class/net/eth0/statistics/rx_bytes)"
  done
}

# The host number of `$1 I` (in REST), checked against cluster NAME.
host_arg() {
  local i=${REST[0]:-}
  [[ $i =~ ^[0-9]+$ ]] && ip netns list | awk '{print $1}' | grep -qx "$NAME-h$i" ||
    die "$1 I: cluster $NAME has no host '$i'"
  echo "$i"
}

# Host I fails as a machine losing power would: its link goes down first, so its peers get no
# connection resets, only silence; then everything running on it is frozen (SIGSTOP). Frozen
# rather than killed: its processes include the OpenMPI daemon that mpirun started through the
# rsh agent, and that agent (unlike ssh to a dead machine) would exit with it and tell mpirun
# at once. `down` kills them.
cmd_fail() {
  take_name "$@"
  need_root
  local i
  i=$(host_arg fail)
  ip -n "$NAME-sw" link set "h$i" down
  ip -n "$NAME-h$i" link set eth0 down
  local pids
  pids=$(ip netns pids "$NAME-h$i")
  # shellcheck disable=SC2086
  [ -z "$pids" ] || kill -STOP $pids 2>/dev/null || true
  echo "cluster $NAME: host $i is off the network; froze $(echo "$pids" | wc -w) processes on it"
}

# Host I comes back as after a reboot: on the network again, nothing of before running.
cmd_restore() {
  take_name "$@"
  need_root
  local i
  i=$(host_arg restore)
  # A rebooted host runs nothing of before: its frozen processes go (KILL acts on them frozen).
  local pids
  pids=$(ip netns pids "$NAME-h$i")
  # shellcheck disable=SC2086
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  ip -n "$NAME-h$i" link set eth0 up
  ip -n "$NAME-sw" link set "h$i" up
  echo "cluster $NAME: host $i is back on the network (killed $(echo "$pids" | wc -w) frozen processes)"
}

# `dptrain launch` in the switch namespace: the cluster's hostfile, heartbeats to the switch's
# address, and mpirun with this script's options (launch gives each job its own hostfile).
cmd_launch() {
  take_name "$@"
  need_root
  local dir bin subnet
  dir=$(dir_of "$NAME")
  [ -f "$dir/cluster.env" ] || die "cluster $NAME is not up (no $dir/cluster.env); start it with: $0 up N --name $NAME"
  [ ${#REST[@]} -ge 1 ] || die "launch BIN [LAUNCH_ARGS...] -- TRAIN_ARGS...: give the dptrain binary"
  bin=${REST[0]}
  subnet=$(. "$dir/cluster.env" && echo "$SUBNET")
  mpirun_line "$NAME" "$dir"
  local opts=() a skip=0
  for a in "${MPIRUN[@]:5}"; do
    if [ $skip = 1 ]; then skip=0; continue; fi
    [ "$a" = --hostfile ] && { skip=1; continue; }
    opts+=("$a")
  done
  local cmd=(ip netns exec "$NAME-sw" "$bin" launch --hostfile "$dir/hostfile"
    --listen "${subnet%.0/24}.254" --mpirun "mpirun ${opts[*]}" "${REST[@]:1}")
  echo "+ ${cmd[*]}" >&2
  exec "${cmd[@]}"
}

cmd_down() {
  take_name "$@"
  [ ${#REST[@]} -eq 0 ] || die "down: unknown option '${REST[0]}'"
  need_root
  local made
  made=$(namespaces_of "$NAME" | tr '\n' ' ')
  teardown "$NAME"
  [ -z "$(namespaces_of "$NAME")" ] || die "namespaces of $NAME are still there: $(namespaces_of "$NAME")"
  if [ -n "$made" ]; then echo "cluster $NAME: removed $made"; else echo "cluster $NAME: nothing to remove"; fi
}

case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  mpirun) shift; cmd_mpirun "$@" ;;
  stats) shift; cmd_stats "$@" ;;
  fail) shift; cmd_fail "$@" ;;
  restore) shift; cmd_restore "$@" ;;
  launch) shift; cmd_launch "$@" ;;
  *) usage ;;
esac
