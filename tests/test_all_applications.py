"""Every constructor that ``keras.applications`` exposes, found programmatically (tests/_apps.py).

Each model is built at the smallest square input it accepts, ``weights=None``, with randomized
BN statistics (the spread of trained networks, ``deep=True``) and small random biases, one model
alive at a time. For every model:

* ``equalize_model(objective="weights")`` (which folds every BN it can and scales every set it
  finds; the default objective scales only the sets whose modelled INT8 gain clears a margin,
  which on randomized weights is few or none) is exact at ``RTOL``;
* every BN is either folded or skipped with a reason, every chain end has a reason;
* the input model is untouched.

The smallest variant of each family (``FULL``) is also checked with ``fold_all_batch_norms`` alone
(exact), ``equalize_model(relu6="replace", high_bias_fold="unpadded")`` (runs, finite output) and a
``.keras`` round trip of the equalized model. The larger variants are the same code with other
widths and depths; checking them once keeps the whole file within the CI budget (the largest,
ConvNeXtXLarge, has 350 M parameters even at 32×32).

EfficientNetV2 and ResNet152 are built in float64: randomized float32 EfficientNetV2 drifts by itself (0.6
relative on V2-S in float32 against 4.5e-15 in float64, as measured for issue #10), so a float32 check
would measure the network's conditioning, not the transforms.
"""

import contextlib
import gc

import keras
import numpy as np
import pytest
from _apps import application_constructors, build_smallest
from conftest import (
    RTOL,
    assert_unchanged,
    batch_norms,
    max_rel_error,
    randomize_batch_norms,
    randomize_biases,
    weights_snapshot,
)

import cle

pytestmark = pytest.mark.slow

APPS = application_constructors()

# The smallest variant of each keras.applications family (module): all checks.
FULL = {
    "ConvNeXtTiny", "DenseNet121", "EfficientNetB0", "EfficientNetV2B0", "InceptionResNetV2",
    "InceptionV3", "MobileNet", "MobileNetV2", "MobileNetV3Small", "MobileNetV3Large",
    "NASNetMobile", "ResNet50", "ResNet50V2", "VGG16", "VGG19", "Xception",
}
# ResNet152: float32 round-off alone reaches ~1.3e-5 relative after equalization (ResNet101:
# 3e-6), so it is checked where rounding cannot hide or fake a transform error.
# The deepest EfficientNets drift in float32 as well (B6: 4.9e-5 relative in one run, under
# 1e-5 in another, depending on the randomized statistics), and so does NASNetLarge (1.6e-5 in
# one run), so they are checked in float64 too.
FLOAT64 = ({name for name in APPS if name.startswith("EfficientNetV2")}
           | {"ResNet152", "EfficientNetB5", "EfficientNetB6", "EfficientNetB7", "NASNetLarge"})


def test_every_family_has_a_fully_checked_model():
    assert len(APPS) >= 40, sorted(APPS)  # Keras 3.15 exposes 40
    assert FULL <= set(APPS)
    families = {APPS[name].__module__ for name in APPS}
    assert families == {APPS[name].__module__ for name in FULL}


@contextlib.contextmanager
def _floatx(dtype):
    floatx, policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx(dtype)
    keras.config.set_dtype_policy(dtype)
    try:
        yield
    finally:
        keras.config.set_floatx(floatx)
        keras.config.set_dtype_policy(policy)


# Open: EfficientNetV2L (smallest input, float64, randomized BN) differs after equalize_model by
# 0.81 of max|logit| (softmax output: 1.0), not understood yet; V2S/V2M/V2B* are exact. Strict, so
# that a fix shows up.
_OPEN = {"EfficientNetV2L": "equalize_model differs by 0.81 relative in float64, not understood yet"}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=_OPEN[n])) if n in _OPEN else n
    for n in sorted(APPS)
])
def test_application(name, tmp_path):
    dtype = "float64" if name in FLOAT64 else "float32"
    with _floatx(dtype):
        # The float64 nets are the deep ones whose randomized logits grow so large that a
        # softmax saturates to one-hot (EfficientNetV2M: max|Δ|/max|y| 3e-32, V2L: a flipped
        # argmax gives 1.0): compare their logits instead.
        kwargs = {"classifier_activation": None} if name in FLOAT64 else {}
        keras.utils.set_random_seed(0)  # the same initial kernels in every run (and in CI)
        model, size = build_smallest(APPS[name], **kwargs)
        randomize_biases(randomize_batch_norms(model, seed=11, deep=True), seed=12, scale=0.1)
        x = np.random.default_rng(5).uniform(-1, 1, (2, size, size, 3)).astype(dtype)
        names = [layer.name for layer in model._flatten_layers()]
        snapshot = weights_snapshot(model)
        n_bn = len(batch_norms(model))

        new, report = cle.equalize_model(model, objective="weights", return_report=True)
        err = max_rel_error(model, new, x)
        print(f"{name} {size}x{size} {dtype}: {len(report.folded)}/{n_bn} BNs folded, "
              f"{len(report.sets)} sets, equalize max|Δ|/max|y| = {err:.2e}")
        print(report.summary())
        assert err <= RTOL, f"{name}: max|Δ|/max|y| = {err:.3g} > {RTOL:g}"
        assert len(report.folded) + len(report.fold_skipped) == n_bn
        assert all(s.reason for s in report.fold_skipped)
        assert all(reason for _, reason in report.set_ends)
        if report.sets:  # scaling happened, so the exactness above is not trivial
            assert any(not np.allclose(p.scale_factor, 1.0)
                       for s in report.sets for p in s.cls_pair_info_list)

        if name in FULL:
            pairs, folded = cle.fold_all_batch_norms(model)
            assert len(pairs) == len(report.folded)
            assert max_rel_error(model, folded, x) <= RTOL
            del folded

            path = tmp_path / f"{name}.keras"
            new.save(path)
            loaded = keras.models.load_model(path)
            assert max_rel_error(new, loaded, x) == 0.0
            del loaded

            other = cle.equalize_model(model, relu6="replace", high_bias_fold="unpadded")
            y = keras.ops.convert_to_numpy(other(x, training=False))
            assert np.isfinite(y).all()
            del other

        assert_unchanged(model, snapshot, names)
    del model, new
    gc.collect()
