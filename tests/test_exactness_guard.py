"""The exactness guard (cle._transforms.exactness): a prepared float model that does not compute
what the input model computes stops `cle.quantize` and `equalize_model` (with data) with an
error naming the first layer whose output diverges; an exact one passes untouched."""

import keras
import numpy as np
import pytest

import cle
from cle._core import rebuild as rebuild_module
from cle._transforms import exactness
from conftest import no_tflite_on_torch, randomize_batch_norms

L = keras.layers


@pytest.fixture(scope="module")
def net():
    """Normalization → conv/BN/ReLU6 → depthwise/BN/ReLU6 → 1x1 conv/BN → pooling → Dense:
    a scaled triplet, folded BNs, an adapted Normalization, with spread BN statistics."""
    rng = np.random.default_rng(0)
    x = rng.normal(5.0, 3.0, (48, 12, 12, 3)).astype("float32")
    norm = L.Normalization(name="norm")
    norm.adapt(x)
    inp = keras.Input((12, 12, 3))
    h = L.ReLU(6.0)(L.BatchNormalization()(L.Conv2D(8, 3, name="conv_a")(norm(inp))))
    h = L.ReLU(6.0)(L.BatchNormalization()(L.DepthwiseConv2D(3, name="dw")(h)))
    h = L.BatchNormalization()(L.Conv2D(8, 1, name="conv_b")(h))
    out = L.Dense(5, name="head")(L.GlobalAveragePooling2D()(h))
    model = keras.Model(inp, out)
    randomize_batch_norms(model, seed=2)
    return model, x


def test_an_exact_build_passes_and_the_input_model_is_kept(net):
    model, x = net
    equalized, report = cle.equalize_model(model, calibration_data=x, bias_correction="empirical", objective="weights",
                                            return_report=True)
    assert report.folded and report.sets  # the guard looked at real folds and scalings
    # bias correction changed the model on purpose after the guard: close, not exact
    assert 20.0 < min(exactness.output_sqnrs(model, equalized, _inputs(model, x))) < 80.0
    exact = cle.equalize_model(model, objective="weights")
    assert min(exactness.output_sqnrs(model, exact, _inputs(model, x))) > 80.0


def _inputs(model, x):
    from cle._core.inputs import check_calibration_data

    return check_calibration_data(model, x)


def test_a_layer_whose_state_is_lost_is_named(net, monkeypatch):
    model, x = net
    monkeypatch.setattr(rebuild_module, "_carry_state", lambda old, new: None)
    with pytest.raises(exactness.NotExactError,
                       match=r"output 'head' is at .* dB .* layer 'norm' \(Normalization\) was "
                             r"not changed and its inputs are the same"):
        cle.equalize_model(model, calibration_data=x, bias_correction="empirical", objective="weights")


def test_an_edited_layer_that_went_wrong_is_named(net, monkeypatch):
    model, x = net
    real = rebuild_module.LayerEdit.new_values

    def spoiled(self, dtype=None):  # the depthwise kernel's planned values, one tap moved
        values = real(self, dtype)
        kernel = values.get("kernel")
        if kernel is not None and kernel.ndim == 4 and kernel.shape[-1] == 1:
            kernel = np.array(kernel, copy=True)
            kernel[1, 1, :, 0] += 3.0 * np.abs(kernel).max()
            values["kernel"] = kernel
        return values

    monkeypatch.setattr(rebuild_module.LayerEdit, "new_values", spoiled)
    with pytest.raises(exactness.NotExactError,
                       match=r"layer 'dw' \(DepthwiseConv2D\) is the first whose output differs "
                             r"by more than a per-channel scale and offset"):
        cle.equalize_model(model, calibration_data=x, bias_correction="empirical", objective="weights")


@no_tflite_on_torch
def test_quantize_stops_on_a_model_that_is_not_exact(net, monkeypatch):
    model, x = net
    monkeypatch.setattr(rebuild_module, "_carry_state", lambda old, new: None)
    with pytest.raises(exactness.NotExactError, match="layer 'norm'"):
        cle.quantize(model, x)


def test_the_guard_holds_off_where_the_options_change_the_model(net, monkeypatch):
    """relu6="replace" changes the float model on purpose: no guard there."""
    model, x = net
    monkeypatch.setattr(rebuild_module, "_carry_state", lambda old, new: None)
    cle.equalize_model(model, calibration_data=x, bias_correction="empirical", objective="weights",
                       relu6="replace")


def test_the_guard_sees_the_model_before_analytic_bias_correction(net, monkeypatch):
    """Analytic bias correction is written into the plan before the rebuild: the guard
    measures the model with those corrections taken out, and they are back afterwards."""
    from cle._core.graph import graph_view
    from cle._transforms.equalize import equalize_checked
    from cle._transforms.options import EqualizeOptions

    model, x = net
    seen = {}
    real_guard = exactness.guard

    def spy(view, prepared, clones, bypass, edited, inputs, what):
        seen["guarded"] = {w.path: np.array(w) for w in prepared.weights}
        real_guard(view, prepared, clones, bypass, edited, inputs, what)

    monkeypatch.setattr(exactness, "guard", spy)
    opts = EqualizeOptions(bias_correction="analytic", objective="weights")
    new, report = equalize_checked(model, graph_view(model), opts, None,
                                   guard_inputs=_inputs(model, x))
    deltas = {r.layer: r.max_abs_delta for r in report.bias_corrections if r.max_abs_delta > 0}
    assert len(deltas) >= 2
    for w in new.weights:
        layer, _, attr = w.path.rpartition("/")
        moved = np.abs(seen["guarded"][w.path].astype(np.float64) - np.array(w)).max()
        if attr == "bias" and layer in deltas:  # inside the guard: the planned bias + delta
            np.testing.assert_allclose(moved, deltas[layer], rtol=1e-3, err_msg=w.path)
        else:
            assert moved == 0.0, w.path
