"""Keras layers that cross-layer equalization inserts into a model.

:class:`ClippedReLU` is a ReLU with a separate upper bound per channel::

    y[..., c, ...] = min(max(x[..., c, ...], 0), caps[c])

Why it is needed. Cross-layer scaling (Nagel et al. 2019) divides output channel ``c`` of one
layer by ``s_c > 0`` and multiplies the matching input channel of the next layer by ``s_c``.
That is exact across a plain ReLU, because ReLU is positively homogeneous
(``max(s·x, 0) = s·max(x, 0)``), but not across ReLU6, whose fixed cap is not scaled.
Replacing the ReLU6 with a per-channel clipped ReLU restores exactness::

    min(max(s·x, 0), 6) = s · min(max(x, 0), 6/s)        for s > 0

so after scaling channel ``c`` by ``1/s_c`` the activation becomes ``ClippedReLU`` with
``caps[c] = 6/s_c``. High-bias folding later absorbs a per-channel amount ``c_k`` into the next
layer's bias and lowers the caps by the same amount (``caps.assign(caps - c)``), which is why
the caps are a (non-trainable) weight that can be updated in place rather than a constant.

Why this form. The layer is computed as ``minimum(relu(x), caps)`` with ``keras.ops`` only,
which every backend and exporter understands. The TFLite converter turns it into a ``RELU``
(fused into the preceding ``CONV_2D``/``DEPTHWISE_CONV_2D``/``FULLY_CONNECTED`` as its fused
activation when there is one) followed by a builtin ``MINIMUM`` against a constant per-channel
vector. Full-integer INT8 quantization quantizes that vector like any other constant, with the
activation's own scale and zero point (``MINIMUM`` needs equal quantization on both sides), so
the model stays entirely in INT8 builtins with no float fallback op. Caps above the calibrated
activation range saturate at its top, which the activation can not exceed anyway.
"""

from __future__ import annotations

import keras
import numpy as np
from keras import ops

__all__ = ["STABLE", "ChannelAffine", "ClippedReLU", "OneHot", "StableActivation"]

_DEFAULT_CAP = 6.0


@keras.saving.register_keras_serializable(package="cle")
class ClippedReLU(keras.layers.Layer):
    """ReLU with a per-channel upper bound: ``y = min(max(x, 0), caps[c])``.

    The caps are a non-trainable weight named ``"caps"`` of shape ``(C,)``, created in
    :meth:`build`; they are saved with the model's weights and can be changed in place with
    ``layer.caps.assign(new_caps)``. The layer config stores only ``axis`` and, when the
    initial ``caps`` was a scalar, that scalar; per-channel values live in the weights.

    With a scalar cap of 6 the layer computes exactly what ``keras.layers.ReLU(max_value=6)``
    computes. With ``caps = 6 / s`` (``s > 0`` per channel),
    ``s * ClippedReLU(caps=6 / s)(x) == ReLU6(s * x)``, which is what makes cross-layer scaling
    across a ReLU6 exact.

    Args:
        caps: Initial upper bounds. A scalar (broadcast to every channel when the layer is
            built) or a 1-D array/list with one value per channel. Defaults to 6.0.
        axis: The channel axis of the input: ``-1`` for channels_last (default), ``1`` for
            channels_first. Inputs of any rank >= 2 are supported.
        **kwargs: Standard layer keyword arguments (``name``, ``dtype``, ...).

    Raises:
        ValueError: If ``caps`` is not a scalar or 1-D or contains NaN, or (at build time)
            if the input's channel dimension is unknown or does not match the number of caps,
            or ``axis`` is out of range.

    Example:

    >>> import numpy as np
    >>> layer = ClippedReLU(caps=[1.0, 2.0, 6.0])
    >>> x = np.array([[-1.0, 1.5, 7.0]], dtype="float32")
    >>> keras.ops.convert_to_numpy(layer(x))
    array([[0. , 1.5, 6. ]], dtype=float32)
    >>> _ = layer.caps.assign([1.0, 1.0, 1.0])  # e.g. after high-bias folding
    >>> keras.ops.convert_to_numpy(layer(x))
    array([[0., 1., 1.]], dtype=float32)
    """

    def __init__(self, caps=None, axis=-1, **kwargs):
        super().__init__(**kwargs)
        if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
            raise ValueError(f"`axis` must be an int, got {axis!r}.")
        self.axis = int(axis)
        # `_config_cap` is what get_config reports: the scalar as given, or None (the default,
        # 6.0, or per-channel caps, whose values then live in the weights only).
        self._config_cap = None
        self._scalar_cap = _DEFAULT_CAP
        self._initial_caps = None
        if caps is not None:
            if hasattr(caps, "shape") and not isinstance(caps, np.ndarray):
                caps = ops.convert_to_numpy(caps)  # backend tensor or Keras variable
            values = np.asarray(caps, dtype="float64")
            if np.isnan(values).any():
                raise ValueError("`caps` must not contain NaN.")
            if values.ndim == 0:
                self._scalar_cap = self._config_cap = float(values)
            elif values.ndim == 1 and values.size > 0:
                self._scalar_cap = None
                self._initial_caps = values
            else:
                raise ValueError(
                    "`caps` must be a scalar or a non-empty 1-D array, "
                    f"got shape {values.shape}."
                )
        self.supports_masking = True

    def _channel_axis(self, rank):
        axis = self.axis + rank if self.axis < 0 else self.axis
        if rank < 2:
            raise ValueError(
                f"{self.__class__.__name__} expects inputs of rank >= 2, got rank {rank}."
            )
        if not 1 <= axis < rank:
            raise ValueError(
                f"`axis`={self.axis} is not a channel axis of a rank-{rank} input "
                f"(valid: 1..{rank - 1} or -1..-{rank - 1})."
            )
        return axis

    def build(self, input_shape):
        input_shape = tuple(input_shape)
        axis = self._channel_axis(len(input_shape))
        channels = input_shape[axis]
        if channels is None:
            raise ValueError(
                f"{self.__class__.__name__} needs a known channel dimension (axis {self.axis}) "
                f"to create its per-channel caps, but got input shape {input_shape}."
            )
        if self._initial_caps is not None:
            if self._initial_caps.shape[0] != channels:
                raise ValueError(
                    f"{self.__class__.__name__} got {self._initial_caps.shape[0]} caps but the "
                    f"input has {channels} channels on axis {self.axis} (shape {input_shape})."
                )
            initial = self._initial_caps
        else:
            initial = np.full((channels,), self._scalar_cap, dtype="float64")
        self.caps = self.add_weight(
            name="caps",
            shape=(channels,),
            initializer=keras.initializers.Constant(initial),
            trainable=False,
        )
        # The per-channel values now live in the weight; keep no copy that could go stale.
        self._initial_caps = None
        self._broadcast_shape = tuple(
            channels if i == axis else 1 for i in range(len(input_shape))
        )

    def call(self, inputs):
        caps = ops.cast(self.caps, inputs.dtype)
        caps = ops.reshape(caps, self._broadcast_shape)
        return ops.minimum(ops.relu(inputs), caps)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        """Returns ``axis`` and ``caps``: the initial cap if it was given as a scalar, else
        ``None`` (default 6.0, or per-channel caps, which are restored from the weights)."""
        config = super().get_config()
        config["axis"] = self.axis
        config["caps"] = self._config_cap
        return config


#: The activations :class:`StableActivation` computes.
STABLE = ("softplus", "mish", "log_sigmoid", "selu")
#: SELU's constants, as Keras and TensorFlow define them.
SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


@keras.saving.register_keras_serializable(package="cle")
class StableActivation(keras.layers.Layer):
    """An activation that TF Lite's converter writes through ``exp(x)``, in a form whose every
    intermediate tensor is bounded. With ``p = relu(x)`` and ``n = x - p`` (that is,
    ``min(x, 0)``), so that ``n - p = -|x|``::

        softplus(x)    = p + log(1 + exp(n - p))
        mish(x)        = x * tanh(softplus(x))
        log_sigmoid(x) = n - log(1 + exp(n - p))
        selu(x)        = scale * (p + alpha * (exp(n) - 1))

    Each computes what ``activation=`` of that name computes, up to float32 round-off.

    Why it is needed: the converter writes a softplus (so a mish and a log-sigmoid) as
    ``log(exp(x) + 1)``, and a SELU with ``exp(x)`` of every input, positive ones included;
    8-bit activations then hold ``exp(x)`` on one range from 0 to ``exp`` of the largest
    pre-activation: one that reaches 7 puts a step of several units on values mostly between
    1 and 3. Here every ``exp`` is of a value at most 0, so each tensor's 8-bit steps are as
    fine as its own values need. The converter writes it with builtin ``RELU``, ``SUB``,
    ``EXP``, ``ADD``, ``LOG``, ``MUL`` and ``TANH``, all of which it quantizes to INT8 (``-|x|``
    is not written with a ``NEG``, which would stay in float).

    Args:
        activation: "softplus", "mish", "log_sigmoid" or "selu" (:data:`STABLE`); the layer
            keeps it as ``kind``.
        **kwargs: Standard layer keyword arguments (``name``, ``dtype``, ...).

    Raises:
        ValueError: for another activation.

    Example:

    >>> import numpy as np
    >>> x = np.array([[-30.0, -1.0, 0.0, 2.0, 30.0]], dtype="float32")
    >>> y = keras.ops.convert_to_numpy(StableActivation("softplus")(x))
    >>> bool(np.allclose(y, np.log1p(np.exp(x.astype("float64"))), rtol=1e-6, atol=1e-7))
    True
    """

    def __init__(self, activation="softplus", **kwargs):
        super().__init__(**kwargs)
        if activation not in STABLE:
            raise ValueError(f"StableActivation computes one of {STABLE}. Received: "
                             f"activation={activation!r}")
        # Not ``self.activation``: code that reads a layer's fused activation function by
        # that attribute (Keras' and cle's) must not find a string here.
        self.kind = activation
        self.supports_masking = True

    def call(self, inputs):
        positive = ops.relu(inputs)
        negative = inputs - positive
        if self.kind == "selu":
            return SELU_SCALE * (positive + SELU_ALPHA * (ops.exp(negative) - 1.0))
        log_term = ops.log(1.0 + ops.exp(negative - positive))
        if self.kind == "log_sigmoid":
            return negative - log_term
        soft = positive + log_term
        return inputs * ops.tanh(soft) if self.kind == "mish" else soft

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config["activation"] = self.kind
        return config


@keras.saving.register_keras_serializable(package="cle")
class ChannelAffine(keras.layers.Layer):
    """``y[..., c] = x[..., c] * scale[c] + offset[c]`` over the last axis, computed as a 1x1
    depthwise convolution, so that TF Lite's converter stores ``scale`` as a depthwise
    kernel, quantized per channel.

    Why it is needed: a ``Normalization`` layer is written as a ``SUB`` and a ``MUL`` by
    constant vectors, each held on one 8-bit scale; where its features' scales differ by a
    large factor (a table's columns, a feature that never varied when it was adapted: a
    scale of 1/epsilon) the small ones read as a few steps or as 0. Here each channel's scale
    has its own 8-bit scale (a kernel with one value per channel is stored exactly) and the
    offset is the convolution's bias (32-bit). :func:`cle.quantize` puts it in place of such a
    ``Normalization`` (``scale = 1 / sqrt(variance)``, ``offset = -mean * scale``).

    The weights ``scale`` and ``offset`` (shape ``(C,)``, trainable as a kernel is) are made in
    :meth:`build` (1 and 0) and set by ``set_weights`` or ``assign``. Inputs of rank 2 or more
    with known sizes but the batch.

    Example:

    >>> import numpy as np
    >>> layer = ChannelAffine()
    >>> layer.build((None, 3))
    >>> layer.set_weights([np.array([1.0, 1e4, 1e-4], "float32"), np.zeros(3, "float32")])
    >>> keras.ops.convert_to_numpy(layer(np.ones((1, 3), "float32"))).tolist()
    [[1.0, 10000.0, 9.999999747378752e-05]]
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.supports_masking = True

    def build(self, input_shape):
        channels = input_shape[-1]
        if len(input_shape) < 2 or channels is None or None in tuple(input_shape[1:]):
            raise ValueError(f"{self.__class__.__name__} needs an input of rank 2 or more with "
                             f"known sizes but the batch. Received: shape {input_shape}")
        # Trainable, as a kernel is: the JAX export freezes trainable weights into the file as
        # constants, which the converter quantizes per channel; it keeps non-trainable ones
        # as variables, which reach the convolution as one more 8-bit tensor.
        self.scale = self.add_weight(name="scale", shape=(channels,), initializer="ones")
        self.offset = self.add_weight(name="offset", shape=(channels,), initializer="zeros")

    def call(self, inputs):
        shape = tuple(inputs.shape[1:])
        channels = shape[-1]
        middle = int(np.prod(shape[:-1], dtype=np.int64))
        flat = ops.reshape(inputs, (-1, 1, middle, channels))
        kernel = ops.reshape(ops.cast(self.scale, inputs.dtype), (1, 1, channels, 1))
        out = ops.depthwise_conv(flat, kernel, 1, "valid") + ops.cast(self.offset, inputs.dtype)
        return ops.reshape(out, (-1,) + shape)

    def compute_output_shape(self, input_shape):
        return input_shape


@keras.saving.register_keras_serializable(package="cle")
class OneHot(keras.layers.Layer):
    """The one-hot vectors of integer ids, as ``keras.layers.CategoryEncoding(num_tokens,
    output_mode="one_hot")`` computes them (the same output shapes: a last axis of size 1 is
    replaced, another kept; an id outside ``[0, num_tokens)`` gives zeros), computed as rows
    of an identity matrix taken by the ids.

    Why it is needed: TF Lite's converter writes a ``CategoryEncoding`` as a ``ONE_HOT`` whose
    on and off values, int8 constants, keep their own scale in an output of another one (the
    concatenation it usually feeds): the one-hot reads as values near 0 and the model's output
    is noise, in TF Lite's own conversion as in cle's. Here the converter writes a ``GATHER``
    from the table, an int8 constant that holds 0 and 1 exactly on its own scale, and the
    model reads as if the one-hot were given as float inputs. :func:`cle.quantize` puts it in
    place of such a ``CategoryEncoding``.

    Example:

    >>> import numpy as np
    >>> layer = OneHot(3)
    >>> keras.ops.convert_to_numpy(layer(np.array([[2], [0], [5]], "int32"))).tolist()
    [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    """

    def __init__(self, num_tokens: int, **kwargs):
        super().__init__(**kwargs)
        self.num_tokens = int(num_tokens)

    def call(self, inputs):
        ids = ops.cast(inputs, "int32")
        if len(ids.shape) >= 2 and ids.shape[-1] == 1:
            ids = ops.squeeze(ids, axis=-1)
        n = self.num_tokens
        ids = ops.where(ops.logical_and(ids >= 0, ids < n), ids, n)  # row n: zeros
        table = np.concatenate([np.eye(n), np.zeros((1, n))]).astype(self.compute_dtype)
        return ops.take(ops.convert_to_tensor(table), ids, axis=0)

    def compute_output_shape(self, input_shape):
        shape = tuple(input_shape)
        if len(shape) >= 2 and shape[-1] == 1:
            shape = shape[:-1]
        return shape + (self.num_tokens,)

    def get_config(self):
        return {**super().get_config(), "num_tokens": self.num_tokens}
