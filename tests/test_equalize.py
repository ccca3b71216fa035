"""equalize_model and the ReLU6 replacements: exactness, report, guarantees."""

import json

import keras
import numpy as np
import pytest
from conftest import (
    RTOL,
    assert_unchanged,
    inputs_for,
    max_rel_error,
    needs_nchw_conv,
    outputs,
    randomize_batch_norms,
    randomize_biases,
    real_mobilenet_v2,
    tensorflow_only,
    weights_snapshot,
)

import cle
from cle._math import equalization

L = keras.layers


def _rand(model, deep=False):
    return randomize_biases(randomize_batch_norms(model, deep=deep), scale=0.1 if deep else 0.5)


def _mobile_block(relu6_form="layer", residual=False):
    """conv → BN → ReLU6 → depthwise → BN → ReLU6 → conv → BN (MobileNetV2's block)."""
    inp = keras.Input((12, 12, 4))

    def relu6(x, name):
        if relu6_form == "layer":
            return L.ReLU(6.0, name=name)(x)
        return L.Activation("relu6", name=name)(x)

    x = relu6(L.BatchNormalization(name="bn1")(L.Conv2D(8, 1, name="expand")(inp)), "r1")
    x = relu6(L.BatchNormalization(name="bn2")(L.DepthwiseConv2D(3, padding="same", name="dw")(x)), "r2")
    x = L.BatchNormalization(name="bn3")(L.Conv2D(4, 1, name="project")(x))
    if residual:
        x = L.Add(name="add")([x, inp])
    return _rand(keras.Model(inp, x))


@pytest.mark.parametrize("form", ["layer", "activation"])
def test_bound_relu6_is_exact_and_makes_a_triplet(form):
    model = _mobile_block(form)
    snap, names = weights_snapshot(model), [la.name for la in model._flatten_layers()]
    x = inputs_for(model) * 4  # drive the ReLU6 caps
    new, report = cle.equalize_model(model, objective="weights", high_bias_fold="none", return_report=True)
    assert len(report.folded) == 3
    assert [[(p.layer1.name, p.layer2.name) for p in s.cls_pair_info_list] for s in report.sets] == [
        [("expand", "dw"), ("dw", "project")]]
    assert sorted(report.relu6_changed) == ["r1", "r2"]
    assert isinstance(new.get_layer("r1"), cle.ClippedReLU)
    caps = np.asarray(new.get_layer("r1").caps)
    assert not np.allclose(caps, 6.0)  # the caps followed the scale factors
    assert max_rel_error(model, new, x) <= RTOL
    assert_unchanged(model, snap, names)


def test_fused_relu6_is_split_into_a_clipped_relu():
    inp = keras.Input((10, 10, 3))
    x = L.Conv2D(6, 3, activation="relu6", name="c1")(inp)
    x = L.Conv2D(4, 3, name="c2")(x)
    model = _rand(keras.Model(inp, x))
    x_in = inputs_for(model) * 5
    new, report = cle.equalize_model(model, objective="weights", return_report=True)
    assert report.relu6_changed == ["c1 (fused activation)"]
    assert isinstance(new.get_layer("c1_relu6"), cle.ClippedReLU)
    assert keras.activations.serialize(new.get_layer("c1").activation) == "linear"
    assert len(report.sets) == 1
    assert max_rel_error(model, new, x_in) <= RTOL


def test_keep_mode_leaves_relu6_and_ends_the_set():
    model = _mobile_block()
    new, report = cle.equalize_model(model, objective="weights", relu6="keep", return_report=True)
    assert report.sets == [] and report.relu6_changed == []
    ends = dict(report.set_ends)
    assert "'r1' is a ReLU capped at 6.0 (relu6='keep')" in ends["expand"]
    assert isinstance(new.get_layer("r1"), L.ReLU)
    assert max_rel_error(model, new, inputs_for(model) * 4) <= RTOL


def test_replace_mode_changes_relu6_to_relu():
    model = _mobile_block("activation")
    new, report = cle.equalize_model(model, objective="weights", relu6="replace", high_bias_fold="none",
                                      return_report=True)
    assert sorted(report.relu6_changed) == ["r1", "r2"]
    assert type(new.get_layer("r1")) is L.ReLU and new.get_layer("r1").max_value is None
    # Equal to the original with the caps removed, i.e. to replace_relu6_with_relu(model).
    relu_model, replaced = cle.replace_relu6_with_relu(model)
    assert sorted(replaced) == ["r1", "r2"]
    x = inputs_for(model) * 4
    assert max_rel_error(relu_model, new, x) <= RTOL
    assert max_rel_error(model, new, x) > RTOL  # replacing ReLU6 does change the function


def test_replace_relu6_every_form():
    inp = keras.Input((8, 8, 3))
    x = L.Conv2D(4, 3, activation="relu6", name="fused")(inp)
    x = L.ReLU(max_value=6, name="relu_layer")(L.Conv2D(4, 1, name="c2")(x))
    x = L.Activation("relu6", name="act_layer")(L.Conv2D(4, 1, name="c3")(x))
    x = L.ReLU(max_value=4, name="relu4")(x)  # not a ReLU6: untouched
    x = L.Dense(3, activation=keras.activations.relu6, name="dense")(x)
    model = _rand(keras.Model(inp, x))
    new, replaced = cle.replace_relu6_with_relu(model)
    assert sorted(replaced) == sorted(["fused (fused activation)", "relu_layer", "act_layer",
                                       "dense (fused activation)"])
    assert new.get_layer("relu4").max_value == 4
    for name in ("fused", "dense"):
        assert keras.activations.serialize(new.get_layer(name).activation) == "relu"
    bounded, replaced2 = cle.replace_relu6_with_clipped_relu(model)
    assert sorted(replaced2) == sorted(replaced)
    x = inputs_for(model) * 5
    assert max_rel_error(model, bounded, x) <= RTOL  # bounding changes nothing
    assert isinstance(bounded.get_layer("fused_relu6"), cle.ClippedReLU)


def test_high_bias_fold_defaults_skip_padded_layers_and_stay_exact_above_c():
    # conv -> BN(beta large) -> ReLU -> conv 1x1 (valid) and -> depthwise 3x3 same.
    inp = keras.Input((10, 10, 3))
    x = L.ReLU(name="r1")(L.BatchNormalization(name="bn1")(L.Conv2D(6, 1, name="c1")(inp)))
    x = L.Conv2D(6, 1, name="c2")(x)
    x = L.ReLU(name="r2")(L.BatchNormalization(name="bn2")(x))
    x = L.DepthwiseConv2D(3, padding="same", name="dw")(x)
    model = keras.Model(inp, x)
    _rand(model)
    # Large β (the absorption is 6 - 3·0.5 = 4.5 per channel) with spread, per-channel μ and σ²
    # (trivial ones would make a wrong fold look exact).
    rng = np.random.default_rng(21)
    for bn in ("bn1", "bn2"):
        layer = model.get_layer(bn)
        layer.beta.assign(np.full(6, 6.0))
        layer.gamma.assign(np.full(6, 0.5))
        layer.moving_mean.assign(rng.uniform(-0.5, 0.5, 6))
        layer.moving_variance.assign(rng.uniform(0.5, 2.0, 6))
    # Small inputs keep bn1's pre-activations within beta ± 3|gamma| (bn2's absorption, into
    # the padded 'dw', is skipped): absorption is exact. Checked, not assumed: (y - μ)/σ >= -3.
    x_in = inputs_for(model) * 0.05
    for bn in ("bn1",):
        layer = model.get_layer(bn)
        y = outputs(keras.Model(model.inputs, layer.input), x_in)[0]
        z = (y - np.asarray(layer.moving_mean)) / np.sqrt(np.asarray(layer.moving_variance)
                                                        + layer.epsilon)
        assert z.min() >= -3.0, (bn, z.min())
    new, report = cle.equalize_model(model, objective="weights", high_bias_fold="unpadded",
                                     return_report=True)
    recs = {(r.layer1, r.layer2): r for r in report.bias_absorptions}
    assert recs[("c1", "c2")].absorbed and recs[("c1", "c2")].channels == 6
    assert not recs[("c2", "dw")].absorbed and "zero-pads its input" in recs[("c2", "dw")].reason
    assert max_rel_error(model, new, x_in) <= RTOL
    # Textbook behaviour absorbs into the padded depthwise too: inexact at the borders.
    textbook = cle.equalize_model(model, objective="weights", high_bias_fold="all")
    assert max_rel_error(model, textbook, x_in) > 1e-3


def test_report_to_dict_is_json_and_str_is_readable():
    model = _mobile_block(residual=True)
    _, report = cle.equalize_model(model, objective="weights", return_report=True)
    data = json.loads(json.dumps(report.to_dict()))
    assert set(data) == {"folded", "fold_skipped", "relu6", "relu6_changed", "sets",
                         "set_ends", "bias_absorptions", "bias_corrections", "objective",
                         "scaling", "stable_changed"}
    assert data["objective"] == "weights" and data["stable_changed"] == []
    assert [d["layers"] for d in data["scaling"]] == [
        [p["layer1"] for p in s] + [s[-1]["layer2"]] for s in data["sets"]]
    _, quantized = cle.equalize_model(model, return_report=True)
    qdata = json.loads(json.dumps(quantized.to_dict()))
    assert qdata["objective"] == "quantized"
    for d in qdata["scaling"]:
        assert {"layers", "scaled", "noise_before", "noise_after", "noise_change_db",
                "activation_range_before", "activation_range_after", "reason"} <= set(d)
    assert data["sets"][0][0]["layer1"] == "expand"
    assert len(data["sets"][0][0]["scale_range"]) == 2
    text = str(report)
    assert "batch norms folded: 3" in text
    assert "scaled sets: 1 (0 pairs, 1 triplets; objective 'weights')" in text
    assert "end  project: the output of 'project' feeds 1 layers" not in text
    assert "end  project:" in text and "'add'" in text


def test_bad_options():
    model = _mobile_block()
    with pytest.raises(ValueError, match="relu6 must be one of.*Received: relu6='clip'"):
        cle.equalize_model(model, relu6="clip")
    with pytest.raises(ValueError, match="high_bias_fold must be one of"):
        cle.equalize_model(model, high_bias_fold=True)
    with pytest.raises(ValueError, match="margin must be >= 0"):
        cle.equalize_model(model, margin=-1)
    with pytest.raises(TypeError):
        cle.equalize_model("model.keras")


def test_equalized_model_saves_and_loads(tmp_path):
    model = _mobile_block()
    new = cle.equalize_model(model, objective="weights")
    path = tmp_path / "eq.keras"
    new.save(path)
    loaded = keras.models.load_model(path)
    x = inputs_for(model) * 4
    np.testing.assert_array_equal(outputs(new, x)[0], outputs(loaded, x)[0])
    np.testing.assert_array_equal(np.asarray(loaded.get_layer("r1").caps),
                                  np.asarray(new.get_layer("r1").caps))


def _spread(kernel, axis, kind):
    r = equalization.channel_ranges(kernel, axis, kind)
    return r.max() / np.median(r)


@pytest.mark.slow
@pytest.mark.parametrize("name, n_sets, n_triplets", [
    ("MobileNetV2", 20, 17), ("ResNet50", 32, 0), ("EfficientNetB0", 2, 0)])
def test_applications_all_relu6_modes(name, n_sets, n_triplets):
    model = getattr(keras.applications, name)(
        weights=None, input_shape=(224, 224, 3), classifier_activation=None)
    _rand(model, deep=True)
    x = np.random.default_rng(5).uniform(-1, 1, (2, 224, 224, 3)).astype("float32")
    for relu6 in ("bound", "keep", "replace"):
        new, report = cle.equalize_model(model, objective="weights", relu6=relu6, high_bias_fold="none",
                                          return_report=True)
        triplets = sum(len(s.cls_pair_info_list) == 2 for s in report.sets)
        err = max_rel_error(model, new, x)
        print(f"{name} relu6={relu6}: {len(report.sets)} sets ({triplets} triplets), "
              f"max|Δ|/max|y| = {err:.2e}")
        if relu6 != "keep" or name != "MobileNetV2":
            assert (len(report.sets), triplets) == (n_sets, n_triplets)
        if relu6 != "replace":
            assert err <= RTOL


@pytest.fixture(scope="module")
def real_mobilenet():
    from cle import pretrained

    model = real_mobilenet_v2()
    x = pretrained.preprocess_imagenet(pretrained.sample_images(64, seed=1))
    return model, x, model.predict(x, batch_size=32, verbose=0).astype(np.float64)


@pytest.mark.slow
def test_real_mobilenet_v2_bound_equalization_is_exact(real_mobilenet):
    model, x, y = real_mobilenet
    new, report = cle.equalize_model(model, objective="weights", high_bias_fold="none", return_report=True)
    assert len(report.folded) == 52
    assert sum(len(s.cls_pair_info_list) == 2 for s in report.sets) == 17
    y_new = new.predict(x, batch_size=32, verbose=0).astype(np.float64)
    err = np.abs(y - y_new).max() / np.abs(y).max()
    print(f"real MobileNetV2, relu6='bound', no HBF: max|Δ|/max|y| = {err:.2e}")
    assert err <= RTOL
    np.testing.assert_array_equal(y.argmax(1), y_new.argmax(1))
    # Equalization did its job: the first depthwise layer's channel ranges are far less spread.
    _, folded = cle.fold_all_batch_norms(model)
    before = _spread(np.asarray(folded.get_layer("expanded_conv_depthwise").kernel), -1,
                     "depthwise_out")
    after = _spread(np.asarray(new.get_layer("expanded_conv_depthwise").kernel), -1,
                    "depthwise_out")
    print(f"expanded_conv_depthwise range spread (max/median): {before:.1f} -> {after:.1f}")
    assert after < before / 2


@pytest.mark.slow
def test_real_mobilenet_v2_high_bias_fold_effect_is_measured(real_mobilenet):
    model, x, y = real_mobilenet

    def sqnr(a, b):
        return 10 * np.log10(np.sum(a ** 2) / np.sum((a - b) ** 2))

    rows = {}
    for hbf in ("unpadded", "all"):
        new, report = cle.equalize_model(model, objective="weights", high_bias_fold=hbf, return_report=True)
        y_new = new.predict(x, batch_size=32, verbose=0).astype(np.float64)
        absorbed = sum(r.absorbed for r in report.bias_absorptions)
        rows[hbf] = (np.mean(y.argmax(1) == y_new.argmax(1)), sqnr(y, y_new), absorbed)
        print(f"real MobileNetV2 relu6=bound high_bias_fold={hbf}: {absorbed} absorbed, "
              f"top-1 agreement {rows[hbf][0]:.0%}, SQNR {rows[hbf][1]:.1f} dB")
    # Skipping padded layers keeps the float model much closer than the textbook rule.
    assert rows["unpadded"][1] > rows["all"][1]
    assert rows["unpadded"][2] > 0


@pytest.mark.parametrize("form", ["layer", "activation", "fused"])
def test_in_place_scaling_never_crosses_a_plain_relu6(form):
    """Regression: scale_model / scale_cls_sets once treated a ReLU6 as boundable in place
    (AttributeError after half the scaling, or a silently wrong fused case)."""
    inp = keras.Input((8, 8, 4))
    if form == "fused":
        x = L.Conv2D(6, 1, activation="relu6", name="c1")(inp)
    else:
        x = L.Conv2D(6, 1, name="c1")(inp)
        x = L.ReLU(6.0)(x) if form == "layer" else L.Activation("relu6")(x)
    model = _rand(keras.Model(inp, L.Conv2D(3, 1, name="c2")(x)))
    snap = weights_snapshot(model)
    assert cle.CrossLayerScaling.scale_model(model) == []
    with pytest.raises(ValueError, match="replace_relu6_with_clipped_relu"):
        cle.CrossLayerScaling.scale_cls_sets(
            [(model.get_layer("c1"), model.get_layer("c2"))], model=model)
    for a, b in zip(snap, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # After conversion, in-place scaling crosses it exactly.
    bounded, _ = cle.replace_relu6_with_clipped_relu(model)
    x_in = inputs_for(model) * 5
    before = outputs(bounded, x_in)[0]
    assert len(cle.CrossLayerScaling.scale_model(bounded)) == 1
    after = outputs(bounded, x_in)[0]
    assert np.abs(before - after).max() <= RTOL * np.abs(before).max()


@tensorflow_only("a TensorFlow-backend bias_add bug; other backends scale: test_backends")
@needs_nchw_conv
def test_channels_first_bias_ambiguity_ends_the_set():
    inp = keras.Input((3, 8, 6))  # conv output (4, 6, 4): channels == last spatial size
    x = L.ReLU()(L.Conv2D(4, 3, data_format="channels_first", name="c1")(inp))
    model = _rand(keras.Model(inp, L.Conv2D(2, 1, data_format="channels_first", name="c2")(x)))
    new, report = cle.equalize_model(model, objective="weights", return_report=True)
    assert report.sets == []
    assert "Keras adds its bias on the wrong axis" in dict(report.set_ends)["c1"]
    assert max_rel_error(model, new, inputs_for(model)) <= RTOL


@pytest.mark.parametrize("mode", ["analytic", "empirical"])
def test_equalize_with_bias_correction(mode):
    from cle.quantization import fake_quantize_weights

    keras.utils.set_random_seed(3)
    model = _mobile_block()
    x = inputs_for(model, batch=64, seed=7) * 2
    kwargs = {"calibration_data": x[:32]} if mode == "empirical" else {}
    plain = cle.equalize_model(model, objective="weights")
    new, report = cle.equalize_model(model, objective="weights", bias_correction=mode,
                                     weight_bits=4, per_channel_weights=False,
                                     return_report=True, **kwargs)
    assert any(r.corrected for r in report.bias_corrections)
    assert "bias correction:" in str(report)
    assert report.to_dict()["bias_corrections"]
    # The report names layers of the returned model.
    layers = {id(la) for la in new._flatten_layers()}
    assert all(id(p.layer) in layers for p in report.folded)
    assert all(id(p.layer1) in layers for s in report.sets for p in s.cls_pair_info_list)
    if mode == "analytic":
        # This block's random BN statistics do not describe its inputs, so the output mean is
        # not the check here (tests/test_bias_correction.py checks it where they do). What is
        # checked: the result is the plain equalized model with only the biases of 'dw' and
        # 'project' moved, each by -Σ ε·E[x] derived here from the scaled BN statistics
        # (N(β, γ²) of the folded layer before, through the ClippedReLU caps) and the 4-bit
        # per-tensor weight error ε. 'expand' reads the model input: not corrected.
        from cle.bias_correction import bn_stats_from_report, expected_clipped_normal
        from cle.quantization import quantize_kernel

        stats = {getattr(k, "name", k): v for k, v in bn_stats_from_report(report).items()}
        rec = {r.layer: r for r in report.bias_corrections}
        assert rec["expand"].mode == "skipped"
        assert rec["dw"].mode == "analytic" and rec["project"].mode == "analytic"
        for layer_p, layer_n in zip(plain.layers, new.layers):
            assert layer_p.name == layer_n.name
            for wp, wn in zip(layer_p.weights, layer_n.weights):
                if not (layer_n.name in ("dw", "project") and wn.path.endswith("bias")):
                    np.testing.assert_array_equal(np.asarray(wp), np.asarray(wn), wn.path)
        for layer, src, relu in (("dw", "expand", "r1"), ("project", "dw", "r2")):
            gamma, beta = stats[src]
            caps = np.asarray(new.get_layer(relu).caps, np.float64)
            mean_x = expected_clipped_normal(beta, gamma, 0.0, caps)
            w = np.asarray(plain.get_layer(layer).kernel, np.float64)
            eps = quantize_kernel(w, 4, None, layer == "dw") - w
            per_in = eps.reshape((-1,) + eps.shape[-2:]).sum(0) * mean_x[:, None]  # (c, o|1)
            delta = per_in[:, 0] if layer == "dw" else per_in.sum(0)
            b_plain = np.asarray(plain.get_layer(layer).bias, np.float64)
            b_new = np.asarray(new.get_layer(layer).bias, np.float64)
            assert np.abs(delta).max() > 1e-3, layer  # a visible correction
            np.testing.assert_allclose(b_new, b_plain - delta, rtol=0,
                                       atol=1e-6 * max(np.abs(b_plain).max(), 1.0))
        return
    # Corrected for 4-bit weights: the quantized model's output mean moves back to the float one.
    y = outputs(model, x[32:])[0]
    err_plain = np.abs((outputs(fake_quantize_weights(plain, bits=4), x[32:])[0] - y).mean(0)).mean()
    err_bc = np.abs((outputs(fake_quantize_weights(new, bits=4), x[32:])[0] - y).mean(0)).mean()
    print(f"{mode}: mean output error {err_plain:.3g} -> {err_bc:.3g}")
    assert err_bc < err_plain
    # equalize_model corrects its own new model in place: the same weights, bit for bit, as
    # correct_bias (which rebuilds) on the plain equalized model.
    from cle.bias_correction import correct_bias

    rebuilt = correct_bias(plain, calibration_data=x[:32], bits=4, per_channel=False)
    for a, b in zip(rebuilt.weights, new.weights):
        assert a.path == b.path
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b), a.path)


def test_bias_correction_options_are_checked():
    model = _mobile_block()
    with pytest.raises(ValueError, match="bias_correction must be one of"):
        cle.equalize_model(model, bias_correction="yes")
    with pytest.raises(ValueError, match="calibration_data is needed for, and only for"):
        cle.equalize_model(model, bias_correction="empirical")
    with pytest.raises(ValueError, match="calibration_data is needed for, and only for"):
        cle.equalize_model(model, calibration_data=np.zeros((1, 12, 12, 4)))


# ------------------------------------------------------------------ one view, one set search


def _count_calls(monkeypatch, module_attr):
    """Wrap every module's reference to ``module_attr`` (imported by name) with a recorder."""
    import importlib

    seen, wrapped = [], 0
    for name in ("cle._transforms.equalize", "cle._transforms.plan", "cle._transforms.stepwise",
                 "cle._transforms.relu6", "cle._transforms.bn_fold",
                 "cle._transforms.bias_correction", "cle._transforms.sets", "cle._core.graph",
                 "cle._core.rebuild"):
        module = importlib.import_module(name)
        fn = getattr(module, module_attr, None)
        if fn is None:
            continue
        wrapped += 1

        def recorder(*args, _fn=fn, **kwargs):
            seen.append(args[0])
            return _fn(*args, **kwargs)

        monkeypatch.setattr(module, module_attr, recorder)
    assert wrapped >= 2  # the defining module and at least one user
    return seen


@pytest.mark.parametrize("options", [
    {},
    {"objective": "weights"},
    {"relu6": "replace", "high_bias_fold": "all", "objective": "weights"},
    {"high_bias_fold": "unpadded", "per_channel_weights": False},
])
def test_equalize_model_views_the_model_once_and_searches_sets_once(monkeypatch, options):
    """Every stage plans on one graph view of the input model with one set search; a second
    view or search (of the rebuilt model) must not come back."""
    inp = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inp)
    x = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization()(x))
    x = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
    x = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization()(x))
    x = keras.layers.Conv2D(6, 1)(x)
    model = randomize_batch_norms(keras.Model(inp, x))
    views = _count_calls(monkeypatch, "graph_view")
    searches = _count_calls(monkeypatch, "find_sets")
    new, report = cle.equalize_model(model, return_report=True, **options)
    assert views == [model]
    assert len(searches) == 1
    assert len(report.scaling) == 1  # the triplet was planned and decided from that search
    if options.get("relu6") != "replace" and options.get("high_bias_fold") != "all":
        x = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")
        assert max_rel_error(model, new, x) <= RTOL


@pytest.mark.parametrize("mode", ["analytic", "empirical"])
@pytest.mark.parametrize("relu6", ["bound", "replace"])
def test_bias_correction_plans_in_the_one_view_and_the_one_rebuild(monkeypatch, mode, relu6):
    """Bias correction is part of the one plan: the input model is viewed once, the new model
    built once (a layer that gets a bias gets it in that rebuild), and the corrected model is
    what the standalone correct_bias makes of the equalized model."""
    inp = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False, name="c1")(inp)
    x = keras.layers.ReLU(6.0, name="r1")(keras.layers.BatchNormalization(name="b1")(x))
    x = keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False, name="dw")(x)
    x = keras.layers.ReLU(6.0, name="r2")(keras.layers.BatchNormalization(name="b2")(x))
    x = keras.layers.Conv2D(6, 1, use_bias=False, name="c2")(x)  # no BN: gets a new bias
    model = randomize_batch_norms(keras.Model(inp, x))
    data = np.random.default_rng(1).normal(size=(8, 8, 8, 3)).astype("float32")
    views = _count_calls(monkeypatch, "graph_view")
    rebuilds = _count_calls(monkeypatch, "rebuild")
    options = dict(relu6=relu6, objective="weights", bias_correction=mode)
    if mode == "empirical":
        options["calibration_data"] = data
    new, report = cle.equalize_model(model, return_report=True, **options)
    assert views == [model] and rebuilds == [model]
    records = {r.layer: r for r in report.bias_corrections}
    assert records["c2"].corrected and records["c2"].added_bias and new.get_layer("c2").use_bias
    monkeypatch.undo()
    # the same corrections as correcting the equalized model afterwards, as before
    plain = cle.equalize_model(model, relu6=relu6, objective="weights")
    stats = cle.bn_stats_from_report(cle.equalize_model(model, relu6=relu6, objective="weights",
                                                        return_report=True)[1])
    want, want_records = cle.correct_bias(
        plain, **({"bn_stats": {k.name: v for k, v in stats.items()}} if mode == "analytic"
                  else {"calibration_data": data}),
        bits=8, per_channel=True, return_report=True)
    assert [str(r) for r in report.bias_corrections] == [str(r) for r in want_records]
    for layer in want.layers:
        for a, b in zip(layer.get_weights(), new.get_layer(layer.name).get_weights()):
            np.testing.assert_array_equal(a, b)


def _structure(view):
    """Each call of a view as (layer name, input producers' layer names, consumers' names)."""
    def name(call):
        return None if call is None else call.layer.name
    return [(c.layer.name, tuple(name(t.producer) for t in c.inputs),
             tuple(tuple(name(u) for u in t.consumers) for t in c.outputs)) for c in view.calls]


def test_rebuilt_view_is_the_view_of_the_rebuilt_model():
    """The view empirical bias correction walks is derived from the input model's view and the
    rebuild (no second reading of the new model's graph); it must be what reading it gives:
    bypassed BNs, ReLU6 turned into ClippedReLUs (replaced or split out of a layer), a nested
    sub-model and a shared layer included."""
    from cle._core.graph import graph_view, rebuilt_view
    from cle._core.rebuild import rebuild
    from cle._transforms.options import EqualizeOptions
    from cle._transforms.plan import plan_equalization

    inner_in = keras.Input((8, 8, 8))
    h = keras.layers.Conv2D(8, 1, name="inner_conv")(inner_in)
    inner = keras.Model(inner_in, keras.layers.BatchNormalization(name="inner_bn")(h),
                        name="inner")
    inp = keras.Input((8, 8, 3), name="x")
    x = keras.layers.Conv2D(8, 3, padding="same", name="c1")(inp)
    x = keras.layers.ReLU(6.0, name="r1")(keras.layers.BatchNormalization(name="b1")(x))
    x = keras.layers.DepthwiseConv2D(3, padding="same", activation="relu6", name="dw")(x)
    x = keras.layers.Conv2D(8, 1, name="c2")(x)
    shared = keras.layers.ReLU(name="shared")
    y = shared(inner(x))
    z = shared(keras.layers.Conv2D(8, 1, name="c3")(x))
    model = randomize_batch_norms(keras.Model(inp, keras.layers.Add(name="add")([y, z])))
    view = graph_view(model)
    for relu6 in ("bound", "replace"):
        plan = plan_equalization(model, view, EqualizeOptions(relu6=relu6, objective="weights"))
        new, clones = rebuild(model, edits=plan.edits, bypass=plan.bypass)
        derived, new_call = rebuilt_view(view, new, clones, plan.bypass)
        assert _structure(derived) == _structure(graph_view(new)), relu6
        assert all(new_call[id(c)].layer is clones[id(c.layer)] for c in view.calls
                   if id(c.layer) not in plan.bypass)
        assert [t.output_of != [] for t in derived.calls[-1].outputs] == [True]


def test_a_one_shot_generator_serves_every_use_of_the_calibration_data():
    """The data is read once, at the door: a generator (used up by one reading) serves both the
    measured activation ranges and empirical bias correction, and gives what the array gives."""
    inp = keras.Input((8, 8, 3))
    x = keras.layers.Conv2D(8, 3, padding="same", use_bias=False)(inp)
    x = keras.layers.ReLU(6.0)(keras.layers.BatchNormalization()(x))
    x = keras.layers.Conv2D(6, 1)(x)
    model = randomize_batch_norms(keras.Model(inp, x))
    data = np.random.default_rng(2).normal(size=(12, 8, 8, 3)).astype("float32")
    options = dict(bias_correction="empirical", activation_ranges="calibration")
    want = cle.equalize_model(model, calibration_data=data, **options)
    got = cle.equalize_model(model, calibration_data=(data[i: i + 4] for i in range(0, 12, 4)),
                             **options)
    for a, b in zip(want.get_weights(), got.get_weights()):
        np.testing.assert_array_equal(a, b)
