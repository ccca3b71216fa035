"""Batch-norm folding *during training*: fused Conv/Depthwise/Dense + BN layers for Keras 3.

For quantization-aware training the kernel that gets (fake-)quantized must be the one that will
be deployed, i.e. the kernel with the batch norm folded in, while the network still trains with
batch statistics. QKeras (``QConv2DBatchnorm``, ``QDepthwiseConv2DBatchnorm``,
``QDenseBatchnorm``) and TensorFlow's old ``contrib/quantize`` graph rewrite did this (Jacob et
al. 2018, "Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only
Inference", section 3.2); neither works with Keras 3. This module does it with ``keras.ops`` only.

Notation, per output channel: ``y = conv(x, W) + b`` is the layer without BN (``b = 0`` without
bias), ``μ_B, σ²_B`` the batch moments of ``y`` (Keras ``BatchNormalization``'s definition:
``keras.ops.moments``, the biased variance), ``μ_mv, σ²_mv`` the moving statistics,
``σ = sqrt(σ² + ε)``, ``Q`` the optional ``kernel_quantizer`` (identity if None).

``folding_mode="ema_stats_folding"`` (default; Jacob et al.'s scheme). The kernel is always folded
with the *moving* statistics, so its quantized value does not jitter from batch to batch:

* training, before the freeze::

      out = conv(x, Q(W·γ/σ_mv)) · (σ_mv/σ_B) + β + γ·(b − μ_B)/σ_B

  which, for ``Q`` = identity, is exactly ``BN_training(conv(x, W) + b)``;
* training after the freeze, and inference::

      out = conv(x, Q(W·γ/σ_mv)) + β + γ·(b − μ_mv)/σ_mv

``folding_mode="batch_stats_folding"``: before the freeze the kernel is folded with the batch
statistics, ``out = conv(x, Q(W·γ/σ_B)) + β + γ·(b − μ_B)/σ_B``; after the freeze and in
inference, as above.

Without a quantizer both modes compute ``BN_training(conv(x, W) + b)`` before the freeze. They
also give the same output with a quantizer whose step is ``max|w|`` per output channel (such as
``FakeQuant(per_channel=True)``): then ``Q(W·s) = Q(W)·s`` for any per-channel ``s``, so only the
per-channel scale of the quantized kernel differs, and it is corrected. The modes differ for
per-tensor quantizers and for quantizers with fixed or learned ranges.

The statistics ``μ_B, σ²_B`` come from an extra ``conv(x, W)`` with the unfolded float kernel
(as in QKeras and ``contrib/quantize``); without a quantizer the layer needs only that one
convolution. Gradients flow through ``μ_B, σ_B`` as in Keras' BN.

Moving statistics update in training exactly like Keras BN's,
``moving = moving·momentum + batch·(1 − momentum)``, until ``ema_freeze_delay`` training steps have
been taken; from then on they stay fixed and training uses them (no batch statistics). The step
counter is a non-trainable integer weight named ``step``, saved with the layer's weights: int64 on
TensorFlow, int32 on the other backends (the dtype Keras gives its optimizers' iteration counter,
``"int"``; JAX has no int64 unless ``JAX_ENABLE_X64`` is set and would truncate with a warning). As for
Keras BN, a layer with ``trainable=False`` always runs in inference mode.

Layers: :class:`FoldedConv1D`, :class:`FoldedConv2D`, :class:`FoldedDepthwiseConv1D`,
:class:`FoldedDepthwiseConv2D`, :class:`FoldedDense` (channels_last only). Model-level:
:func:`fuse_for_training` turns ``layer → BN`` pairs into fused layers,
:func:`export_folded` turns fused layers back into plain layers with the folded (and quantized)
kernel, ready for the TFLite converter. :class:`FakeQuant` is a small symmetric fake quantizer
with a straight-through gradient.
"""

from __future__ import annotations

import logging

import keras
import numpy as np
from keras import ops

from cle._transforms import bn_fold as _bnf
from cle._transforms.bn_match import find_matches, identity_like
from cle._transforms.folded_bn import (
    BN_DEFAULTS, ConvMixin, DepthwiseMixin, FoldedBatchNorm, check_options, fused_doc,
)
from cle._transforms.folded_bn import FOLDING_MODES  # noqa: F401  (cle.training_fold.FOLDING_MODES)
from cle._core.graph import graph_view
from cle._core.rebuild import LayerEdit, layer_config, rebuild

__all__ = [
    "FakeQuant",
    "FoldedConv1D",
    "FoldedConv2D",
    "FoldedDense",
    "FoldedDepthwiseConv1D",
    "FoldedDepthwiseConv2D",
    "export_folded",
    "fuse_for_training",
]

logger = logging.getLogger("cle.training_fold")


# ------------------------------------------------------------------------------ FakeQuant


@keras.saving.register_keras_serializable(package="cle")
class FakeQuant:
    """Symmetric uniform fake quantizer with a straight-through gradient.

    ``q(w) = clip(round(w / Δ), −n, n) · Δ`` with ``n = 2^(bits−1) − 1`` and
    ``Δ = max|w| / n`` per channel along ``axis`` (or over the whole tensor). This is the scheme
    TFLite uses for int8 weights (symmetric, narrow range [−127, 127], per output channel), so a
    kernel trained through ``FakeQuant(8)`` is converted without further rounding error.

    The forward pass returns ``q(w)``; the gradient is the identity
    (``w + stop_gradient(q(w) − w)``).

    The fused layers pass their folded kernel in a layout whose last axis is the output
    channel (depthwise kernels as ``(*k, 1, in·mult)``), so the default ``axis=-1`` is per
    output channel for every fused layer.

    Args:
        bits: number of bits, 2 to 16.
        per_channel: one scale per index of ``axis`` (True) or one for the whole tensor.
        axis: the channel axis when ``per_channel``.

    Example:
        >>> q = cle.FakeQuant(bits=4)
        >>> w = np.array([[0.1, -1.0], [0.7, 0.25]], "float32")
        >>> keras.ops.convert_to_numpy(q(w))  # column scales 0.7/7 and 1/7
        array([[ 0.1      , -1.       ],
               [ 0.7      ,  0.2857143]], dtype=float32)
        >>> layer = cle.FoldedConv2D(8, 3, kernel_quantizer=cle.FakeQuant(8))
    """

    def __init__(self, bits=8, per_channel=True, axis=-1):
        if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 16:
            raise ValueError(f"bits must be an int from 2 to 16. Received: bits={bits!r}")
        if isinstance(axis, bool) or not isinstance(axis, int):
            raise ValueError(f"axis must be an int. Received: axis={axis!r}")
        self.bits = bits
        self.per_channel = bool(per_channel)
        self.axis = axis

    @property
    def levels(self) -> int:
        """``n``: the largest quantized magnitude (127 for 8 bits)."""
        return 2 ** (self.bits - 1) - 1

    def __call__(self, w):
        w = ops.convert_to_tensor(w)
        if self.per_channel and len(w.shape) > 0:
            axis = self.axis % len(w.shape)
            axes = tuple(i for i in range(len(w.shape)) if i != axis)
            amax = ops.max(ops.abs(w), axis=axes, keepdims=True) if axes else ops.abs(w)
        else:
            amax = ops.max(ops.abs(w))
        n = float(self.levels)
        step = ops.maximum(amax, 1e-30) / n
        q = ops.clip(ops.round(w / step), -n, n) * step
        return w + ops.stop_gradient(q - w)

    def get_config(self):
        return {"bits": self.bits, "per_channel": self.per_channel, "axis": self.axis}

    @classmethod
    def from_config(cls, config):
        return cls(**config)

    def __eq__(self, other):
        return type(other) is type(self) and other.get_config() == self.get_config()

    def __hash__(self):
        return hash((type(self), tuple(self.get_config().items())))

    def __repr__(self):
        return f"FakeQuant(bits={self.bits}, per_channel={self.per_channel}, axis={self.axis})"


# ------------------------------------------------------------------------------ fused layers
# (their shared base, FoldedBatchNorm, and the conv/depthwise hooks are in cle/_folded_bn.py)


@fused_doc
@keras.saving.register_keras_serializable(package="cle")
class FoldedConv2D(ConvMixin, FoldedBatchNorm, keras.layers.Conv2D):
    """``Conv2D`` followed by ``BatchNormalization``, folded for quantization-aware training.

    Takes every ``keras.layers.Conv2D`` argument (``data_format="channels_last"`` only;
    ``activation`` is applied after the batch norm) plus the arguments below.

{FUSED_ARGS}

    Example:
        >>> layer = cle.FoldedConv2D(16, 3, padding="same", use_bias=False,
        ...                          kernel_quantizer=cle.FakeQuant(8), ema_freeze_delay=2000)
        >>> y = layer(x, training=True)          # trains like conv -> BN(training)
        >>> kernel, bias = layer.get_folded_weights()   # what a plain Conv2D would need
    """

    _plain_class = keras.layers.Conv2D


@fused_doc
@keras.saving.register_keras_serializable(package="cle")
class FoldedConv1D(ConvMixin, FoldedBatchNorm, keras.layers.Conv1D):
    """``Conv1D`` followed by ``BatchNormalization``, folded for quantization-aware training.

    Takes every ``keras.layers.Conv1D`` argument (``data_format="channels_last"`` only; causal
    padding works) plus the arguments below.

{FUSED_ARGS}

    Example:
        >>> layer = cle.FoldedConv1D(32, 5, padding="causal", kernel_quantizer=cle.FakeQuant(8))
    """

    _plain_class = keras.layers.Conv1D


@fused_doc
@keras.saving.register_keras_serializable(package="cle")
class FoldedDepthwiseConv2D(DepthwiseMixin, FoldedBatchNorm, keras.layers.DepthwiseConv2D):
    """``DepthwiseConv2D`` followed by ``BatchNormalization``, folded for quantization-aware
    training.

    Takes every ``keras.layers.DepthwiseConv2D`` argument (any ``depth_multiplier``; output
    channel ``c·mult + m``; ``data_format="channels_last"`` only) plus the arguments below. The
    ``kernel_quantizer`` sees the folded kernel reshaped to ``(*k, 1, in·mult)`` (TFLite's
    depthwise layout), so its last axis is the output channel.

{FUSED_ARGS}

    Example:
        >>> layer = cle.FoldedDepthwiseConv2D(3, padding="same", depth_multiplier=2,
        ...                                   kernel_quantizer=cle.FakeQuant(8))
    """

    _plain_class = keras.layers.DepthwiseConv2D


@fused_doc
@keras.saving.register_keras_serializable(package="cle")
class FoldedDepthwiseConv1D(DepthwiseMixin, FoldedBatchNorm, keras.layers.DepthwiseConv1D):
    """``DepthwiseConv1D`` followed by ``BatchNormalization``, folded for quantization-aware
    training (as :class:`FoldedDepthwiseConv2D`, one spatial axis).

{FUSED_ARGS}

    Example:
        >>> layer = cle.FoldedDepthwiseConv1D(5, padding="same")
    """

    _plain_class = keras.layers.DepthwiseConv1D


@fused_doc
@keras.saving.register_keras_serializable(package="cle")
class FoldedDense(FoldedBatchNorm, keras.layers.Dense):
    """``Dense`` followed by ``BatchNormalization`` (on the last axis), folded for
    quantization-aware training.

    Takes every ``keras.layers.Dense`` argument plus the arguments below. Inputs of any rank
    >= 2; batch statistics are taken over every axis but the last, as Keras BN does.

{FUSED_ARGS}

    Example:
        >>> layer = cle.FoldedDense(64, activation="relu", kernel_quantizer=cle.FakeQuant(8))
    """

    _plain_class = keras.layers.Dense

    def _out_channels(self, input_shape):
        return self.units

    def _linear(self, inputs, kernel):
        return ops.matmul(inputs, kernel)


FUSED_LAYERS = {
    keras.layers.Conv1D: FoldedConv1D,
    keras.layers.Conv2D: FoldedConv2D,
    keras.layers.DepthwiseConv1D: FoldedDepthwiseConv1D,
    keras.layers.DepthwiseConv2D: FoldedDepthwiseConv2D,
    keras.layers.Dense: FoldedDense,
}
_FUSED_TYPES = tuple(FUSED_LAYERS.values())


# ------------------------------------------------------------------------------ model level


def _q(name):
    return f"'{name}'"


def _fuse_reason(match) -> str | None:
    """Why a BN matched by the inference fold cannot become a fused training layer."""
    bn_call, target = match.bn_call, match.target
    bn, layer = bn_call.layer, target.layer
    if not match.bn_after:
        return (
            f"it comes before {_q(target.name)} (forward fold); fused training layers take a "
            "batch norm that follows the layer"
        )
    producer = bn_call.inputs[0].producer
    if producer is not target:
        return (
            f"it follows {_q(producer.name)}, a batch norm that is fused into "
            f"{_q(target.name)} already; a fused layer holds one batch norm"
        )
    if type(layer) not in FUSED_LAYERS:
        supported = ", ".join(c.__name__ for c in FUSED_LAYERS)
        return (
            f"{_q(target.name)} is a {type(layer).__name__}; fused training layers exist for "
            f"{supported}"
        )
    if getattr(layer, "data_format", "channels_last") != "channels_last":
        return (
            f"{_q(target.name)} is channels_first; fused training layers are channels_last only"
        )
    if bn.renorm:
        return "it uses batch renormalization (renorm=True), which the fused layers do not"
    if bn.synchronized:
        return (
            "it is synchronized across replicas (synchronized=True), which the fused layers "
            "are not"
        )
    if bool(bn.trainable) != bool(layer.trainable):
        return (
            f"it has trainable={bn.trainable} but {_q(target.name)} has "
            f"trainable={layer.trainable}; a fused layer has one trainable flag"
        )
    return None


def _fused_config(layer, bn, options):
    config = layer_config(layer)
    bn_config = bn.get_config()
    config.update({key: bn_config[key] for key in BN_DEFAULTS})
    config.update(options)
    return config


def _copy_into_fused(fused, layer, bn):
    # A copy, never the same array: on JAX, assigning another variable's value shares its
    # buffer, and training one model then deletes (donates) the other's arrays.
    def put(var, value):
        var.assign(ops.cast(np.array(ops.convert_to_numpy(value), copy=True), var.dtype))

    put(fused.kernel, layer.kernel)
    if layer.use_bias:
        put(fused.bias, layer.bias)
    if bn.scale:
        put(fused.gamma, bn.gamma)
    if bn.center:
        put(fused.beta, bn.beta)
    put(fused.moving_mean, bn.moving_mean)
    put(fused.moving_variance, bn.moving_variance)
    fused.step.assign(0)


def fuse_for_training(
    model,
    folding_mode="ema_stats_folding",
    ema_freeze_delay=None,
    kernel_quantizer=None,
    return_pairs=False,
):
    """Replace every ``layer → BatchNormalization`` pair by one fused training layer.

    The pairs are those the inference fold (:func:`cle.fold_all_batch_norms`) folds backward,
    with a layer of exact class Conv1D, Conv2D, DepthwiseConv1D, DepthwiseConv2D or Dense
    (channels_last). The fused layer (:class:`FoldedConv2D`, ...) takes the layer's name and
    config and the BN's parameters, moving statistics and config (momentum, epsilon, ...), with
    its step counter at 0; the BN is removed. Every other BN is left in place and listed with
    the reason.

    The input model is not modified. In inference mode the new model computes what ``model``
    computes (float32 round-off); in training mode, before any freeze and without a quantizer,
    it computes what ``model`` computes in training mode.

    Args:
        model: a Functional or Sequential ``keras.Model``.
        folding_mode: ``"ema_stats_folding"`` (default) or ``"batch_stats_folding"``, for
            every fused layer.
        ema_freeze_delay: training steps after which moving statistics freeze; None: never.
        kernel_quantizer: callable applied to every folded kernel (e.g. ``cle.FakeQuant(8)``),
            or None.
        return_pairs: also return the pairs.

    Returns:
        The new model, or ``(new_model, fused_pairs)`` with ``return_pairs=True``:
        ``fused_pairs`` is a :class:`cle.FoldedPairs` of :class:`cle.FoldedPair`
        ``(fused_layer, bn)`` (``fused_layer`` of the new model, ``bn`` of ``model``) with
        ``.skipped``, a :class:`cle.SkippedBatchNorm` with the reason for every BN left in
        place. Reasons are also logged at INFO level on the logger ``"cle.training_fold"``.

    Raises:
        TypeError: ``model`` is not a ``keras.Model``.
        ValueError: an invalid option, or the graph of ``model`` cannot be read.

    Example:
        >>> qat = cle.fuse_for_training(model, kernel_quantizer=cle.FakeQuant(8),
        ...                             ema_freeze_delay=1000)
        >>> qat.compile("adam", "sparse_categorical_crossentropy")
        >>> qat.fit(x, y, epochs=2)
        >>> deployable = cle.export_folded(qat)      # plain Conv/Dense layers, no BN
    """
    kernel_quantizer = check_options(folding_mode, ema_freeze_delay, kernel_quantizer)
    options = {
        "folding_mode": folding_mode,
        "ema_freeze_delay": ema_freeze_delay,
        "kernel_quantizer": kernel_quantizer,
    }
    view = graph_view(model)
    matches, skipped = find_matches(view)
    fused, edits, bypass = [], {}, set()
    for match in matches:
        reason = _fuse_reason(match)
        if reason:
            skipped.append(_bnf.SkippedBatchNorm(match.bn_call.layer, reason))
            continue
        layer, bn = match.target.layer, match.bn_call.layer
        cls = FUSED_LAYERS[type(layer)]
        config = _fused_config(layer, bn, options)
        edits[id(layer)] = LayerEdit(replace=lambda old, cls=cls, config=config:
                                     cls.from_config(config))
        if match.bn_call.outputs[0].is_model_output:
            edits[id(bn)] = LayerEdit(replace=identity_like)  # keeps output names
        else:
            bypass.add(id(bn))
        fused.append((layer, bn))
    order = {id(call.layer): call.index for call in view.calls}
    skipped.sort(key=lambda s: order.get(id(s.bn), len(order)))
    new_model, clones = rebuild(model, edits=edits, bypass=bypass)
    pairs = []
    for layer, bn in fused:
        new = clones[id(layer)]
        _copy_into_fused(new, layer, bn)
        pairs.append(_bnf.FoldedPair(new, bn, True))
    for s in skipped:
        logger.info("BatchNormalization '%s' not fused: %s", s.bn.name, s.reason)
    logger.info(
        "model '%s': %d batch norms fused for training, %d skipped",
        model.name, len(pairs), len(skipped),
    )
    if return_pairs:
        return new_model, _bnf.FoldedPairs(pairs, skipped)
    return new_model


def export_folded(model):
    """Turn every fused training layer back into a plain layer with the folded weights.

    Each :class:`FoldedConv2D` / :class:`FoldedDepthwiseConv2D` / :class:`FoldedDense` / ...
    becomes a ``Conv2D`` / ``DepthwiseConv2D`` / ``Dense`` / ... with the same name, config and
    activation, ``use_bias=True``, and the weights of :meth:`get_folded_weights` (the kernel
    folded with the moving statistics, ``kernel_quantizer`` applied). Everything else is copied
    unchanged. The result computes what ``model`` computes in inference mode and is ready for
    ``tf.lite.TFLiteConverter.from_keras_model``.

    Args:
        model: a Functional or Sequential ``keras.Model``; ``model`` is not modified.

    Returns:
        A new model without fused layers.

    Raises:
        TypeError: ``model`` is not a ``keras.Model``.
        ValueError: the graph of ``model`` cannot be read.

    Example:
        >>> plain = cle.export_folded(qat_model)
        >>> converter = tf.lite.TFLiteConverter.from_keras_model(plain)
    """
    view = graph_view(model)
    fused = {}
    for call in view.calls:
        if isinstance(call.layer, _FUSED_TYPES):
            fused[id(call.layer)] = call.layer

    def plain(old):
        return old._plain_class.from_config(old._plain_config())

    edits = {key: LayerEdit(replace=plain) for key in fused}
    new_model, clones = rebuild(model, edits=edits)
    for key, old in fused.items():
        kernel, bias = old.get_folded_weights()
        new = clones[key]
        new.kernel.assign(ops.cast(kernel, new.kernel.dtype))
        new.bias.assign(ops.cast(bias, new.bias.dtype))
    return new_model
