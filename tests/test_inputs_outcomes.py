"""Issue #19: every model and every input gets a clear outcome, on any CPU.

Each refusal is checked for its one-line message and exit status (command line) or its
exception (Python), and for leaving no new file behind.
"""

import os

import keras
import numpy as np
import pytest
from conftest import BACKEND

import cle
from cle import cli
from cle._core import backend as _backend_caps
from cle._cli import commands

L = keras.layers


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(err, *fragments):
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("cle: error: "), err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


def files_in(path):
    return sorted(os.listdir(path))


# ------------------------------------------- item 5: channels_first where the CPU cannot run it


def channels_first_model():
    inp = keras.Input((3, 8, 8), name="image")
    x = L.Conv2D(4, 3, data_format="channels_first", name="cf_conv")(inp)
    x = L.BatchNormalization(axis=1, name="cf_bn")(x)
    x = L.ReLU(name="relu")(x)
    x = L.Conv2D(2, 1, data_format="channels_first", name="cf_head")(x)
    return keras.Model(inp, x, name="cf_model")


@pytest.fixture
def no_nchw(monkeypatch):
    """Pretend the backend cannot run NCHW convolutions here, as TensorFlow without oneDNN."""
    monkeypatch.setattr(_backend_caps, "_probe", lambda backend: (False, "probe"))


def test_probe_is_tried_once_and_cached():
    first = _backend_caps.channels_first_conv_supported()
    hits = _backend_caps._probe.cache_info().hits
    assert _backend_caps.channels_first_conv_supported() is first
    assert _backend_caps._probe.cache_info().hits == hits + 1
    if BACKEND != "tensorflow":
        assert first  # only TensorFlow's CPU kernels lack NCHW convolutions


def test_channels_first_model_refused_in_python(no_nchw):
    model = channels_first_model()
    x = np.zeros((2, 3, 8, 8), "float32")
    with pytest.raises(RuntimeError, match=r"bias_correction='empirical' runs the model, but "
                       r"model 'cf_model' cannot be run here.*'cf_conv', 'cf_head' use "
                       r"data_format='channels_first'.*KERAS_BACKEND=jax"):
        cle.equalize_model(model, bias_correction="empirical", calibration_data=x)
    with pytest.raises(RuntimeError, match="activation_ranges='calibration' runs the model"):
        cle.equalize_model(model, activation_ranges="calibration", calibration_data=x)
    with pytest.raises(RuntimeError, match="empirical bias correction runs the model"):
        cle.correct_bias(model, calibration_data=x)
    # Weight edits never run the model: folding and data-free equalization still work.
    pairs, _ = cle.fold_all_batch_norms(model)
    assert len(pairs) == 1
    cle.equalize_model(model, bias_correction="analytic")


def test_channels_last_model_is_not_refused(no_nchw):
    inp = keras.Input((8, 8, 3))
    model = keras.Model(inp, L.Conv2D(2, 3, name="c")(inp))
    assert _backend_caps.channels_first_problem(model) is None


def test_channels_first_model_refused_by_cli(capsys, tmp_path, no_nchw):
    path = tmp_path / "cf.keras"
    channels_first_model().save(path)
    np.save(tmp_path / "calib.npy", np.zeros((4, 3, 8, 8), "float32"))
    before = files_in(tmp_path)
    code, out, err = run(capsys, "equalize", path, "-o", tmp_path / "out.keras",
                         "--bias-correction", "empirical", "--calibration",
                         tmp_path / "calib.npy")
    assert code == 1 and out == ""
    assert_one_line_error(err, "--bias-correction empirical runs the model, but model "
                          "'cf_model' cannot be run here", "channels_first", "KERAS_BACKEND=jax")
    assert files_in(tmp_path) == before
    # fold needs no run: it works on such a CPU
    code, _, err = run(capsys, "fold", path, "-o", tmp_path / "folded.keras")
    assert code == 0, err


# ------------------------------------- item 1: why nothing was scaled, on the console and inspect


def small_cnn():
    """conv -> BN -> ReLU6 -> depthwise -> BN -> ReLU6 -> conv, pooling, softmax Dense; a BN on
    the input that cannot be folded (the first conv pads)."""
    inp = keras.Input((10, 10, 3), name="image")
    x = L.BatchNormalization(name="input_bn")(inp)
    x = L.Conv2D(8, 3, padding="same", name="stem_conv")(x)
    x = L.BatchNormalization(name="stem_bn")(x)
    x = L.ReLU(6.0, name="stem_relu6")(x)
    x = L.DepthwiseConv2D(3, name="dw")(x)
    x = L.BatchNormalization(name="dw_bn")(x)
    x = L.ReLU(6.0, name="dw_relu6")(x)
    x = L.Conv2D(6, 1, name="project")(x)
    x = L.GlobalAveragePooling2D(name="pool")(x)
    out = L.Dense(5, activation="softmax", name="logits")(x)
    model = keras.Model(inp, out, name="small_cnn")
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            c = layer.moving_mean.shape[0]
            layer.set_weights([rng.uniform(0.5, 1.5, c), rng.normal(0.0, 1.0, c),
                               rng.normal(0.0, 0.5, c), rng.uniform(0.5, 2.0, c)])
        elif layer.weights:
            layer.set_weights([rng.normal(0.0, 0.3, w.shape).astype("float32")
                               for w in layer.get_weights()])
    return model


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("io") / "small.keras"
    small_cnn().save(path)
    return str(path)


def _reason_lines(text):
    return [ln.strip() for ln in text.splitlines() if " ×" in ln and "(e.g. '" in ln]


@pytest.mark.parametrize("options", [[], ["--objective", "weights", "--per-tensor",
                                          "--relu6", "keep"]], ids=["defaults", "options"])
def test_equalize_and_inspect_print_every_reason_and_the_options(capsys, tmp_path, model_file,
                                                                 options):
    report_path = tmp_path / "r.json"
    code, out_eq, err = run(capsys, "equalize", model_file, "-o", tmp_path / "o.keras",
                            "--report", report_path, *options)
    assert code == 0, err
    code, out_in, err = run(capsys, "inspect", model_file, *options)
    assert code == 0, err
    objective = "weights" if options else "quantized"
    _, report = cle.equalize_model(keras.saving.load_model(model_file), return_report=True,
                                   objective=objective, relu6="keep" if options else "bound",
                                   per_channel_weights=not options)
    expected = [ln.strip() for ln in report.summary().splitlines()[2:]]
    assert expected  # the input BN at least is left, with its reason
    assert _reason_lines(out_eq) == expected
    assert _reason_lines(out_in) == expected
    header = [ln for ln in out_in.splitlines() if ln.startswith("dry run of: cle equalize ")]
    assert len(header) == 1
    for option in [f"--objective {objective}", "--weight-bits 8", "--activation-bits 8",
                   "--bias-correction none", "--activation-ranges bn"]:
        assert option in header[0] and option in out_eq.splitlines()[0]
    assert ("--per-tensor" in header[0]) == bool(options)
    # inspect shows what equalize did: the same scaled sets, and the ones left, with reasons.
    if not options:
        kept = [d for d in report.scaling if not d.scaled]
        assert kept and "Sets left as they are (objective 'quantized') (%d)" % len(kept) in out_in
        if not report.sets:
            assert f"(none: {len(kept)} found, left as they are; see below)" in out_in


def test_fold_prints_one_line_per_reason(capsys, tmp_path, model_file):
    code, out, err = run(capsys, "fold", model_file, "-o", tmp_path / "f.keras")
    assert code == 0, err
    assert _reason_lines(out) == [
        "bn skip ×1: not after a foldable layer (its input is a model input); not before one "
        "('…' pads its input (padding='same'); the padded zeros would not be normalized, so "
        "folding into it is not exact) (e.g. 'input_bn')"]


# ------------------------------------------------------------ item 2: Lambda layers, no switch


def lambda_model():
    inp = keras.Input((8, 8, 3), name="image")
    x = L.Conv2D(6, 3, name="c1")(inp)
    x = L.BatchNormalization(name="bn1")(x)
    x = L.ReLU(name="relu")(x)
    x = L.Conv2D(5, 1, name="c2")(x)
    x = L.BatchNormalization(name="bn2")(x)
    x = L.Lambda(lambda t: t * 0.5 + 1.0, name="shift")(x)
    out = L.Conv2D(4, 1, name="head")(x)
    model = keras.Model(inp, out, name="lambda_model")
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if isinstance(layer, L.BatchNormalization):
            c = layer.moving_mean.shape[0]
            layer.set_weights([rng.uniform(0.5, 1.5, c), rng.normal(0.0, 1.0, c),
                               rng.normal(0.0, 0.5, c), rng.uniform(0.5, 2.0, c)])
        elif layer.weights:
            w = [rng.normal(0.0, 0.3, v.shape) for v in layer.get_weights()]
            w[0] = w[0] * rng.uniform(0.1, 5.0, w[0].shape[-1])  # spread ranges: scaling acts
            layer.set_weights([v.astype("float32") for v in w])
    return model


def _rel(a, b, x):
    ya, yb = (np.asarray(keras.ops.convert_to_numpy(m(x, training=False)), np.float64)
              for m in (a, b))
    return float(np.abs(ya - yb).max() / np.abs(ya).max())


def _safe_mode():
    from keras.src.saving import serialization_lib

    return serialization_lib.in_safe_mode()


def test_lambda_model_folds_and_equalizes_exactly_in_python():
    model = lambda_model()
    x = np.random.default_rng(1).normal(size=(2, 8, 8, 3)).astype("float32")
    before_mode = _safe_mode()
    names = [layer.name for layer in model.layers]
    weights = [w.copy() for w in model.get_weights()]
    pairs, folded = cle.fold_all_batch_norms(model)
    assert len(pairs) == 2
    assert _rel(model, folded, x) <= 1e-5
    equalized, report = cle.equalize_model(model, objective="weights", return_report=True)
    assert len(report.sets) == 1
    assert _rel(model, equalized, x) <= 1e-5
    assert isinstance(equalized.get_layer("shift"), L.Lambda)
    # no global switch left behind, and the input model untouched
    assert _safe_mode() == before_mode
    assert [layer.name for layer in model.layers] == names
    for a, b in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # a file is still loaded safely by default
    with pytest.raises(ValueError, match="safe_mode=False"):
        keras.models.Model.from_config(model.get_config())


@pytest.fixture(scope="module")
def lambda_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("lam") / "lam.keras"
    lambda_model().save(path)
    return path


@pytest.mark.parametrize("command", ["fold", "equalize", "inspect"])
def test_lambda_file_refused_by_cli_naming_the_option(capsys, tmp_path, lambda_file, command):
    out_args = [] if command == "inspect" else ["-o", tmp_path / "out.keras"]
    code, out, err = run(capsys, command, lambda_file, *out_args)
    assert code == 1 and out == ""
    assert_one_line_error(err, "lam.keras holds a Lambda layer whose function is Python code",
                          "if you trust this file, pass --unsafe-deserialization")
    assert files_in(tmp_path) == []


@pytest.mark.parametrize("command", ["fold", "equalize"])
def test_lambda_file_with_the_opt_in(capsys, tmp_path, lambda_file, command):
    out_path = tmp_path / "out.keras"
    extra = ["--objective", "weights"] if command == "equalize" else []
    code, out, err = run(capsys, command, lambda_file, "-o", out_path,
                         "--unsafe-deserialization", *extra)
    assert code == 0, err
    original = cle.load_model(lambda_file, safe_mode=False)
    written = cle.load_model(out_path, safe_mode=False)
    x = np.random.default_rng(1).normal(size=(2, 8, 8, 3)).astype("float32")
    assert _rel(original, written, x) <= 1e-5
    assert len([la for la in written.layers if isinstance(la, L.BatchNormalization)]) == 0


# ------------------------------------------------- item 4: cle.load_model reads what cle reads


def test_load_model_reads_a_legacy_hdf5_without_compiling(capsys, tmp_path):
    h5py = pytest.importorskip("h5py")
    import json

    inp = keras.Input((4,))
    model = keras.Model(inp, L.Dense(2)(inp))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    path = tmp_path / "legacy.hdf5"
    model.save(path)
    with h5py.File(path, "r+") as f:  # an optimizer config as Keras 2 wrote it
        config = json.loads(f.attrs["training_config"])
        config["optimizer_config"]["config"]["lr"] = 0.1
        f.attrs["training_config"] = json.dumps(config)
    loaded = cle.load_model(path)
    np.testing.assert_array_equal(loaded.get_weights()[0], model.get_weights()[0])
    assert run(capsys, "fold", path, "-o", tmp_path / "f.keras")[0] == 0
    with pytest.raises(Exception, match="lr"):  # compiling stays available, when asked
        cle.load_model(path, compile=True)


# ------------------------------------------ item 3: inputs checked first, all outputs or none


def _unwritable_dir(tmp_path):
    """A directory no file can be created in: read-only for a normal user; for root (whom
    permissions do not stop) a directory of /proc."""
    if os.geteuid() == 0:
        if not os.path.isdir("/proc/self") or os.access("/proc", os.W_OK) and _can_create("/proc"):
            pytest.skip("running as root without a read-only directory to test with")
        return "/proc"
    d = tmp_path / "readonly"
    d.mkdir()
    d.chmod(0o500)
    return str(d)


def _can_create(directory):
    try:
        with open(os.path.join(directory, ".cle-probe"), "w"):
            pass
    except OSError:
        return False
    os.unlink(os.path.join(directory, ".cle-probe"))
    return True


def test_unwritable_outputs_refused_before_loading(capsys, tmp_path, model_file, monkeypatch):
    ro = _unwritable_dir(tmp_path)
    monkeypatch.setattr(commands, "Session", None)  # nothing may be loaded: refused before that
    for argv, option in [
        (["fold", model_file, "-o", f"{ro}/out.keras"], "-o"),
        (["equalize", model_file, "-o", f"{ro}/out.keras"], "-o"),
        (["equalize", model_file, "-o", tmp_path / "o.keras", "--report", f"{ro}/r.json"],
         "--report"),
        (["fold", model_file, "-o", tmp_path / "o.keras", "--report", tmp_path], "--report"),
        (["fold", model_file, "-o", tmp_path / "dir.keras"], "-o"),
    ]:
        if argv[-1] == tmp_path / "dir.keras":
            (tmp_path / "dir.keras").mkdir()
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == "", (argv, err)
        assert_one_line_error(err, f"{option} ", "expected a file location cle can write, but ")
    assert sorted(os.listdir(tmp_path)) in (["dir.keras"], ["dir.keras", "readonly"])


def test_failed_report_write_leaves_no_model(capsys, tmp_path, model_file, monkeypatch):
    from cle._core import files

    real = files.write_bytes_atomic
    (tmp_path / "old.keras").write_bytes(b"old model")

    def fail_on_report(path, data):
        if str(path).endswith(".json"):
            raise PermissionError(13, "Permission denied", str(path))
        real(path, data)

    monkeypatch.setattr(files, "write_bytes_atomic", fail_on_report)
    for target in ("new.keras", "old.keras"):
        code, out, err = run(capsys, "equalize", model_file, "-o", tmp_path / target,
                             "--report", tmp_path / "r.json")
        assert code == 1 and out == ""
        assert_one_line_error(err, "cannot write", "r.json: Permission denied; nothing was "
                              "written")
    assert files_in(tmp_path) == ["old.keras"]
    assert (tmp_path / "old.keras").read_bytes() == b"old model"


@pytest.mark.parametrize("argv, message", [
    (["--bias-correction", "empirical"],
     "--bias-correction empirical needs --calibration PATH; received no --calibration"),
    (["--activation-ranges", "calibration"],
     "--activation-ranges calibration needs --calibration PATH; received no --calibration"),
    (["--calibration", "c.npy"],
     "--calibration c.npy is given but nothing would read it: it is for --bias-correction "
     "empirical and/or --activation-ranges calibration; received --bias-correction none "
     "--activation-ranges bn"),
    (["--activation-ranges", "calibration", "--calibration", "c.npy", "--objective", "weights"],
     "--activation-ranges calibration is for --objective quantized (the measured ranges "
     "choose its scales); received --objective weights"),
    (["--bias-correction", "empirical", "--calibration", "missing.npy"],
     "--calibration missing.npy: no such file"),
], ids=["empirical-no-data", "ranges-no-data", "data-unused", "ranges-weights", "data-missing"])
@pytest.mark.parametrize("command", ["equalize", "inspect"])
def test_option_combinations_refused_before_loading(capsys, tmp_path, model_file, monkeypatch,
                                                    argv, message, command):
    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "c.npy", np.zeros((2, 10, 10, 3), "float32"))
    monkeypatch.setattr(commands, "Session", None)  # nothing may be loaded: refused before that
    out_args = ["-o", tmp_path / "o.keras"] if command == "equalize" else []
    code, out, err = run(capsys, command, model_file, *out_args, *argv)
    assert code == 2 and out == ""
    assert_one_line_error(err, message)
    assert files_in(tmp_path) == ["c.npy"]


# ------------------------------------------ item 6: the bad-input matrix of docs/cli.md's table


def _gen_cli_docs():
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                        "gen_cli_docs.py")
    spec = importlib.util.spec_from_file_location("gen_cli_docs_for_outcomes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_GEN = _gen_cli_docs()


@pytest.mark.parametrize("case", _GEN.OUTCOME_CASES, ids=[c[0] for c in _GEN.OUTCOME_CASES])
def test_outcome_matrix(tmp_path, case):
    code, out, err, new = _GEN.run_outcome_case(case, tmp_path)
    assert "Traceback" not in out + err
    if code == 0:
        assert err == "" and new == ["out.keras"]
        assert out.strip().splitlines()[-1] == "wrote out.keras"
    else:
        assert new == [] and out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("cle: error: "), err
        assert code in (1, 2)
