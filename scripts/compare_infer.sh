#!/usr/bin/env bash
# Inference speed side by side, interleaved: `dptrain bench infer` (a net set up for inference,
# evaluation mode) against PyTorch's model.eval() + torch.no_grad() (../shared/peers/
# pytorch_infer.py), batch 64, 1 and 2 threads, each round running both in turn; prints the
# medians over rounds and the ratios.
# PyTorch comes from the venv at ${PEER_VENV:-$HOME/torchvenv}, made (pip install torch) if absent.
# Usage: scripts/compare_infer.sh [rounds] [models] [steps]   (default: 5 resnet18 20)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-5}
models=${2:-resnet18}
steps=${3:-20}
venv=${PEER_VENV:-$HOME/torchvenv}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch
fi
py=$venv/bin/python
peers=../shared/peers
bin=target/release/dptrain
cargo build --release -q
out=$(mktemp)
trap 'rm -f "$out"' EXIT
torch_name() { case $1 in lenet5) echo lenet ;; vgg-small) echo vgg ;; *) echo "$1" ;; esac; }
for r in $(seq "$rounds"); do
  for model in ${models//,/ }; do
    for t in 1 2; do
      $bin bench infer --model "$model" --threads $t --steps "$steps" | grep RESULT | sed "s/^/$model $t /" >>"$out"
      "$py" "$peers/pytorch_infer.py" "$(torch_name "$model")" $t "$steps" | grep RESULT | sed "s/^/$model $t /" >>"$out"
    done
  done
done
python3 - "$out" "$rounds" <<'PY'
import sys, re, statistics, collections
vals = collections.defaultdict(list)
for line in open(sys.argv[1]):
    model, t, _, who = line.split()[:4]
    vals[(model, int(t), who)].append(float(re.search(r"median_ms=([0-9.]+)", line).group(1)))
print(f"{'model':<12}{'threads':>8}{'dptrain ms':>12}{'pytorch ms':>12}{'ratio':>8}   (medians of {sys.argv[2]} rounds, batch 64)")
for model, t in sorted({k[:2] for k in vals}):
    ours, torch = vals.get((model, t, 'dptrain')), vals.get((model, t, 'torch'))
    if ours and torch:
        o, p = statistics.median(ours), statistics.median(torch)
        print(f"{model:<12}{t:>8}{o:>12.1f}{p:>12.1f}{o / p:>8.2f}")
print("ratio = dptrain time / PyTorch time (below 1: dptrain faster)")
PY
