"""Where each supported Keras layer keeps its channels: the one table transforms consult.

Every transform asks :func:`layout_of` instead of branching on layer classes. Lookup is by
exact class: a subclass of ``Conv2D`` may override ``call`` and is treated as an unknown
layer (passed through unchanged).

Kernel layouts (channels_last and channels_first alike, Keras stores kernels one way):

=====================  ==========================================  ===========  ==========
layer                  kernel shape                                out channel  in channel
=====================  ==========================================  ===========  ==========
Conv1D/2D/3D           (*k, in/groups, out)                        axis -1      axis -2
DepthwiseConv1D/2D     (*k, in, mult)                              in*mult + m  axis -2
SeparableConv1D/2D     depthwise (*k, in, mult),                   pointwise -1 depthwise -2
                       pointwise (*1, in*mult, out)
Conv1D/2D/3DTranspose  (*k, out, in)                               axis -2      axis -1
Dense                  (in, out)                                   axis -1      axis 0
=====================  ==========================================  ===========  ==========
"""

from __future__ import annotations

import dataclasses

import keras

from cle._core import keras_internals as internals
from cle._core.weights import read_weight

__all__ = ["Layout", "layout_of", "channel_axis", "bias_on_wrong_axis", "untouchable_reason",
           "read_weight"]


@dataclasses.dataclass(frozen=True)
class Layout:
    """How one layer class stores its channels.

    Attributes:
        kind: "conv", "depthwise", "separable", "transpose" or "dense".
        out_kernel: attribute holding the kernel whose output channels the layer emits.
        out_axis: axis of ``out_kernel`` that indexes output channels. For "depthwise" the
            output channel ``c * mult + m`` is spread over axes (-2, -1).
        in_kernel: attribute holding the kernel that reads the layer's input.
        in_axis: axis of ``in_kernel`` that indexes input channels.
        spatial_rank: number of spatial dimensions (0 for Dense).
    """

    kind: str
    out_kernel: str
    out_axis: int
    in_kernel: str
    in_axis: int
    spatial_rank: int

    @property
    def kernel_attrs(self) -> tuple[str, ...]:
        if self.out_kernel == self.in_kernel:
            return (self.out_kernel,)
        return (self.in_kernel, self.out_kernel)


_L = keras.layers
_TABLE: dict[type, Layout] = {}
for _rank, _conv, _tconv in (
    (1, _L.Conv1D, _L.Conv1DTranspose),
    (2, _L.Conv2D, _L.Conv2DTranspose),
    (3, _L.Conv3D, _L.Conv3DTranspose),
):
    _TABLE[_conv] = Layout("conv", "kernel", -1, "kernel", -2, _rank)
    _TABLE[_tconv] = Layout("transpose", "kernel", -2, "kernel", -1, _rank)
for _rank, _dw, _sep in (
    (1, _L.DepthwiseConv1D, _L.SeparableConv1D),
    (2, _L.DepthwiseConv2D, _L.SeparableConv2D),
):
    _TABLE[_dw] = Layout("depthwise", "kernel", -1, "kernel", -2, _rank)
    _TABLE[_sep] = Layout(
        "separable", "pointwise_kernel", -1, "depthwise_kernel", -2, _rank
    )
_TABLE[_L.Dense] = Layout("dense", "kernel", -1, "kernel", 0, 0)


def layout_of(layer) -> Layout | None:
    """The :class:`Layout` of ``layer``'s exact class, or None if keras-cle does not know it."""
    return _TABLE.get(type(layer))


def channel_axis(layer, rank: int) -> int:
    """Non-negative channel axis of a tensor of ``rank`` that ``layer`` reads or writes."""
    if layout_of(layer).kind != "dense" and (
        getattr(layer, "data_format", "channels_last") == "channels_first"
    ):
        return 1
    return rank - 1


def bias_on_wrong_axis(layer, out_shape) -> str | None:
    """Why Keras would add a per-channel bias of ``layer`` along the wrong axis, or None.

    Keras 3.15's TensorFlow ``ops.add`` turns ``x + bias.reshape(1, C, 1, ...)`` into
    ``tf.nn.bias_add`` and picks NHWC whenever ``x``'s last axis also has C entries, so a
    channels_first layer whose last spatial size equals its channel count adds its bias along
    the last axis (measured). A transform that changes such a layer's bias would then not
    compute what the formulas say. This is a TensorFlow-backend bug: other backends (JAX,
    PyTorch) add the bias on the channel axis, so the guard applies on TensorFlow only.
    """
    if keras.backend.backend() != "tensorflow":
        return None
    if getattr(layer, "data_format", None) != "channels_first" or len(out_shape) < 3:
        return None
    if out_shape[1] is None or out_shape[1] != out_shape[-1]:
        return None
    return (
        f"'{layer.name}' is channels_first with its last spatial size equal to its "
        f"{out_shape[1]} channels; on the TensorFlow backend Keras adds its bias on the wrong "
        "axis there (tf.nn.bias_add takes it for channels_last), so a changed bias would not "
        "be applied per channel"
    )


def untouchable_reason(layer, n_calls: int) -> str | None:
    """Why no transform may rewrite ``layer``'s weights, whatever the pattern, or None."""
    if n_calls > 1:
        return f"'{layer.name}' is a shared layer, called {n_calls} times"
    if getattr(layer, "quantization_mode", None):
        return f"'{layer.name}' is quantized ({layer.quantization_mode})"
    if getattr(layer, "lora_enabled", False):
        return f"'{layer.name}' has LoRA enabled"
    return None


def kernel_specs(layer):
    """(kernel attribute, axis, depthwise) for each kernel of a layer with a layout."""
    layout = layout_of(layer)
    specs = []
    for attr in layout.kernel_attrs:
        depthwise = layout.kind == "depthwise" or (
            layout.kind == "separable" and attr == layout.in_kernel
        )
        axis = -1 if depthwise or attr != layout.out_kernel else layout.out_axis
        specs.append((attr, axis, depthwise))
    return specs


def kernel_layers(model):
    """Distinct layers of ``model`` (sub-models and custom layers seen through) with a layout."""
    seen, out = set(), []
    for layer in internals.sublayers(model):
        if id(layer) in seen or layout_of(layer) is None:
            continue
        seen.add(id(layer))
        out.append(layer)
    return out
