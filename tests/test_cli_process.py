"""The ``cle`` command and package as a new process sees them: start-up without TensorFlow,
a quiet stderr, loading equalized models, and files that survive an interrupted write.

Every check that depends on what a fresh interpreter imports runs in a subprocess (the test
process itself has long imported Keras).
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import keras
import numpy as np
import pytest

from cle import cli
from cle._core import files as _files
from conftest import randomize_batch_norms

L = keras.layers
CLE = os.path.join(os.path.dirname(sys.executable), "cle")


def python(code, *args, timeout=300, env=None):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=env)


def tiny_relu6_cnn():
    inp = keras.Input((8, 8, 3), name="image")
    x = L.Conv2D(6, 3, name="conv1")(inp)
    x = L.BatchNormalization(name="bn1")(x)
    x = L.ReLU(6.0, name="relu6")(x)
    x = L.Conv2D(4, 1, name="conv2")(x)
    return randomize_batch_norms(keras.Model(inp, x, name="tiny"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("process")
    tiny_relu6_cnn().save(d / "tiny.keras")
    return d


# ---------------------------------------------------------------------------- start-up


def test_help_version_usage_errors_and_import_cle_do_not_import_keras(tmp_path):
    proc = python(f"""
        import contextlib, io, sys
        import cle
        from cle.cli import main
        codes = []
        for argv in (["--help"], ["equalize", "--help"], ["--version"],
                     ["equalize", {str(tmp_path / "missing.keras")!r}, "-o", "x.keras"],
                     ["equalize", "--relu6", "clip"]):
            with contextlib.redirect_stdout(io.StringIO()), \\
                    contextlib.redirect_stderr(io.StringIO()):
                codes.append(main(argv))
        heavy = sorted(m for m in ("keras", "tensorflow", "numpy", "jax")
                       if m in sys.modules)
        print(codes, heavy)
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[0, 0, 0, 2, 2] []"
    assert proc.stderr == ""


def test_the_import_hook_never_breaks_import_keras():
    """``import cle`` puts a finder before Keras' import; an error registering cle's layers is a
    warning, and Keras is imported all the same."""
    proc = python("""
        import sys, warnings
        import cle
        sys.modules["cle.layers"] = None  # importing cle.layers now raises ImportError
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import keras
        print(keras.__name__, [str(w.message)[:50] for w in caught
                               if issubclass(w.category, RuntimeWarning)])
        print(any(type(f).__name__ == "_RegisterAfterKeras" for f in sys.meta_path))
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "keras ['keras-cle could not register its layers with Keras']", "False"]


def test_console_script_help_is_quick_and_silent():
    proc = subprocess.run([CLE, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "equalize" in proc.stdout
    assert proc.stderr == ""
    proc = subprocess.run([CLE, "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("cle ")


def test_cle_commands_write_nothing_but_their_output_on_stderr(files):
    """No TensorFlow / absl / oneDNN start-up line from a command that imports TensorFlow."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TF_", "CLE_"))}
    proc = subprocess.run([CLE, "equalize", files / "tiny.keras", "-o", files / "eq.keras",
                           "--report", files / "eq.json"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "wrote" in proc.stdout
    proc = subprocess.run([CLE, "inspect", files / "eq.keras"], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


# ---------------------------------------------------------------------------- loading


@pytest.fixture(scope="module")
def equalized_file(files):
    import cle

    path = files / "equalized.keras"
    # objective="weights" scales every set, so the file holds ClippedReLU layers (the default
    # scales only sets above its modelled-gain margin: none on this tiny model).
    cle.equalize_model(keras.models.load_model(files / "tiny.keras"),
                       objective="weights").save(path)
    return path


@pytest.mark.parametrize("order", ["import cle; import keras", "import keras; import cle"])
def test_import_cle_makes_keras_load_model_work(equalized_file, order):
    proc = python(f"""
        import sys
        {order}
        m = keras.models.load_model(sys.argv[1])
        print(sorted({{type(l).__name__ for l in m.layers}}))
    """, equalized_file)
    assert proc.returncode == 0, proc.stderr
    assert "'ClippedReLU'" in proc.stdout


def test_without_cle_keras_cannot_load_and_cle_load_model_can(equalized_file):
    proc = python("""
        import sys
        import numpy as np
        import keras
        try:
            keras.models.load_model(sys.argv[1])
        except Exception as exc:
            print("keras alone:", "Could not locate class 'ClippedReLU'" in str(exc))
        import cle
        m = cle.load_model(sys.argv[1])
        x = np.random.default_rng(0).normal(size=(2, 8, 8, 3)).astype("float32")
        # convert_to_numpy, not np.asarray: on PyTorch the outputs are tensors that require grad.
        y = keras.ops.convert_to_numpy(m(x))
        same = np.array_equal(y, keras.ops.convert_to_numpy(keras.models.load_model(sys.argv[1])(x)))
        print("cle.load_model:", type(m.get_layer("relu6")).__name__, same)
    """, equalized_file)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["keras alone: True", "cle.load_model: ClippedReLU True"]


def test_cle_load_model_in_process(equalized_file):
    import cle

    m = cle.load_model(equalized_file, compile=False)
    assert isinstance(m.get_layer("relu6"), cle.ClippedReLU)
    assert set(cle.custom_objects()) >= {"ClippedReLU", "FoldedConv2D", "FakeQuant"}


# ---------------------------------------------------------------------------- safe writes


def test_output_equal_to_input_is_refused(capsys, files, tmp_path):
    src = tmp_path / "model.keras"
    src.write_bytes((files / "tiny.keras").read_bytes())
    before = src.read_bytes()
    for out in (src, tmp_path / "." / "model.keras"):
        code = cli.main(["equalize", str(src), "-o", str(out)])
        _, err = capsys.readouterr()
        assert code == 2
        assert err.startswith("cle: error: -o ") and "is the input model" in err
        assert "--overwrite" in err and len(err.strip().splitlines()) == 1
    link = tmp_path / "link.keras"
    link.symlink_to(src)
    assert cli.main(["fold", str(src), "-o", str(link)]) == 2
    capsys.readouterr()
    assert src.read_bytes() == before
    assert cli.main(["equalize", str(src), "-o", str(src), "--overwrite"]) == 0
    capsys.readouterr()
    assert src.read_bytes() != before
    assert sorted(os.listdir(tmp_path)) == ["link.keras", "model.keras"]


def test_report_cannot_be_the_input_or_the_output(capsys, files, tmp_path):
    src = files / "tiny.keras"
    code = cli.main(["fold", str(src), "-o", str(tmp_path / "o.keras"), "--report", str(src)])
    assert code == 2 and "is the input model" in capsys.readouterr().err
    out = tmp_path / "o.keras"
    code = cli.main(["fold", str(src), "-o", str(out), "--report", str(out)])
    assert code == 2 and "is also the output model" in capsys.readouterr().err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("anonymous", [True, False], ids=["O_TMPFILE", "named-temp"])
def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch, anonymous):
    target = tmp_path / "report.json"
    target.write_bytes(b"old")
    if not anonymous:
        monkeypatch.delattr(os, "O_TMPFILE", raising=False)

    def fail_half_way(fd, data, chunk=1 << 20):
        os.write(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_files, "_write_all", fail_half_way)
    with pytest.raises(OSError):
        _files.write_bytes_atomic(str(target), b"new content")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["report.json"]
    monkeypatch.undo()
    _files.write_bytes_atomic(str(target), b"new content")
    assert target.read_bytes() == b"new content"
    assert os.listdir(tmp_path) == ["report.json"]


def test_killed_mid_write_leaves_old_file_and_nothing_else(files, tmp_path):
    """SIGKILL while the new model's bytes are being written: the old output file is intact
    and no partial or temporary file is left in the directory."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    old = out_dir / "eq.keras"
    old.write_bytes(b"the user's previous model")
    marker = tmp_path / "writing"
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import os, sys, time
        from cle import cli
        from cle._core import files as _files

        def slow(fd, data, chunk=1 << 20):
            os.write(fd, data[: len(data) // 2])
            open(sys.argv[1], "w").close()
            time.sleep(600)

        _files._write_all = slow
        sys.exit(cli.main(sys.argv[2:]))
    """), str(marker), "equalize", str(files / "tiny.keras"), "-o", str(old)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the child never started writing"
            time.sleep(0.1)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    assert old.read_bytes() == b"the user's previous model"
    assert os.listdir(out_dir) == ["eq.keras"]


def test_reports_are_written_atomically(capsys, files, tmp_path, monkeypatch):
    report = tmp_path / "fold.json"
    report.write_text("{}")
    calls = []
    real = _files.write_bytes_atomic
    monkeypatch.setattr(_files, "write_bytes_atomic",
                        lambda path, data: calls.append(os.path.basename(path)) or real(path, data))
    code = cli.main(["fold", str(files / "tiny.keras"), "-o", str(tmp_path / "f.keras"),
                     "--report", str(report)])
    capsys.readouterr()
    assert code == 0
    assert calls == ["f.keras", "fold.json"]
    assert json.loads(report.read_text())["folded"][0]["bn"] == "bn1"
    assert sorted(os.listdir(tmp_path)) == ["f.keras", "fold.json"]


# ---------------------------------------------------------------------------- clear messages


def test_sequential_with_only_an_input_says_it_has_no_layers():
    import cle

    with pytest.raises(ValueError, match=r"'only_input' has no layers \(a keras.Input alone"):
        cle.equalize_model(keras.Sequential([keras.Input((4,))], name="only_input"))


@pytest.mark.parametrize("kind, fragment", [
    ("object", "holds Python objects (a pickled object array)"),
    ("npz", "is an .npz archive"),
    ("strings", "holds an array of <U1, not numbers"),
    ("missing", ": no such file"),
])
def test_calibration_file_errors(capsys, files, tmp_path, kind, fragment):
    path = tmp_path / ("c.npz" if kind == "npz" else "c.npy")
    if kind == "object":
        np.save(path, np.array([{"a": 1}], dtype=object))
    elif kind == "npz":
        np.savez(path, a=np.zeros(3))
    elif kind == "strings":
        np.save(path, np.array(["a"]))
    code = cli.main(["equalize", str(files / "tiny.keras"), "-o", str(tmp_path / "o.keras"),
                     "--bias-correction", "empirical", "--calibration", str(path)])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("cle: error: --calibration ")
    assert fragment in err
    assert "allow_pickle" not in err
    assert not (tmp_path / "o.keras").exists()


def test_every_public_name_and_submodule_resolves():
    import cle

    for name in cle.__all__:
        assert getattr(cle, name) is not None, name
    assert cle.equalize_model is sys.modules["cle.cross_layer_equalization"].equalize_model
    assert cle.quantization is sys.modules["cle.quantization"]
    assert set(cle.__all__) <= set(dir(cle))
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        cle.no_such_name
