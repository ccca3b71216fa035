"""Issue #44, item 4: what the synthetic inputs can give the 4-bit rounding without data,
measured on the real ImageNet MobileNetV2 and EfficientNet-Lite1 of ``cle.pretrained``.

Without data the rounding's statistics (each layer's input correlations) come from inputs
distilled from the batch norms' statistics (``cle._measure.synthetic.distill``: Adam on the
inputs, ``STEPS`` steps from white noise). Those match each channel's mean and variance at
every BN; how channels and pixels move together comes only through the BN losses of later
layers, which a few steps do not settle. Each row changes the distillation only:

* ``s<k>``: ``k`` Adam steps instead of the default;
* ``pink``: the distillation starts from noise with a natural image's spectrum (amplitude
  falling as 1/frequency) instead of white noise;
* ``corr<c>``: with ``pink``, a share ``c`` of each pixel's variance common to its channels
  (real pixels are mostly luminance);
* ``distilled`` / ``fields``: the distillation as by default, but the rounding fitted on the
  distilled inputs alone, or on the natural-image fields alone (without data the calibration
  inputs are both: ``SYNTHETIC_CALIBRATION`` distilled, then as many fields across the input
  range; the activation ranges still see both);
* ``real48``: an oracle, not a method: the rounding (``gptq``, the no-data default) fitted
  on 48 real crops (those a build with data fits) with the ridge and correlations it takes on
  real data, everything else without data; how close inputs could bring the rounding;
* ``n<k>``: ``k`` distilled calibration inputs instead of ``SYNTHETIC_CALIBRATION`` (the
  fields as many as before): more for the rounding's statistics, and for the ranges.

``again`` is ``base`` once more, in a process of its own: how far two runs of the same call
fall apart (the no-data route was not bit-reproducible from run to run here; where the
difference enters was not traced).

Run it directly (one network per process; rows of 100 steps take several minutes)::

    .venv/bin/python benchmarks/bench_w4_distill.py --net efficientnet_lite1 \\
        --rows base s100 pink_corr0.8_s100 --json distill.jsonl
    .venv/bin/python scripts/gen_w4a8_results.py --distill distill.jsonl   # the docs' table

Each row is ``cle.quantize(model, weight_bits=4, input_range=...)`` judged as
``benchmarks/bench_w4a8.py`` judges (LiteRT on 256 photo crops against the float Keras model:
top-1 agreement and SQNR). It prints figures and asserts nothing.
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
from cle._core.inputs import ModelInputs  # noqa: E402
from cle._measure import synthetic as S  # noqa: E402
from cle._quantize import pipeline, weight_stages  # noqa: E402

from bench_w4a8 import NETS, _append, _cpu, machine  # noqa: E402

ROWS = ("base", "again", "s100", "pink", "pink_corr0.8", "pink_corr0.8_s100", "s300",
        "pink_corr0.8_s300", "distilled", "fields", "n96", "n160", "real48")


def parse(row):
    """``(steps, start, common share)`` of a row's name."""
    steps, start, corr = S.STEPS, "white", 0.0
    for part in row.split("_"):
        if part.startswith("s") and part[1:].isdigit():
            steps = int(part[1:])
        elif part == "pink":
            start = "pink"
        elif part.startswith("corr"):
            corr = float(part[4:])
    return steps, start, corr


def pink_start(white, corr):
    """A replacement for ``synthetic._start``: images of 1/f-amplitude noise (each image and
    channel of unit variance), a share ``corr`` of the variance common to the channels, put
    in the input's range as the white start is; other inputs start as before."""

    def start(rng, b, shapes, clips):
        xs = []
        for shape, clip in zip(shapes, clips):
            if len(shape) != 3:
                xs.append(white(rng, b, [shape], [clip])[0])
                continue
            h, w, c = shape
            fy, fx = np.fft.fftfreq(h)[:, None], np.fft.rfftfreq(w)[None, :]
            f = np.sqrt(fx ** 2 + fy ** 2)
            f[0, 0] = 1.0 / max(h, w)
            amp = 1.0 / f

            def field(n):
                z = (rng.standard_normal((n, h, w // 2 + 1))
                     + 1j * rng.standard_normal((n, h, w // 2 + 1)))
                x = np.fft.irfft2(z * amp, s=(h, w))
                return ((x - x.mean(axis=(1, 2), keepdims=True))
                        / x.std(axis=(1, 2), keepdims=True))

            common = field(b)[..., None]
            own = field(b * c).reshape(b, c, h, w).transpose(0, 2, 3, 1)
            x = (np.sqrt(corr) * common + np.sqrt(1 - corr) * own).astype(np.float32)
            if clip is not None:
                x = np.clip(x * (clip[1] - clip[0]) / 4 + (clip[0] + clip[1]) / 2, *clip)
            xs.append(x)
        return xs

    return start


def rounding_on(part, round_stage, real=None):
    """A replacement for ``weight_stages.round_stage`` that fits the rounding on one part of
    the no-data calibration inputs: ``"distilled"`` (the first ``SYNTHETIC_CALIBRATION``) or
    ``"fields"`` (the rest), or on ``real`` inputs instead (``"real48"``)."""
    k = pipeline.SYNTHETIC_CALIBRATION

    def stage(equalized, x, *args):
        assert len(x) == k + pipeline.SYNTHETIC_CHECK, len(x)
        if part == "real48":  # with the settings the rounding takes on real data
            saved = weight_stages.SYNTHETIC_DAMP, weight_stages.SYNTHETIC_SHRINK
            weight_stages.SYNTHETIC_DAMP = weight_stages.DATA_DAMP_LOW_BITS
            weight_stages.SYNTHETIC_SHRINK = 0.0
            try:
                return round_stage(equalized, ModelInputs((real,), x.names, x.shapes), *args)
            finally:
                weight_stages.SYNTHETIC_DAMP, weight_stages.SYNTHETIC_SHRINK = saved
        return round_stage(equalized, x[:k] if part == "distilled" else x[k:], *args)

    return stage


def measure(net, rows, json_path=None):
    load, size, prep, input_range = NETS[net]
    model = load()
    x_eval = prep(P.sample_images(256, size, seed=7))
    reference = model.predict(x_eval, batch_size=32, verbose=0)
    real = prep(P.sample_images(64, size, seed=1))[:48]  # the crops a build with data fits
    white, defaults, round_stage = S._start, S.distill.__defaults__, weight_stages.round_stage
    n_distilled = pipeline.SYNTHETIC_CALIBRATION
    try:
        for row in rows:
            pipeline.SYNTHETIC_CALIBRATION = (int(row[1:]) if row[0] == "n" and row[1:].isdigit()
                                              else n_distilled)
            steps, start_kind, corr = parse(row)
            S._start = pink_start(white, corr) if start_kind == "pink" else white
            weight_stages.round_stage = (rounding_on(row, round_stage, real)
                                         if row in ("distilled", "fields", "real48")
                                         else round_stage)
            S.distill.__defaults__ = (steps,) + defaults[1:]
            start = time.perf_counter()
            content, report = cle.quantize(model, weight_bits=4, input_range=input_range)
            seconds = time.perf_counter() - start
            y = Q.run_tflite(content, x_eval, batch_size=32)
            r = {"net": net, "row": row, "steps": steps, "start": start_kind, "common": corr,
                 "distilled": pipeline.SYNTHETIC_CALIBRATION,
                 "top1": Q.top1_agreement(reference, y), "sqnr_db": Q.sqnr_db(reference, y),
                 "n_eval": len(x_eval), "synthesis_loss": report.synthesis_loss,
                 "seconds": seconds, "stages": dict(report.seconds),
                 "load": os.getloadavg()[0], "cpu": _cpu(), "cores": os.cpu_count()}
            print(f"{net:18s} {row:18s} top-1 {r['top1']:.3f}  SQNR {r['sqnr_db']:6.2f} dB  "
                  f"{seconds:4.0f} s (synthesis {r['stages']['synthesize']:.0f} s)  "
                  f"load {r['load']:.1f}", flush=True)
            _append(json_path, r)
    finally:
        S._start, S.distill.__defaults__ = white, defaults
        weight_stages.round_stage = round_stage
        pipeline.SYNTHETIC_CALIBRATION = n_distilled


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(NETS), required=True)
    parser.add_argument("--rows", nargs="+", choices=ROWS, default=["base", "s100"])
    parser.add_argument("--json", help="append every row to this JSON-lines file")
    args = parser.parse_args(argv)
    print(machine(), flush=True)
    measure(args.net, args.rows, args.json)


if __name__ == "__main__":
    main()
