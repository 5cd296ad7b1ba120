#!/usr/bin/env bash
# dptrain over MPI next to PyTorch DDP (gloo) across the namespace cluster of scripts/cluster.sh,
# on the same shaped links, interleaved; prints a markdown table of medians (needs root).
#
#   scripts/compare_cluster.sh [--models vgg-small,resnet20] [--hosts 2,4] [--workers 1,2]
#       [--links 1gbit,100mbit] [--reps 3] [--steps 30] [--bin target/release/dptrain]
#       [--name dpcmp] [--python PY] [--peers DIR] [--logs DIR] [--dptrain-args "ARGS"]
#
# Per (link, hosts) it brings up a cluster (`cluster.sh up HOSTS --bandwidth LINK --name NAME`),
# and per (model, workers) runs, REPS times and alternating (dptrain, DDP, dptrain, DDP, ...):
# - dptrain: `cluster.sh mpirun -np HOSTS BIN train --transport mpi --workers W --threads 1`, one
#   rank per host, synthetic 3x32x32 data, global batch 64, one epoch of STEPS + 5 batches;
# - DDP: `pytorch_ddp_host.py` (../shared/peers), W processes per host (world = HOSTS x W), each
#   started in its host's namespace with `ip netns exec`, 1 thread, GLOO_SOCKET_IFNAME=eth0,
#   the master at host 1's address, global batch 64, 5 warm-up steps then STEPS timed ones.
# Both figures are steady-state images/s: 64 / (mean step time after 5 warm-up steps). For
# dptrain the mean step is summary.json's `breakdown.mean.step_ms` (rank 0's workers, first 5
# steps excluded); DDP's is the wall time of its timed steps between two barriers / STEPS.
# Equal work: same global batch and per-worker batch, the same model definitions (models.py
# matches dptrain's built-ins), one thread per worker/process, and dptrain's optimizer set to
# DDP's (SGD lr 0.01, momentum 0.9, no Nesterov, no weight decay).
#
# Rows print as they finish; then dptrain's step breakdown per row (medians over its runs).
# Every run's figures go to LOGS/results.tsv and its output to LOGS/*.log (default LOGS:
# /tmp/compare-cluster-NAME). The cluster is taken down on exit, error or interrupt.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

models=vgg-small,resnet20
hosts_list=2,4
workers_list=1,2
links=1gbit,100mbit
reps=3
steps=30
bin=target/release/dptrain
name=dpcmp
py=${TORCH_PY:-$HOME/torchvenv/bin/python}
peers=../shared/peers
logs=""
extra=""
batch=64
warmup=5 # dptrain's metrics::WARMUP_STEPS, and pytorch_ddp_host.py's warm-up loop

die() {
  echo "compare_cluster.sh: error: $*" >&2
  exit 1
}

usage() {
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

while [ $# -gt 0 ]; do
  case $1 in
    --models) models=${2:?--models needs a value}; shift 2 ;;
    --hosts) hosts_list=${2:?--hosts needs a value}; shift 2 ;;
    --workers) workers_list=${2:?--workers needs a value}; shift 2 ;;
    --links) links=${2:?--links needs a value}; shift 2 ;;
    --reps) reps=${2:?--reps needs a value}; shift 2 ;;
    --steps) steps=${2:?--steps needs a value}; shift 2 ;;
    --bin) bin=${2:?--bin needs a value}; shift 2 ;;
    --name) name=${2:?--name needs a value}; shift 2 ;;
    --python) py=${2:?--python needs a value}; shift 2 ;;
    --peers) peers=${2:?--peers needs a value}; shift 2 ;;
    --logs) logs=${2:?--logs needs a value}; shift 2 ;;
    --dptrain-args) extra=${2?--dptrain-args needs a value}; shift 2 ;;
    -h | --help) usage ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

[ "$(id -u)" = 0 ] ||
  die "needs root: scripts/cluster.sh makes network namespaces, veth pairs and tc qdiscs; run it with sudo"
[[ $reps =~ ^[1-9][0-9]*$ ]] || die "--reps '$reps': give a number of repetitions, at least 1"
[[ $steps =~ ^[1-9][0-9]*$ ]] || die "--steps '$steps': give a number of timed steps, at least 1"
for h in ${hosts_list//,/ }; do
  [[ $h =~ ^[0-9]+$ ]] && [ "$h" -ge 2 ] || die "--hosts: '$h' is not a number of hosts >= 2"
done
for w in ${workers_list//,/ }; do
  [[ $w =~ ^[1-9][0-9]*$ ]] || die "--workers: '$w' is not a number of workers per host"
done
for m in ${models//,/ }; do
  case $m in
    vgg-small | resnet20 | resnet18 | mobilenetv2) ;;
    *) die "--models: '$m' is not one of vgg-small, resnet20, resnet18, mobilenetv2 (3x32x32 models both sides have)" ;;
  esac
done
case $bin in /*) ;; *) bin=$repo/$bin ;; esac
[ -x "$bin" ] || die "no dptrain binary at $bin: build it with \`cargo build --release --features mpi\` (or give --bin PATH)"
command -v mpirun >/dev/null || die "mpirun not found: install the Debian package openmpi-bin"
case $peers in /*) ;; *) peers=$repo/$peers ;; esac
[ -f "$peers/pytorch_ddp_host.py" ] || die "no $peers/pytorch_ddp_host.py (give --peers DIR, the peers folder)"
[ -x "$py" ] || command -v "$py" >/dev/null ||
  die "no python at $py: make a PyTorch venv with \`python3 -m venv \"\$HOME/torchvenv\" && \"\$HOME/torchvenv/bin/pip\" install torch\` (outside the repo; see ../shared/peers/README.md), or give --python PY / TORCH_PY"
"$py" -c 'import torch' 2>/dev/null ||
  die "PyTorch is not installed for $py: install it with \`python3 -m venv \"\$HOME/torchvenv\" && \"\$HOME/torchvenv/bin/pip\" install torch\` (outside the repo; see ../shared/peers/README.md), or give --python PY / TORCH_PY"
"$bin" train --help 2>/dev/null | grep -q -- '--transport' || die "$bin does not look like dptrain (no train --transport)"

logs=${logs:-/tmp/compare-cluster-$name}
mkdir -p "$logs"
results=$logs/results.tsv
: >"$results"
: >"$logs/load.txt"
cluster=$repo/scripts/cluster.sh
up=0

# The cluster goes down however the script ends (cluster.sh's `down` also kills whatever still
# runs in its namespaces: a DDP rank or an MPI rank left over by a failed run).
cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  if [ "$up" = 1 ]; then "$cluster" down --name "$name" >/dev/null || echo "compare_cluster.sh: warning: could not take cluster $name down" >&2; fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

torch_name() { case $1 in vgg-small) echo vgg ;; *) echo "$1" ;; esac; }

# One dptrain run: appends "dptrain MODEL HOSTS W LINK REP imgs_per_s step data fwd bwd exposed
# update whole_run_imgs_per_s" (the last: summary.json's images_per_s, warm-up included, a check).
run_dptrain() {
  local model=$1 hosts=$2 w=$3 link=$4 rep=$5 dir log
  dir=$(mktemp -d "$logs/run.XXXXXX")
  log=$logs/dptrain-$model-${hosts}x$w-$link-$rep.log
  cut -d' ' -f1 /proc/loadavg >>"$logs/load.txt"
  # In the background and waited for: bash runs a trap at once during `wait`, but only after a
  # foreground command ends, and `timeout` takes its command out of the terminal's Ctrl-C.
  # shellcheck disable=SC2086
  timeout 900 "$cluster" mpirun --name "$name" -np "$hosts" "$bin" train --transport mpi \
    --model "$model" --dataset synthetic:3x32x32:10 --batch $batch --workers "$w" --threads 1 \
    --epochs 1 --train-limit $((batch * (steps + warmup))) --test-limit $batch \
    --lr 0.01 --momentum 0.9 --nesterov false --weight-decay 0 --warmup-steps 0 \
    --no-checkpoints --quiet --comm-timeout 120 --run-dir "$dir" $extra >"$log" 2>&1 &
  if ! wait $!; then
    tail -20 "$log" >&2
    die "dptrain run failed ($model ${hosts}x$w $link); its output: $log"
  fi
  "$py" - "$dir/summary.json" "$model $hosts $w $link $rep" $batch >>"$results" <<'PY' || die "no summary.json from the dptrain run in $dir (output: $log)"
import json, sys
s = json.load(open(sys.argv[1])); m = s["breakdown"]["mean"]; batch = int(sys.argv[3])
assert s["breakdown"]["steps"] > 0, "no timed steps"
print("dptrain", sys.argv[2], f"{batch * 1000 / m['step_ms']:.1f}",
      *(f"{m[k]:.2f}" for k in ("step_ms", "data_ms", "forward_ms", "backward_ms", "exposed_comm_ms", "update_ms")),
      f"{s['images_per_s']:.1f}")
PY
  rm -rf "$dir"
}

# One DDP run: W processes in each host's namespace; appends "ddp MODEL HOSTS W LINK REP imgs_per_s step_ms".
run_ddp() {
  local model=$1 hosts=$2 w=$3 link=$4 rep=$5 log world master port i l rank pids=() failed=0
  log=$logs/ddp-$model-${hosts}x$w-$link-$rep.log
  cut -d' ' -f1 /proc/loadavg >>"$logs/load.txt"
  world=$((hosts * w))
  master=$(awk 'NR == 1 { print $1 }' "${DPTRAIN_CLUSTER_DIR:-/tmp/dptrain-cluster}/$name/hostfile")
  # A fresh port per run: the last run's sockets may still hold the old one (TIME_WAIT).
  port=$((29500 + RANDOM % 5000))
  : >"$log"
  for i in $(seq "$hosts"); do
    for l in $(seq 0 $((w - 1))); do
      rank=$(((i - 1) * w + l))
      ip netns exec "$name-h$i" env GLOO_SOCKET_IFNAME=eth0 MASTER_PORT=$port OMP_NUM_THREADS=1 \
        timeout 900 "$py" "$peers/pytorch_ddp_host.py" "$(torch_name "$model")" $rank $world "$master" \
        "$steps" 1 $batch >>"$log" 2>&1 &
      pids+=($!)
    done
  done
  for i in "${pids[@]}"; do wait "$i" || failed=1; done
  local line
  line=$(grep '^RESULT torch-ddp' "$log" || true)
  if [ -z "$line" ]; then
    tail -20 "$log" >&2
    die "DDP run failed ($model ${hosts}x$w $link); its output: $log"
  fi
  # Gloo sometimes aborts in destroy_process_group after the timed steps ("terminate called
  # without an active exception"; once in about 60 runs here): the figure stands; say so.
  [ "$failed" = 0 ] ||
    echo "compare_cluster.sh: warning: a DDP process failed after rank 0's result ($model ${hosts}x$w $link, run $rep); kept the result; output: $log" >&2
  echo "$line" | awk -v k="ddp $model $hosts $w $link $rep" '{
    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    print k, v["imgs_per_s"], v["step_ms"] }' >>"$results"
}

# The table row of one configuration, from the results so far.
row() {
  "$py" - "$results" "$@" <<'PY'
import sys, statistics as st
path, model, hosts, w, link = sys.argv[1:6]
vals = {"dptrain": [], "ddp": []}
for line in open(path):
    f = line.split()
    if f[1:5] == [model, hosts, w, link]:
        vals[f[0]].append(float(f[6]))
d, t = vals["dptrain"], vals["ddp"]
fmt = lambda v: f"{st.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"
print(f"| {model} | {hosts} x {w} | {link} | {fmt(d)} | {fmt(t)} | {st.median(d) / st.median(t):.2f} |", flush=True)
PY
}

# dptrain's step breakdown per row, the rows below 1.3x, and the load the runs started under.
breakdown_table() {
  "$py" - "$results" "$logs/load.txt" <<'PY'
import sys, statistics as st, collections
rows = collections.OrderedDict()
ips = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = line.split()
    ips[(f[0], *f[1:5])].append(float(f[6]))
    if f[0] == "dptrain":
        rows.setdefault(tuple(f[1:5]), []).append([float(x) for x in f[7:13]])
low = [k for k in rows if ips[("ddp", *k)] and
       st.median(ips[("dptrain", *k)]) < 1.3 * st.median(ips[("ddp", *k)])]
print("\nrows where dptrain is below 1.3x DDP: " + (", ".join(f"{m} {h} x {w} {l}" for m, h, w, l in low) or "none"))
load = [float(x) for x in open(sys.argv[2])]
if load:
    print(f"1-minute load average as the runs started: {min(load):.2f}-{max(load):.2f}, median {st.median(load):.2f}")
print("\ndptrain step breakdown, ms (medians over its runs; rank 0's workers, after 5 warm-up steps):\n")
print("| model | hosts x workers | link | step | data wait | forward | backward | exposed comm | update |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|")
for (model, hosts, w, link), runs in rows.items():
    med = [st.median(c) for c in zip(*runs)]
    print(f"| {model} | {hosts} x {w} | {link} | " + " | ".join(f"{v:.1f}" for v in med) + " |")
PY
}

started=$(date -u +%FT%TZ)
echo "compare_cluster.sh: $started, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); dptrain $bin; torch $("$py" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
echo "models $models, hosts $hosts_list, workers per host $workers_list, links $links, $reps reps x $steps timed steps after $warmup warm-up, global batch $batch, 1 thread per worker${extra:+, dptrain extra args: $extra}"
echo "images/s = $batch / mean step after warm-up; median (min-max) over the reps; ratio = dptrain median / DDP median"
echo
echo "| model | hosts x workers/host | link | dptrain images/s | DDP images/s | ratio |"
echo "|---|---|---|---:|---:|---:|"
t0=$(date +%s)
for link in ${links//,/ }; do
  for hosts in ${hosts_list//,/ }; do
    "$cluster" up "$hosts" --name "$name" --bandwidth "$link" >"$logs/cluster-$hosts-$link.log" 2>&1 ||
      { cat "$logs/cluster-$hosts-$link.log" >&2; die "cluster.sh up $hosts --bandwidth $link failed"; }
    up=1
    for model in ${models//,/ }; do
      for w in ${workers_list//,/ }; do
        for rep in $(seq "$reps"); do
          run_dptrain "$model" "$hosts" "$w" "$link" "$rep"
          run_ddp "$model" "$hosts" "$w" "$link" "$rep"
        done
        row "$model" "$hosts" "$w" "$link"
      done
    done
    "$cluster" down --name "$name" >/dev/null
    up=0
  done
done
breakdown_table
echo
echo "took $(($(date +%s) - t0)) s; load average at the end $(cut -d' ' -f1-3 /proc/loadavg); every run: $results"
