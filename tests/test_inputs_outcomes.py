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
from cle import _backend_caps, cli

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
