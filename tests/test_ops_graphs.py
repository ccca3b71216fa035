"""Functional graphs with plain Keras operations (``x + y``, ``keras.ops.multiply``, an ops-built
hard-swish) between, inside and after the layers that are folded and scaled.

Such operations are graph nodes that are not layers: they have no weights and must pass through
the graph view and the rebuild untouched (MobileNetV3 and ConvNeXt crashed in ``copy_weights``
before). An elementwise add of two same-shape tensors behaves as a ``keras.layers.Add``.
"""

import keras
import numpy as np
import pytest
from conftest import (
    RTOL,
    assert_folds,
    assert_unchanged,
    inputs_for,
    max_rel_error,
    randomize_batch_norms,
    randomize_biases,
    weights_snapshot,
)

import cle
from cle._core.graph import graph_view

L = keras.layers
ops = keras.ops


def _rand(model):
    return randomize_biases(randomize_batch_norms(model, seed=4), seed=5)


def _residual_op_before_bn():
    """c1 → bn1 → r1 ─┬─ c2 ─ (+) ─ bn2 ─ c3 (1×1, valid)
                      └────────┘
    bn2's input is the ``+`` op, so it cannot fold backward; it folds forward into c3."""
    inp = keras.Input((10, 10, 4))
    a = L.ReLU(name="r1")(L.BatchNormalization(name="bn1")(
        L.Conv2D(6, 3, padding="same", name="c1")(inp)))
    s = L.Conv2D(6, 1, name="c2")(a) + a
    out = L.Conv2D(5, 1, name="c3")(L.BatchNormalization(name="bn2")(s))
    return _rand(keras.Model(inp, out))


def test_op_between_conv_and_bn_folds_forward_and_exactly():
    model = _residual_op_before_bn()
    pairs, folded, _ = assert_folds(model, 2, 0, forward=1)
    assert sorted((p.layer.name, p.bn.name, p.bn_after) for p in pairs) == [
        ("c1", "bn1", True), ("c3", "bn2", False)]
    new, report = cle.equalize_model(model, return_report=True)
    assert len(report.folded) == 2
    assert max_rel_error(model, new, inputs_for(model)) <= RTOL


def _ops_chain():
    """c1 → bn1 → r1 → c2 → bn2 → r2 → c3 → ops hard-swish → ops gating → c4 → bn4 ─ (+) = output
                                                                      └→ c5 ─────────┘
    (c1, c2) and (c2, c3) are scalable; the hard-swish and the gating (operations, not layers)
    end the chain at c3; c4 and c5 feed an op that is the model's output."""
    inp = keras.Input((12, 12, 3))
    x = L.ReLU(name="r1")(L.BatchNormalization(name="bn1")(L.Conv2D(8, 3, name="c1")(inp)))
    x = L.ReLU(name="r2")(L.BatchNormalization(name="bn2")(L.Conv2D(8, 3, name="c2")(x)))
    h = L.Conv2D(8, 1, name="c3")(x)
    h = h * ops.relu6(h + 3.0) / 6.0
    g = ops.multiply(h, ops.sigmoid(ops.mean(h, axis=(1, 2), keepdims=True)))
    y = L.BatchNormalization(name="bn4")(L.Conv2D(4, 1, name="c4")(g))
    out = y + L.Conv2D(4, 1, name="c5")(g)
    return _rand(keras.Model(inp, out))


@pytest.mark.parametrize("relu6", ["bound", "replace"])
def test_ops_inside_a_scaling_chain_and_as_model_output(relu6):
    model = _ops_chain()
    snap, names = weights_snapshot(model), [la.name for la in model._flatten_layers()]
    pairs, _, _ = assert_folds(model, 3, 0)
    assert sorted(p.bn.name for p in pairs) == ["bn1", "bn2", "bn4"]
    # objective="weights": every set found is scaled (the default's margin would leave these).
    new, report = cle.equalize_model(model, relu6=relu6, objective="weights",
                                     return_report=True)
    assert [[(p.layer1.name, p.layer2.name) for p in s.cls_pair_info_list]
            for s in report.sets] == [[("c1", "c2")], [("c2", "c3")]]
    ends = dict(report.set_ends)
    assert set(ends) == {"c3", "c4", "c5"}, ends
    # Scaling really happened (otherwise the exactness check below would be trivial).
    assert not np.allclose(report.sets[0].cls_pair_info_list[0].scale_factor, 1.0)
    x = inputs_for(model) * 3  # drive the hard-swish's relu6 into both caps
    assert max_rel_error(model, new, x) <= RTOL
    assert [t._keras_history.operation.name for t in new.outputs] == [
        t._keras_history.operation.name for t in model.outputs]
    # High-bias folding (approximate by design: the 3σ rule) runs through the ops as well.
    hbf, hbf_report = cle.equalize_model(model, relu6=relu6, high_bias_fold="unpadded",
                                         objective="weights", return_report=True)
    assert len(hbf_report.bias_absorptions) == 2
    assert np.isfinite(outputs_of(hbf, x)).all()
    assert_unchanged(model, snap, names)


def outputs_of(model, x):
    return keras.ops.convert_to_numpy(model(x, training=False))


def test_model_with_ops_round_trips_as_keras_file(tmp_path):
    model = _ops_chain()
    new = cle.equalize_model(model)
    path = tmp_path / "ops.keras"
    new.save(path)
    loaded = keras.models.load_model(path, custom_objects={"ClippedReLU": cle.ClippedReLU})
    x = inputs_for(model)
    assert max_rel_error(new, loaded, x) == 0.0


def _kind(fn, shapes=((4, 4, 3),)):
    inputs = [keras.Input(shape) for shape in shapes]
    (call,) = graph_view(keras.Model(inputs, fn(*inputs))).calls
    return call


def test_kind_of_ops():
    assert _kind(lambda x: x + x).kind is L.Add  # two same-shape tensors
    assert _kind(lambda x, y: x + y, ((4, 4, 3),) * 2).kind is L.Add
    assert _kind(lambda x, y: ops.multiply(x, y), ((4, 4, 3),) * 2).kind is L.Multiply
    const = _kind(lambda x: x + 1.0)  # one tensor and a constant
    assert const.kind is not L.Add and not const.is_layer
    assert _kind(lambda x, y: x + y, ((4, 4, 3), (1, 1, 3))).kind is not L.Add  # broadcast
    assert _kind(lambda x: ops.subtract(x, x)).kind is not L.Add
    layer = _kind(lambda x: L.Add()([x, x]))
    assert layer.kind is L.Add and layer.is_layer


def _two_branch(use_op):
    inp = keras.Input((9, 9, 3))
    a = L.BatchNormalization(name="bn1")(L.Conv2D(6, 3, name="c1")(inp))
    b = L.BatchNormalization(name="bn2")(L.Conv2D(6, 3, name="c2")(inp))
    s = a + b if use_op else L.Add(name="add")([a, b])
    out = L.Conv2D(4, 1, name="c3")(s)
    return keras.Model(inp, out)


def test_analytic_bias_correction_sees_an_op_add_as_an_add():
    with_layer = _rand(_two_branch(False))
    with_op = _two_branch(True)
    with_op.set_weights(with_layer.get_weights())
    results = []
    for model in (with_layer, with_op):
        new, report = cle.equalize_model(model, bias_correction="analytic", return_report=True)
        records = {r.layer: r for r in report.bias_corrections}
        results.append((new, records))
    (new_a, rec_a), (new_b, rec_b) = results
    # c3's input mean is the sum of the two folded BNs' means, through the Add in both models.
    assert rec_a["c3"].mode == "analytic" and rec_b["c3"].mode == "analytic", rec_b["c3"]
    assert rec_a["c3"].max_abs_delta > 0
    for name in ("c1", "c2", "c3"):
        np.testing.assert_array_equal(
            new_a.get_layer(name).bias.numpy(), new_b.get_layer(name).bias.numpy())
