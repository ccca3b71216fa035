"""What the tensors of a calibrated flatbuffer are to its outputs: the roles the choice of
activation ranges reads (:mod:`cle._quantize.ranges`). Which tensors decide an output
(:func:`protected_indices`), hold a softmax's logits (:func:`logit_indices`), feed a global
max pooling (:func:`max_kept_indices`) or come out of a global average pooling that
scales a map (:func:`pooled_indices`), are sums of class scores (:func:`score_bounds`), or
feed given tensors (:func:`upstream_indices`); all read from the flatbuffer's operators,
parsed once (:func:`parsed`). :mod:`cle._tflite.converter` re-exports them under its own name."""

from __future__ import annotations

import collections
import functools

import numpy as np

from cle._tflite import internals
from cle._tflite.flatgraph import FlatGraph
from cle._tflite.runtime import keras_output_order

__all__ = ["SCORE_OPS", "logit_indices", "max_kept_indices", "output_indices", "padded_below",
           "parsed", "pooled_indices", "pooled_sources", "protected_indices", "score_bounds",
           "softmax_logits", "softmax_outputs", "tensor_name", "upstream_indices"]


@functools.lru_cache(maxsize=2)
def parsed(calibrated: bytes):
    """The object tree of a calibrated flatbuffer, parsed once for the readers of this module
    and :mod:`cle._tflite.converter` (a parse costs as much as a few interpreter runs; one
    build reads the same flatbuffer a dozen times). Shared: a caller that changes it puts it
    back (:func:`cle._tflite.converter.with_ranges`)."""
    return internals.read_model(calibrated)


@functools.lru_cache(maxsize=2)
def _flat(calibrated: bytes) -> FlatGraph:
    """The :class:`cle._tflite.flatgraph.FlatGraph` of a calibrated flatbuffer, built once for
    the readers of this module (which only read it: a build asks for the sums of class scores
    and the pooled tensors several times)."""
    return FlatGraph(calibrated)


def tensor_name(tensor) -> str:
    """A flatbuffer tensor's name as text."""
    name = tensor.name
    return name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)


# Ops through which an output's range is decided by their input's: the logits before a
# softmax, what only moves values around or changes their type, and a max (pooling or a
# reduction: a feature vector's GlobalMaxPooling), whose output is its input's largest values,
# so that tails cut on the input clip the output itself (found by helper-18's hunt).
_PASS_BACK = ("SOFTMAX", "LOGISTIC", "LOG_SOFTMAX", "RESHAPE", "SQUEEZE", "DEQUANTIZE",
              "QUANTIZE", "CAST", "MAX_POOL_2D", "REDUCE_MAX")


def _kinds(obj):
    """``(op kind, operator)`` of each operator of the main subgraph."""
    names = internals.builtin_operator_names()
    for op in obj.subgraphs[0].operators:
        code = obj.operatorCodes[op.opcodeIndex]
        yield names.get(max(int(code.builtinCode), int(code.deprecatedBuiltinCode)), ""), op


def _producers(obj) -> dict:
    """``{tensor: (op kind, input tensors)}`` of the main subgraph's operators."""
    producer = {}
    for kind, op in _kinds(obj):
        for t in (op.outputs if op.outputs is not None else []):
            producer[int(t)] = (kind, [int(i) for i in (op.inputs if op.inputs is not None
                                                         else [])])
    return producer


def protected_indices(calibrated: bytes) -> tuple[set, set]:
    """``(tensors that decide the outputs, input tensors)`` of the main subgraph: the outputs
    and the class scores only their sums read (an ensemble's members, :func:`score_bounds`),
    and walking back from them through :data:`_PASS_BACK` ops, their inputs."""
    obj = parsed(calibrated)
    graph = obj.subgraphs[0]
    producer = _producers(obj)
    protected = _reached(producer, [int(i) for i in graph.outputs] + _summed_members(calibrated),
                         lambda kind, inputs: inputs[:1] if kind in _PASS_BACK else [])
    return protected, set(int(i) for i in graph.inputs)


def _reached(producer: dict, start, back) -> set:
    """The tensors ``start`` and those reached from them walking back to producers' inputs:
    ``back(kind, inputs)`` names the inputs of a tensor's producer the walk goes on to."""
    seen, todo = set(), list(start)
    while todo:
        t = todo.pop()
        if t in seen or t < 0:
            continue
        seen.add(t)
        todo.extend(back(*producer.get(t, ("", []))))
    return seen


#: Elementwise ops through which a tensor's largest values come from their inputs' largest
#: (:func:`max_kept_indices`): activations, a swish's product, a residual sum.
_MONOTONE = ("RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "LEAKY_RELU", "PRELU", "ELU",
             "HARD_SWISH", "GELU", "LOGISTIC", "TANH", "MUL", "ADD")
_MAX_KEEPERS = ("REDUCE_MAX", "MAX_POOL_2D")
#: Ops through whose data input (the first) a map's largest values are made of its input's
#: largest (:func:`max_kept_indices`): a convolution's or a dense layer's sum over a window
#: of its input, a max pooling over several positions, a padding.
_MAX_PASSERS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "MAX_POOL_2D", "PAD",
                "EXPAND_DIMS")


def max_kept_indices(calibrated: bytes) -> set:
    """The tensors whose largest values a global max pooling keeps: the input of a REDUCE_MAX,
    or of a MAX_POOL_2D whose output is one position, and back from it through elementwise ops
    (:data:`_MONOTONE`) and ops that only move values around (:data:`_SAME_VALUES`). What a
    tensor's tails leave out is every value such a pooling passes on: on a multi-label
    classifier that pools its last feature map by its maximum, the tails cut the features of
    the inputs that mattered (without data, far below the converter: CHANGELOG).

    From a pooling of a map's positions to one value per channel (:func:`_pools_positions`),
    the walk goes on through a concatenation and the data input of convolutions, dense
    layers and max poolings (:data:`_MAX_PASSERS`): the largest values of the pooled map are
    made of the largest of the maps before it, whose tails cut them too (the same classifier
    with data: its first two blocks at their tails read farther from the float model on new
    inputs than at min/max, though no one of their tensors alone moved it much: CHANGELOG).
    Behind a global max pooling head that is most of the network. Not from the maximum a
    softmax or a log-sum-exp subtracts (JAX's export and ``keras.ops.logsumexp`` write it as
    a REDUCE_MAX too, over positions where the softmax is over them), nor from a max over
    the channels."""
    g = _flat(calibrated)
    producer = _producers(parsed(calibrated))
    pooled, other = [], []
    for op in g.ops:
        if op.kind not in _MAX_KEEPERS or not op.inputs or not op.outputs:
            continue
        out = g.signature(op.outputs[0])
        if op.kind == "MAX_POOL_2D" and (len(out) != 4 or any(d != 1 for d in out[1:3])):
            continue
        (pooled if _pools_positions(g, op) else other).append(op.inputs[0])
    return _reached(producer, other, lambda kind, inputs:
                    inputs if kind in _MONOTONE or kind in _SAME_VALUES else []) | _reached(
        producer, pooled, lambda kind, inputs:
        inputs if kind in _MONOTONE or kind in _SAME_VALUES or kind == "CONCATENATION"
        else inputs[:1] if kind in _MAX_PASSERS else [])


def padded_below(calibrated: bytes) -> dict[int, int]:
    """``{output: input}`` of each padding (a PADV2) by a constant below every value its input
    took in calibration whose output only max poolings read, each window wider than the
    padding on its side (so that it holds a value of the input): keras_hub's ResNetV2 and
    CSPNet stems pad by ``-inf`` before a max pooling, and the calibrated range of such a
    padding reaches the lowest float. The quantizer gives the padding and its input one
    scale, so the input's 8-bit steps were 1e36 wide and the file's every output 0, the
    plain converter's too. Set to its input's range
    (:func:`cle._tflite.converter.with_ranges`), the padding's constant is its lowest 8-bit
    value, below or at every value of the input there, and the pooling takes the same
    maxima as with ``-inf``."""
    g = _flat(calibrated)
    found = {}
    for op in g.ops:
        if op.kind != "PADV2" or len(op.inputs) < 3 or min(op.inputs) < 0:
            continue
        value, widths = g.constant(op.inputs[2]), g.constant(op.inputs[1])
        q = g.graph.tensors[op.inputs[0]].quantization
        if (value is None or value.size != 1 or widths is None or widths.shape != (4, 2)
                or q is None or q.min is None or len(q.min) != 1
                or not float(value.reshape(())) < float(q.min[0])):
            continue
        readers = [g.ops[c] for c in g.consumers.get(op.outputs[0], [])]
        if readers and all(_pool_holds(r, widths) for r in readers) \
                and op.outputs[0] not in g.outputs:
            found[op.outputs[0]] = op.inputs[0]
    return found


#: The schema's ``Padding.VALID`` (a pooling of no padding of its own).
_VALID = 1


def _pool_holds(op, widths) -> bool:
    """Whether ``op`` is a max pooling of no padding of its own each of whose windows reaches
    past a padding of ``widths`` (``(4, 2)``: before and after on each axis of an NHWC map)
    into its input."""
    if op.kind != "MAX_POOL_2D":
        return False
    o = op.obj.builtinOptions
    return (int(o.padding) == _VALID and int(widths[1].max()) < int(o.filterHeight)
            and int(widths[2].max()) < int(o.filterWidth) and not widths[0].any()
            and not widths[3].any())


#: Ops a subtracted maximum passes on its way to the subtraction (JAX's softmax: a MAXIMUM
#: with the lowest float; ``keras.ops.logsumexp``: a SELECT_V2 of the finite ones).
_TO_SUBTRACTION = ("RESHAPE", "SQUEEZE", "EXPAND_DIMS", "CAST", "MAXIMUM", "SELECT_V2",
                   "BROADCAST_TO")


def _pools_positions(g, op) -> bool:
    """Whether the max pooling ``op`` pools a map's positions to one value per channel: its
    input has several positions between its batch and its last axis (or a number not fixed),
    its output one and the same last axis; a REDUCE_MAX reduces exactly those axes (read from
    its constant axes: a max over the channels of a square map has the shapes of one over its
    positions), and its output is not subtracted (a softmax's or a log-sum-exp's maximum,
    which shapes alone cannot tell from a pooling when the softmax is over the positions)."""
    source, out = g.signature(op.inputs[0]), g.signature(op.outputs[0])
    if len(source) < 3 or len(out) < 2 or out[-1] != source[-1] or out[-1] < 0:
        return False
    if not (-1 in source[1:-1] or int(np.prod(source[1:-1])) > 1) or any(
            d != 1 for d in out[1:-1]):
        return False
    if op.kind == "MAX_POOL_2D":
        return True
    axes = g.constant(op.inputs[1]) if len(op.inputs) > 1 else None
    if axes is None or {int(a) % len(source) for a in np.ravel(axes)} != set(
            range(1, len(source) - 1)):
        return False
    todo, seen = [op.outputs[0]], set()
    while todo:
        t = todo.pop()
        for reader in (g.ops[i] for i in g.consumers.get(t, [])):
            if reader.kind in ("SUB", "SQUARED_DIFFERENCE"):
                return False
            if reader.kind in _TO_SUBTRACTION and reader.outputs[0] not in seen:
                seen.add(reader.outputs[0])
                todo.append(reader.outputs[0])
    return True


#: Ops that pool a map over its positions: a mean, an average pooling, and a sum (JAX's
#: export writes a global average pooling as a SUM and a MUL by one over the positions).
_POOLERS = ("MEAN", "AVERAGE_POOL_2D", "SUM")


def pooled_indices(calibrated: bytes) -> set:
    """The outputs of a global average pooling that scale a map: a pooling
    (:data:`_POOLERS`) that keeps the channels and leaves one position (one value per channel
    and input), from which, through ops whose outputs are no larger per input, a MUL is
    reached whose output is (a gate: squeeze-and-excitation, ECA, whose sigmoid multiplies the
    map); and onwards from them through ops that only move values around
    (:data:`_SAME_VALUES`, EXPAND_DIMS) or multiply them by a constant. Not a pooling whose
    vector only a classifier's head reads."""
    return set(pooled_sources(calibrated))


def pooled_sources(calibrated: bytes) -> dict:
    """``{tensor: map}`` of :func:`pooled_indices`: each with the map its pooling averaged
    (channels last, as the pooling's output)."""
    g = _flat(calibrated)

    def shape(t):
        s = g.shape(t)
        return list(s[1:]) if len(s) >= 2 else None

    def size(t):
        return int(np.prod(shape(t))) if shape(t) is not None else 0

    def gates(p):
        todo, seen = [p], {p}
        while todo:
            for op in (g.ops[i] for i in g.consumers.get(todo.pop(), [])):
                out = op.outputs[0]
                if op.kind == "MUL" and size(out) > size(p):
                    return True
                if out not in seen and 0 < size(out) <= size(p):
                    seen.add(out)
                    todo.append(out)
        return False
    pooled = {}
    for op in g.ops:
        if op.kind not in _POOLERS or not op.inputs or not op.outputs:
            continue
        t, source = op.outputs[0], op.inputs[0]
        if (shape(t) is not None and shape(source) is not None and size(t) == shape(t)[-1]
                and size(source) > size(t) and shape(t)[-1] == shape(source)[-1] and gates(t)):
            pooled[t] = source
    moved = [(op.outputs[0], op.inputs[0]) for op in g.ops if op.inputs and op.outputs and (
        op.kind in _SAME_VALUES + ("EXPAND_DIMS",) or op.kind == "MUL" and len(op.inputs) == 2
        and op.inputs[1] >= 0 and g.constant(op.inputs[1]) is not None)]
    while True:
        more = {out: pooled[src] for out, src in moved if src in pooled and out not in pooled}
        if not more:
            return pooled
        pooled.update(more)


def upstream_indices(calibrated: bytes, outputs) -> set:
    """The tensors the tensors ``outputs`` are computed from, walking back through every
    operator's inputs (constants included, but no tensor past a model input), ``outputs``
    included."""
    return _reached(_producers(parsed(calibrated)), [int(t) for t in outputs],
                    lambda kind, inputs: inputs)


#: Ops whose output over their last axis is class scores or their logarithm.
SCORE_OPS = ("SOFTMAX", "LOG_SOFTMAX")


def softmax_outputs(calibrated: bytes) -> set:
    """The output tensors of the main subgraph that are a SOFTMAX or a LOG_SOFTMAX (walking
    back through ops that only move values around or change their type): class scores, at
    one position or at each of many."""
    obj = parsed(calibrated)
    producer = _producers(obj)
    return {int(t) for t in obj.subgraphs[0].outputs
            if _back(producer, int(t))[0] in SCORE_OPS}


#: Ops whose output is their input moved around or retyped (TF Lite gives both one scale).
_SAME_VALUES = ("RESHAPE", "SQUEEZE", "DEQUANTIZE", "QUANTIZE", "CAST")


def _back(producer, t) -> tuple[str, list]:
    """``(kind, inputs)`` of the op that makes tensor ``t``, walking back past the ops that
    only move values around or change their type (:data:`_SAME_VALUES`)."""
    kind, inputs = producer.get(t, ("", []))
    while kind in _SAME_VALUES and inputs:
        kind, inputs = producer.get(inputs[0], ("", []))
    return kind, inputs


def softmax_logits(calibrated: bytes) -> list:
    """For each output of the main subgraph, in the order of the Keras model's outputs, the
    index of the tensor it is the SOFTMAX of (walking back through ops that only move values
    around or change their type), else None (on JAX the converter may split a softmax into
    its arithmetic: None too)."""
    obj = parsed(calibrated)
    graph = obj.subgraphs[0]
    producer = _producers(obj)
    outputs = [int(i) for i in graph.outputs]
    found = []
    for t in outputs:
        kind, inputs = _back(producer, t)
        found.append(inputs[0] if kind == "SOFTMAX" and inputs else None)
    names = [tensor_name(graph.tensors[i]) for i in outputs]
    inputs = [tensor_name(graph.tensors[int(i)]) for i in graph.inputs]
    return [found[k] for k in keras_output_order(names, inputs)]


def logit_indices(calibrated: bytes) -> dict:
    """``{tensor: (op, classes)}`` for the tensors that hold the logits of an output's softmax
    (or log_softmax, or sigmoid): the input of the SOFTMAX, LOG_SOFTMAX or LOGISTIC (``op``)
    an output is (walking back through ops that only move values around or change their
    type), or that only a sum of class scores reads (:func:`score_bounds`: an ensemble's
    members), and back from it through such ops; ``classes``: the size of the softmax's axis
    (the last), 1 for a sigmoid, and 0 for a tensor the chain to the softmax is not the only
    reader of (a model output, or read by another op too: what its other readers need is not
    the softmax's). Not a tensor before an output that is a reshape alone (its range is the
    output's)."""
    obj = parsed(calibrated)
    graph = obj.subgraphs[0]
    producer = _producers(obj)
    outputs = [int(i) for i in graph.outputs]
    readers = collections.Counter(int(i) for op in graph.operators
                                  for i in (op.inputs if op.inputs is not None else []))
    found = {}
    for t in outputs + _summed_members(calibrated):
        op, inputs = _back(producer, t)
        if op not in SCORE_OPS + ("LOGISTIC",) or not inputs:
            continue
        t = inputs[0]  # the logits, and back from them past the same ops
        shape = graph.tensors[t].shape
        classes = int(shape[-1]) if op in SCORE_OPS and shape is not None and len(shape) else 1
        while True:
            alone = readers[t] == 1 and t not in outputs and classes
            found[t] = (op, classes if alone else 0)
            classes = classes if alone else 0  # earlier tensors feed that other reader too
            kind, inputs = producer.get(t, ("", []))
            if kind not in _SAME_VALUES or not inputs:
                break
            t = inputs[0]
    return found


def _summed_members(calibrated: bytes) -> list:
    """The SOFTMAX and LOGISTIC tensors that only sums of class scores read
    (:func:`score_bounds`)."""
    sums, g = score_bounds(calibrated), _flat(calibrated)
    return [t for op in g.ops if op.kind in ("SOFTMAX", "LOGISTIC") for t in op.outputs
            if g.consumers.get(t) and all(o in sums for c in g.consumers[t]
                                          for o in g.ops[c].outputs)]


def score_bounds(calibrated: bytes) -> dict:
    """``{tensor: (lo, hi)}`` for the tensors computed from class scores (a SOFTMAX or a
    LOGISTIC, in [0, 1] whatever their input) by sums and non-negative constant factors alone,
    with the bounds that gives them: an ensemble's mean of its members' softmaxes (ADD, then
    MUL by 1/k) lies in [0, 1], its partial sums in [0, 2], ... Not the scores themselves, nor
    what only moves them around: TF Lite fixes their range."""
    g = _flat(calibrated)
    bounds, summed = {}, set()
    for op in g.ops:
        ins = [t for t in op.inputs if t >= 0]
        if len(op.outputs) != 1 or not ins:
            continue
        out = op.outputs[0]
        if op.kind in ("SOFTMAX", "LOGISTIC"):
            bounds[out] = (0.0, 1.0)
        elif op.kind in _SAME_VALUES and ins[0] in bounds:
            bounds[out] = bounds[ins[0]]
        elif op.kind == "ADD" and len(ins) == 2 and all(t in bounds for t in ins):
            bounds[out] = (bounds[ins[0]][0] + bounds[ins[1]][0],
                           bounds[ins[0]][1] + bounds[ins[1]][1])
        elif op.kind == "MUL" and len(ins) == 2 and sum(t in bounds for t in ins) == 1:
            known = ins[0] if ins[0] in bounds else ins[1]
            factor = g.constant(ins[1] if known == ins[0] else ins[0])
            if factor is None or factor.size != 1 or not float(factor.ravel()[0]) >= 0.0:
                continue
            bounds[out] = tuple(float(factor.ravel()[0]) * b for b in bounds[known])
        else:
            continue
        if op.kind in ("ADD", "MUL") or ins[0] in summed:
            summed.add(out)
    return {t: bounds[t] for t in summed}


def output_indices(calibrated: bytes) -> set:
    """The output tensors of the main subgraph."""
    return set(int(i) for i in parsed(calibrated).subgraphs[0].outputs)
