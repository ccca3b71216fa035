"""Reference outputs of every TF Lite route, for a change that must not change them (a move).

Records, into ``OUT/results.json`` and ``OUT/*.tflite``, the bytes (SHA-256) and reports
(times left out) of ``cle.quantize`` in its modes (with data, ``--compare``, min/max and tail
ranges, 4-bit weights, integer I/O, 16x8, per-tensor, tuning, GPTQ, without data), of
``cle.analyze``, of the public ``convert_to_tflite_int8`` / ``run_tflite`` / ``evaluate`` on a
seeded toy CNN and a two-input, two-output model; with ``--real`` also the real MobileNetV2 at
8 and 4 bits. Record before the change, record after it, then compare::

    python scripts/record_references.py /tmp/before --real      # on the old checkout
    python scripts/record_references.py /tmp/after --real       # on the new one
    python scripts/record_references.py --compare /tmp/before /tmp/after

Two recordings of the same checkout are identical (TensorFlow and JAX backends, AMD EPYC).
"""
import hashlib
import json
import os
import sys

if sys.argv[1] == "--compare":
    a, b = (json.load(open(os.path.join(d, "results.json"))) for d in sys.argv[2:4])
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    print(f"{len(a)} and {len(b)} entries; differ: {differ or 'none'}")
    sys.exit(1 if differ else 0)
out = sys.argv[1]
os.makedirs(out, exist_ok=True)

import keras  # noqa: E402  (after --compare, which needs none of them)
import numpy as np  # noqa: E402

from cle import pretrained as P  # noqa: E402
from cle import quantization as Q  # noqa: E402
import cle  # noqa: E402
L = keras.layers


def toy(seed=0):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((24, 24, 3))
    x = L.Conv2D(8, 3, padding="same", use_bias=False)(inp)
    x = L.BatchNormalization()(x); x = L.ReLU(6.0)(x)
    x = L.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
    x = L.BatchNormalization()(x); x = L.ReLU(6.0)(x)
    x = L.Conv2D(16, 1, use_bias=False)(x)
    x = L.BatchNormalization()(x); x = L.ReLU()(x)
    x = L.GlobalAveragePooling2D()(x)
    y = L.Dense(10, activation="softmax")(x)
    m = keras.Model(inp, y)
    rng = np.random.default_rng(seed)
    for l in m.layers:
        if isinstance(l, L.BatchNormalization):
            c = l.moving_mean.shape[0]
            l.gamma.assign(rng.uniform(0.2, 2, c)); l.beta.assign(rng.normal(0, .5, c))
            l.moving_mean.assign(rng.normal(0, .5, c)); l.moving_variance.assign(rng.uniform(.2, 2, c))
    return m


def two_io(seed=1):
    keras.utils.set_random_seed(seed)
    a = keras.Input((16, 16, 3), name="img"); b = keras.Input((5,), name="side")
    x = L.Conv2D(8, 3, padding="same")(a); x = L.BatchNormalization()(x); x = L.ReLU()(x)
    x = L.GlobalAveragePooling2D()(x)
    x = L.Concatenate()([x, L.Dense(4, activation="relu")(b)])
    cls = L.Dense(12, activation="softmax", name="cls")(x)
    box = L.Dense(4, name="box")(x)
    return keras.Model({"img": a, "side": b}, {"cls": cls, "box": box})


def strip(d):
    if isinstance(d, dict):
        return {k: strip(v) for k, v in d.items() if k not in ("seconds",)}
    if isinstance(d, list):
        return [strip(v) for v in d]
    return d


results = {}
def rec(name, content, report=None, extra=None):
    path = os.path.join(out, name + ".tflite")
    if content is not None:
        open(path, "wb").write(content)
    results[name] = {"sha": None if content is None else hashlib.sha256(content).hexdigest(),
                     "report": None if report is None else strip(report.to_dict()),
                     "extra": extra}
    print(name, results[name]["sha"], flush=True)


m = toy()
x = np.random.default_rng(0).normal(0, 1, (48, 24, 24, 3)).astype("float32")
for name, kw in [("toy_data", {}), ("toy_compare", {"compare": True}),
                 ("toy_minmax", {"ranges": "minmax"}), ("toy_pct", {"ranges": "percentile"}),
                 ("toy_w4", {"weight_bits": 4}), ("toy_io", {"integer_io": True}),
                 ("toy_a16", {"activation_bits": 16}), ("toy_pt", {"per_channel": False}),
                 ("toy_tune", {"tune": True}), ("toy_gptq", {"rounding": "gptq"})]:
    try:
        c, r = cle.quantize(m, x, **kw)
    except Exception as e:
        results[name] = {"error": str(e)}; continue
    rec(name, c, r)
for name, kw in [("toy_nodata", {}), ("toy_nodata_w4", {"weight_bits": 4})]:
    c, r = cle.quantize(m, None, input_range=(-1, 1), **kw)
    rec(name, c, r)
a = cle.analyze(m, x)
results["toy_analyze"] = {"report": strip(a.to_dict())}
# public API
c = Q.convert_to_tflite_int8(m, x[:16])
y = Q.run_tflite(c, x[:8])
rec("api_convert", c, extra={"run": np.asarray(y).round(7).tolist()})
c = Q.convert_to_tflite_int8(m, x[:16], per_channel=False)
rec("api_convert_pt", c)
ev = Q.evaluate(m, x[:16], m.predict(x[:16], verbose=0))
results["api_evaluate"] = {"extra": repr(ev)}

m2 = two_io()
rng = np.random.default_rng(1)
x2 = {"img": rng.uniform(0, 1, (40, 16, 16, 3)).astype("float32"),
      "side": rng.normal(0, 1, (40, 5)).astype("float32")}
c, r = cle.quantize(m2, x2, compare=True, output_kinds={"box": "values"})
rec("two_io", c, r)
a = cle.analyze(m2, x2)
results["two_io_analyze"] = {"report": strip(a.to_dict())}

if "--real" in sys.argv:
    mv2 = P.mobilenet_v2_imagenet()
    xs = P.sample_images(48, seed=5)
    xs = P.preprocess_imagenet(xs)
    c, r = cle.quantize(mv2, xs)
    rec("mv2_data", c, r)
    c, r = cle.quantize(mv2, xs, weight_bits=4)
    rec("mv2_w4", c, r)
json.dump(results, open(os.path.join(out, "results.json"), "w"), indent=1, sort_keys=True, default=str)
print("done")
