#!/usr/bin/env bash
# Side-by-side, interleaved comparison with the PyTorch baselines in ../shared/peers/.
# Needs a PyTorch venv (see ../shared/peers/README.md); set TORCH_PY to its python.
# Usage: [CONV_ALGO=auto|direct|winograd|winograd:2] scripts/compare_pytorch.sh [rounds] [models]
#   models: comma-separated dptrain names (default lenet5,vgg-small,resnet20,resnet18,mobilenetv2)
#   CONV_ALGO: how dptrain computes 3x3 stride-1 convolutions, in the steps and the 2-worker
#   rows alike (default auto: Winograd where its measured rule says it pays,
#   src/backend/conv_algo.rs).
# Prints medians per (model, threads) and ratios: one training step at batch 64 on 1 and 2
# threads, and 2 workers x 1 thread against PyTorch DDP (gloo, 2 processes x 1 thread).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
models=${2:-lenet5,vgg-small,resnet20,resnet18,mobilenetv2}
py=${TORCH_PY:-$HOME/torchvenv/bin/python}
# Gloo on loopback: with its default interface choice it aborted here ("terminate called
# without an active exception") on a machine with extra (down) interfaces.
export GLOO_SOCKET_IFNAME=${GLOO_SOCKET_IFNAME:-lo}
conv_algo=${CONV_ALGO:-auto}
peers=../shared/peers
bin=target/release/dptrain
cargo build --release -q
out=$(mktemp)
trap 'rm -f "$out"' EXIT
torch_name() { case $1 in lenet5) echo lenet ;; vgg-small) echo vgg ;; *) echo "$1" ;; esac; }
steps_for() { case $1 in resnet18|mobilenetv2) echo 5 ;; resnet20) echo 10 ;; *) echo 20 ;; esac; }
for r in $(seq "$rounds"); do
  for model in ${models//,/ }; do
    m=$(torch_name "$model"); s=$(steps_for "$model")
    for t in 1 2; do
      WARM=2 "$py" "$peers/pytorch_step.py" "$m" $t "$s" 2>/dev/null | grep RESULT | sed "s/^/step $model $t /" >>"$out"
      $bin bench step --model "$model" --threads $t --steps "$s" --conv-algo "$conv_algo" | grep RESULT | sed "s/^/step $model $t /" >>"$out"
    done
    case $model in resnet18|mobilenetv2) continue ;; esac
    # Data-parallel, 2 workers: PyTorch DDP (gloo, 2 processes x 1 thread) vs dptrain (2 worker threads x 1 thread).
    # A gloo process sometimes aborts at teardown after the figure is printed ("terminate
    # called without an active exception", as in compare_cluster.sh): keep the figure if it came.
    { "$py" "$peers/pytorch_ddp.py" "$m" 2 $((s + 10)) 1 2>/dev/null || echo "warning: pytorch_ddp.py $m exited non-zero" >&2; } \
      | { grep RESULT || true; } | sed "s/^/ddp $model 2 /" >>"$out"
    $bin bench overlap --model "$model" --workers 2 --threads 1 --link-bandwidth none --comm auto --steps $((s + 10)) --conv-algo "$conv_algo" \
      | awk -v m="$model" '$1=="none" && $3=="on" {print "ddp " m " 2 RESULT dptrain imgs_per_s=" $9}' >>"$out"
  done
done
python3 - "$out" "$conv_algo" <<'PY'
import sys, re, statistics, collections
vals = collections.defaultdict(list)
for line in open(sys.argv[1]):
    kind, model, t, _, who = line.split()[:5]
    m = re.search(r"(median_ms|imgs_per_s)=([0-9.]+)", line)
    vals[(kind, model, t, who)].append(float(m.group(2)))
rows = sorted({k[:3] for k in vals}, key=lambda k: (k[0] != 'step', k[1], k[2]))
n = max(len(v) for v in vals.values())
print(f"{'what':<6}{'model':<13}{'thr/wk':>7}{'dptrain':>13}{'pytorch':>13}{'ratio':>8}   (medians of {n} rounds; --conv-algo {sys.argv[2]})")
for kind, model, t in rows:
    ours = vals.get((kind, model, t, 'dptrain'))
    torch = vals.get((kind, model, t, 'torch' if kind == 'step' else 'torch-ddp'))
    if not ours or not torch:
        continue
    ours, torch = statistics.median(ours), statistics.median(torch)
    unit = 'ms' if kind == 'step' else 'img/s'
    print(f"{kind:<6}{model:<13}{t:>7}{ours:>11.1f}{unit:>2}{torch:>11.1f}{unit:>2}{ours / torch:>8.2f}")
print("step: ratio = dptrain time / PyTorch time (lower is better); ddp: ratio = dptrain images/s / PyTorch DDP images/s (higher is better)")
PY
rm -f "$out"
