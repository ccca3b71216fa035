"""The plan of :func:`cle.equalize_model`: every stage decided on the one graph view of the
input model and written as ``LayerEdit``s for one rebuild.

Stages, in order: BN folding (``batch_norm_fold.fold_plan``), the scaling sets as they will be
after folding and ReLU6 handling (one ``find_sets``), each set's scales (chosen for the INT8
target, or Nagel's), high-bias folding, the ReLU6 edits (a ReLU6 inside a scaled set becomes a
ClippedReLU with its scaled caps). Weights a later stage reads are the ones the earlier stages
will give (:class:`cle._transforms.scaling.PlannedWeights`): nothing is built or assigned until the
rebuild.
"""

from __future__ import annotations

import dataclasses
import functools
import logging

import keras
import numpy as np

from cle._math import noise
from cle._transforms import scale_choice
from cle._transforms import scaling as _scaling
from cle._transforms.bn_match import find_matches, fold_plan
from cle._transforms.sets import SetSearch, find_sets
from cle._core.backend import compiled
from cle._core.graph import GraphView, inner_function
from cle._core.layouts import channel_axis
from cle._transforms.options import EqualizeOptions
from cle._core.rebuild import LayerEdit
from cle._transforms.relu6 import all_relu6, changed_name, merge, relu6_edit
from cle._transforms.stable import (all_normalizations, all_one_hots, all_stable,
                                   normalization_edit, one_hot_edit, stable_edit)
from cle._core.weights import gamma_beta

__all__ = ["EqualizePlan", "decide_sets", "measure_junctions", "plan_equalization",
           "pre_activation"]

logger = logging.getLogger("cle.cross_layer_equalization")

#: The junction pass's batch on a large network (:func:`measure_junctions`), and what its
#: junctions' activations may hold at once, in bytes, for a larger batch on a small one.
JUNCTION_BATCH = 8
JUNCTION_PASS_BYTES = 64 * 2 ** 20


@dataclasses.dataclass
class EqualizePlan:
    """What :func:`plan_equalization` decided, on the input model's layers."""

    matches: list
    fold_skipped: list
    search: SetSearch
    decisions: list  # one ScalingDecision per set of ``search``
    scaled: list  # (links, scales) of every scaled set, in graph order
    absorptions: list  # BiasAbsorption records
    relu6_changed: list[str]
    edits: dict
    bypass: set
    # id(layer) -> (lo, hi): the clip each changed ReLU6 will apply (a standalone one, or a
    # layer's fused one): per-channel ClippedReLU caps, or a ReLU's (0, inf)
    clips: dict = dataclasses.field(default_factory=dict)
    # names of the layers put in a form 8-bit tensors can hold (StableActivation,
    # ChannelAffine: cle._transforms.stable)
    stable_changed: list = dataclasses.field(default_factory=list)


def _set_layers(links):
    return tuple(link.first.layer for link in links) + (links[-1].second.layer,)


def _pre_activation_call(link, folded_bns):
    t = link.first.outputs[0]
    while len(t.consumers) == 1 and id(t.consumers[0].layer) in folded_bns:
        t = t.consumers[0].outputs[0]
    call = t.producer
    return call if not call.scope and len(call.outputs) == 1 else None


def pre_activation(link, folded_bns):
    """The top-level layer whose output is the pre-activation of a link's junction (the last
    BN that will be folded into layer1, else layer1 itself), or None if it is nested."""
    call = _pre_activation_call(link, folded_bns)
    return None if call is None else call.layer


def measure_junctions(model, search, matches, x, value, progress):
    """``{id(link.first): Junction}`` measured on ``x`` (calibration inputs, already checked
    against the model) for every link of the search whose pre-activation is a top-level
    tensor; one streaming pass over the data (compiled on TensorFlow:
    :func:`cle._core.backend.compiled`), each junction's per-channel sums computed next to its
    values (only they leave the backend; on JAX, whose model call runs operation by
    operation, the sums are one compiled function per junction's shape:
    :func:`junction_sums`)."""
    folded = {id(m.bn_call.layer) for m in matches}
    links = [link for links in search.sets for link in links]
    targets = [(link, _pre_activation_call(link, folded)) for link in links]
    targets = [(link, call) for link, call in targets if call is not None]
    if not targets:
        return {}
    # The calls' own output tensors: a layer of a loaded Sequential model has several nodes.
    probe = keras.Model(inner_function(model).inputs,
                        [call.node.outputs[0] for _, call in targets])
    kinds = [scale_choice.junction_kind(link, value) for link, _ in targets]
    axes = [channel_axis(link.first.layer, len(call.node.outputs[0].shape))
            for link, call in targets]

    def sums(*arrays):
        outs = probe(list(arrays), training=False)
        outs = outs if isinstance(outs, (list, tuple)) else [outs]
        return [junction_sums(out, axis, *kind) for out, axis, kind in zip(outs, axes, kinds)]

    run = compiled(sums)
    stats = [noise.SampleStats(*kind) for kind in kinds]
    batches = [x[idx] for idx in np.array_split(np.arange(len(x)), -(-len(x) // _batch(
        [call.node.outputs[0] for _, call in targets])))]
    for b, batch in enumerate(batches):
        if progress is not None:
            progress(f"activation ranges: batch {b + 1}/{len(batches)}")
        for st, measured in zip(stats, run(*batch.arrays)):
            st.add(*(keras.ops.convert_to_numpy(v) for v in measured), inputs=len(batch))
    return {id(link.first): st.junction() for (link, _), st in zip(targets, stats)}


def _batch(tensors) -> int:
    """How many inputs the junction pass takes at once: the pass holds every junction's whole
    activation of a batch, so :data:`JUNCTION_BATCH` on a network whose junctions hold more
    than :data:`JUNCTION_PASS_BYTES` for that many inputs, more where they hold less (the
    batches then are fewer and of one size or two: each new batch shape is a new trace on
    TensorFlow and a compile of every operation on JAX)."""
    sizes = [t.shape[1:] for t in tensors]
    if any(d is None for shape in sizes for d in shape):
        return JUNCTION_BATCH
    per_input = 4 * sum(int(np.prod(shape)) for shape in sizes)  # float32 bytes
    return max(JUNCTION_BATCH, JUNCTION_PASS_BYTES // max(per_input, 1))


def junction_sums(pre, axis, kind, cap):
    """:func:`_junction_sums` in the backend: on JAX through one ``jax.jit`` of it, kept for
    the process (each operation of it run alone would be compiled for each junction's shape,
    a dozen compiles a junction; the jitted function is compiled once per shape, and a later
    call on the same shapes compiles nothing); elsewhere as it is (inside the pass's
    ``tf.function`` on TensorFlow)."""
    if keras.backend.backend() != "jax":
        return _junction_sums(pre, axis, kind, cap)
    top = None if cap is None else np.asarray(cap, np.float32)
    return _jax_junction_sums()(pre, top, axis=axis, kind=kind)


@functools.cache
def _jax_junction_sums():
    import jax

    return jax.jit(lambda pre, top, axis, kind: _junction_sums(pre, axis, kind, top),
                   static_argnames=("axis", "kind"))


def _junction_sums(pre, axis, kind, cap):
    """What :meth:`cle._math.noise.SampleStats.update` sums of a junction's pre-activations
    ``pre`` (channels on ``axis``), in the backend: ``(max, min, sum of squares after the
    activation, positive count, passing count, values per channel)``. The squares are
    summed in float32 (the backend's tree reduction: round-off far below what the choice
    reads); the rest is exact."""
    ops = keras.ops
    pre = ops.cast(pre, "float32")  # a float16 layer's squares would overflow
    axis = axis % len(pre.shape)
    others = tuple(i for i in range(len(pre.shape)) if i != axis)
    positive = ops.greater(pre, 0.0)
    if kind == "linear":
        post, passing = pre, positive
    elif cap is None:
        post, passing = ops.relu(pre), positive
    else:
        shape = [1] * len(pre.shape)
        shape[axis] = -1
        top = ops.reshape(ops.cast(ops.convert_to_tensor(cap), "float32"), shape)
        post = ops.minimum(ops.relu(pre), top)
        passing = ops.logical_and(positive, ops.less(pre, top))
    return (ops.max(pre, axis=others), ops.min(pre, axis=others),
            ops.sum(ops.square(post), axis=others),
            ops.sum(ops.cast(positive, "int32"), axis=others),
            ops.sum(ops.cast(passing, "int32"), axis=others),
            ops.size(pre) // ops.shape(pre)[axis])


def decide_sets(model, search, matches, planned, opts, data, progress):
    """Decide every set in graph order on the weights as the earlier sets leave them (a layer
    can end one set and start the next) and record the scaled ones in ``planned``."""
    measured, bn_stats = None, None
    if opts.objective == "quantized":
        bn_stats = {id(m.target.layer): gamma_beta(m.bn_call.layer) for m in matches
                    if m.bn_after}
        if data is not None:
            measured = measure_junctions(model, search, matches, data, planned.exact, progress)
    decisions, scaled = [], []
    for links in search.sets:
        layers = _set_layers(links)
        planned.keep({id(la) for la in layers})  # one set's kernels at a time
        if opts.objective == "quantized":
            d = scale_choice.decide_set(links, planned.exact, bn_stats, opts.target, measured)
            scales = d.scales if d.scaled else None
            if not d.scaled:
                logger.info("scaling set %s left as it is: %s", d.layers, d.reason)
        else:
            scales = _scaling.nagel_scales(layers, planned)
            d = scale_choice.ScalingDecision(tuple(la.name for la in layers), True, "weights")
        if scales is not None:
            planned.record(_scaling.set_factors(layers, scales, links, planned.has_bias))
            scaled.append((links, list(scales)))
        decisions.append(d)
    planned.keep(())
    return decisions, scaled


def _fold_high_biases(scaled, matches, planned, opts):
    backward = {id(m.target.layer): m.bn_call.layer for m in matches if m.bn_after}
    records = []
    for links, scales in scaled:
        for link, s in zip(links, scales):
            bn = backward.get(id(link.first.layer))
            if bn is None:
                continue
            record, updates = _scaling.absorb(
                link.first.layer, link.second.layer, s, link.relu, link,
                (bn.name, *gamma_beta(bn)), opts.margin, opts.high_bias_fold == "all", planned)
            if not record.absorbed:
                logger.info("no bias absorbed from '%s' into '%s': %s",
                            record.layer1, record.layer2, record.reason)
            for layer, attr, value in updates:
                planned.set(layer, attr, value)
            records.append(record)
    return records


def _relu6_edits(view, scaled, planned, mode):
    if mode == "replace":
        targets = all_relu6(view)
    elif mode == "bound":
        on_links = {id(layer) for links, _ in scaled for link in links
                    for layer, _ in _scaling.cap_refs(link)}
        targets = [t for t in all_relu6(view) if id(t[0]) in on_links]
    else:
        targets = []
    edits, changed, clips = {}, [], {}
    for layer, kind, axis in targets:
        caps = planned.vector(
            layer, _scaling.CAPS if kind == "standalone" else _scaling.FUSED_CAPS)
        edits[id(layer)] = relu6_edit(layer, kind, mode, axis, caps)
        changed.append(changed_name(layer, kind))
        clips[id(layer)] = (0.0, np.inf if mode == "replace" else
                            6.0 if caps is None else np.asarray(caps, dtype=np.float64))
    return edits, changed, clips


def plan_equalization(model, view: GraphView, opts: EqualizeOptions, x=None,
                      progress=None) -> EqualizePlan:
    """Every decision of :func:`cle.equalize_model` on the input model's ``view``, as edits
    for one rebuild; ``x``: the calibration inputs, checked against the model, or None."""
    matches, fold_skipped = find_matches(view)
    fold_edits, bypass = fold_plan(matches)
    # The sets as they will be after folding and ReLU6 handling.
    search = find_sets(view, opts.relu6, transparent={id(m.bn_call.layer) for m in matches})
    for call, reason in search.ends:
        logger.info("no scaling set starts at '%s': %s", call.layer.name, reason)
    planned = _scaling.PlannedWeights(fold_edits)
    decisions, scaled = decide_sets(model, search, matches, planned, opts,
                                    x if opts.activation_ranges == "calibration" else None,
                                    progress)
    absorptions = []
    if opts.high_bias_fold != "none":
        absorptions = _fold_high_biases(scaled, matches, planned, opts)
    edits = {k: dataclasses.replace(e) for k, e in fold_edits.items()}
    relu6, changed, clips = _relu6_edits(view, scaled, planned, opts.relu6)
    for key, layer in planned.layers.items():
        if key in relu6 and relu6[key].replace is not None:
            continue  # a standalone ReLU6: its ClippedReLU takes the caps
        old = edits.get(key)
        edits[key] = LayerEdit(
            config=dict(old.config) if old is not None else {},
            compute=lambda dtype=None, layer=layer: planned.final(layer, dtype))
    for key, edit in relu6.items():
        merge(edits, key, edit)
    stable = all_stable(view) if opts.stable_activations else []
    for layer, kind, name in stable:
        merge(edits, id(layer), stable_edit(layer, kind, name))
    affine = all_normalizations(view) if opts.stable_activations else []
    for layer, mean, scale in affine:
        merge(edits, id(layer), normalization_edit(layer, mean, scale))
    one_hots = all_one_hots(view) if opts.stable_activations else []
    for layer in one_hots:
        merge(edits, id(layer), one_hot_edit(layer))
    return EqualizePlan(matches, fold_skipped, search, decisions, scaled, absorptions, changed,
                        edits, bypass, clips, [changed_name(la, k) for la, k, _ in stable]
                        + [la.name for la, _, _ in affine] + [la.name for la in one_hots])
