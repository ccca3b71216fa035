"""Targets of ``cle.quantize(..., target=...)`` (#42): the table, the options it sets, the file
run in TF Lite Micro and compiled by Vela with their own figures, INT4 only where the target
runs it, and the command line (``--target``, ``--float-io``, ``cle targets``,
``OUT_vela.tflite``)."""

from __future__ import annotations

import importlib.util

import keras
import numpy as np
import pytest
from conftest import BACKEND, no_tflite_on_torch

import cle
from cle import cli
from cle._core.inputs import ModelInputs
from cle._quantize.options import QuantizeOptions
from cle._tflite import targets as T
from cle._tflite import tflm, vela

L = keras.layers
HAVE_TOOLS = all(importlib.util.find_spec(m) for m in ("tflite_micro", "ethosu"))
needs_tools = pytest.mark.skipif(not HAVE_TOOLS, reason="needs pip install keras-cle[targets]")


# ------------------------------------------------------------------------------ the table


def test_every_target_is_found_by_name_and_a_wrong_name_lists_them():
    for name, spec in T.TARGETS.items():
        assert T.target_named(name) is spec and spec.name == name
    assert {"litert", "tflm", "ethos-u55-128", "ethos-u65-512", "ethos-u85-256"} <= set(T.TARGETS)
    with pytest.raises(ValueError, match="ethos-u55-128.*Received: target='ethos-u99'"):
        T.target_named("ethos-u99")


def test_int4_rules_are_read_from_the_table():
    litert, micro, npu = (T.TARGETS[n] for n in ("litert", "tflm", "ethos-u55-128"))
    assert litert.int4_refusal("FULLY_CONNECTED", True) is None
    assert "TRANSPOSE_CONV" in litert.int4_refusal("TRANSPOSE_CONV", True)
    assert micro.int4_refusal("CONV_2D", True) is None
    assert micro.int4_refusal("FULLY_CONNECTED", False) is None
    assert "runs per-tensor ones" in micro.int4_refusal("FULLY_CONNECTED", True)
    assert micro.per_tensor_kinds(True) == {"dense": micro.no_int4["FULLY_CONNECTED"]}
    assert micro.per_tensor_kinds(False) == {} == litert.per_tensor_kinds(True)
    assert "Vela" in npu.int4_refusal("CONV_2D", False)
    assert (litert.integer_io, micro.integer_io, npu.integer_io) == (False, True, True)


def test_options_take_the_targets_io_and_refuse_what_it_cannot_do(monkeypatch):
    assert QuantizeOptions().integer_io is False
    if HAVE_TOOLS:
        assert QuantizeOptions(target="tflm").integer_io is True
        assert QuantizeOptions(target="tflm", integer_io=False).integer_io is False
        with pytest.raises(ValueError, match="8-bit activations only.*activation_bits=16"):
            QuantizeOptions(target="ethos-u55-128", activation_bits=16)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"needs tflite_micro.*pip install keras-cle\[targets\]"):
        QuantizeOptions(target="tflm")


# ----------------------------------------------------------------------- on the target


def _net(seed=0):
    keras.utils.set_random_seed(seed)
    inp = keras.Input((16, 16, 3))
    x = L.Conv2D(8, 3, padding="same", use_bias=False)(inp)
    x = L.ReLU()(L.BatchNormalization()(x))
    x = L.DepthwiseConv2D(3, padding="same", use_bias=False)(x)
    x = L.ReLU()(L.BatchNormalization()(x))
    x = L.GlobalAveragePooling2D()(L.Conv2D(16, 1)(x))
    model = keras.Model(inp, L.Dense(10, activation="softmax")(x))
    rng = np.random.default_rng(seed)
    for bn in model.layers:
        if isinstance(bn, L.BatchNormalization):
            c = bn.moving_mean.shape[0]
            bn.gamma.assign(rng.uniform(0.5, 2.0, c))
            bn.beta.assign(rng.normal(0.0, 0.5, c))
    return model, rng.uniform(-1, 1, (40, 16, 16, 3)).astype("float32")


@pytest.fixture(scope="module")
def net():
    return _net()


@needs_tools
@no_tflite_on_torch
def test_tflm_runs_the_file_agrees_with_litert_and_reports_the_arena_it_needs(
        net, monkeypatch):
    model, x = net
    content, report = cle.quantize(model, x, target="tflm")
    t = report.target
    assert t["name"] == "tflm" and t["integer_io"] and t["flash_bytes"] == len(content)
    assert t["runs"], report.warnings  # on JAX too: read with a batch of one (static_batch)
    check = t["runtime_check"]
    assert check["runtime"] == "tflm" and check["n"] == 10
    for o in check["outputs"]:  # reference kernels round differently from LiteRT's: close
        assert abs(float(o["sqnr_db"]) - float(o["litert_sqnr_db"])) < 0.5
    assert t["file_bytes"] == len(content)
    # the arena reported is what TFLM needs: the file runs in it, not in a little less
    x1 = ModelInputs((x[:1],), ("x",), (x.shape[1:],))
    monkeypatch.setattr(tflm, "ARENA_LIMIT", t["arena_bytes"])
    assert tflm.run_tflm(content, x1).arena_bytes == t["arena_bytes"]
    monkeypatch.setattr(tflm, "ARENA_LIMIT", t["arena_bytes"] - 256)
    with pytest.raises(tflm.TflmFailed, match="refused"):
        tflm.run_tflm(content, x1)
    assert "TF Lite Micro: tensor arena" in report.summary()


@needs_tools
@no_tflite_on_torch
@pytest.mark.parametrize("per_channel", [True, False])
def test_tflm_gets_int4_only_where_its_kernels_take_it(net, per_channel):
    model, x = net
    content, report = cle.quantize(model, x, target="tflm", weight_bits=4,
                                   per_channel=per_channel, rounding="nearest")
    storage = {w.op: w.storage for w in report.weights}
    assert storage["CONV_2D"] == storage["DEPTHWISE_CONV_2D"] == "INT4"
    fc = next(w for w in report.weights if w.op == "FULLY_CONNECTED")
    assert fc.storage == "INT4" and not fc.per_channel  # per tensor: what TFLM runs
    assert ("per-tensor: TFLM's FULLY_CONNECTED" in fc.reason) == per_channel
    assert ("dense layers on per-tensor grids: TFLM's" in report.summary()) == per_channel
    conv = next(w for w in report.weights if w.op == "CONV_2D")
    assert conv.per_channel == per_channel
    assert report.target["runs"], report.warnings


@needs_tools
@no_tflite_on_torch
def test_a_file_tflm_refuses_is_a_failure_naming_the_operator(net):
    model, x = net
    content, _ = cle.quantize(model, x, weight_bits=4, rounding="nearest")  # LiteRT's rules
    x1 = ModelInputs((x[:1],), ("x",), (x.shape[1:],))
    with pytest.raises(tflm.TflmFailed, match="FULLY_CONNECTED|UNSORTED_SEGMENT_PROD"):
        tflm.run_tflm(content, x1)


@needs_tools
@no_tflite_on_torch
def test_ethos_u_compiles_every_operator_onto_the_npu_with_vela_figures(net):
    model, x = net
    content, report = cle.quantize(model, x, target="ethos-u55-128")
    t = report.target
    assert t["compiled"] and t["npu_ops"] > 0
    assert t["sram_bytes"] > 0 and t["flash_bytes"] > 0 and t["inference_seconds"] > 0
    assert report.compiled[4:8] == b"TFL3" and report.compiled != content
    assert t["cpu_ops"] == 0 and t["cpu_op_names"] == []
    assert t["runs"]  # and the INT8 file runs in TFLM's reference kernels
    # float input/output: the ends go to the CPU, and the report says so
    _, floats = cle.quantize(model, x, target="ethos-u55-128", integer_io=False)
    assert sorted(floats.target["cpu_op_names"]) == ["DEQUANTIZE", "QUANTIZE"]
    assert any("to the CPU (DEQUANTIZE, QUANTIZE)" in w and "unsupported DataType Float32" in w
               for w in floats.warnings)
    assert "QUANTIZE" in floats.target["cpu_reasons"]


@needs_tools
@no_tflite_on_torch
def test_ethos_u_with_4_bit_weights_writes_grids_vela_compiles(net):
    model, x = net
    content, report = cle.quantize(model, x, target="ethos-u85-256", weight_bits=4,
                                   rounding="nearest")
    assert {w.storage for w in report.weights} == {"INT8"}
    assert all("Vela 5.2 crashes on INT4" in w.reason for w in report.weights)
    assert report.target["compiled"] and report.compiled


@no_tflite_on_torch
def test_a_device_target_reads_the_model_with_a_batch_of_one(net):
    """Keras' export (every model on JAX) is polymorphic in the batch, and its shape
    arithmetic has no TFLM kernel; within static_batch(1) the file holds a batch of one, and
    LiteRT runs it one input at a time, as close to the float model as the free-batch file."""
    from cle._tflite import converter
    from cle._tflite.runtime import interpreter, run_all

    model, x = net
    free = converter.convert_int8(model, x[:8], keras_route=True)
    with converter.static_batch(1):
        fixed = converter.convert_int8(model, x[:8], keras_route=True)
    signature = interpreter(fixed).get_input_details()[0]["shape_signature"]
    assert list(signature) == [1, 16, 16, 3]
    free_batch = interpreter(free).get_input_details()[0]["shape_signature"][0]
    assert free_batch == (-1 if BACKEND == "tensorflow" else 1)  # converter.export_batch
    xs = ModelInputs((x[:5],), ("x",), (x.shape[1:],))
    ref = model.predict(x[:5], verbose=0)
    for content in (fixed, free):
        y = run_all(content, xs)[0]
        assert y.shape == ref.shape
        assert 10 * np.log10(np.sum(ref ** 2) / np.sum((y - ref) ** 2)) > 25


@needs_tools
@pytest.mark.skipif(BACKEND != "tensorflow", reason="recurrent layers convert on TensorFlow "
                    "only (tests/test_unconvertible.py)")
def test_an_unrolled_lstm_runs_on_the_microcontroller():
    """A model traced on TensorFlow kept its batch free, and an unrolled LSTM's zero state
    became SHAPE and FILL of that batch: TF Lite Micro refused the file ('Non-constant dims
    tensor is not supported', FILL). Traced with the device's batch of one it has neither,
    and the file runs in TFLM (its reference kernels for the gates' logistic and tanh round
    otherwise than LiteRT's: about a decibel lower here, measured and reported)."""
    from cle._tflite import converter
    from cle._tflite.runtime import interpreter

    keras.utils.set_random_seed(0)
    inp = keras.Input((12, 4), name="signal")
    model = keras.Model(inp, L.Dense(3)(L.LSTM(8, unroll=True)(inp)))
    x = np.random.default_rng(0).normal(size=(40, 12, 4)).astype(np.float32)
    _, report = cle.quantize(model, x, target="tflm")
    assert report.target["runs"], report.warnings
    (check,) = report.target["runtime_check"]["outputs"]
    assert float(check["sqnr_db"]) > 25 and float(check["litert_sqnr_db"]) > 25
    assert check["agreement"] is None and check["top1_agreement"] is None  # values: no argmax
    xs = ModelInputs((x[:8],), ("signal",), (x.shape[1:],))
    with converter.static_batch(1):
        fixed = converter.convert_int8(model, xs)
    ops = {d["op_name"] for d in interpreter(fixed)._get_ops_details()}
    assert not ops & {"SHAPE", "FILL"}, ops
    assert list(interpreter(fixed).get_input_details()[0]["shape_signature"]) == [1, 12, 4]


def test_vela_failure_names_how_it_ended():
    class Done:
        returncode, stdout, stderr = -8, "Warning: No system configuration\n", ""
    assert vela._failure(Done()) == "Vela's process was stopped by signal 8 with no message"


# ---------------------------------------------------------------------- command line


def test_cle_targets_lists_every_target(capsys):
    assert cli.main(["targets"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in T.TARGETS)
    assert "keras-cle[targets]" in out


def test_an_unknown_target_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["quantize", "m.keras", "-o", str(tmp_path / "o.tflite"), "--target",
                     "npu"]) == 2
    assert "invalid choice: 'npu'" in capsys.readouterr().err


@needs_tools
@no_tflite_on_torch
def test_cli_writes_the_vela_model_beside_the_output(net, tmp_path, capsys):
    model, x = net
    model.save(tmp_path / "m.keras")
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "m_int8.tflite"
    assert cli.main(["quantize", str(tmp_path / "m.keras"), "-o", str(out), "--calibration",
                     str(tmp_path / "x.npy"), "--target", "ethos-u55-128"]) == 0
    said = capsys.readouterr().out
    assert (tmp_path / "m_int8_vela.tflite").read_bytes()[4:8] == b"TFL3"
    assert "Vela (ethos-u55-128" in said and f"wrote {tmp_path / 'm_int8_vela.tflite'}" in said


@needs_tools
@no_tflite_on_torch
def test_cli_writes_a_file_the_target_refuses_and_exits_3_saying_why(net, tmp_path, capsys,
                                                                     monkeypatch):
    model, x = net
    model.save(tmp_path / "m.keras")
    np.save(tmp_path / "x.npy", x)
    out = tmp_path / "m_int8.tflite"
    monkeypatch.setattr(tflm, "ARENA_LIMIT", 1024)  # no file of this net fits: TFLM refuses
    assert cli.main(["quantize", str(tmp_path / "m.keras"), "-o", str(out), "--calibration",
                     str(tmp_path / "x.npy"), "--target", "tflm"]) == 3
    said = capsys.readouterr()
    assert out.read_bytes()[4:8] == b"TFL3" and f"wrote {out}" in said.out
    assert f"cle: error: {out} was written, but on target tflm: the file does not run in " \
           "TF Lite Micro" in said.err
    # the report says the same; where the file runs, no failures (and exit 0: the Vela test)
    _, report = cle.quantize(model, x, target="tflm")
    assert not report.target["runs"] and report.target["failures"] == [
        w for w in report.warnings if "does not run in TF Lite Micro" in w]
    monkeypatch.undo()
    _, report = cle.quantize(model, x, target="tflm")
    assert report.target["runs"] and "failures" not in report.target


@needs_tools
@no_tflite_on_torch
def test_cli_removes_an_earlier_runs_vela_model_when_vela_fails(net, tmp_path, capsys,
                                                                 monkeypatch):
    """helper-34's review: Vela failing (exit 3) left an earlier run's OUT_vela.tflite beside
    the new OUT.tflite, a compiled model of another file."""
    from cle._quantize import deploy

    model, x = net
    model.save(tmp_path / "m.keras")
    np.save(tmp_path / "x.npy", x)
    out, old = tmp_path / "m_int8.tflite", tmp_path / "m_int8_vela.tflite"
    old.write_bytes(b"an earlier run's compiled model")

    def fails(*args, **kwargs):
        raise vela.VelaFailed("Vela stopped")

    monkeypatch.setattr(deploy.vela, "compile_for_npu", fails)
    assert cli.main(["quantize", str(tmp_path / "m.keras"), "-o", str(out), "--calibration",
                     str(tmp_path / "x.npy"), "--target", "ethos-u55-128"]) == 3
    err = capsys.readouterr().err
    assert out.exists() and not old.exists()
    assert "Vela could not compile the file for ethos-u55-128: Vela stopped" in err
    assert f"cle: removed {old}: an earlier run compiled it" in err
