"""Tests for cle.analyze / `cle analyze`: the .tflite it analyses is the one cle.quantize
writes, its output figures are that .tflite's against the Keras model, every layer with weights
has an entry under the user's name, the flatbuffer's tensors are paired with Keras layers by
value (not by name), the switchable simulation is the float model with every switch off and the
INT8 model with every switch on, a layer's weight SQNR is its output with the INT8 model's
weights, a layer built to be badly ranged is ranked first, and the report, JSON, picture and
command line."""

from __future__ import annotations

import dataclasses
import json

import keras
import numpy as np
import pytest
from keras import layers as L

import cle
from cle import cli
from cle import quantization as Q
from cle._quantize.options import QuantizeOptions
from cle._quantize.analysis import analyze_checked
from cle._quantize.pipeline import build_checked, quantize_checked
from cle._tflite import quant_sim
from cle._tflite.flatgraph import FlatGraph, align, dequantize
from cle._tflite.layer_map import map_layers
from cle._tflite.runtime import interpreter

from conftest import BACKEND, no_tflite_on_torch, randomize_batch_norms, small_classifier

pytestmark = no_tflite_on_torch

# Backend-independent parts (ranking, the synthetic inputs, the command line) run on TensorFlow;
# on JAX, whose every conversion compiles the model anew, the analysis itself is tested.
not_on_jax = pytest.mark.skipif(
    BACKEND == "jax", reason="skipped on JAX to keep CI within budget: backend-independent "
    "(the analysis on JAX is tested by the other tests of this file); runs on TensorFlow")


_net = small_classifier


def badly_ranged(factor, seed=0):
    """A convolution ('wide') whose channel 0 is ``factor``× the others, read by two depthwise
    convolutions that scale it back (so the per-tensor activation step is what hurts, and no
    scaling set can move it: 'wide' feeds two layers)."""
    keras.utils.set_random_seed(seed)
    inp = keras.Input((16, 16, 3))
    x = L.Conv2D(16, 3, padding="same", name="c1")(inp)
    x = L.BatchNormalization(name="bn1")(x)
    x = L.ReLU(name="r1")(x)
    x = L.Conv2D(16, 1, name="wide")(x)
    a = L.DepthwiseConv2D(3, padding="same", name="dw_a")(x)
    b = L.DepthwiseConv2D(3, padding="same", name="dw_b")(x)
    x = L.ReLU(name="r2")(L.Add(name="add")([a, b]))
    x = L.GlobalAveragePooling2D(name="gap")(x)
    model = keras.Model(inp, L.Dense(10, name="logits")(x))
    randomize_batch_norms(model, seed=seed, deep=True)
    w, bias = model.get_layer("wide").get_weights()
    w[..., 0] *= factor
    bias[0] *= factor
    model.get_layer("wide").set_weights([w, bias])
    for name in ("dw_a", "dw_b"):
        k, b = model.get_layer(name).get_weights()
        k[:, :, 0, :] /= factor
        b[0] /= factor
        model.get_layer(name).set_weights([k, b])
    return model


@pytest.fixture(scope="module")
def net():
    return _net()


@pytest.fixture(scope="module")
def data():
    return np.random.default_rng(1).uniform(-1, 1, (40, 24, 24, 3)).astype(np.float32)


@pytest.fixture(scope="module")
def report(net, data):
    return cle.analyze(net, data, output_kinds={"logits": "classes"})


@pytest.fixture(scope="module")
def build(net, data):
    return build_checked(net, data, QuantizeOptions(has_data=True), lambda message: None)


# ----------------------------------------------------------------------- what is analysed


def test_the_tflite_is_the_one_quantize_writes_and_the_output_is_its_check(net, data, report,
                                                                          monkeypatch):
    # analyze measures cle's build, its ranges calibrated on every input: what quantize
    # writes when its choice keeps cle's build (made to here: no other may replace it)
    from cle._quantize import choice

    monkeypatch.setattr(choice, "SUPPORT", {name: 2.0 for name in choice.SUPPORT})
    monkeypatch.setattr(choice, "_farther_outputs", lambda *args, **kwargs: [])
    opts = QuantizeOptions.from_call(data, output_kinds={"logits": "classes"})
    kept = []  # cle.quantize's own call, its build kept
    content, quantized = quantize_checked(net, data, opts, builds=kept)
    assert quantized.choice.written == "cle"
    assert report.tflite == content
    assert report.output["sqnr_db"] == quantized.sqnr_db
    assert report.output["top1_agreement"] == quantized.top1_agreement > 0.5
    assert report.n_check == 40 and report.check_inputs.startswith("calibration inputs, each")
    # that build analysed as it is (cle demo) is the analysis of a build made again
    (made,) = kept
    again = analyze_checked(net, data, opts, build=made).to_dict()
    fresh = report.to_dict()
    for figures in (again, fresh):
        figures.pop("seconds")
    assert again == fresh
    assert "layers" not in quantized.seconds  # the quantize report's own times untouched
    for other in (dataclasses.replace(made, opts=QuantizeOptions.from_call(data)),
                  dataclasses.replace(made, crossfit={**made.crossfit, "written": "plain"})):
        with pytest.raises(ValueError, match="analyses cle's build"):
            analyze_checked(net, data, opts, build=other)


def test_the_output_entry_matches_an_independent_check(net, data, report):
    """The output's figure is the cross-fitted check's: each input run by a build not
    calibrated on it, recomputed here from the folds and the LiteRT runs."""
    from cle._quantize import crossfit

    opts = QuantizeOptions.from_call(data, output_kinds={"logits": "classes"})
    build = build_checked(net, data, opts, lambda message: None)
    fit = crossfit.CrossFit(net, build, {"cle": build.content})
    outputs = [Q.run_tflite(fit._content("cle", k)[0], x.arrays[0])
               for k, x in enumerate(fit.folds[:-1])] + [Q.run_tflite(build.content, data[30:])]
    order = np.concatenate([*fit.parts, np.arange(30, 40)])
    independent = Q.sqnr_db(net.predict(data[order], verbose=0), np.concatenate(outputs))
    assert abs(report.output["sqnr_db"] - independent) < 1e-3


def test_every_layer_with_weights_has_an_entry_under_its_name(net, report):
    names = [layer.name for layer in report.layers]
    assert names[0] == net.layers[0].name and report.layers[0].kind == "InputLayer"
    kernels = [layer.name for layer in net.layers if layer.weights
               and not isinstance(layer, L.BatchNormalization)]
    assert set(kernels) <= set(names), (kernels, names)
    assert report.unmatched == []
    covered = [name for layer in report.layers for name in layer.layers]
    for bn in ("bn1", "bn2", "bn3", "bn4"):  # each folded into the conv before it
        assert f"{bn} (folded)" in covered
    by_name = {layer.name: layer for layer in report.layers}
    assert "bn1 (folded)" in by_name["c1"].layers and "bn3 (folded)" in by_name["c2"].layers
    if BACKEND == "tensorflow":  # the converter fuses each ReLU into its convolution
        assert by_name["c1"].layers[:2] == ["c1", "r1"]
    assert [layer.depth for layer in report.layers] == list(range(len(report.layers)))


# ----------------------------------------------------------------------- pairing by value


def test_entries_are_found_by_value_not_by_name(data):
    """Layer names the converter's own names would confuse: 'conv' and 'conv_1' (TensorFlow
    names the tensors of a layer called 'conv' 'conv_1/...'). Each entry's tensor holds the
    output of the layer it is named after, on inputs the pairing never saw."""
    keras.utils.set_random_seed(3)
    inp = keras.Input((24, 24, 3))
    x = L.Conv2D(6, 3, padding="same", name="conv_1")(inp)
    x = L.Conv2D(6, 3, padding="same", name="conv", activation="relu")(x)
    x = L.Conv2D(4, 1, name="conv_1_1")(x)
    model = keras.Model(inp, L.GlobalAveragePooling2D(name="pool")(x))
    from cle._tflite import converter as tflite

    content = tflite.calibrate(model, data[:8])
    lmap = map_layers(model, content, data[:2])
    assert [e.name for e in lmap.entries] == ["conv_1", "conv", "conv_1_1", "pool"]
    interp = interpreter(content, preserve_all_tensors=True)
    interp.resize_tensor_input(interp.get_input_details()[0]["index"], (4, 24, 24, 3))
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], data[10:14])
    interp.invoke()
    outputs = [model.get_layer(entry.layers[-1]).output for entry in lmap.entries]
    wanted = keras.Model(model.inputs, outputs).predict(data[10:14], verbose=0)
    for entry, want in zip(lmap.entries, wanted):
        got = interp.get_tensor(entry.tensor)
        assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want)), entry.name


# ----------------------------------------------------------------- the switchable simulation


def test_simulation_is_the_float_model_off_and_the_int8_model_on(build, data):
    sim = quant_sim.build(build.calibrated, build.content)
    q, f = FlatGraph(build.content), sim.float_graph
    alignment = align(f, q)
    for s in sim.switches:  # activation switches carry the INT8 model's own scale and zero point
        if s.params is not None and not s.requantize:
            u = alignment.int8_of[s.tensor]
            assert np.array_equal(s.params[0], q.params(u)[0]) and np.array_equal(
                s.params[1], q.params(u)[1])
    x = data[30:34]
    masks = np.zeros((8, len(sim.switches)), np.float32)
    masks[4:] = 1.0
    out = sim.float_graph.outputs[0]
    got = {}  # one call per invocation: one of 8 rows, or 8 of 1 for a fixed-batch file (JAX)
    sim.run(x, np.array([0, 1, 2, 3, 0, 1, 2, 3]), masks,
            lambda start, stop, read: got.update({start: read(out)}), batch=8)
    got["y"] = np.concatenate([got[k] for k in sorted(got)])
    assert len(got["y"]) == 8
    float_y = Q.run_tflite(build.calibrated, x)
    int8_y = Q.run_tflite(build.content, x)
    assert np.max(np.abs(got["y"][:4] - float_y)) <= 1e-5 * np.max(np.abs(float_y))
    # Every switch on: the INT8 model up to its integer kernels' rounding of their sums, which
    # moves an output by one step of its int8 grid where a value sits on a rounding edge.
    step = q.params(alignment.int8_of[out])[0][0]
    diff = np.abs(got["y"][4:] - int8_y)
    assert diff.max() <= 1.01 * step and np.mean(diff < 1e-3 * step) > 0.8, diff / step


def test_weight_sqnr_is_the_layer_run_with_the_int8_models_weights(build, report, data):
    """'logits' with the INT8 model's dequantized weights and bias (read from the .tflite) on
    its float input, against its float output: the report's weight SQNR."""
    q = FlatGraph(build.content)
    fc = next(op for op in q.ops if op.kind == "FULLY_CONNECTED")
    w = dequantize(q.constant(fc.inputs[1]), q.params(fc.inputs[1])).T  # (in, out)
    bias = fc.inputs[2]
    b = dequantize(q.constant(bias), q.params(bias)).reshape(-1)
    model = build.equalized
    x = data[30:30 + report.n_layer_inputs]
    features = keras.Model(model.inputs, model.get_layer("gap").output).predict(x, verbose=0)
    if q.ops[q.producer[fc.inputs[0]]].kind == "SUM":  # JAX's export (a batch of one) sums
        features = features * np.prod(model.get_layer("gap").input.shape[1:3])  # 1/(h·w) in w
    y = model.predict(x, verbose=0)
    want = Q.sqnr_db(y, features.astype(np.float64) @ w + b)
    got = next(layer for layer in report.layers if layer.name == "logits").weight_sqnr_db
    assert abs(got - want) < 0.05, (got, want)


# ------------------------------------------------------------------------------ ranking


@pytest.fixture(scope="module")
def ranked():
    x = np.random.default_rng(1).uniform(-1, 1, (40, 16, 16, 3)).astype(np.float32)
    return cle.analyze(badly_ranged(100.0), x), cle.analyze(badly_ranged(1.0), x)


@not_on_jax
def test_a_badly_ranged_layer_is_ranked_first_with_its_reason(ranked):
    bad, control = ranked
    first = bad.worst(1)[0]
    assert first.name == "wide", bad.summary()
    assert first.share > 0.5 and first.activation_share > first.weight_share
    assert first.stats["channel_spread"] > 50  # channel 0 is 100× the others
    assert "spans" in first.reason and "from its activations" in first.reason
    assert control.worst(1)[0].name != "wide" or control.worst(1)[0].share < 0.5
    # The badly ranged layer costs the output what its share says.
    assert bad.output["sqnr_db"] < control.output["sqnr_db"] - 10


# ------------------------------------------------------------------ report, JSON, picture


def test_report_json_and_summary(report):
    data = json.loads(json.dumps(report.to_dict()))
    assert data["output"]["sqnr_db"] == pytest.approx(report.output["sqnr_db"])
    for entry in data["layers"]:
        for key in ("name", "sqnr_db", "weight_sqnr_db", "activation_sqnr_db", "range"):
            assert key in entry
    dense = next(e for e in data["layers"] if e["name"] == "logits")
    assert dense["range"]["how"].startswith("min/max (the output")
    relu = next(e for e in data["layers"] if "r3" in e["layers"])  # c3's ReLU's output
    assert relu["range"]["how"] == "1e-4 tails" and relu["range"]["low"] == 0.0
    assert sum(e["share"] for e in data["layers"]) == pytest.approx(1.0)
    text = report.summary(3)
    assert "worst layers" in text and report.worst(1)[0].name in text
    assert f"SQNR {report.output['sqnr_db']:.2f} dB" in text


def test_picture_is_a_png(report, tmp_path):
    path = report.plot(tmp_path / "a.png")
    assert (tmp_path / "a.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path


def test_refuses_bad_layer_inputs_before_any_work(net):
    with pytest.raises(ValueError, match=r"layer_inputs.*Received: layer_inputs=0"):
        cle.analyze(net, layer_inputs=0)


@not_on_jax
def test_without_data_it_analyses_quantizes_unseen_synthetic_check_sets(net):
    """Without data: the .tflite and the output's figures are cle.quantize's (the lower of its
    two check sets of synthetic inputs the calibration never saw), and the summary says the
    inputs are synthetic."""
    # the data's range, stated: the net's random statistics only let it guess (refused)
    report = cle.analyze(net, layer_inputs=2, input_range=(-1.0, 1.0))
    content, quantized = cle.quantize(net, input_range=(-1.0, 1.0))
    assert report.tflite == content and report.calibration == "synthetic"
    assert report.output["sqnr_db"] == quantized.sqnr_db
    assert report.check_inputs == quantized.check_inputs
    assert report.check_inputs.startswith("inputs the calibration never saw")
    assert report.layer_inputs in [c["inputs"] for c in quantized.check_sets]
    assert "no real data" in report.summary() and "synthetic inputs" in report.summary()
    assert {layer.name for layer in report.layers} >= {"c1", "dw", "c2", "c3", "logits"}


def _two_outputs():
    inp = keras.Input((8, 8, 3), name="image")
    x = L.Conv2D(4, 3, name="conv")(inp)
    x = L.BatchNormalization(name="bn")(x)
    x = L.GlobalAveragePooling2D(name="gap")(x)
    return keras.Model(inp, [L.Dense(3, name="a")(x), L.Dense(2, name="b")(x)],
                       name="two_heads")


@not_on_jax
def test_several_outputs_are_refused_by_the_tuning_at_the_door(monkeypatch):
    """Tuning takes one input and one output: another model is refused before any work,
    naming the model (cle.quantize without tune, and cle.analyze, take it)."""
    from cle._quantize import pipeline

    def fail(*args, **kwargs):
        raise AssertionError("work started")

    monkeypatch.setattr(pipeline, "equalize_checked", fail)
    import re

    x = np.zeros((8, 8, 8, 3), np.float32)
    with pytest.raises(ValueError, match="^" + re.escape(
            "cle.quantize(tune=True) supports models with one input and one output so far "
            "(several inputs or outputs are not supported there yet; cle.quantize without "
            "tuning takes them). Received: model 'two_heads' with 1 inputs and 2 outputs")
            + "$"):
        cle.quantize(_two_outputs(), x, tune=True)


# -------------------------------------------------------------------------- command line


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, net, data):
    path = tmp_path_factory.mktemp("analyze")
    net.save(path / "m.keras")
    np.save(path / "cal.npy", data)
    return path


@not_on_jax
def test_cli_analyze_writes_report_and_picture(workdir, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    code = cli.main(["analyze", "m.keras", "--calibration", "cal.npy", "--report", "a.json",
                     "--plot", "a.png", "--worst", "2"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "worst layers" in out.out and "wrote a.json" in out.out and "wrote a.png" in out.out
    assert "pairing the model's layers" in out.err  # progress on stderr
    data = json.loads((workdir / "a.json").read_text())
    assert {e["name"] for e in data["layers"]} >= {"c1", "dw", "c2", "c3", "logits"}
    assert (workdir / "a.png").read_bytes()[:4] == b"\x89PNG"


@not_on_jax
@pytest.mark.parametrize("args, message", [
    (["--plot", "a.jpg"], r"--plot a\.jpg: the picture's file name must end in \.png"),
    (["--plot", "r.png", "--report", "r.png"], r"--plot r\.png is also --report"),
    (["--calibration", "nope.npy"], r"no such file or folder"),
    (["--bias-correction", "empirical"], r"needs --calibration"),
    (["--layer-inputs", "0"], r"must be at least 1"),
    (["--calibration", "cal.npy", "--input-range=-1,1"], r"--input-range is for synthetic"),
])
def test_cli_analyze_usage_errors(workdir, capsys, monkeypatch, args, message):
    import re

    monkeypatch.chdir(workdir)
    before = set(workdir.iterdir())
    code = cli.main(["analyze", "m.keras", *args])
    err = capsys.readouterr().err
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), err
    assert set(workdir.iterdir()) == before


# ------------------------------------------------------------------- quantize(tune=True)


@not_on_jax
def test_tuning_fixes_the_badly_ranged_layer_on_inputs_it_never_saw():
    """The badly ranged 'wide' gets a narrower range, the model is kept, and on other inputs
    it is at least 3 dB closer to the float model than without tuning (the 1e-4 tails leave
    its 100× channel's whole range in the one per-tensor step)."""
    model = badly_ranged(100.0)
    x = np.random.default_rng(1).uniform(-1, 1, (40, 16, 16, 3)).astype(np.float32)
    x_eval = np.random.default_rng(2).uniform(-1, 1, (64, 16, 16, 3)).astype(np.float32)
    ref = model.predict(x_eval, verbose=0)
    plain, _ = cle.quantize(model, x)
    tuned, report = cle.quantize(model, x, tune=True)
    tuning = report.tuning
    assert tuning.kept and any(name == "wide" for name, *_ in tuning.changes), tuning.lines()
    wide = next(c for c in tuning.changes if c[0] == "wide")
    assert wide[2]["high"] - wide[2]["low"] < wide[1]["high"] - wide[1]["low"]
    assert report.n_check == 5 and report.check_inputs == "held-out calibration inputs"
    assert tuning.held_out and not tuning.flatters
    assert not any("flatter" in w for w in report.warnings), report.warnings
    assert (Q.sqnr_db(ref, Q.run_tflite(tuned, x_eval))
            >= Q.sqnr_db(ref, Q.run_tflite(plain, x_eval)) + 3)
    text = report.summary()
    assert "tuning on 5 held-out calibration inputs (the check uses the other 5)" in text
    assert "30 to calibrate, 5 held out to tune, 5 held out for the check" in text
    assert json.loads(json.dumps(report.to_dict()))["tuning"]["kept"] is True


@pytest.mark.skipif(BACKEND == "jax", reason="JAX's export adds each bias as an operator of its "
                    "own: the correction of an operator's bias input has none to correct there "
                    "(tuning reports it); runs on TensorFlow")
def test_bias_correction_removes_the_mean_error_of_the_input_quantization(build, data):
    """The first layer's pre-activation in the corrected model, its input alone quantized,
    against the uncorrected float model: the mean error per channel the correction measured
    is gone (on the inputs it was measured on: this checks that the bias was written to its
    tensor, with its sign and channel order; later layers' float inputs move with the
    corrections before them, which is the point)."""
    from cle._quantize import tune

    x = data[:2]
    calibrated, content, layers = tune.correct_biases(build.calibrated, build.content, x,
                                                      True, False)
    assert layers >= 4

    def pre_activations(calibrated, content, on):
        sim = quant_sim.build(calibrated, content, pre_activations=True)
        keys = [k for k in sim.readable if isinstance(k, tuple)]
        masks = np.zeros((len(x), len(sim.switches)), np.float32)
        out = {}
        for key in keys:  # each layer's input switches alone, one run per layer
            op = sim.float_graph.ops[key[1]]
            if on:
                masks[:] = [s.kind == "activation" and s.tensor in op.inputs
                            and not s.requantize for s in sim.switches]
            sim.run(x, np.arange(len(x)), masks,
                    lambda start, stop, read: out.__setitem__(key, read(key)))
        return out

    float_ = pre_activations(build.calibrated, build.content, False)
    before = pre_activations(build.calibrated, build.content, True)
    after = pre_activations(calibrated, content, True)
    first = min(float_, key=lambda k: k[1])
    mean = lambda v: (v - float_[first]).reshape(-1, v.shape[-1]).mean(axis=0)  # noqa: E731
    assert np.abs(mean(before[first])).max() > 0
    assert np.abs(mean(after[first])).max() <= 0.05 * np.abs(mean(before[first])).max()


@pytest.mark.parametrize("kwargs, message", [
    ({"ranges": "minmax"}, r"tune=True chooses 8-bit activation ranges.*ranges='minmax'"),
    ({"activation_bits": 16}, r"tune=True chooses.*activation_bits=16"),
    ({"tune": "yes"}, r"`tune` must be True or False\. Received: tune='yes'"),
])
def test_tune_refuses_what_it_cannot_do(net, data, kwargs, message):
    with pytest.raises(ValueError, match=message):
        cle.quantize(net, data, **{"tune": True, **kwargs})


@not_on_jax
def test_cli_quantize_tune_usage_error(workdir, capsys, monkeypatch):
    monkeypatch.chdir(workdir)
    code = cli.main(["quantize", "m.keras", "-o", "t.tflite", "--tune", "--ranges", "minmax"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "--tune chooses among 8-bit activation ranges" in err[0], err
    assert not (workdir / "t.tflite").exists()


@not_on_jax
def test_tuning_without_data_tunes_on_calibration_inputs_and_checks_on_unseen_sets(net):
    """Without data the tuning measures on the synthetic calibration inputs; the check is
    cle.quantize's two sets of synthetic inputs that neither the calibration nor the tuning
    saw (the lower figure), as without tuning."""
    content, report = cle.quantize(net, tune=True, input_range=(-1.0, 1.0))
    tuning = report.tuning
    assert tuning.inputs.startswith("synthetic calibration inputs") and tuning.n == 16
    assert not tuning.held_out and not tuning.flatters
    assert report.check_inputs.startswith("inputs the calibration never saw")
    assert len(report.check_sets) == 2 and report.n_check == 48
    assert report.sqnr_db == min(c["outputs"][0].sqnr_db for c in report.check_sets)
    assert f"tuning on 16 {tuning.inputs}" in report.summary()


@not_on_jax
def test_tuning_with_too_few_held_out_says_its_check_flatters(net, data):
    _, report = cle.quantize(net, data[:12], tune=True)
    assert report.tuning.flatters and report.check_inputs.endswith(
        "also the tuning inputs: the check flatters")
    assert any("flatter the tuned model" in w for w in report.warnings)


@not_on_jax
@pytest.mark.parametrize("kind, counted", [("values", None), ("classes", "top-1")])
def test_the_tunings_verdict_reads_the_outputs_kind(net, data, kind, counted):
    """Bug caught: the tuning weighed every output's argmax: a value output's (a regression,
    coordinates) means nothing, yet a flip of it vetoed a closer file, and its reason printed a
    "top-1 agreement" for it. Its figures carry the agreement the check gives the output's
    kind (none for values), and its verdict reads only that."""
    from cle._quantize import tune

    _, report = cle.quantize(net, data, tune=True, output_kinds={"logits": kind})
    tuning = report.tuning
    seen = [f for f in (tuning.before, tuning.after, tuning.bias["before"], tuning.bias["after"])
            if f is not None]
    assert seen, "the tuning measured nothing"
    for figures in seen:
        assert figures["agreement"] == counted
        assert (figures["top1_agreement"] is None) == (counted is None)
    said = " ".join(r for r in (tuning.reason, tuning.bias["reason"]) if r)
    assert ("agreement" in said) == (counted is not None), said
    json.dumps(report.to_dict(), allow_nan=False)  # no NaN where no agreement is counted
    closer = {"sqnr_db": 31.0, "top1_agreement": None}
    assert tune._better({"sqnr_db": 30.0, "top1_agreement": None}, closer)
    assert not tune._better({"sqnr_db": 30.0, "top1_agreement": 0.9},
                            {"sqnr_db": 31.0, "top1_agreement": 0.8})
