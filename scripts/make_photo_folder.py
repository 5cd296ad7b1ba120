#!/usr/bin/env python3
"""Makes a JPEG ImageFolder of mixed sizes and aspect ratios from Fashion-MNIST's IDX files.

Each 28x28 image is resized (PIL bicubic) to a random height of MIN..MAX px with a random
aspect ratio (log-uniform in RATIO_MIN..RATIO_MAX, width = height * ratio, clamped to
MIN..MAX) and saved as a greyscale JPEG at a random quality (QMIN..QMAX):

    OUT/train/<class>/<index>.jpg   (60,000 by default)
    OUT/test/<class>/<index>.jpg    (10,000)

Class directories are the label, zero-padded, so sorted order is label order, as dptrain's
and torchvision's ImageFolder read them. Deterministic for a seed. The output directory must
not exist (nothing is overwritten); files are written to OUT.partial and renamed at the end.

Pillow comes from a venv: ${PEER_VENV:-$HOME/torchvenv}, created (python3 -m venv) and given
`pip install pillow` if it lacks it; the script re-runs itself there.

    scripts/make_photo_folder.py --out /tmp/fashion-photos
    dptrain train --dataset imagefolder --data-dir /tmp/fashion-photos --image-size 28 \
        --augment random-resized-crop:0.35,1,flip
"""

import argparse
import gzip
import os
import random
import struct
import subprocess
import sys


def ensure_pillow():
    try:
        import PIL  # noqa: F401
        return
    except ImportError:
        pass
    venv = os.environ.get("PEER_VENV", os.path.join(os.path.expanduser("~"), "torchvenv"))
    py = os.path.join(venv, "bin", "python3")
    if os.environ.get("MAKE_PHOTO_FOLDER_IN_VENV"):
        sys.exit(f"error: Pillow is still missing in {venv}; run {py} -m pip install pillow")
    if not os.path.exists(py):
        subprocess.check_call([sys.executable, "-m", "venv", venv])
    if subprocess.call([py, "-c", "import PIL"], stderr=subprocess.DEVNULL) != 0:
        subprocess.check_call([py, "-m", "pip", "install", "--quiet", "pillow"])
    os.environ["MAKE_PHOTO_FOLDER_IN_VENV"] = "1"
    os.execv(py, [py, os.path.abspath(__file__)] + sys.argv[1:])


def read_idx(path):
    """(count, rows, cols, bytes) of an IDX image file, or (count, bytes) of a label file."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic = struct.unpack(">I", data[:4])[0]
    if magic == 2051:
        n, rows, cols = struct.unpack(">III", data[4:16])
        return n, rows, cols, data[16:]
    if magic == 2049:
        (n,) = struct.unpack(">I", data[4:8])
        return n, data[8:]
    sys.exit(f"error: {path}: not an IDX image or label file (magic {magic})")


def find(src, stem):
    for name in (stem + ".gz", stem):
        p = os.path.join(src, name)
        if os.path.exists(p):
            return p
    sys.exit(f"error: {src}: no {stem}[.gz]; install Fashion-MNIST with "
             "`apt-get install dataset-fashion-mnist` or pass --src")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--src", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--train", type=int, default=60000, help="training images (first N)")
    ap.add_argument("--test", type=int, default=10000, help="test images (first N)")
    ap.add_argument("--min", type=int, default=20, help="smallest side, px")
    ap.add_argument("--max", type=int, default=300, help="largest side, px")
    ap.add_argument("--ratio-min", type=float, default=3 / 4)
    ap.add_argument("--ratio-max", type=float, default=4 / 3)
    ap.add_argument("--qmin", type=int, default=40)
    ap.add_argument("--qmax", type=int, default=95)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    ensure_pillow()
    from PIL import Image

    if os.path.lexists(a.out):
        sys.exit(f"error: {a.out} exists; choose a new directory (nothing is overwritten)")
    part = a.out + ".partial"
    if os.path.lexists(part):
        sys.exit(f"error: {part} exists (an interrupted run?); delete it first")
    rng = random.Random(a.seed)
    splits = [("train", "train-images-idx3-ubyte", "train-labels-idx1-ubyte", a.train),
              ("test", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", a.test)]
    sizes = []
    for split, images, labels, limit in splits:
        n, rows, cols, px = read_idx(find(a.src, images))
        nl, lb = read_idx(find(a.src, labels))
        if nl != n:
            sys.exit(f"error: {split}: {n} images but {nl} labels")
        n = min(n, limit)
        for c in sorted(set(lb[:n])):
            os.makedirs(os.path.join(part, split, f"{c:02d}"))
        for i in range(n):
            img = Image.frombytes("L", (cols, rows), px[i * rows * cols:(i + 1) * rows * cols])
            ratio = rng.uniform(0, 1)
            ratio = a.ratio_min * (a.ratio_max / a.ratio_min) ** ratio
            h = rng.randint(a.min, a.max)
            w = min(a.max, max(a.min, round(h * ratio)))
            q = rng.randint(a.qmin, a.qmax)
            img = img.resize((w, h), Image.BICUBIC)
            img.save(os.path.join(part, split, f"{lb[i]:02d}", f"{i:06d}.jpg"), quality=q)
            sizes.append((w, h))
        print(f"{split}: {n} images", flush=True)
    os.rename(part, a.out)
    ws = sorted(w for w, _ in sizes)
    hs = sorted(h for _, h in sizes)
    print(f"wrote {a.out}: widths {ws[0]}..{ws[-1]} (median {ws[len(ws) // 2]}), "
          f"heights {hs[0]}..{hs[-1]} (median {hs[len(hs) // 2]}), "
          f"JPEG quality {a.qmin}..{a.qmax}, aspect {a.ratio_min:.3f}..{a.ratio_max:.3f}")


if __name__ == "__main__":
    main()
