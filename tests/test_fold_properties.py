"""Property-based tests of ``cle.fold_all_batch_norms`` on random small Functional graphs.

A hypothesis strategy draws a *recipe* (plain dicts, printed on failure) and
:func:`build` turns it into a Keras model deterministically. Recipes mix Conv, Depthwise,
Separable, Transposed convolutions and Dense-on-channels (1D and 2D), with BatchNormalization
before / after / around each layer (center, scale, epsilon and sometimes a non-channel axis
drawn), in-layer ReLU or a ReLU layer after the block, residual adds and channel
concatenations with any earlier tensor (including the pre-BN output of a layer), a second
model output taken from the middle of the graph, and an optional Flatten/GAP -> Dense head.

For every model the properties are:

* exactness: ``max|Δ| <= RTOL * max|y|`` on every output, with spread BN statistics, random
  biases and random kernels, and the input model unchanged (``conftest.assert_folds``);
* bookkeeping: every BN is folded or skipped exactly once, skips carry a reason, no folded BN
  is left and the folded model holds exactly ``len(skipped)`` BatchNormalization layers;
* coverage: an independent oracle, computed on the recipe's own graph bookkeeping from the
  documented folding conditions (module docstring of ``cle.batch_norm_fold``), predicts for
  each BN "backward into L", "forward into L" or "skip"; the folder must agree, so a folder
  that skipped everything (trivially exact) would fail;
* the folded model is an ordinary model: folding it again works, stays exact against the
  original and only touches BNs the first pass skipped (it fails if the Identity that
  replaces an output BN cannot be serialized).
"""

from __future__ import annotations

import collections
import math

import keras
import numpy as np
from conftest import (
    RTOL,
    assert_folds,
    batch_norms,
    inputs_for,
    max_rel_error,
    randomize_batch_norms,
    randomize_biases,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import cle

_L = keras.layers

# Layer classes by spatial rank; "dense" is Dense applied on the channel axis.
_CLASSES = {
    1: {
        "conv": _L.Conv1D,
        "depthwise": _L.DepthwiseConv1D,
        "separable": _L.SeparableConv1D,
        "transpose": _L.Conv1DTranspose,
        "dense": _L.Dense,
    },
    2: {
        "conv": _L.Conv2D,
        "depthwise": _L.DepthwiseConv2D,
        "separable": _L.SeparableConv2D,
        "transpose": _L.Conv2DTranspose,
        "dense": _L.Dense,
    },
}
_POOL = {1: _L.GlobalAveragePooling1D, 2: _L.GlobalAveragePooling2D}
_ABSORBING = tuple({cls for table in _CLASSES.values() for cls in table.values()})
_TRANSPOSED = (_L.Conv1DTranspose, _L.Conv2DTranspose)

MAX_CHANNELS = 8
MAX_SPATIAL = 12

# Observed max relative error per example (read by whoever wants the figure).
OBSERVED_ERRORS: list[float] = []

_SETTINGS = dict(
    deadline=None,
    derandomize=True,  # reproducible in CI: the examples depend only on this file's source
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ---------------------------------------------------------------------------- strategies


def _bn_spec(draw):
    return {
        "center": draw(st.booleans()),
        "scale": draw(st.booleans()),
        "epsilon": draw(st.sampled_from([1e-3, 1e-5, 0.1])),
        # Mostly the channel axis; sometimes axis 1 (a spatial axis for conv tensors), which
        # must be skipped (and left in place) for conv layers.
        "axis": 1 if draw(st.integers(0, 7)) == 7 else -1,
    }


def _conv_out(n, k, s, padding):
    return (n - k) // s + 1 if padding == "valid" else (n - 1) // s + 1


def _transpose_out(n, k, s, padding):
    return n * s + max(k - s, 0) if padding == "valid" else n * s


@st.composite
def recipes(draw, rank, max_blocks=6):
    spatial = tuple(draw(st.integers(6, 10)) for _ in range(rank))
    channels = draw(st.integers(2, 4))
    # Shapes (without batch) of every tensor build() records, in the same order; 0 = input.
    shapes = [spatial + (channels,)]
    blocks = []
    for _ in range(draw(st.integers(2, max_blocks))):
        *sp, cin = shapes[-1]
        kind = draw(st.sampled_from(["conv", "depthwise", "separable", "transpose", "dense"]))
        layer = {"kind": kind, "use_bias": draw(st.booleans())}
        layer["activation"] = draw(st.sampled_from([None, "relu"]))
        if kind == "dense":
            cout = draw(st.integers(2, 6))
            layer["units"] = cout
            new_sp = sp
        else:
            k = draw(st.integers(1, 3))
            paddings = ["same", "valid"] if min(sp) >= k else ["same"]
            padding = draw(st.sampled_from(paddings))
            if kind == "transpose":
                fits = all(_transpose_out(n, k, 2, padding) <= MAX_SPATIAL for n in sp)
                stride = draw(st.integers(1, 2)) if fits else 1
                new_sp = [_transpose_out(n, k, stride, padding) for n in sp]
            else:
                fits = all(_conv_out(n, k, 2, padding) >= 2 for n in sp)
                stride = draw(st.integers(1, 2)) if fits else 1
                new_sp = [_conv_out(n, k, stride, padding) for n in sp]
            layer.update(kernel_size=k, strides=stride, padding=padding)
            if kind in ("depthwise", "separable"):
                mult = draw(st.integers(1, 2)) if 2 * cin <= MAX_CHANNELS else 1
                layer["depth_multiplier"] = mult
            if kind == "depthwise":
                cout = cin * layer["depth_multiplier"]
            elif kind == "conv" and cin % 2 == 0 and draw(st.booleans()):
                layer["groups"] = 2
                cout = 2 * draw(st.integers(1, 3))
                layer["filters"] = cout
            else:
                cout = draw(st.integers(2, 6))
                layer["filters"] = cout
        out_shape = tuple(new_sp) + (cout,)
        placement = draw(st.sampled_from(["none", "after", "before", "both"]))
        block = {"layer": layer, "bn_before": None, "bn_after": None}
        if placement in ("before", "both"):
            block["bn_before"] = _bn_spec(draw)
            shapes.append(shapes[-1])
        shapes.append(out_shape)
        if placement in ("after", "both"):
            block["bn_after"] = _bn_spec(draw)
            shapes.append(out_shape)
        block["relu"] = draw(st.booleans())
        if block["relu"]:
            shapes.append(out_shape)
        block["merge"] = None
        merge = draw(st.sampled_from([None, None, "add", "concat"]))
        cur = shapes[-1]
        # Any earlier tensor, including a layer's pre-BN output and the current one (x + x).
        if merge == "add":
            candidates = [j for j, s in enumerate(shapes) if s == cur]
        elif merge == "concat":
            candidates = [
                j for j, s in enumerate(shapes)
                if s[:-1] == cur[:-1] and s[-1] + cur[-1] <= MAX_CHANNELS + 2
            ]
        if merge and candidates:
            j = draw(st.sampled_from(candidates))
            block["merge"] = (merge, j)
            if merge == "add":
                shapes.append(cur)
            else:
                shapes.append(cur[:-1] + (cur[-1] + shapes[j][-1],))
        blocks.append(block)

    head = None
    if draw(st.booleans()):
        head = {
            "pool": draw(st.sampled_from(["flatten", "gap"])),
            "bn_before_pool": _bn_spec(draw) if draw(st.booleans()) else None,
            "bn_before_dense": _bn_spec(draw) if draw(st.booleans()) else None,
            "units": draw(st.integers(2, 5)),
            "use_bias": draw(st.booleans()),
            "activation": draw(st.sampled_from([None, "relu"])),
            "bn_after_dense": _bn_spec(draw) if draw(st.booleans()) else None,
        }
    # A second model output from the middle of the graph (never the input nor, without a
    # head, the final tensor itself).
    last = len(shapes) - (1 if head is None else 0)
    extra_output = draw(st.none() | st.integers(1, last - 1)) if last > 1 else None
    return {
        "rank": rank,
        "input_shape": shapes[0],
        "blocks": blocks,
        "head": head,
        "extra_output": extra_output,
        "shapes": shapes,
    }


# ---------------------------------------------------------------------------- builder


class _Net:
    """Calls layers and keeps its own producer/consumer bookkeeping for the oracle."""

    def __init__(self):
        self.producer = {}  # id(tensor) -> layer
        self.consumers = collections.defaultdict(list)  # id(tensor) -> [layer]
        self.bn_io = []  # (bn, input tensor, output tensor)
        self.output_of = {}  # id(layer) -> output tensor
        self.keep = []  # keep tensors alive so that ids stay valid

    def __call__(self, layer, *xs):
        y = layer(xs[0] if len(xs) == 1 else list(xs))
        for x in xs:
            self.consumers[id(x)].append(layer)
        self.producer[id(y)] = layer
        self.output_of[id(layer)] = y
        self.keep += [*xs, y]
        if isinstance(layer, _L.BatchNormalization):
            self.bn_io.append((layer, xs[0], y))
        return y


def _make_bn(spec):
    return _L.BatchNormalization(**spec)


def _make_layer(rank, spec):
    spec = dict(spec)
    cls = _CLASSES[rank][spec.pop("kind")]
    return cls(**spec)


def build(recipe):
    """Model of ``recipe`` and the oracle's expected outcome per BN name."""
    rank = recipe["rank"]
    net = _Net()
    inp = keras.Input(shape=recipe["input_shape"])
    recorded = [inp]
    x = inp

    def record(t):
        recorded.append(t)
        i = len(recorded) - 1
        assert tuple(t.shape[1:]) == recipe["shapes"][i], (i, t.shape, recipe["shapes"][i])

    for block in recipe["blocks"]:
        if block["bn_before"]:
            x = net(_make_bn(block["bn_before"]), x)
            record(x)
        x = net(_make_layer(rank, block["layer"]), x)
        record(x)
        if block["bn_after"]:
            x = net(_make_bn(block["bn_after"]), x)
            record(x)
        if block["relu"]:
            x = net(_L.ReLU(), x)
            record(x)
        if block["merge"]:
            op, j = block["merge"]
            merge = _L.Add() if op == "add" else _L.Concatenate(axis=-1)
            x = net(merge, x, recorded[j])
            record(x)
    assert len(recorded) == len(recipe["shapes"])
    head = recipe["head"]
    if head:
        if head["bn_before_pool"]:
            x = net(_make_bn(head["bn_before_pool"]), x)
        x = net(_L.Flatten() if head["pool"] == "flatten" else _POOL[rank](), x)
        if head["bn_before_dense"]:
            x = net(_make_bn(head["bn_before_dense"]), x)
        dense = _L.Dense(head["units"], use_bias=head["use_bias"], activation=head["activation"])
        x = net(dense, x)
        if head["bn_after_dense"]:
            x = net(_make_bn(head["bn_after_dense"]), x)
    outputs = [x]
    if recipe["extra_output"] is not None:
        outputs.append(recorded[recipe["extra_output"]])
    model = keras.Model(inp, outputs if len(outputs) > 1 else x)
    return model, _oracle(net, outputs)


def _linear(layer):
    return keras.activations.serialize(layer.activation) in (None, "linear")


def _oracle(net, outputs):
    """Expected outcome per BN name: ("after", layer name), ("before", layer name) or None.

    Straight from the documented conditions, on this file's own bookkeeping of the graph.
    """
    out_ids = {id(t) for t in outputs}
    expected = {}
    for bn, x, y in net.bn_io:
        rank = len(x.shape)
        on_channels = bn.axis % rank == rank - 1
        # Backward: a linear absorbing layer whose output feeds only this BN.
        producer = net.producer.get(id(x))
        # A BN right after a BN that folds backward folds into the same layer.
        prev = expected.get(getattr(producer, "name", None))
        if (
            isinstance(producer, _L.BatchNormalization)
            and prev is not None
            and prev[0] == "after"
            and net.consumers[id(x)] == [bn]
            and id(x) not in out_ids
            and bn.axis % rank == producer.axis % rank
        ):
            expected[bn.name] = prev
            continue
        if (
            isinstance(producer, _ABSORBING)
            and _linear(producer)
            and net.consumers[id(x)] == [bn]
            and id(x) not in out_ids
            and on_channels
        ):
            expected[bn.name] = ("after", producer.name)
            continue
        # Forward: the BN feeds only one non-transposed absorbing layer without padding
        # (or a Flatten that feeds only a Dense).
        expected[bn.name] = None
        if id(y) in out_ids or len(net.consumers[id(y)]) != 1:
            continue
        target = net.consumers[id(y)][0]
        if isinstance(target, _L.Flatten):
            z = net.output_of[id(target)]
            if id(z) in out_ids or len(net.consumers[id(z)]) != 1:
                continue
            target = net.consumers[id(z)][0]
            if isinstance(target, _L.Dense):
                expected[bn.name] = ("before", target.name)
            continue
        if not isinstance(target, _ABSORBING) or isinstance(target, _TRANSPOSED):
            continue
        if not isinstance(target, _L.Dense) and (
            target.padding != "valid" or getattr(target, "groups", 1) != 1
        ):
            continue
        if on_channels:
            expected[bn.name] = ("before", target.name)
    return expected


def _randomize_kernels(model, seed):
    rng = np.random.default_rng(seed)
    for layer in model._flatten_layers():
        if isinstance(layer, _L.BatchNormalization):
            continue
        for var in layer.weights:
            if var.name not in ("kernel", "depthwise_kernel", "pointwise_kernel"):
                continue
            shape = tuple(var.shape)
            fan_in = math.prod(shape[:-2] if var.name == "depthwise_kernel" else shape[:-1])
            var.assign(rng.normal(0.0, 1.0 / math.sqrt(max(fan_in, 1)), shape))


# ---------------------------------------------------------------------------- properties


def _check(recipe, seed):
    model, expected = build(recipe)
    _randomize_kernels(model, seed)
    randomize_biases(model, seed=seed + 1)
    randomize_batch_norms(model, seed=seed + 2)
    all_bns = batch_norms(model)
    assert sorted(expected) == sorted(bn.name for bn in all_bns)

    report = cle.find_foldable_batch_norms(model)
    n_folded = sum(v is not None for v in expected.values())
    pairs, folded, err = assert_folds(
        model,
        n_folded=len(report.folds),
        n_skipped=len(report.skipped),
        x=inputs_for(model, seed=seed + 3),
        rtol=RTOL,
    )
    OBSERVED_ERRORS.append(err)

    # Every BN of the input model is folded or skipped, exactly once.
    accounted = collections.Counter(id(bn) for _, bn in pairs)
    accounted.update(id(s.bn) for s in pairs.skipped)
    assert accounted == collections.Counter(id(bn) for bn in all_bns)
    for s in pairs.skipped:
        assert isinstance(s.reason, str) and s.reason.strip(), s
    # The folded model keeps exactly the skipped BNs (an Identity replaces a folded BN that
    # was a model output; it is not a BatchNormalization).
    left = sorted(bn.name for bn in batch_norms(folded))
    assert left == sorted(s.bn.name for s in pairs.skipped)
    assert not {bn.name for _, bn in pairs} & set(left)
    # find_foldable_batch_norms agrees with what was folded.
    assert [(p.layer.name, p.bn.name, p.bn_after) for p in report.folds] == [
        (p.layer.name, p.bn.name, p.bn_after) for p in pairs
    ]
    # The oracle: every fold the documented rules allow happens, in the right direction.
    got = {p.bn.name: ("after" if p.bn_after else "before", p.layer.name) for p in pairs}
    got.update({s.bn.name: None for s in pairs.skipped})
    assert got == expected, {
        "mismatch": {k: (got.get(k), v) for k, v in expected.items() if got.get(k) != v},
        "skipped": [str(s) for s in pairs.skipped],
    }
    assert len(pairs) == n_folded


@settings(max_examples=80, **_SETTINGS)
@given(recipe=recipes(rank=2), seed=st.integers(0, 2**16))
def test_fold_random_2d_graphs(recipe, seed):
    _check(recipe, seed)


@settings(max_examples=60, **_SETTINGS)
@given(recipe=recipes(rank=1), seed=st.integers(0, 2**16))
def test_fold_random_1d_graphs(recipe, seed):
    _check(recipe, seed)


@settings(max_examples=30, **_SETTINGS)
@given(recipe=recipes(rank=2), seed=st.integers(0, 2**16))
def test_folded_model_folds_again(recipe, seed):
    """The folded model is an ordinary Keras model: folding it again works, stays exact
    against the original, and can only fold BNs that the first pass skipped (a BN that
    followed a folded BN may now sit right next to a layer)."""
    model, _ = build(recipe)
    _randomize_kernels(model, seed)
    randomize_biases(model, seed=seed + 1)
    randomize_batch_norms(model, seed=seed + 2)
    x = inputs_for(model, seed=seed + 3)
    pairs, folded = cle.fold_all_batch_norms(model)
    report = cle.find_foldable_batch_norms(folded)
    pairs2, _, _ = assert_folds(
        folded, n_folded=len(report.folds), n_skipped=len(report.skipped), x=x, rtol=RTOL
    )
    _, folded2 = cle.fold_all_batch_norms(folded)
    assert max_rel_error(model, folded2, x) <= RTOL
    skipped = sorted(s.bn.name for s in pairs.skipped)
    assert sorted([bn.name for _, bn in pairs2] + [s.bn.name for s in pairs2.skipped]) == skipped
