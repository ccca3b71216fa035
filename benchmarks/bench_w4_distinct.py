"""Issue #44's goal with the calibration a user has: 64 distinct photos, not 64 crops of nine.

``bench_w4_generalize.py`` calibrates on crops of ``cle.pretrained``'s nine sample photos, as
the docs' tables do, and finds that the 4-bit rounding learns those photos: on photos they do
not hold it reads far below its own check. Here the calibration is one crop of each of 64
distinct photos of ``photo_pool.py`` (GCompris' activity photos: animals, fish, tools,
objects, monuments), and every build is judged on a centre crop of each photo of the pool's
other packages (wallpapers, OpenCV's samples, a photo album, Tux Paint's templates, photos in
wheels): other photographers, other subjects. The same network is also calibrated on the nine
photos' 64 crops (the docs' protocol) and judged on the same photos, for comparison.

Rows, each ``(calibration, build)``: ``baseline`` (the float model straight into TF Lite's
converter at W8A8 with the 64 inputs: the issue's goal), ``int8`` (``cle.quantize(model, x)``,
cle's 8-bit default), ``w4`` (``cle.quantize(model, x, weight_bits=4)``, the default
rounding); each with ``pool`` (64 distinct photos) or ``nine`` (crops of the nine) calibration.
Printed: top-1 agreement and logit SQNR against the float Keras model (LiteRT), the build's own
claim (its check on the 16 inputs it held out), seconds.

    python benchmarks/photo_pool.py ~/.cache/cle-photos             # once: fetch the photos
    python benchmarks/bench_w4_distinct.py --pool ~/.cache/cle-photos --net efficientnet_lite0

It prints figures and asserts nothing.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import cle  # noqa: E402
from cle import pretrained as P  # noqa: E402
from cle import quantization as Q  # noqa: E402
from cle._pretrained.networks import crop_photos  # noqa: E402

import photo_pool  # noqa: E402
from bench_w4_generalize import GENERALIZE_NETS  # noqa: E402
from bench_w4a8 import _append, _cpu, machine  # noqa: E402

#: The package whose photos calibrate; every other package's photos judge.
CALIBRATION_SOURCE = "gcompris-qt-data"
ROWS = ("pool:baseline", "pool:w4", "pool:int8", "nine:baseline", "nine:w4")
#: The share of each photo's shorter side its centre crop keeps (ImageNet's evaluation crop).
CENTRE = 0.875


def centre_crop(image, size):
    """The central square of ``CENTRE`` of the shorter side, resized to ``size``."""
    from PIL import Image

    h, w = image.shape[:2]
    side = int(min(h, w) * CENTRE)
    top, left = (h - side) // 2, (w - side) // 2
    return np.asarray(Image.fromarray(image[top:top + side, left:left + side]).resize(
        (size, size), Image.BILINEAR))


def inputs(root, size, prep):
    """``(calibration by protocol, evaluation)``: 64 crops of 64 distinct pool photos (drawn
    with seed 0 from :data:`CALIBRATION_SOURCE`'s) or of the nine sample photos; a centre
    crop of every photo of the other packages."""
    judged = photo_pool.paths(root, exclude=(CALIBRATION_SOURCE,))
    own = photo_pool.paths(root, sources=(CALIBRATION_SOURCE,))
    drawn = [own[i] for i in np.random.default_rng(0).permutation(len(own))[:64]]
    calibration = {"pool": prep(crop_photos([photo_pool.load(p) for p in drawn], 64, size, 1)),
                   "nine": prep(P.sample_images(64, size, seed=1))}
    evaluation = prep(np.stack([centre_crop(photo_pool.load(p), size) for p in judged]))
    return calibration, evaluation


def measure(net, root, rows, json_path=None):
    load, size, prep, _ = GENERALIZE_NETS[net]
    model = load()
    calibration, x_eval = inputs(root, size, prep)
    reference = model.predict(x_eval, batch_size=32, verbose=0)
    for row in rows:
        source, build = row.split(":")
        x = calibration[source]
        start = time.perf_counter()
        claim = None
        if build == "baseline":
            content = Q.convert_to_tflite_int8(model, x, per_channel=True)
        else:
            content, report = cle.quantize(model, x, **({"weight_bits": 4} if build == "w4"
                                                        else {}))
            claim = report.sqnr_db
        y = Q.run_tflite(content, x_eval, batch_size=32)
        r = {"net": net, "calibration": source, "row": build, "judged": len(x_eval),
             "top1": Q.top1_agreement(reference, y), "sqnr_db": Q.sqnr_db(reference, y),
             "claim": claim, "seconds": time.perf_counter() - start,
             "load": os.getloadavg()[0], "cpu": _cpu(), "cores": os.cpu_count()}
        print(f"{net:18s} {source:4s} {build:8s} top-1 {r['top1']:.3f}  SQNR "
              f"{r['sqnr_db']:6.2f} dB  claimed {'-' if claim is None else f'{claim:.2f}'}  "
              f"{r['seconds']:5.0f} s  load {r['load']:.1f}", flush=True)
        _append(json_path, r)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(GENERALIZE_NETS), default="mobilenet_v2")
    parser.add_argument("--pool", default=os.path.expanduser("~/.cache/cle-photos"),
                        help="where benchmarks/photo_pool.py made the photos")
    parser.add_argument("--rows", nargs="*", choices=ROWS, default=list(ROWS))
    parser.add_argument("--json", help="append every row to this JSON-lines file")
    args = parser.parse_args(argv)
    print(machine(), flush=True)
    measure(args.net, args.pool, args.rows, args.json)


if __name__ == "__main__":
    main()
