#!/usr/bin/env bash
# A packed dataset larger than the memory the trainer may use still trains: the file is
# memory-mapped, so its pages are page cache that the kernel drops and re-reads under pressure,
# not memory the process owns. This packs a raw dataset several times a memory limit, trains
# on it under that limit (a cgroup: v1 memory.limit_in_bytes here, else systemd-run's
# MemoryMax on cgroup v2), and prints the file size, the limit, the cgroup's peak, the run's
# peak RSS and that it finished. Needs root for the cgroup.
# Usage: scripts/packed_memory.sh [limit_mb] [photos_dir]
#   photos_dir: an ImageFolder (default: the one scripts/bench_loader.sh makes; made here with
#   scripts/make_photos.py if missing, which needs python3 with pillow and numpy: PEER_VENV).
set -euo pipefail
cd "$(dirname "$0")/.."
limit_mb=${1:-256}
work=${WORK:-/tmp/dptrain-bench-loader}
photos=${2:-$work/photos-200}
bin=$PWD/target/release/dptrain
[ -x "$bin" ] || cargo build --release -q
mkdir -p "$work"
if [ ! -d "$photos/train" ]; then
  "${PEER_VENV:-$HOME/torchvenv}/bin/python" scripts/make_photos.py "$photos" 200 10 10
fi
pack=$work/raw-full.pack
[ -f "$pack" ] || $bin data pack "$photos" --out "$pack" --max-side 4096 --raw
run=$work/memory-run
rm -rf "$run"
train=("$bin" train --dataset "packed:$pack" --model lenet5 --image-size 32
       --augment random-resized-crop,flip --epochs 2 --batch 64 --threads 1 --loader-threads 1
       --run-dir "$run" --no-checkpoints --quiet)
# Drop the file's cached pages first so the run reads it from disk under the limit.
sync; echo 1 > /proc/sys/vm/drop_caches 2>/dev/null || true
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  systemd-run --scope -q -p MemoryMax=${limit_mb}M -p MemorySwapMax=0 "${train[@]}"
  peak="(see systemctl status of the scope)"
else
  cg=/sys/fs/cgroup/memory/dptrain-packed-memory-$$
  mkdir "$cg"
  trap 'rmdir "$cg" 2>/dev/null || true' EXIT
  echo $((limit_mb << 20)) > "$cg/memory.limit_in_bytes"
  # The run in a child shell that joins the cgroup first; the cgroup goes when it has ended.
  bash -c 'echo $$ > "$1/cgroup.procs"; shift; exec "$@"' _ "$cg" "${train[@]}"
  peak=$(( $(cat "$cg/memory.max_usage_in_bytes") >> 20 ))" MB (memory.max_usage_in_bytes, page cache included)"
  fails=$(cat "$cg/memory.failcnt")
  peak="$peak, limit hit $fails times"
fi
size_mb=$(( $(stat -c %s "$pack") >> 20 ))
python3 - "$run/summary.json" "$size_mb" "$limit_mb" "$peak" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"packed file {sys.argv[2]} MB, memory limit {sys.argv[3]} MB ({int(sys.argv[2]) / int(sys.argv[3]):.1f}x)")
print(f"cgroup peak: {sys.argv[4]}")
print(f"trained {len(s['epochs'])} epochs to the end: test accuracy {s['final_test_accuracy']:.4f}, "
      f"{s['images_per_s']:.0f} images/s, peak RSS {s['peak_rss_mb']:.0f} MB")
PY
