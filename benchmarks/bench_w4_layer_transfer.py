"""Issue #44: where the 4-bit rounding learns its calibration photos, layer by layer.

Run it directly (one network per process; about ten minutes on 2 cores for
EfficientNet-Lite0)::

    .venv/bin/python benchmarks/bench_w4_layer_transfer.py --net efficientnet_lite0

``cle.quantize(model, x64, weight_bits=4)`` runs as ``benchmarks/bench_w4_generalize.py``
runs it; its rounding stage's model is kept before and after the rounding. Then, in Keras
(float activations), for every kernel the stage put on a 4-bit grid: the logits' SQNR (dB)
against the float model with that kernel alone rounded (the others float), as the stage
rounded it (with its bias) and to nearest on its grid (the rounding stage's own nearest
rounding; bias as it was), on 256 other crops of the nine calibration photos and on
256 crops of the new photos (``bench_w4_generalize.new_photos``). A kernel whose rounding gains
much more over nearest on the crops than on the new photos has learnt the calibration photos.

It prints one line per kernel and asserts nothing.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import argparse  # noqa: E402

import numpy as np  # noqa: E402

import cle  # noqa: E402
from cle import pretrained as P  # noqa: E402
from cle._pretrained.networks import crop_photos  # noqa: E402
from cle._quantize import rounding, weight_stages  # noqa: E402

from bench_w4_generalize import GENERALIZE_NETS, new_photos  # noqa: E402


def _sqnr(reference, y) -> float:
    return float(10 * np.log10((reference ** 2).sum() / ((reference - y) ** 2).sum()))


def measure(net):
    load, size, prep, _ = GENERALIZE_NETS[net]
    model = load()
    x_cal = prep(P.sample_images(64, size, seed=1))
    sets = {"crops": prep(P.sample_images(256, size, seed=7)),
            "new photos": prep(crop_photos(new_photos(), 256, size, seed=3))}
    held = {}
    stage = weight_stages.round_model

    def round_model(rounded, *args, **kwargs):
        held["model"] = rounded
        held["float"] = {layer.name: layer.get_weights() for layer in rounded.layers}
        result = stage(rounded, *args, **kwargs)
        held["rounded"] = {layer.name: layer.get_weights() for layer in rounded.layers}
        held["report"] = result[0]
        return result

    weight_stages.round_model = round_model
    try:
        cle.quantize(model, x_cal, weight_bits=4)
    finally:
        weight_stages.round_model = stage
    m, floats, rounded = held["model"], held["float"], held["rounded"]
    for layer in m.layers:
        layer.set_weights(floats[layer.name])
    refs = {k: m.predict(x, batch_size=32, verbose=0) for k, x in sets.items()}
    four = [r.layer for r in held["report"].layers if r.bits == 4 and r.kind != "pointwise"]
    print(f"{'kernel':28s} {'weights':>9s}  rounded / nearest: crops | new photos (dB)")
    for name in four:
        layer, row = m.get_layer(name), {}
        for how in ("rounded", "nearest"):
            if how == "rounded":
                layer.set_weights(rounded[name])
            else:  # per channel, as the stage rounds 4-bit kernels by default
                for part in rounding.parts(layer):
                    rounding._to_nearest(layer, part, 4, False)
            row[how] = {k: _sqnr(refs[k], m.predict(x, batch_size=32, verbose=0))
                        for k, x in sets.items()}
            layer.set_weights(floats[name])
        print(f"{name:28s} {floats[name][0].size:9,d}  "
              f"{row['rounded']['crops']:6.2f} / {row['nearest']['crops']:6.2f} | "
              f"{row['rounded']['new photos']:6.2f} / {row['nearest']['new photos']:6.2f}",
              flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--net", choices=sorted(GENERALIZE_NETS), default="efficientnet_lite0")
    measure(parser.parse_args(argv).net)


if __name__ == "__main__":
    main()
