"""How the rounding stage (:mod:`cle._quantize.rounding`) reads a layer: as one or more
*parts*, a kernel each with the geometry of its channels-last input. A 1-D layer is a 2-D one
over a single row; a separable layer is two parts, its depthwise kernel (no bias) and its
pointwise kernel (a 1x1 convolution with the layer's bias) on the depthwise kernel's output.
So the rounding math (:mod:`cle._math.rounding`, :mod:`cle._math.moments`) only ever sees
convolutions, depthwise convolutions and dense products."""

from __future__ import annotations

import dataclasses

import keras
import numpy as np

from cle._math.moments import Geometry

__all__ = ["KINDS", "NOT_ROUNDED", "Part", "channels_last", "depthwise_out", "kind_of",
           "parts"]

#: The layer types the rounding stage rounds, and how it reads each.
KINDS = {keras.layers.Conv1D: "conv", keras.layers.Conv2D: "conv",
         keras.layers.DepthwiseConv1D: "depthwise", keras.layers.DepthwiseConv2D: "depthwise",
         keras.layers.Dense: "dense",
         keras.layers.SeparableConv1D: "separable", keras.layers.SeparableConv2D: "separable"}
#: Why a layer of another type keeps the kernel the converter writes.
NOT_ROUNDED = ("the rounding stage rounds Conv1D/2D, DepthwiseConv1D/2D, SeparableConv1D/2D "
               "and Dense layers")


@dataclasses.dataclass(frozen=True)
class Part:
    """One kernel of a layer the rounding stage rounds, read as its own layer: a SeparableConv's
    depthwise kernel (no bias) feeds its pointwise kernel (a 1x1 convolution with the
    layer's bias); every other layer is one part.

    Attributes:
        attr: the kernel's attribute.
        kind: its rows' layout (:func:`cle._math.rounding.to_rows`): "conv", "depthwise",
            "dense".
        label: the kind its :class:`cle._quantize.rounding.RoundedLayer` is reported under
            ("pointwise" for a separable layer's second part).
        bias: the part's output takes the layer's bias.
        geometry: how it reads its channels-last input.
        groups: input channel groups.
    """

    attr: str
    kind: str
    label: str
    bias: bool
    geometry: Geometry
    groups: int = 1


def kind_of(layer) -> str:
    """:data:`KINDS` of the layer's type."""
    return KINDS[type(layer)]


def parts(layer) -> list[Part]:
    """The kernels of a layer the rounding stage rounds, in the order they read the input (a
    1-D layer's sequence is one row of :func:`channels_last`, its kernel one row of ``k`` taps)."""
    kind = kind_of(layer)
    if kind == "dense":
        return [Part("kernel", "dense", "dense", layer.use_bias, Geometry("dense"))]
    lead = (1,) * (2 - len(layer.kernel_size))
    spatial = (lead + tuple(layer.kernel_size), lead + tuple(layer.strides),
               lead + tuple(layer.dilation_rate), layer.padding)
    if kind == "separable":
        return [Part("depthwise_kernel", "depthwise", "depthwise", False,
                     Geometry("depthwise", *spatial)),
                Part("pointwise_kernel", "conv", "pointwise", layer.use_bias,
                     Geometry("conv"))]
    groups = int(getattr(layer, "groups", 1) or 1)
    return [Part("kernel", kind, kind, layer.use_bias, Geometry(kind, *spatial, groups),
                 groups)]


def channels_last(layer, value):
    """The layer's input, channels last; a 1-D convolution's ``(N, L, C)`` as
    ``(N, 1, L, C)``."""
    x = np.asarray(keras.ops.convert_to_numpy(value), np.float32)
    if isinstance(layer, keras.layers.Dense):
        return x
    if getattr(layer, "data_format", "channels_last") == "channels_first":
        x = np.moveaxis(x, 1, -1)
    return x[:, None] if x.ndim == 3 else x


def depthwise_out(part, a, kernel):
    """A separable layer's depthwise output, channels last, from its channels-last input
    ``a`` with ``kernel`` (a 1-D layer's as one row)."""
    g = part.geometry
    k = np.reshape(kernel, g.kernel + tuple(np.shape(kernel)[-2:]))
    out = keras.ops.depthwise_conv(a, k, strides=g.strides, padding=g.padding,
                                   data_format="channels_last", dilation_rate=g.dilation)
    return np.asarray(keras.ops.convert_to_numpy(out), np.float32)
