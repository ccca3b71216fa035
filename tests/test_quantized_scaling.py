"""equalize_model(objective="quantized"): scales chosen for the INT8 target, do-no-harm, report,
calibration ranges, the AIMET-style in-place route and the CLI options."""

import keras
import numpy as np
import pytest
from conftest import (
    RTOL,
    assert_unchanged,
    inputs_for,
    max_rel_error,
    randomize_batch_norms,
    randomize_biases,
    real_mobilenet_v2,
    weights_snapshot,
)

import cle
from cle._math import noise
from cle._transforms import scale_choice

L = keras.layers


@pytest.fixture(scope="module")
def mobilenet():
    keras.utils.set_random_seed(0)  # the kernels' initial values decide which sets pay off
    model = keras.applications.MobileNetV2(weights=None, input_shape=(64, 64, 3), alpha=0.35)
    return randomize_biases(randomize_batch_norms(model, deep=True), scale=0.1)


@pytest.fixture(scope="module")
def pristine(mobilenet):
    """The weights and layer names of ``mobilenet`` before any test transformed it."""
    return weights_snapshot(mobilenet), [la.name for la in mobilenet._flatten_layers()]


@pytest.fixture(scope="module")
def equalized(mobilenet, pristine):
    """``equalized(**options)``: ``cle.equalize_model(mobilenet, return_report=True,
    **options)``, run once per set of options and shared by the tests that only read it."""
    done = {}

    def get(**options):
        key = tuple(sorted(options.items()))
        if key not in done:
            done[key] = cle.equalize_model(mobilenet, return_report=True, **options)
        return done[key]
    return get


def _clipped(model):
    return [la for la in model._flatten_layers() if isinstance(la, cle.ClippedReLU)]


@pytest.mark.parametrize("per_channel", [True, False])
def test_default_objective_is_exact_and_reports_every_set(mobilenet, pristine, equalized,
                                                          per_channel):
    x = inputs_for(mobilenet, batch=2) * 3
    new, report = equalized(per_channel_weights=per_channel)
    assert report.objective == "quantized"
    assert max_rel_error(mobilenet, new, x) <= RTOL
    assert_unchanged(mobilenet, *pristine)  # as built, before any equalize_model
    # One decision per set the weight objective scales (the same planner finds them).
    _, weights_report = equalized(objective="weights")
    assert [d.layers for d in report.scaling] == [d.layers for d in weights_report.scaling]
    scaled = [d for d in report.scaling if d.scaled]
    assert len(report.sets) == len(scaled)
    for d in scaled:
        assert d.noise_after < d.noise_before and d.reason == ""
        assert len(d.activation_range_after) == len(d.layers) - 1
    for d in report.scaling:
        if not d.scaled:
            assert d.reason and d.noise_after == d.noise_before
    # The scales applied are the scales decided, set by set.
    for info, d in zip(report.sets, scaled):
        for pair, s in zip(info.cls_pair_info_list, d.scales):
            np.testing.assert_allclose(pair.scale_factor, s)
    # str and to_dict carry the decisions.
    text = str(report)
    assert "objective 'quantized'" in text
    assert sum(line.startswith("  cls  ") for line in text.splitlines()) == len(scaled)
    assert len(report.to_dict()["scaling"]) == len(report.scaling)


@pytest.fixture(scope="module")
def real_mobilenet():
    return real_mobilenet_v2()


def test_unscaled_sets_keep_their_relu6(real_mobilenet):
    """ClippedReLUs appear only on sets that are scaled; the rest keep the fused-able ReLU6.
    On the real MobileNetV2 the defaults scale the first three sets (modelled gains of 2.5,
    4.7 and 2.1 dB) and leave the other 16 with their reason."""
    mobilenet = real_mobilenet
    new, report = cle.equalize_model(mobilenet, return_report=True)
    scaled = [d.layers[0] for d in report.scaling if d.scaled]
    assert scaled == ["Conv1", "block_1_expand", "block_2_expand"], scaled
    for d in report.scaling:
        if d.scaled:
            assert d.noise_change_db <= -noise.MIN_GAIN_DB
        else:
            assert d.reason and d.noise_after == d.noise_before
    margin = [d for d in report.scaling if "dB the model can tell apart" in d.reason]
    assert len(margin) >= 10, [d.reason for d in report.scaling]

    def relu6_names(model):
        return {la.name for la in model._flatten_layers()
                if type(la) is L.ReLU and la.max_value is not None}

    # MobileNetV2 names the ReLU6 after a layer "<layer>_relu" ("out_relu" after Conv_1):
    # the ones bounded must be exactly those after the first/middle layer of a scaled set.
    def relu_after(name):
        return "out_relu" if name == "Conv_1" else f"{name}_relu"

    expected = relu6_names(mobilenet) & {
        relu_after(name) for d in report.scaling if d.scaled for name in d.layers[:-1]}
    assert 0 < len(expected) < len(relu6_names(mobilenet))
    assert set(report.relu6_changed) == expected
    assert {la.name for la in _clipped(new)} == expected
    assert relu6_names(new) == relu6_names(mobilenet) - expected


def test_identical_channels_are_left_as_they_are():
    """Nothing to gain: every set stays, the model is the folded one weight for weight."""
    inp = keras.Input((8, 8, 4))
    x = L.ReLU(6.0, name="r1")(L.BatchNormalization(name="bn1")(L.Conv2D(6, 1, name="c1")(inp)))
    out = L.Conv2D(5, 1, name="c2")(x)
    model = keras.Model(inp, out)
    model.get_layer("c1").set_weights([np.ones((1, 1, 4, 6)) * 0.3, np.zeros(6)])
    model.get_layer("c2").set_weights([np.ones((1, 1, 6, 5)) * 0.2, np.zeros(5)])
    new, report = cle.equalize_model(model, return_report=True)
    (d,) = report.scaling
    assert not d.scaled and "no candidate scaling lowers" in d.reason
    assert report.sets == [] and _clipped(new) == []
    _, folded = cle.fold_all_batch_norms(model)
    for la in folded.layers:
        for a, b in zip(la.get_weights(), new.get_layer(la.name).get_weights()):
            np.testing.assert_array_equal(a, b)


def test_weights_objective_is_nagel(mobilenet, equalized):
    """objective='weights' scales every set with Nagel's ranges, as the stepwise route does."""
    new, report = equalized(objective="weights")
    assert report.objective == "weights" and all(d.scaled for d in report.scaling)
    bounded, _ = cle.replace_relu6_with_clipped_relu(mobilenet)
    _, folded = cle.fold_all_batch_norms(bounded)
    infos = cle.CrossLayerScaling.scale_model(folded)
    assert len(infos) == len(report.sets)
    for a, b in zip(infos, report.sets):
        for pa, pb in zip(a.cls_pair_info_list, b.cls_pair_info_list):
            np.testing.assert_allclose(pa.scale_factor, pb.scale_factor, rtol=1e-6)


def test_calibration_ranges_are_measured_and_exact(mobilenet, equalized):
    x = inputs_for(mobilenet, batch=4) * 3
    new, report = cle.equalize_model(mobilenet, activation_ranges="calibration",
                                     calibration_data=x, return_report=True)
    assert max_rel_error(mobilenet, new, x) <= RTOL
    _, bn_report = equalized(per_channel_weights=True)  # the defaults
    # Measured ranges are the calibration data's maxima, not the BN model's tails.
    before = [d.activation_range_before for d in report.scaling]
    assert before != [d.activation_range_before for d in bn_report.scaling]


def test_the_junction_pass_takes_what_memory_allows_and_measures_the_same(mobilenet,
                                                                         monkeypatch):
    """A small network's junction pass takes its 12 inputs in one batch (one trace, one
    compile of each operation on JAX); in the batches a large network gets, it measures the
    same ranges, and the scaling it decides is the same."""
    from cle._transforms import plan

    x = inputs_for(mobilenet, batch=12) * 3
    sizes = []
    real = plan._batch
    monkeypatch.setattr(plan, "_batch", lambda tensors: sizes.append(real(tensors)) or sizes[-1])
    reports = []
    for budget in (plan.JUNCTION_PASS_BYTES, 0):  # 0: batches of JUNCTION_BATCH, as a big net
        monkeypatch.setattr(plan, "JUNCTION_PASS_BYTES", budget)
        reports.append(cle.equalize_model(mobilenet, activation_ranges="calibration",
                                          calibration_data=x, return_report=True)[1])
    assert sizes[0] >= len(x) and sizes[1] == plan.JUNCTION_BATCH < len(x)
    one, batched = reports
    assert [d.activation_range_before for d in one.scaling] == [
        d.activation_range_before for d in batched.scaling] and one.scaling
    assert [len(s.cls_pair_info_list) for s in one.sets] == [
        len(s.cls_pair_info_list) for s in batched.sets] and one.sets
    for a, b in zip(one.sets, batched.sets):
        for p, q in zip(a.cls_pair_info_list, b.cls_pair_info_list):
            np.testing.assert_allclose(p.scale_factor, q.scale_factor, rtol=1e-5)


def test_measured_junction_is_the_data_max():
    """SampleStats accumulates over batches to what one pass over all the data gives."""
    rng = np.random.default_rng(0)
    pre = rng.normal(1.0, 2.0, size=(1000, 5))
    whole = noise.junction_from_samples(pre, "relu6", 6.0)
    st = noise.SampleStats("relu6", 6.0)
    for part in np.array_split(pre, 7):
        st.update(part)
    parts = st.junction()
    for attr in ("hi", "lo", "mean_sq", "passing", "positive"):
        np.testing.assert_allclose(getattr(parts, attr), getattr(whole, attr))
    np.testing.assert_allclose(whole.hi, pre.max(axis=0))
    np.testing.assert_allclose(whole.mean_sq, (np.clip(pre, 0, 6) ** 2).mean(axis=0))


@pytest.mark.parametrize("kind, cap", [("linear", None), ("relu", None), ("relu6", 6.0),
                                       ("clipped", np.array([0.5, 1.0, 2.0, 3.0, 9.0]))])
def test_float32_activations_give_the_float64_statistics(kind, cap):
    """SampleStats keeps float32 activations in float32 (for speed): the range and the counts
    are those of the float64 values exactly, the mean square to float32 round-off."""
    rng = np.random.default_rng(1)
    pre = rng.normal(0.5, 2.0, size=(20000, 5)).astype(np.float32)
    single = noise.junction_from_samples(pre, kind, cap)
    double = noise.junction_from_samples(pre.astype(np.float64), kind, cap)
    for attr in ("hi", "lo", "passing", "positive"):
        np.testing.assert_array_equal(getattr(single, attr), getattr(double, attr))
    np.testing.assert_allclose(single.mean_sq, double.mean_sq, rtol=1e-6)
    assert single.hi.dtype == single.mean_sq.dtype == np.float64


@pytest.mark.parametrize("kind, cap", [("linear", None), ("relu", None), ("relu6", 6.0),
                                       ("clipped", np.array([0.5, 1.0, 2.0, 3.0, 9.0]))])
@pytest.mark.parametrize("axis", [-1, 1])
def test_backend_sums_give_the_numpy_statistics(kind, cap, axis):
    """The junction sums measure_junctions computes in the backend, next to the activations
    (compiled: tf.function on TensorFlow, jax.jit on JAX), accumulate to what
    SampleStats.update gives on the same values moved to (N, C): range and counts exactly,
    the mean square to float32 round-off."""
    from cle._core.backend import compiled
    from cle._transforms.plan import junction_sums

    rng = np.random.default_rng(2)
    pre = rng.normal(0.5, 2.0, size=(6, 5, 7, 9) if axis == 1 else (6, 7, 9, 5))
    pre = pre.astype(np.float32)
    flat = np.moveaxis(pre, axis, -1).reshape(-1, 5)
    numpy_route = noise.SampleStats(kind, cap)
    backend_route = noise.SampleStats(kind, cap)
    run = compiled(lambda a: junction_sums(a, axis, kind, cap))
    for part, rows in ((pre[:4], flat[: len(flat) * 4 // 6]), (pre[4:], flat[len(flat) * 4 // 6:])):
        numpy_route.update(rows)
        backend_route.add(*(keras.ops.convert_to_numpy(v) for v in run(part)))
    a, b = numpy_route.junction(), backend_route.junction()
    assert numpy_route.n == backend_route.n == len(flat)
    for attr in ("hi", "lo", "passing", "positive"):
        np.testing.assert_array_equal(getattr(a, attr), getattr(b, attr))
    np.testing.assert_allclose(a.mean_sq, b.mean_sq, rtol=1e-6)


def test_scale_model_quantized_in_place(mobilenet, monkeypatch):
    # No margin: on this randomized network no set clears the default 2 dB; the point here is
    # that the sets scale_model does scale keep the function.
    monkeypatch.setattr(noise, "MIN_GAIN_DB", 0.0)
    bounded, _ = cle.replace_relu6_with_clipped_relu(mobilenet)
    pairs, folded = cle.fold_all_batch_norms(bounded)
    x = inputs_for(mobilenet, batch=2) * 3
    before = keras.ops.convert_to_numpy(folded(x))
    with pytest.raises(ValueError, match="needs folded_pairs"):
        cle.CrossLayerScaling.scale_model(folded, objective="quantized")
    infos = cle.CrossLayerScaling.scale_model(folded, objective="quantized", folded_pairs=pairs)
    after = keras.ops.convert_to_numpy(folded(x))
    assert np.abs(after - before).max() <= RTOL * np.abs(before).max()
    assert 0 < len(infos)


@pytest.mark.parametrize("kwargs, match", [
    ({"objective": "range"}, "objective must be one of"),
    ({"activation_ranges": "data"}, "activation_ranges must be one of"),
    ({"activation_ranges": "calibration"}, "calibration_data is needed"),
    ({"weight_bits": 1}, "weight_bits must be an integer in"),
    ({"activation_bits": 8.0}, "activation_bits must be an integer in"),
    ({"per_channel_weights": "yes"}, "per_channel_weights must be a bool"),
])
def test_bad_options_are_refused(mobilenet, kwargs, match):
    with pytest.raises(ValueError, match=match):
        cle.equalize_model(mobilenet, **kwargs)


def test_decision_without_statistics_says_why():
    """A junction whose producer has no BN cannot be modelled without data."""
    inp = keras.Input((8, 8, 3))
    x = L.Conv2D(4, 3, activation="relu", name="c1")(inp)
    out = L.Conv2D(2, 1, name="c2")(x)
    model = randomize_biases(keras.Model(inp, out))
    new, report = cle.equalize_model(model, return_report=True)
    (d,) = report.scaling
    assert not d.scaled and "no activation statistics for the output of 'c1'" in d.reason
    assert f"keep c1 -> c2: left as it is, {d.reason}" in str(report)


def test_in_out_ranges_cover_every_layout():
    """R[i, o] / SQ[i, o] read the kernel the way the layer reads its input channel i (in
    float32: a range is exact, a float32 sum of squares within 1e-6)."""
    rng = np.random.default_rng(1)
    conv = L.Conv2D(6, 3, groups=2)
    conv.build((None, 8, 8, 4))
    k = rng.normal(size=conv.kernel.shape).astype(np.float32)
    r, sq, taps, r_in = scale_choice._in_out_ranges(k, conv)
    assert r.shape == (4, 6) and taps == 9
    assert r.dtype == sq.dtype == np.float32
    # input channel 3 is in group 1 (channels 2..3), which feeds outputs 3..5 only
    np.testing.assert_array_equal(r[3, :3], 0)
    np.testing.assert_array_equal(r_in, r.max(axis=1))
    assert r[3, 4] == np.abs(k[:, :, 1, 4]).max()
    np.testing.assert_allclose(sq[3, 4], (k[:, :, 1, 4].astype(np.float64) ** 2).sum(), rtol=1e-6)
    dw = L.DepthwiseConv2D(3, depth_multiplier=2)
    dw.build((None, 8, 8, 3))
    kd = rng.normal(size=dw.kernel.shape).astype(np.float32)
    r, sq, _, r_in = scale_choice._in_out_ranges(kd, dw)
    assert r.shape == (3, 6)
    assert r[1, 3] == np.abs(kd[:, :, 1, 1]).max()
    np.testing.assert_allclose(sq[1, 3], (kd[:, :, 1, 1].astype(np.float64) ** 2).sum(), rtol=1e-6)
    assert r[1, 0] == 0
    tr = L.Conv2DTranspose(5, 3)
    tr.build((None, 8, 8, 4))
    kt = rng.normal(size=tr.kernel.shape)  # (*k, out, in)
    r, _, _, r_in = scale_choice._in_out_ranges(kt, tr)
    assert r.shape == (4, 5)
    np.testing.assert_allclose(r[2, 1], np.abs(kt[:, :, 1, 2]).max(), rtol=1e-7)
    # the per-input-channel range the candidate scales come from is exact (float64 kernel)
    assert r_in.dtype == np.float64 and r_in[2] == np.abs(kt[..., 2]).max()


def test_junction_knows_its_values_per_input():
    """SampleStats told how many inputs gave each batch's sums (measure_junctions does) gives
    the junction its values per channel per input; values alone leave it unknown."""
    rng = np.random.default_rng(3)
    st = noise.SampleStats("relu")
    for _ in range(3):
        pre = rng.normal(size=(4 * 25, 6))  # 4 inputs of 5x5 positions
        st.add(pre.max(0), pre.min(0), (np.maximum(pre, 0) ** 2).sum(0), (pre > 0).sum(0),
               (pre > 0).sum(0), len(pre), inputs=4)
    assert st.junction().per_input == 25
    assert noise.junction_from_samples(pre, "relu").per_input is None


def _imbalanced_pair(conv, bn):
    """Two layers through a ReLU whose first layer's output channels differ in range a
    hundredfold (the scaling the noise model gains most from), as Dense on vectors or as
    Conv2D on 6x6 maps; ``bn``: a BatchNormalization after the first (folded)."""
    keras.utils.set_random_seed(4)
    inp = keras.Input((6, 6, 3) if conv else (12,))
    first = (L.Conv2D(8, 1, name="first") if conv else L.Dense(8, name="first"))
    h = first(inp)
    if bn:
        h = L.BatchNormalization(name="bn")(h)
    h = L.ReLU()(h)
    out = (L.Conv2D(4, 1, name="second") if conv else L.Dense(4, name="second"))(h)
    model = keras.Model(inp, out)
    if bn:  # the BN's output channels (what its data-free model reads)
        gamma, beta, mean, var = model.get_layer("bn").get_weights()
        gamma[0] *= 100.0
        model.get_layer("bn").set_weights([gamma, beta, mean, var])
    else:
        kernel, bias = first.get_weights()
        kernel[..., 0] *= 100.0
        first.set_weights([kernel, bias])
    return model


@pytest.mark.parametrize("conv, bn, scaled", [(False, False, False), (False, True, True),
                                              (True, False, True)])
def test_vectors_are_not_equalized_on_their_measured_ranges(conv, bn, scaled):
    """With calibration data, a pair joined by a vector (one value per channel per input:
    each channel's measured range is the largest of a few dozen values, which new inputs
    pass) is scaled on its BN's data-free model where a folded BN gives one, else left as it
    is, saying why; a pair joined by maps keeps its measured ranges. Without the rule the
    vector pair is scaled on its measured ranges (hunt7's flat autoencoder, its code
    equalized, read several dB below the converter on new inputs)."""
    model = _imbalanced_pair(conv, bn)
    x = np.random.default_rng(6).normal(size=(32,) + tuple(model.inputs[0].shape[1:]))
    new, report = cle.equalize_model(model, return_report=True, activation_ranges="calibration",
                                     calibration_data=x.astype("float32"))
    (decision,) = report.scaling
    assert decision.layers == ("first", "second")
    assert decision.scaled == scaled, decision.reason
    if not scaled:
        assert "gives one value per channel per input" in decision.reason
    if bn and not conv:  # the BN's data-free model, not the measured ranges
        _, free = cle.equalize_model(model, return_report=True)
        np.testing.assert_array_equal(decision.scales[0], free.scaling[0].scales[0])
    assert max_rel_error(model, new, x.astype("float32")) <= RTOL
