"""Synthetic calibration inputs from the model itself (ZeroQ-style distillation).

Without data, the converter still needs activation ranges. The model's batch norms remember
what real inputs did to it: each BN's moving mean μ and variance σ² are the statistics of its
input over the training data. :func:`distill` starts from Gaussian noise and runs Adam on the
inputs themselves so that, at every BN, the batch's per-channel mean and standard deviation
match μ and σ (Cai et al. 2020, "ZeroQ"). The loss, per BN, is the mean over channels of
``((m − μ)/σ)² + ((s − σ)/σ)²`` with ``s = sqrt(v + 1e-5)`` and ``σ = sqrt(σ² + 1e-5)``;
without that epsilon a channel whose variance is 0 divides by 0 and the loss turns NaN. A
non-finite loss or input is an error, never a result.

The batch norms are those of the model's own graph (:func:`cle._core.graph.graph_view`: a
layer called once, at the top level; a loaded Sequential model's layers have several Keras
nodes and are found all the same). A BN inside a nested sub-model is seen through its
sub-model's output only. Several inputs are optimized together, each kept in its own range.

Backends: TensorFlow (``tf.GradientTape``) and JAX (``jax.value_and_grad`` over the model's
``stateless_call``).
"""

from __future__ import annotations

import time
import weakref
from typing import Callable

import keras
import numpy as np

from cle._core.backend import weights_digest
from cle._core.graph import concatenated, graph_view, inner_function, weighed_on_every_path
from cle._core.inputs import ModelInputs, input_signatures, integer_inputs
from cle._core.keras_internals import sublayers
from cle._core.rebuild import flattened
from cle._math.json_numbers import sqnr_words
from cle._measure import bn_moments
from cle._measure.check import (MIN_CLASSES, declared_kinds, ends_in, guessed_scores,
                                output_kinds, output_names)

EPS = 1e-5
#: Weight of the cross-entropy term for outputs of class scores, against the BN loss.
CE_WEIGHT = 0.05
STEPS, BATCH, LEARNING_RATE = 20, 20, 0.25
#: Input ranges wider than this scale Adam's step by ``width / WIDE_RANGE``.
WIDE_RANGE = 8.0
#: A model whose batch norms still hold this share of Keras' starting statistics or more
#: (the median over them, :func:`cle._measure.bn_moments.start_weight`) is refused without data:
#: the distillation would match statistics that describe no data (a NASNet trained a few steps
#: at its batch norms' momentum of 0.9997, CHANGELOG).
MAX_START_WEIGHT = 0.98


class NeedsData(ValueError):
    """Synthetic inputs cannot be made for this model: real calibration data is needed.
    ``why`` says what the model lacks; the message ends with what to pass in Python
    (``calibration_data``), and the command line names its own option (``--calibration``)."""

    def __init__(self, why: str):
        self.why = why
        super().__init__(f"{why}; pass calibration_data")


#: Without data, a file whose check reads an output below this SQNR (dB) on the synthetic
#: inputs is refused: its error is a fair share of the output's signal on inputs made to
#: look like real ones, and nothing without data can tell which of its layers is at fault.
FAR_DB = 6.0


def refuse_far_file(outputs) -> None:
    """Raise :class:`NeedsData` when an output of a file made without data reads below
    :data:`FAR_DB` on its check (``outputs``: the report's
    :class:`cle._measure.check.OutputCheck`, the lower over the synthetic sets), naming them:
    a file that far from its float model is no answer, and data is what would make another."""
    far = [o for o in outputs if o.sqnr_db < FAR_DB]
    if far:
        raise NeedsData(
            "without data the file came out far from the float model on the synthetic inputs "
            "of its check (" + ", ".join(f"output '{o.name}': {sqnr_words(o.sqnr_db)}"
                                         for o in far)
            + f"; a file needs {FAR_DB:g} dB): inputs distilled from the batch norms do not "
            "stand in for real ones on this model")


#: The flattened copy of each model whose batch norms sit in nested models
#: (:func:`reachable`), with the digest of the weights it was made from, while the model lives.
_FLAT: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def reachable(model):
    """``model``, or, when some of its batch norms sit inside a nested model (a
    ``keras.applications`` backbone called as a layer), its flattened copy
    (:func:`cle._core.rebuild.flattened`): the distillation reads batch norms through the
    model's own graph, and a nested model's tensors are not in it. Made once per model and
    weights."""
    view = graph_view(model)
    if not any(c.scope and isinstance(c.layer, keras.layers.BatchNormalization)
               for c in view.calls):
        return model
    digest = weights_digest(model)
    kept = _FLAT.get(model)
    if kept is None or kept[0] != digest:
        try:
            flat = flattened(model)
        except ValueError:  # e.g. two nested models whose layers share names: not one graph
            flat = model  # their batch norms stay out of reach, and the refusal says where
        kept = _FLAT[model] = (digest, flat)
    return kept[1]


def batch_norms(model) -> list:
    """``(bn layer, its input tensor)`` for the BatchNormalization layers of ``model``'s own
    graph called once, in graph order (the tensors are the model's own symbolic tensors)."""
    view = graph_view(model)
    return [(c.layer, c.node.input_tensors[0]) for c in view.calls
            if isinstance(c.layer, keras.layers.BatchNormalization) and not c.scope
            and view.n_calls(c.layer) == 1]


def _unreached(model) -> str:
    """Why the batch norms ``model`` holds, if any, are not ones :func:`batch_norms` reads:
    inside a nested model (a backbone called as a layer), or called more than once (shared, or
    wrapped by ``TimeDistributed``); "" when it holds none."""
    view = graph_view(model)
    nested = sorted({c.scope[0] for c in view.calls if c.scope
                     and isinstance(c.layer, keras.layers.BatchNormalization)})
    shared = [c.layer.name for c in view.calls if not c.scope and view.n_calls(c.layer) > 1
              and isinstance(c.layer, keras.layers.BatchNormalization)]
    held = sum(isinstance(layer, keras.layers.BatchNormalization) for layer in sublayers(model))
    if not held:
        return ""
    why = ([f"inside nested model {', '.join(repr(n) for n in nested)}"] if nested else []) + (
        [f"called more than once ({', '.join(repr(n) for n in sorted(set(shared)))})"]
        if shared else [])
    return (f" of its own graph called once (it holds {held}: "
            + ("; ".join(why) if why else "inside a wrapper layer such as TimeDistributed")
            + "; the distillation reads only the batch norms of the model's own graph, each "
              "called once)")


def _scored(model, guessed):
    """``(output tensor, kind)`` of the outputs the cross-entropy pushes: vectors of class
    scores (``guessed``, :func:`cle._measure.check.guessed_scores` of the model as given; a
    segmentation map's per-pixel scores are left to the BN statistics)."""
    function = inner_function(model)
    return [(o, k) for o, k in zip(function.outputs, guessed)
            if k != "values" and len(o.shape) == 2]


def _feature_model(model, bns, scored):
    function = inner_function(model)
    return keras.Model(function.inputs, [t for _, t in bns] + [o for o, _ in scored])


#: Output endings that bound the output's range whatever the input (so synthetic inputs can
#: set it without data).
BOUNDED_ACTIVATIONS = ("softmax", "softmax, not last axis", "sigmoid", "tanh", "hard_sigmoid",
                       "hard_tanh", "relu6")


def _entries(out) -> int | None:
    dims = tuple(out.shape)[1:]
    return None if any(d is None for d in dims) else int(np.prod(dims, dtype=np.int64))


def regression_outputs(model, declared=None) -> list[tuple[str, int]]:
    """``(name, entries)`` of the outputs whose range synthetic inputs cannot tell: values
    (not class scores, :func:`output_kinds`) with no ending that bounds them
    (:data:`BOUNDED_ACTIVATIONS`), of fewer than :data:`MIN_CLASSES` entries per sample (a
    regression value, a box, a few coordinates), or a map of two to :data:`MIN_CLASSES` - 1
    channels that a layer with weights makes past the last batch norm on every path (a raw
    detection grid: values per position, as a regression head gives them; not a map an input
    joins unweighted, such as a residual denoiser's input + its correction, nor one with an
    input's channels and a multiple of its size, an image-to-image net's image, nor one of
    one channel, a binary segmentation's logits maybe (which cannot be declared class scores),
    nor one of many channels, which may be a segmentation's logits), or such values joined to
    others. Without data their range would come from inputs distilled to match the batch
    norms, which set nothing of what a regression head gives real inputs (hunt9's raw grid
    head: clipped where synthetic inputs stopped). An integer or bool output is none."""
    names = output_names(model)
    return [(names[k], n) for k, n in _regression_entries(model, declared).items()]


def _regression_entries(model, declared) -> dict[int, int]:
    """``{output index: entries}`` of :func:`regression_outputs` (by index: a nested model's
    outputs share its name)."""
    found, view_outputs = {}, None
    for k, (out, kind) in enumerate(zip(model.outputs, output_kinds(model, declared))):
        n = _entries(out)
        if (kind != "values" or n is None or ends_in(out) in BOUNDED_ACTIVATIONS
                or "float" not in str(out.dtype)):  # an integer or bool output has no range
            continue
        if n < MIN_CLASSES or _joins_values(out):
            found[k] = n
        elif (len(tuple(out.shape)) > 2 and 2 <= (out.shape[-1] or 0) < MIN_CLASSES
              and not _image_like(model, out)):
            if view_outputs is None:
                view_outputs = graph_view(reachable(model)).outputs
            if weighed_on_every_path(view_outputs[k]):
                found[k] = n
    return found


def _joins_values(out) -> bool:
    """Whether ``out`` concatenates a few unbounded values with others (hunt12: probabilities
    and a box in pixels, taken for logits; the box's range then came from synthetic inputs)."""
    return any(ends_in(p) not in BOUNDED_ACTIVATIONS and (_entries(p) or MIN_CLASSES)
               < MIN_CLASSES for p in concatenated(out))


def _image_like(model, out) -> bool:
    """Whether map ``out`` has an input's channels and a whole multiple of its size on each
    spatial axis (an image-to-image net's output: a denoised or upscaled image, whose range
    follows the input's)."""
    shape = tuple(out.shape)[1:]
    for inp in model.inputs:
        given = tuple(inp.shape)[1:]
        if (len(given) == len(shape) and given[-1] == shape[-1] and all(
                a and b and b % a == 0 for a, b in zip(given[:-1], shape[:-1]))):
            return True
    return False


def coded_outputs(model, declared=None) -> list[tuple[str, str, int]]:
    """``(output name, layer name, entries)`` for each output of values (neither class scores
    nor logits the distillation pushes) computed past the last batch norm on its way from a
    vector a layer with weights makes, every path back from it passing such a vector before any
    batch norm or input (the narrowest such vector is named). Synthetic inputs match the batch
    norms' statistics and say nothing of what such a vector holds for real inputs, as for a
    regression head (:func:`regression_outputs`, whose outputs are not
    named again here): without data its range, and those of the layers after it, are ranges
    no real input gives. A map, an image or a signal: the code of an autoencoder, the latent
    vector of a decoder (measured on an autoencoder whose decoder has no batch norm: far below
    TF Lite's converter, its check far above the real figure). A vector output too, even when
    its ending bounds it: a regression head ending in a tanh, or in a sigmoid its loss or
    ``declared`` says holds values, an embedding normalized to unit length (hunt8: the
    pre-activation's range, or the norm's, came from synthetic inputs and clipped real ones:
    far below the converter, the check far above the real figure); not a sigmoid it does not
    say so of (a binary classifier's score: its logit saturates where synthetic inputs stop). A map
    that a vector only joins (a squeeze-excitation gate, a context or metadata vector added to
    it) also reaches a batch norm or an input past it, and is not one."""
    flat = reachable(model)
    view = graph_view(flat)
    kinds, pushed = output_kinds(model, declared), guessed_scores(model, declared)
    told = declared_kinds(model, declared)
    regression = _regression_entries(model, declared)
    found = []
    for k, (out, name, kind, push) in enumerate(zip(view.outputs, output_names(model), kinds,
                                                    pushed)):
        if kind != "values" or push != "values" or len(out.shape) < 2 or k in regression:
            continue
        if (len(out.shape) == 2 and ends_in(model.outputs[k]) in ("sigmoid", "hard_sigmoid")
                and told.get(k) != "values"):
            continue
        vectors, seen, stack, open_path = [], set(), [(out, False)], False
        while stack:
            tensor, past_vector = stack.pop()
            call = tensor.producer
            if call is None or isinstance(call.layer, keras.layers.BatchNormalization):
                open_path |= not past_vector  # reached what the statistics know, vector-free
                continue
            if (id(call), past_vector) in seen:
                continue
            seen.add((id(call), past_vector))
            if call.is_layer and call.layer.weights and len(tensor.shape) == 2:
                vectors.append((int(tensor.shape[-1] or 0), call.layer.name))
                past_vector = True
            stack.extend((t, past_vector) for t in call.inputs)
        if vectors and not open_path:
            entries, layer = min(vectors)
            found.append((name, layer, entries))
    return found


def check_distillable(model):
    """``(batch norms, input signatures)`` when synthetic inputs can be distilled for
    ``model``; else :class:`NeedsData` saying why (no batch norm, one whose statistics are not
    finite, an input that takes integers, an input that is not an image (a sample of rank 1 or
    2: a vector, a sequence, a signal), an input whose size is not fixed). Cheap: reads the
    graph and the statistics (a model whose batch norms sit in a nested model is flattened
    once, :func:`reachable`)."""
    flat = reachable(model)
    bns = batch_norms(flat)
    if not bns:
        raise NeedsData(f"model '{model.name}' has no BatchNormalization layer whose statistics "
                        "could shape synthetic inputs" + _unreached(flat))
    _stats(bns)
    _refuse_unsettled(model, bns)
    integers = integer_inputs(model)
    if integers:  # token ids, raw 8-bit pixels: no gradient reaches them
        raise NeedsData(
            "synthetic inputs cannot be distilled for " + ", ".join(
                f"input '{name}'" for name in integers) + ", which takes integers (token ids, "
            "indices, 8-bit pixels: no gradient reaches them)")
    signatures = input_signatures(model)
    others = [(name, shape) for name, shape in signatures if len(shape) < 3]
    if others:  # the distillation's inputs were measured against real ones on maps only
        raise NeedsData(
            "without data, synthetic inputs stand in for images only (and other maps of two "
            "spatial axes or more: a sample of rank 3 or more), and " + ", ".join(
                f"input '{name}' (sample shape {tuple(shape)})"
                for name, shape in others)
            + f" {'is' if len(others) == 1 else 'are'} not: on models of other inputs "
            "(signals, audio, tables, latent vectors) they have missed real inputs by more than "
            "the check could state, and the files read far below TF Lite's own converter's "
            "(docs/quantize_int8.md, \"Without data: what it needs\"); a grayscale image "
            "without a channel axis, (H, W), runs as an (H, W, 1) input")
    for name, shape in signatures:
        if any(d is None for d in shape):
            raise NeedsData(
                f"synthetic inputs need a fixed input size; model input '{name}' is (N, "
                f"{', '.join('?' if d is None else str(d) for d in shape)})")
    return bns, signatures


def _refuse_unsettled(model, bns):
    """Raise :class:`NeedsData` when ``model``'s batch norms hold :data:`MAX_START_WEIGHT` of
    their starting statistics or more (a model trained a few steps at a high momentum)."""
    steps = bn_moments.training_steps(model)
    share = float(np.median([bn_moments.start_weight(bn, steps) for bn, _ in bns]))
    if share >= MAX_START_WEIGHT:
        momentum = float(np.median([bn.momentum for bn, _ in bns]))
        raise NeedsData(
            f"model '{model.name}' was trained for {steps} steps, and at a momentum of "
            f"{momentum:g} its batch norms' moving statistics still hold {share:.1%} of Keras' "
            "starting values (mean 0, variance 1; the median over its "
            f"{len(bns)} batch norms): they say too little of what its activations were in "
            "training for synthetic inputs to be distilled from them")


def _stats(bns):
    mus, sds, axes = [], [], []
    for bn, _ in bns:
        mu = np.asarray(keras.ops.convert_to_numpy(bn.moving_mean), np.float64)
        var = np.asarray(keras.ops.convert_to_numpy(bn.moving_variance), np.float64)
        if not (np.isfinite(mu).all() and np.isfinite(var).all() and (var >= 0).all()):
            raise NeedsData(
                f"batch norm '{bn.name}' holds non-finite or negative moving statistics "
                f"({int((~np.isfinite(mu)).sum() + (~np.isfinite(var)).sum())} non-finite, "
                f"{int((var < 0).sum())} negative values), which cannot shape synthetic inputs")
        mus.append(mu.astype(np.float32))
        sds.append(np.sqrt(var + EPS).astype(np.float32))
        axes.append(bn.axis if isinstance(bn.axis, int) else bn.axis[0])
    return mus, sds, axes


def _objective(outs, mus, sds, axes, targets, kinds):
    """``(loss, BN-statistics loss)``: the BN loss plus, for each output of class scores,
    cross-entropy towards ``targets``. Terms are summed as one reduction of a stacked vector:
    a chain of ``+`` becomes, in TensorFlow's graph optimizer, one ``AddN`` whose order of
    addition varies from run to run (see :func:`_moments`)."""
    ops = keras.ops
    n_bn = len(mus)
    terms = []
    for f, mu, sd, axis in zip(outs[:n_bn], mus, sds, axes):
        axis = axis % len(f.shape)
        mean, var = _moments(f, tuple(i for i in range(len(f.shape)) if i != axis))
        std = ops.sqrt(var + EPS)
        terms.append(ops.mean(ops.square((mean - mu) / sd) + ops.square((std - sd) / sd)))
    bn_loss = ops.sum(ops.stack(terms)) / n_bn
    total = [bn_loss]
    for scores, kind in zip(outs[n_bn:], kinds):
        classes = int(scores.shape[-1])
        log_p = ops.log(ops.clip(scores, 1e-12, 1.0)) if kind == "probabilities" else \
            ops.log_softmax(scores, axis=-1)
        ce = -ops.mean(ops.sum(ops.one_hot(targets % classes, classes) * log_p, axis=-1))
        total.append(CE_WEIGHT * ce)
    return ops.sum(ops.stack(total)), bn_loss


def _moments(f, reduce):
    """``(mean, variance)`` of ``f`` over the axes ``reduce``.

    On TensorFlow, one operation with its own gradient, ``(g_mean + 2 g_var (f - mean)) / n``
    (the term through the mean is zero): read through ``ops.mean`` and ``ops.var``, ``f``
    feeds four operations besides its batch norm, and TensorFlow adds their gradients with
    one ``AddN`` whose CPU kernel changes the order of three or more addends with the timing of
    the threads (it moves the input whose buffer it reuses to the front). A difference in the
    last bit of the gradient, through Adam's division by the gradient's own size, grew to
    inputs several units apart after 20 steps: two runs of :func:`distill` with one seed gave
    different inputs. With two addends the order does not matter. A tensor of the network
    that feeds three layers or more (DenseNet's concatenations) still gets such a sum."""
    ops = keras.ops
    if keras.backend.backend() != "tensorflow":
        return ops.mean(f, axis=reduce), ops.var(f, axis=reduce)
    import tensorflow as tf

    @tf.custom_gradient
    def moments(f):
        mean = tf.reduce_mean(f, axis=reduce, keepdims=True)
        centred = f - mean
        var = tf.reduce_mean(tf.square(centred), axis=reduce)
        n = tf.cast(tf.size(f) // tf.size(mean), f.dtype)

        def grad(g_mean, g_var):
            shape = tf.shape(mean)
            return (tf.reshape(g_mean, shape) + 2.0 * tf.reshape(g_var, shape) * centred) / n

        return (tf.reshape(mean, [-1]), var), grad

    return moments(f)


def _ranges(input_range, k):
    """One ``(lo, hi)`` or None per input."""
    if input_range is None:
        return [None] * k
    if len(input_range) == 2 and all(np.isscalar(v) for v in input_range):
        return [(float(input_range[0]), float(input_range[1]))] * k
    return [None if r is None else (float(r[0]), float(r[1])) for r in input_range]


def _start(rng, b, shapes, clips):
    xs = []
    for shape, clip in zip(shapes, clips):
        x = rng.standard_normal((b,) + shape).astype(np.float32)
        if clip is not None:
            x = np.clip(x * (clip[1] - clip[0]) / 4 + (clip[0] + clip[1]) / 2, *clip)
        xs.append(x)
    return xs


def distill(model, n: int, steps: int = STEPS, batch_size: int = BATCH,
            learning_rate: float = LEARNING_RATE, input_range=None, seed: int = 0,
            progress: Callable[[str], None] | None = None,
            fail_above: float | None = None,
            output_kinds=None) -> tuple[ModelInputs, list]:
    """``n`` synthetic inputs whose statistics at every BN match its moving mean and variance.

    For each vector of class scores (:func:`cle._measure.check.guessed_scores`) each input is
    also pushed towards a class of its own (cross-entropy with weight :data:`CE_WEIGHT`,
    targets spread over the classes), so the synthetic outputs span the confident range that
    real inputs give (DeepInversion, Yin et al. 2020); BN statistics alone give logits far
    narrower than real ones.

    Args:
        model: a ``keras.Model`` whose inputs have fixed shapes, with batch norms in its graph.
        n: how many inputs.
        steps: Adam steps per batch.
        batch_size: inputs optimized together (the BN statistics are matched per batch).
        learning_rate: Adam's step size on the inputs (scaled up for an input range wider
            than :data:`WIDE_RANGE`).
        input_range: ``(lo, hi)`` every input is kept in (e.g. ``(-1, 1)`` for the ``tf``
            preprocessing), or one ``(lo, hi)`` or None per input, or None.
        seed: the starting noise and the target classes.
        progress: optional ``callable(str)``, told about every batch.
        fail_above: a batch's final BN-statistics loss above which the distillation failed
            (:class:`NeedsData`, at the first such batch); None: any loss is returned.
        output_kinds: ``{output name: "classes" | "values"}`` the caller declared: an output
            declared values is not pushed, a vector declared classes is.

    Returns:
        ``(inputs, losses)``: :class:`cle._core.inputs.ModelInputs` and each batch's final
        BN-statistics loss (the cross-entropy term left out).

    Raises:
        NeedsData: (a ValueError) the model has no batch norm to match, one with non-finite
            statistics, an input that takes integers or an input size is not fixed
            (:func:`check_distillable`), or a batch's loss is above ``fail_above``.
        RuntimeError: the backend is neither TensorFlow nor JAX, or the loss or an input
            turned non-finite.
    """
    bns, signatures = check_distillable(model)
    guessed = guessed_scores(model, output_kinds)  # by the names of the model as given
    model = reachable(model)  # what the batch norms' tensors belong to
    shapes = [shape for _, shape in signatures]
    scored = _scored(model, guessed)
    clips = _ranges(input_range, len(shapes))
    # Inputs normalized to a few units take the step as it is; a wider range (0..255, caffe's
    # ±125) scales it, or a few dozen steps could not leave the starting noise.
    lrs = [learning_rate * (1.0 if c is None else max(1.0, (c[1] - c[0]) / WIDE_RANGE))
           for c in clips]
    run = _runner(model, bns, scored, lrs, clips)
    rng = np.random.default_rng(seed)
    n_classes = max([int(o.shape[-1]) for o, _ in scored] or [1])
    targets = rng.permutation(max(n, n_classes))[:n] % n_classes
    out, losses = [], []
    start = time.perf_counter()
    # Batches of one size (32 inputs in batches of at most 20: 16 and 16), so that the step
    # is traced once, not again for a last, smaller batch.
    sizes = [len(part) for part in np.array_split(np.arange(n), -(-n // batch_size))]
    for first, b in zip(np.cumsum([0] + sizes[:-1]), sizes):
        first = int(first)
        xs, value = run(_start(rng, b, shapes, clips), steps,
                        targets[first: first + b].astype(np.int32))
        if not (np.isfinite(value) and all(np.isfinite(x).all() for x in xs)):
            raise RuntimeError(
                f"the distillation of synthetic inputs diverged (batch {first // batch_size + 1}"
                f": loss {value}, non-finite inputs); no synthetic inputs. Pass calibration data")
        if fail_above is not None and value > fail_above:
            raise NeedsData(
                f"the distillation of synthetic inputs failed on model '{model.name}' (final "
                f"batch-norm loss {value:.3g}, above {fail_above:g}: it did not converge): "
                "inputs that do not match the model's batch-norm statistics cannot stand in for "
                "real ones, and a file calibrated on them can be broken")
        out.append(xs)
        losses.append(value)
        if progress is not None:
            progress(f"synthesized {first + b} of {n} inputs (loss {value:.3g}, "
                     f"{time.perf_counter() - start:.0f} s)")
    arrays = tuple(np.concatenate([xs[i] for xs in out], axis=0) for i in range(len(shapes)))
    return ModelInputs(arrays, tuple(nm for nm, _ in signatures), tuple(shapes)), losses


#: The step functions made for each model (:func:`_runner`), while the model lives.
_RUNS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _runner(model, bns, scored, lrs, clips):
    """:func:`_step_function` for ``model``, made once per model, weights and options: a
    second call (``cle.quantize`` distills its calibration inputs and, apart, its check's)
    does not trace the step again, which on a 260 px network costs tens of seconds. The key
    holds a digest of every weight and batch-norm statistic, so a model changed in between
    gets a new step."""
    key = (weights_digest(model), tuple(lrs), tuple(None if c is None else tuple(c) for c in clips),
           CE_WEIGHT, EPS)  # the constants the traced step reads
    runs = _RUNS.setdefault(model, {})
    if key not in runs:
        runs.clear()  # one step per model: an older one is for weights it no longer has
        runs[key] = _step_function(_feature_model(model, bns, scored), _stats(bns), lrs, clips,
                                   [k for _, k in scored])
    return runs[key]


def _step_function(features, stats, lrs, clips, kinds):
    """``run(xs, steps, targets) -> (xs, BN loss)``: Adam on the inputs, on the backend's own
    autodiff; each input is projected into its range (``clips``) after each step."""
    mus, sds, axes = stats
    backend = keras.backend.backend()
    b1, b2, eps = 0.9, 0.999, 1e-8

    def objective(outs, targets):
        return _objective(keras.tree.flatten(outs), mus, sds, axes, targets, kinds)

    def feed(xs):
        return xs[0] if len(xs) == 1 else xs

    def adam(xs, gs, ms, vs, t):
        new = []
        for x, g, m, v, lr, clip in zip(xs, gs, ms, vs, lrs, clips):
            if g is None:  # an input no batch norm and no class score sees keeps its start
                new.append((x, m, v))
                continue
            m = b1 * m + (1 - b1) * g
            v = b2 * v + (1 - b2) * g * g
            x = x - lr * (m / (1 - b1**t)) / (keras.ops.sqrt(v / (1 - b2**t)) + eps)
            if clip is not None:
                x = keras.ops.clip(x, clip[0], clip[1])
            new.append((x, m, v))
        return [list(z) for z in zip(*new)]

    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(reduce_retracing=True)
        def step(xs, ms, vs, t, targets):
            with tf.GradientTape() as tape:
                tape.watch(xs)
                value, bn_loss = objective(features(feed(xs), training=False), targets)
            xs, ms, vs = adam(xs, tape.gradient(value, xs), ms, vs, t)
            return xs, ms, vs, bn_loss

    elif backend == "jax":
        import jax

        def loss_of(xs, targets, weights):
            outs, _ = features.stateless_call(weights[0], weights[1], feed(xs), training=False)
            return objective(outs, targets)

        grad = jax.value_and_grad(loss_of, has_aux=True)

        @jax.jit
        def jitted(xs, ms, vs, t, targets, weights):  # weights as arguments, not constants
            (_, bn_loss), gs = grad(xs, targets, weights)
            xs, ms, vs = adam(xs, gs, ms, vs, t)
            return xs, ms, vs, bn_loss

        def step(xs, ms, vs, t, targets):
            # The arrays read at each step, not once: the step is kept for the model's life
            # (_runner), and Keras' jitted predict on JAX donates the model's arrays and gives
            # its variables new ones, so arrays read once were deleted by the next predict
            # (a second cle.quantize without data on one model crashed).
            weights = ([v.value for v in features.trainable_variables],
                       [v.value for v in features.non_trainable_variables])
            return jitted(xs, ms, vs, t, targets, weights)
    else:
        raise RuntimeError(
            "synthetic calibration inputs need the TensorFlow or JAX backend (gradients with "
            f"respect to the inputs). Received: KERAS_BACKEND={backend}; pass calibration data")

    def run(xs, steps, targets):
        xs = [keras.ops.convert_to_tensor(x) for x in xs]
        ms = [keras.ops.zeros_like(x) for x in xs]
        vs = [keras.ops.zeros_like(x) for x in xs]
        targets = keras.ops.convert_to_tensor(targets)
        value = None
        for t in range(1, steps + 1):
            xs, ms, vs, value = step(xs, ms, vs, keras.ops.convert_to_tensor(float(t)), targets)
        return ([np.asarray(keras.ops.convert_to_numpy(x)) for x in xs],
                float(keras.ops.convert_to_numpy(value)))
    return run
