"""How much photos differ in contrast, against the synthetic inputs of a run without data.

Without data, half of the calibration inputs and one of the two check sets are
natural-image-like fields (``cle._measure.input_range.natural_inputs``). Models that normalize a
whole image or patch (a LayerNormalization over positions, a Dense over a map's pixels) meet
on a flat photo values that fields of one contrast never reach, and calibrated on those
fields they clip them. This prints the spread of the contrast between images, the
interquartile range of the log of each image's standard deviation in units of a normal
distribution's (1.349), and its low percentiles (the flat images), for:

* the photo pool of ``benchmarks/photo_pool.py`` (386 distinct photos), each photo brought to
  the size whole, and a crop of that size from the photo brought to 256 px;
* the synthetic fields with ``CONTRAST_SPREAD`` and without (``contrast_spread=0``).

    python benchmarks/bench_contrast.py ~/.cache/cle-photos

It prints figures, it asserts nothing (``CONTRAST_SPREAD`` was set from them).
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SIZES = (16, 32, 64, 128, 224)


def spread(stds):
    """(the robust spread of log std, its 1st and 5th percentiles below the median)."""
    logs = np.log(np.maximum(np.asarray(stds), 1e-4))
    q1, q3 = np.percentile(logs, [25, 75])
    low = np.percentile(logs - np.median(logs), [1, 5])
    return (q3 - q1) / 1.349, low[0], low[1]


def pool_rows(root):
    from PIL import Image

    import photo_pool

    rng = np.random.default_rng(0)
    images = [Image.open(p).convert("RGB") for p in photo_pool.paths(root)]
    rows = []
    for size in SIZES:
        whole = [np.asarray(im.resize((size, size)), np.float32).std() / 255 for im in images]
        crops = []
        for im in images:
            a = np.asarray(im.resize((256, 256)), np.float32) / 255
            y, x = rng.integers(0, 257 - size, 2)
            crops.append(a[y:y + size, x:x + size].std())
        rows += [(f"pool, whole photos at {size} px", *spread(whole)),
                 (f"pool, {size} px crops of 256 px photos", *spread(crops))]
    return rows


def field_rows():
    from cle._measure import input_range as IR

    rows = []
    for size in SIZES:
        for s, label in ((IR.CONTRAST_SPREAD, "CONTRAST_SPREAD"), (0.0, "one contrast")):
            x = np.clip(IR.natural_images(256, size, size, seed=1, contrast_spread=s), 0, 255)
            rows.append((f"fields at {size} px, {label}", *spread(x.std(axis=(1, 2, 3)) / 255)))
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    rows = (pool_rows(argv[0]) if argv else []) + field_rows()
    print(f"{'images':46s} {'spread':>7s} {'1st pct':>8s} {'5th pct':>8s}")
    for label, s, p1, p5 in rows:
        print(f"{label:46s} {s:7.2f} {p1:8.2f} {p5:8.2f}")


if __name__ == "__main__":
    main()
