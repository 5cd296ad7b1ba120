#!/usr/bin/env bash
# Side-by-side, interleaved comparison with the PyTorch baselines in ../shared/peers/.
# Needs a PyTorch venv (see ../shared/peers/README.md); set TORCH_PY to its python.
# Usage: scripts/compare_pytorch.sh [rounds]     Prints medians per (model, threads) and ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
py=${TORCH_PY:-$HOME/torchvenv/bin/python}
peers=../shared/peers
bin=target/release/dptrain
cargo build --release -q
out=$(mktemp)
for r in $(seq "$rounds"); do
  for m in lenet vgg; do
    model=$([ $m = lenet ] && echo lenet5 || echo vgg-small)
    for t in 1 2; do
      "$py" "$peers/pytorch_step.py" $m $t 20 | grep RESULT | sed "s/^/step $model $t /" >>"$out"
      $bin bench step --model $model --threads $t --steps 20 | grep RESULT | sed "s/^/step $model $t /" >>"$out"
    done
    # Data-parallel, 2 workers: PyTorch DDP (gloo, 2 processes x 1 thread) vs dptrain (2 worker threads x 1 thread).
    "$py" "$peers/pytorch_ddp.py" $m 2 30 1 | grep RESULT | sed "s/^/ddp $model 2 /" >>"$out"
    $bin bench overlap --model $model --workers 2 --threads 1 --link-bandwidth none --comm auto --steps 30 \
      | awk -v m=$model '$1=="none" && $3=="on" {print "ddp " m " 2 RESULT dptrain imgs_per_s=" $9}' >>"$out"
  done
done
python3 - "$out" <<'PY'
import sys, re, statistics, collections
vals = collections.defaultdict(list)
for line in open(sys.argv[1]):
    kind, model, t, _, who = line.split()[:5]
    m = re.search(r"(median_ms|imgs_per_s)=([0-9.]+)", line)
    vals[(kind, model, t, who)].append(float(m.group(2)))
rows = sorted({k[:3] for k in vals})
print(f"{'what':<6}{'model':<11}{'thr/wk':>7}{'dptrain':>12}{'pytorch':>12}{'ratio':>8}   (medians of {len(next(iter(vals.values())))} rounds)")
for kind, model, t in rows:
    ours = statistics.median(vals[(kind, model, t, 'dptrain')])
    torch = statistics.median(vals[(kind, model, t, 'torch' if kind == 'step' else 'torch-ddp')])
    unit = 'ms' if kind == 'step' else 'img/s'
    ratio = ours / torch if kind == 'step' else ours / torch
    print(f"{kind:<6}{model:<11}{t:>7}{ours:>10.1f}{unit:>2}{torch:>10.1f}{unit:>2}{ratio:>8.2f}")
print("step: ratio = dptrain time / PyTorch time (lower is better); ddp: ratio = dptrain images/s / PyTorch DDP images/s (higher is better)")
PY
rm -f "$out"
