"""A model whose class gives ``predict`` its own meaning (keras_hub's object detectors decode
and select boxes in their ``predict_step``): cle compares the outputs of its graph, which TF
Lite's converter writes, not what its ``predict`` returns (``cle.quantize`` stopped after all
its work with "returned 4 outputs but has 2")."""

import keras
import numpy as np

import cle
from cle._core.inputs import check_calibration_data
from cle._measure.inference import own_predict, predict_all

from conftest import no_tflite_on_torch

L = keras.layers


class _Decoding(keras.Model):
    """A functional model whose predict decodes: each input's best anchor and its score (as
    keras_hub's detectors do in their predict_step; here in predict, the same on every
    backend)."""

    def predict(self, x, **kwargs):
        boxes, scores = super().predict(x, **kwargs)
        return {"best": np.argmax(scores.max(-1), -1), "score": scores.max((1, 2)),
                "count": np.full(len(x), 1), "boxes": boxes[:, :2]}


def _detector():
    keras.utils.set_random_seed(0)
    inp = keras.Input((16, 16, 3), name="image")
    h = L.ReLU()(L.BatchNormalization()(L.Conv2D(8, 3, strides=2, padding="same")(inp)))
    boxes = L.Reshape((64, 4), name="boxes")(L.Conv2D(4, 1, name="box_head")(h))
    scores = L.Reshape((64, 3), name="scores")(L.Conv2D(3, 1, name="score_head")(h))
    return _Decoding(inputs=inp, outputs=[boxes, scores], name="decoding_detector")


def test_predictions_are_the_graphs_outputs_where_predict_decodes():
    model = _detector()
    x = np.random.default_rng(0).uniform(-1, 1, (40, 16, 16, 3)).astype("float32")
    assert own_predict(model) and not own_predict(keras.Model(model.inputs, model.outputs))
    assert len(keras.tree.flatten(model.predict(x, verbose=0))) == 4  # the premise
    got = predict_all(model, check_calibration_data(model, x))
    called = [np.asarray(a) for a in model(x)]
    assert [a.shape for a in got] == [(40, 64, 4), (40, 64, 3)]
    for a, b in zip(got, called):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@no_tflite_on_torch
def test_such_a_model_quantizes_and_is_checked_on_its_graphs_outputs():
    model = _detector()
    x = np.random.default_rng(1).uniform(-1, 1, (64, 16, 16, 3)).astype("float32")
    _, report = cle.quantize(model, x)
    assert [o.name for o in report.outputs] == ["boxes", "scores"]
    assert all(o.sqnr_db > 20 for o in report.outputs), report.outputs
