# ImageNet-like JPEGs for the input-pipeline benchmark: DIR/train/<class>/*.jpg and DIR/test/...,
# about 500x375 (sizes and aspect ratios vary a little, as ImageNet's do), content with detail
# at every scale (smooth colour fields, shapes, texture, sensor noise) so that JPEG file sizes
# and decode times are those of photos (~60-120 kB at quality 90), not of flat synthetic images.
# Usage: python make_photos.py DIR [train_per_class] [classes] [test_per_class]   (pip install pillow numpy)
import os, sys
import numpy as np
from PIL import Image, ImageDraw, ImageFilter

root = sys.argv[1]
per_class = int(sys.argv[2]) if len(sys.argv) > 2 else 200
classes = int(sys.argv[3]) if len(sys.argv) > 3 else 10
test_per_class = int(sys.argv[4]) if len(sys.argv) > 4 else 10
rng = np.random.default_rng(0)

def photo(c, k):
    w = int(rng.integers(440, 561)); h = int(round(w * rng.choice([0.75, 0.75, 0.667, 0.8, 1.333])))
    h = min(max(h, 300), 560)
    # Smooth colour field: a few random pixels upscaled (lighting, sky, background), tinted per class.
    base = rng.integers(0, 256, (4, 5, 3), dtype=np.uint8)
    base = (0.6 * base + 0.4 * np.array([(37 * c) % 256, (91 * c) % 256, (53 * c) % 256])).astype(np.uint8)
    img = Image.fromarray(base).resize((w, h), Image.BICUBIC)
    d = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(8, 20))):  # objects: ellipses and polygons of random colour
        x, y = int(rng.integers(0, w)), int(rng.integers(0, h)); r = int(rng.integers(10, 120))
        col = tuple(int(v) for v in rng.integers(0, 256, 3))
        if rng.random() < 0.5:
            d.ellipse([x - r, y - r // 2, x + r, y + r // 2], fill=col)
        else:
            d.polygon([(x + int(rng.integers(-r, r)), y + int(rng.integers(-r, r))) for _ in range(5)], fill=col)
    img = img.filter(ImageFilter.GaussianBlur(1.2))
    a = np.asarray(img).astype(np.float32)
    # Texture at a middle scale (foliage, fabric) and fine noise (sensor grain).
    tex = np.asarray(Image.fromarray(rng.integers(0, 256, (h // 4, w // 4), dtype=np.uint8)).resize((w, h), Image.BILINEAR)).astype(np.float32)
    a += (tex[..., None] - 128) * 0.25 + rng.normal(0, 6, a.shape)
    return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8))

for split, n in (("train", per_class), ("test", test_per_class)):
    for c in range(classes):
        d = os.path.join(root, split, f"class{c:02d}")
        os.makedirs(d, exist_ok=True)
        for k in range(n):
            photo(c, k).save(os.path.join(d, f"{k:05d}.jpg"), quality=int(rng.integers(85, 96)))
print(f"wrote {classes * (per_class + test_per_class)} JPEGs to {root}")
