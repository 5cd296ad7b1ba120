#!/usr/bin/env bash
# The input pipeline alone on ImageNet-like photos, side by side with torchvision, interleaved:
# images/s of decode + RandomResizedCrop(224) + flip + normalise at batch 64, 1 and 2 loader
# threads (torchvision: num_workers 1 and 2), for
#   - dptrain --dataset imagefolder (the JPEG files),
#   - dptrain --dataset packed:F, F = `data pack` of the same folder: JPEG at --max-side 256,
#     JPEG at full size, raw at --max-side 256,
#   - torchvision DataLoader(ImageFolder) (../shared/peers/pytorch_loader.py).
# Usage: scripts/bench_loader.sh [reps] [train_per_class]     (10 classes; defaults 3 and 200)
# Env: PEER_VENV (a venv with torch, torchvision, pillow, numpy; made there if missing,
#      default $HOME/torchvenv), WORK (scratch directory, default /tmp/dptrain-bench-loader).
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
per_class=${2:-200}
venv=${PEER_VENV:-$HOME/torchvenv}
work=${WORK:-/tmp/dptrain-bench-loader}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import torchvision, PIL, numpy" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch torchvision pillow numpy
fi
py=$venv/bin/python
bin=target/release/dptrain
flock /tmp/cargo.lock cargo build --release -q 2>/dev/null || cargo build --release -q
mkdir -p "$work"
photos=$work/photos-$per_class
if [ ! -d "$photos/train" ]; then
  "$py" scripts/make_photos.py "$photos.part" "$per_class" 10 10 && mv "$photos.part" "$photos"
fi
pack() { [ -f "$work/$1" ] || $bin data pack "$photos" --out "$work/$1" "${@:2}"; }
pack jpeg-256.pack --max-side 256
pack jpeg-full.pack --max-side 4096
pack raw-256.pack --max-side 256 --raw
ls -l "$work"/*.pack
du -sh "$photos/train"
out=$(mktemp)
batches=30
for r in $(seq "$reps"); do
  $bin bench loader --imagefolder "$photos" \
    --packed "$work/jpeg-256.pack,$work/jpeg-full.pack,$work/raw-256.pack" \
    --loader-threads 1,2 --reps 1 --batches $batches | grep '^RESULT' >>"$out"
  for w in 1 2; do
    "$py" ../shared/peers/pytorch_loader.py "$photos" $w 224 $batches | grep '^RESULT' >>"$out"
  done
done
"$py" - "$out" <<'PY'
import sys, re, statistics, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    f = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
    if line.startswith("RESULT dptrain-loader"):
        runs[(f["source"], int(f["threads"]))].append(float(f["images_per_s"]))
    elif line.startswith("RESULT torch-loader"):
        runs[("torchvision", int(f["workers"]))].append(float(f["images_per_s"]))
med = {k: statistics.median(v) for k, v in runs.items()}
print("| source | loader threads / workers | images/s (median) | vs torchvision | runs |")
print("|---|---|---|---|---|")
for (src, t), m in sorted(med.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    tv = med.get(("torchvision", t))
    ratio = f"{m / tv:.2f}x" if tv else "-"
    print(f"| {src} | {t} | {m:.0f} | {ratio} | {' '.join(f'{x:.0f}' for x in runs[(src, t)])} |")
PY
rm -f "$out"
