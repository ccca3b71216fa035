"""Residual groups (cle/_transforms/residual.py): every layer writing and reading a residual
stream scaled at once, for per-tensor weights; exact, found where the stream allows it."""

import keras
import numpy as np
import pytest
from conftest import RTOL, inputs_for, max_rel_error, randomize_batch_norms, randomize_biases

import cle
from cle._core.graph import graph_view
from cle._math import equalization
from cle._transforms import residual
from cle._transforms.bias_correction import planned_semantics
from cle._transforms.equalize import equalize_checked
from cle._transforms.options import EqualizeOptions
from cle._transforms.plan import plan_equalization

L = keras.layers


def _block(x, c, name, after_add=None):
    """expand → BN → ReLU6 → depthwise → BN → ReLU6 → project → BN, added to ``x``."""
    y = L.Conv2D(c * 4, 1, name=name + "_expand")(x)
    y = L.ReLU(6.0)(L.BatchNormalization(name=name + "_bn1")(y))
    y = L.ReLU(6.0)(L.BatchNormalization(name=name + "_bn2")(
        L.DepthwiseConv2D(3, padding="same", name=name + "_dw")(y)))
    y = L.BatchNormalization(name=name + "_bn3")(L.Conv2D(c, 1, name=name + "_project")(y))
    y = L.Add(name=name + "_add")([x, y])
    return y if after_add is None else after_add(y)


def _net(after_add=None, head=True):
    inp = keras.Input((10, 10, 3))
    x = L.BatchNormalization(name="stem_bn")(L.Conv2D(6, 3, padding="same", name="stem")(inp))
    x = _block(_block(x, 6, "b1", after_add), 6, "b2", after_add)
    if head:
        x = L.Conv2D(5, 1, name="head")(x)
    return randomize_biases(randomize_batch_norms(keras.Model(inp, x)))


def _groups(model):
    """find_groups with every BN looked through (as the fold plan will remove them)."""
    bns = {id(la) for la in model.layers if isinstance(la, L.BatchNormalization)}
    return residual.find_groups(graph_view(model), bns)


def _equalize(model, **options):
    opts = EqualizeOptions(**{"per_channel_weights": False, "residual_groups": True, **options})
    return equalize_checked(model, graph_view(model), opts, None)


def test_per_tensor_scales_the_stream_exactly():
    model = _net()
    new, report = _equalize(model)
    assert [(g.producers, g.consumers) for g in report.groups] == [
        (["stem", "b1_project", "b2_project"], ["b1_expand", "b2_expand", "head"])]
    lo, hi = report.groups[0].scale_range
    assert lo < hi and (lo != 1.0 or hi != 1.0)
    assert max_rel_error(model, new, inputs_for(model) * 3) < RTOL
    assert "residual groups: 1" in report.summary()
    assert report.to_dict()["groups"][0]["producers"] == ["stem", "b1_project", "b2_project"]


@pytest.mark.parametrize("kwargs", [{"per_channel_weights": True}, {"objective": "weights"},
                                    {"residual_groups": False}])
def test_per_channel_weight_objective_and_default_leave_the_stream(kwargs):
    """Per-channel weights of a producer do not depend on the stream's scale; Nagel's
    weight objective keeps its own sets; the groups are asked for (off by default)."""
    _, report = _equalize(_net(), **kwargs)
    assert report.groups == []
    _, report = cle.equalize_model(_net(), per_channel_weights=False, return_report=True)
    assert report.groups == []


def test_group_scale_equalizes_producer_and_consumer_ranges():
    model = _net()
    groups, ends = _groups(model)
    assert ends == [] and len(groups) == 1

    def read(layer, attr):
        return np.asarray(getattr(layer, attr))

    g = groups[0]
    s = residual.group_scale(g, read)
    out = np.max([equalization.channel_ranges(read(c.layer, "kernel"), -1) / s
                  for c in g.producers], axis=0)
    into = np.max([equalization.channel_ranges(read(c.layer, "kernel"), -2) * s
                   for c in g.consumers], axis=0)
    np.testing.assert_allclose(out, into, rtol=1e-12)


@pytest.mark.parametrize("case, reason", [
    ("relu", "(ReLU) reads it"),
    ("output", "it is an output of model"),
    ("input", "a model input is part of it"),
])
def test_streams_that_are_not_groups_say_why(case, reason):
    if case == "relu":
        model = _net(after_add=L.ReLU())
    elif case == "output":
        model = _net(head=False)
    else:
        inp = keras.Input((10, 10, 6))
        model = keras.Model(inp, L.Conv2D(4, 1, name="head")(_block(inp, 6, "b1")))
    groups, ends = _groups(model)
    assert groups == [] and ends
    assert reason in ends[0][1]


def test_analytic_bias_correction_reads_the_scaled_statistics():
    """The producers' folded BN statistics are divided by the group's scale, as a set's
    first layer's are by the set's."""
    model = _net()
    opts = EqualizeOptions(per_channel_weights=False, bias_correction="analytic",
                           residual_groups=True)
    plan = plan_equalization(model, graph_view(model), opts)
    (group, s), = plan.groups
    stats = planned_semantics(plan).stats
    bn = model.get_layer("b1_bn3")
    gamma = np.asarray(bn.gamma)
    np.testing.assert_allclose(stats["b1_project"][0], gamma / s, rtol=1e-6)
    new, _ = _equalize(model, bias_correction="analytic")
    assert max_rel_error(model, new, inputs_for(model)) < 0.1
