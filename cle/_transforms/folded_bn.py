"""What the fused training layers of :mod:`cle.training_fold` share: :class:`FoldedBatchNorm`,
the batch norm folded into a conv/dense layer (training with batch or moving statistics, the
freeze, the folded inference kernel, the config), the conv and depthwise hooks, the check of the
folding options and the shared part of the layers' docstrings. The registered layer classes
themselves live in :mod:`cle.training_fold`."""

from __future__ import annotations

import keras
from keras import ops

# The step counter's dtype: Keras' "int", the dtype of its optimizers' iteration counter (int64
# on TensorFlow, int32 elsewhere: JAX without JAX_ENABLE_X64 truncates int64 with a warning).
STEP_DTYPE = "int64" if keras.backend.backend() == "tensorflow" else "int32"

FOLDING_MODES = ("ema_stats_folding", "batch_stats_folding")

# BatchNormalization config entries the fused layers take over, with Keras BN's defaults.
BN_DEFAULTS = {
    "momentum": 0.99,
    "epsilon": 1e-3,
    "center": True,
    "scale": True,
    "beta_initializer": "zeros",
    "gamma_initializer": "ones",
    "moving_mean_initializer": "zeros",
    "moving_variance_initializer": "ones",
    "beta_regularizer": None,
    "gamma_regularizer": None,
    "beta_constraint": None,
    "gamma_constraint": None,
}


def _serialize(obj):
    return None if obj is None else keras.saving.serialize_keras_object(obj)


def check_options(folding_mode, ema_freeze_delay, kernel_quantizer):
    """Validate the folding options; returns the quantizer (deserialized if given as a dict)."""
    if folding_mode not in FOLDING_MODES:
        raise ValueError(
            f"folding_mode must be one of {FOLDING_MODES}. Received: folding_mode={folding_mode!r}"
        )
    if ema_freeze_delay is not None and (
        isinstance(ema_freeze_delay, bool)
        or not isinstance(ema_freeze_delay, int)
        or ema_freeze_delay < 0
    ):
        raise ValueError(
            "ema_freeze_delay must be None (never freeze) or an int >= 0. "
            f"Received: ema_freeze_delay={ema_freeze_delay!r}"
        )
    if isinstance(kernel_quantizer, dict):
        kernel_quantizer = keras.saving.deserialize_keras_object(kernel_quantizer)
    if kernel_quantizer is not None and not callable(kernel_quantizer):
        raise ValueError(
            "kernel_quantizer must be callable or None. "
            f"Received: kernel_quantizer={kernel_quantizer!r}"
        )
    return kernel_quantizer


class FoldedBatchNorm:
    """Mixin with everything the fused layers share; subclasses add a Keras layer class and
    four hooks (:meth:`_out_channels`, :meth:`_linear`, :meth:`_scale_kernel`,
    :meth:`_quantize_kernel`)."""

    _plain_class: type = None  # the Keras layer class this one extends

    def __init__(
        self,
        *args,
        folding_mode="ema_stats_folding",
        ema_freeze_delay=None,
        kernel_quantizer=None,
        momentum=0.99,
        epsilon=1e-3,
        center=True,
        scale=True,
        beta_initializer="zeros",
        gamma_initializer="ones",
        moving_mean_initializer="zeros",
        moving_variance_initializer="ones",
        beta_regularizer=None,
        gamma_regularizer=None,
        beta_constraint=None,
        gamma_constraint=None,
        **kwargs,
    ):
        name = type(self).__name__
        if kwargs.get("lora_rank"):
            raise ValueError(
                f"{name} does not support LoRA. Received: lora_rank={kwargs['lora_rank']!r}"
            )
        super().__init__(*args, **kwargs)
        if getattr(self, "data_format", "channels_last") != "channels_last":
            raise ValueError(
                f"{name} supports data_format='channels_last' only. "
                f"Received: data_format={self.data_format!r}"
            )
        kernel_quantizer = check_options(folding_mode, ema_freeze_delay, kernel_quantizer)
        if not float(epsilon) > 0:
            raise ValueError(f"epsilon must be > 0. Received: epsilon={epsilon!r}")
        self.folding_mode = folding_mode
        self.ema_freeze_delay = ema_freeze_delay
        self.kernel_quantizer = kernel_quantizer
        self.momentum = float(momentum)
        self.epsilon = float(epsilon)
        self.center = bool(center)
        self.scale = bool(scale)
        self.beta_initializer = keras.initializers.get(beta_initializer)
        self.gamma_initializer = keras.initializers.get(gamma_initializer)
        self.moving_mean_initializer = keras.initializers.get(moving_mean_initializer)
        self.moving_variance_initializer = keras.initializers.get(moving_variance_initializer)
        self.beta_regularizer = keras.regularizers.get(beta_regularizer)
        self.gamma_regularizer = keras.regularizers.get(gamma_regularizer)
        self.beta_constraint = keras.constraints.get(beta_constraint)
        self.gamma_constraint = keras.constraints.get(gamma_constraint)
        self.gamma = self.beta = self.moving_mean = self.moving_variance = self.step = None

    # -------------------------------------------------------------- state

    def build(self, input_shape):
        super().build(input_shape)
        channels = self._out_channels(input_shape)
        if self.scale:
            self.gamma = self.add_weight(
                name="gamma", shape=(channels,), initializer=self.gamma_initializer,
                regularizer=self.gamma_regularizer, constraint=self.gamma_constraint,
                trainable=True, autocast=False,
            )
        if self.center:
            self.beta = self.add_weight(
                name="beta", shape=(channels,), initializer=self.beta_initializer,
                regularizer=self.beta_regularizer, constraint=self.beta_constraint,
                trainable=True, autocast=False,
            )
        self.moving_mean = self.add_weight(
            name="moving_mean", shape=(channels,), initializer=self.moving_mean_initializer,
            trainable=False, autocast=False,
        )
        self.moving_variance = self.add_weight(
            name="moving_variance", shape=(channels,),
            initializer=self.moving_variance_initializer, trainable=False, autocast=False,
        )
        self.step = self.add_weight(
            name="step", shape=(), dtype=STEP_DTYPE, initializer="zeros", trainable=False,
            autocast=False,
        )

    # The Keras Conv/Dense classes save only kernel and bias (their quantization/LoRA-aware
    # versions); the fused layers save every variable, in order, like a plain Layer.
    def save_own_variables(self, store):
        keras.layers.Layer.save_own_variables(self, store)

    def load_own_variables(self, store):
        keras.layers.Layer.load_own_variables(self, store)

    def quantize(self, mode=None, *args, **kwargs):
        raise NotImplementedError(
            f"{type(self).__name__} cannot be quantized by Keras. Use kernel_quantizer for "
            "quantization-aware training, then cle.export_folded(model) and the TFLite converter."
        )

    def enable_lora(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not support LoRA.")

    # -------------------------------------------------------------- hooks

    def _out_channels(self, input_shape) -> int:
        raise NotImplementedError

    def _linear(self, inputs, kernel):
        """The layer's convolution / matmul with ``kernel`` (no bias, no activation)."""
        raise NotImplementedError

    def _scale_kernel(self, kernel, s):
        """``kernel`` with output channel ``o`` multiplied by ``s[o]``."""
        return kernel * s

    def _quantize_kernel(self, kernel):
        if self.kernel_quantizer is None:
            return kernel
        return self.kernel_quantizer(kernel)

    # -------------------------------------------------------------- math

    def _f32(self, value):
        return ops.cast(value, "float32")

    def _gamma_beta(self):
        gamma = self._f32(self.gamma) if self.scale else None
        beta = self._f32(self.beta) if self.center else None
        return gamma, beta

    def _factor(self, inv_sigma, gamma):
        return inv_sigma if gamma is None else gamma * inv_sigma

    def _bias_term(self, mean, s, beta):
        """``β + (b − μ)·s``: the output bias for statistics ``μ`` and factor ``s = γ/σ``."""
        b = self._f32(self.bias) if self.use_bias else 0.0
        out = (b - mean) * s
        return out if beta is None else out + beta

    def _inference_kernel_and_bias(self):
        """``(Q(W·γ/σ_mv), β + γ·(b − μ_mv)/σ_mv)`` as float32 tensors (kernel layout of the
        plain layer)."""
        gamma, beta = self._gamma_beta()
        mean = self._f32(self.moving_mean)
        s = self._factor(ops.rsqrt(self._f32(self.moving_variance) + self.epsilon), gamma)
        kernel = self._quantize_kernel(self._scale_kernel(self._f32(self.kernel), s))
        return kernel, self._bias_term(mean, s, beta)

    def _finish(self, outputs):
        outputs = ops.cast(outputs, self.compute_dtype)
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs

    def call(self, inputs, training=None):
        if not (training and self.trainable):
            kernel, bias = self._inference_kernel_and_bias()
            y = self._linear(inputs, ops.cast(kernel, self.compute_dtype))
            return self._finish(self._f32(y) + bias)

        # Batch statistics of conv(x, W) + b, as Keras BN computes them.
        y = self._linear(inputs, self.kernel)
        if self.use_bias:
            y = ops.add(y, ops.cast(self.bias, y.dtype))
        y = self._f32(y)
        axes = list(range(len(y.shape) - 1))
        batch_mean, batch_var = ops.moments(y, axes=axes)

        moving_mean = self._f32(self.moving_mean)
        moving_var = self._f32(self.moving_variance)
        frozen = None
        if self.ema_freeze_delay is not None:
            frozen = ops.greater_equal(self.step, self.ema_freeze_delay)
            mean = ops.where(frozen, moving_mean, batch_mean)
            var = ops.where(frozen, moving_var, batch_var)
        else:
            mean, var = batch_mean, batch_var

        gamma, beta = self._gamma_beta()
        if self.kernel_quantizer is None:
            # conv(x, W·γ/σ_fold)·(σ_fold/σ) + bias term == BN(y) with (mean, var): one conv.
            outputs = ops.batch_normalization(
                y, mean, var, axis=-1, offset=beta, scale=gamma, epsilon=self.epsilon
            )
        else:
            inv_sigma = ops.rsqrt(var + self.epsilon)
            s = self._factor(inv_sigma, gamma)
            if self.folding_mode == "ema_stats_folding":
                inv_sigma_mv = ops.rsqrt(moving_var + self.epsilon)
                fold = self._factor(inv_sigma_mv, gamma)
                correction = inv_sigma / inv_sigma_mv  # σ_mv/σ_B, 1 once frozen
            else:
                fold, correction = s, None
            kernel = self._quantize_kernel(self._scale_kernel(self._f32(self.kernel), fold))
            outputs = self._f32(self._linear(inputs, ops.cast(kernel, self.compute_dtype)))
            if correction is not None:
                outputs = outputs * correction
            outputs = outputs + self._bias_term(mean, s, beta)

        m = self.momentum
        new_mean = moving_mean * m + batch_mean * (1.0 - m)
        new_var = moving_var * m + batch_var * (1.0 - m)
        if frozen is not None:
            new_mean = ops.where(frozen, moving_mean, new_mean)
            new_var = ops.where(frozen, moving_var, new_var)
        self.moving_mean.assign(ops.cast(new_mean, self.moving_mean.dtype))
        self.moving_variance.assign(ops.cast(new_var, self.moving_variance.dtype))
        self.step.assign(self.step + 1)
        return self._finish(outputs)

    # -------------------------------------------------------------- public helpers

    def is_frozen(self) -> bool:
        """Whether the moving statistics are frozen (``step >= ema_freeze_delay``)."""
        if self.ema_freeze_delay is None:
            return False
        step = 0 if self.step is None else int(ops.convert_to_numpy(self.step))
        return step >= self.ema_freeze_delay

    def get_folded_weights(self):
        """The inference kernel and bias, as numpy arrays.

        ``kernel = Q(W·γ/σ_mv)`` in the plain layer's kernel layout (``kernel_quantizer``
        applied) and ``bias = β + γ·(b − μ_mv)/σ_mv``: a plain layer with these weights computes
        what this layer computes in inference mode. :func:`export_folded` uses them.

        Returns:
            ``(kernel, bias)``, float32 numpy arrays.

        Raises:
            ValueError: the layer is not built yet.
        """
        if not self.built:
            raise ValueError(f"Layer '{self.name}' is not built yet; call it on an input first.")
        kernel, bias = self._inference_kernel_and_bias()
        return ops.convert_to_numpy(kernel), ops.convert_to_numpy(bias)

    def _plain_config(self):
        """Config of the plain layer :func:`export_folded` puts in place of this one."""
        config = self._plain_class.get_config(self)
        config["use_bias"] = True
        return config

    def get_config(self):
        config = super().get_config()
        config.update({
            "folding_mode": self.folding_mode,
            "ema_freeze_delay": self.ema_freeze_delay,
            "kernel_quantizer": _serialize(self.kernel_quantizer),
            "momentum": self.momentum,
            "epsilon": self.epsilon,
            "center": self.center,
            "scale": self.scale,
            "beta_initializer": keras.initializers.serialize(self.beta_initializer),
            "gamma_initializer": keras.initializers.serialize(self.gamma_initializer),
            "moving_mean_initializer": keras.initializers.serialize(self.moving_mean_initializer),
            "moving_variance_initializer": keras.initializers.serialize(
                self.moving_variance_initializer
            ),
            "beta_regularizer": keras.regularizers.serialize(self.beta_regularizer),
            "gamma_regularizer": keras.regularizers.serialize(self.gamma_regularizer),
            "beta_constraint": keras.constraints.serialize(self.beta_constraint),
            "gamma_constraint": keras.constraints.serialize(self.gamma_constraint),
        })
        return config


_FUSED_ARGS_DOC = """
    Batch-norm arguments (as ``keras.layers.BatchNormalization``, normalizing the channel axis):
    ``momentum=0.99``, ``epsilon=1e-3``, ``center=True``, ``scale=True``, ``beta_initializer``,
    ``gamma_initializer``, ``moving_mean_initializer``, ``moving_variance_initializer``,
    ``beta_regularizer``, ``gamma_regularizer``, ``beta_constraint``, ``gamma_constraint``.

    Folding arguments:
        folding_mode: ``"ema_stats_folding"`` (default): fold with the moving statistics and
            correct the output by ``σ_mv/σ_B`` before the freeze; ``"batch_stats_folding"``:
            fold with the batch statistics before the freeze. See :mod:`cle.training_fold`.
        ema_freeze_delay: number of training steps after which the moving statistics stop
            updating and training uses them instead of batch statistics; None (default) never
            freezes. The step counter is the layer's ``step`` weight.
        kernel_quantizer: optional callable applied to the folded kernel in training and
            inference (e.g. :class:`cle.FakeQuant`); serializable objects survive ``.keras``
            saving.

    Weights, in this order: ``kernel``, ``bias`` (if ``use_bias``), ``gamma`` (if ``scale``),
    ``beta`` (if ``center``), ``moving_mean``, ``moving_variance``, ``step`` (int64 on TensorFlow, int32 on other backends).
"""


def fused_doc(cls):
    cls.__doc__ = cls.__doc__.replace("{FUSED_ARGS}", _FUSED_ARGS_DOC.strip("\n"))
    return cls


class ConvMixin:
    def _out_channels(self, input_shape):
        return self.filters

    def _linear(self, inputs, kernel):
        padding = self.padding
        if padding == "causal":
            inputs = ops.pad(inputs, self._compute_causal_padding())
            padding = "valid"
        return ops.conv(
            inputs, kernel, strides=list(self.strides), padding=padding,
            dilation_rate=self.dilation_rate, data_format=self.data_format,
        )


class DepthwiseMixin:
    def _out_channels(self, input_shape):
        return input_shape[-1] * self.depth_multiplier

    def _linear(self, inputs, kernel):
        return ops.depthwise_conv(
            inputs, kernel, strides=self.strides, padding=self.padding,
            dilation_rate=self.dilation_rate, data_format=self.data_format,
        )

    def _scale_kernel(self, kernel, s):
        # kernel (*k, in, mult): output channel c*mult + m.
        return kernel * ops.reshape(s, tuple(kernel.shape[-2:]))

    def _quantize_kernel(self, kernel):
        # The quantizer sees (*k, 1, in*mult), TFLite's depthwise layout: last axis = output
        # channel, as for the other fused layers.
        if self.kernel_quantizer is None:
            return kernel
        shape = tuple(kernel.shape)
        flat = ops.reshape(kernel, shape[:-2] + (1, shape[-2] * shape[-1]))
        return ops.reshape(self.kernel_quantizer(flat), shape)
