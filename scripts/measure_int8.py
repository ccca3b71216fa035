"""Measure INT8 fidelity of equalization variants on a real pretrained network.

Usage: python scripts/measure_int8.py [--net mobilenet_v2] [--variants a,b,...] [--eval N] [--calib N]
Prints one row per variant: TFLite full INT8 per-tensor / per-channel, top-1 agreement and
logit SQNR against the original float model.
"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402

import cle  # noqa: E402
from cle import pretrained, quantization as q  # noqa: E402


NETS = {
    "mobilenet_v2": (pretrained.mobilenet_v2_imagenet, pretrained.preprocess_imagenet, 224),
    "efficientnet_lite1": (pretrained.efficientnet_lite1_imagenet,
                           pretrained.preprocess_efficientnet_lite, pretrained.LITE1_INPUT_SIZE),
}


def variants(model, calib):
    # (index: name, builder)
    yield "BN folding only", lambda: cle.fold_all_batch_norms(model)[1]
    yield "weight-only CLE (AIMET)", lambda: cle.equalize_model(model, objective="weights")
    yield "equalize_model() defaults", lambda: cle.equalize_model(model)
    yield "defaults, per-tensor target", lambda: cle.equalize_model(model, per_channel_weights=False)
    yield "per-tensor target + analytic BC", lambda: cle.equalize_model(
        model, per_channel_weights=False, bias_correction="analytic")
    yield "calibration ranges", lambda: cle.equalize_model(
        model, activation_ranges="calibration", calibration_data=calib)
    yield "calibration ranges, per-tensor target", lambda: cle.equalize_model(
        model, activation_ranges="calibration", calibration_data=calib, per_channel_weights=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--net", default="mobilenet_v2")
    ap.add_argument("--variants", default="")
    ap.add_argument("--eval", type=int, default=128)
    ap.add_argument("--calib", type=int, default=64)
    ap.add_argument("--granularity", default="pt,pc")
    args = ap.parse_args()
    build, prep, size = NETS[args.net]
    model = build()
    x = prep(pretrained.sample_images(args.eval, size=size, seed=0))
    xc = prep(pretrained.sample_images(args.calib, size=size, seed=1))
    ref = model.predict(x, verbose=0, batch_size=32)
    wanted = [v for v in args.variants.split(",") if v]
    for i, (name, make) in enumerate(variants(model, xc)):
        if wanted and str(i) not in wanted:
            continue
        t = time.time()
        m = make()
        y = m.predict(x, verbose=0, batch_size=32)
        row = {"variant": name, "float_sqnr": round(q.sqnr_db(ref, y), 1)}
        for g in args.granularity.split(","):
            content = q.convert_to_tflite_int8(m, xc, per_channel=(g == "pc"))
            yq = q.run_tflite(content, x, batch_size=32)
            row[g] = (round(q.top1_agreement(ref, yq), 3), round(q.sqnr_db(ref, yq), 2))
        row["s"] = round(time.time() - t)
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
