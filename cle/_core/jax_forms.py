"""Forms of a few JAX computations that TF Lite's converter can read, with the same values:
each takes the Keras JAX backend's own function and returns a replacement that computes what
it computes another way where the original's form stops the converter, and calls the original
everywhere else. :mod:`cle._core.keras_internals` swaps them in during the JAX export
(:mod:`cle._tflite.export`); they themselves use JAX and Keras' public API only.
"""

from __future__ import annotations

__all__ = ["broadcast_pixel", "dft_stft", "last_axis_softmax", "pixel_convolution",
           "pixel_einsum"]


def dft_stft(keras_stft):
    """``keras_stft`` (Keras' JAX ``stft``) computed as a real convolution (:func:`cle._core.keras_internals.dft_stft_on_jax`)."""
    def stft(x, sequence_length, sequence_stride, fft_length, window="hann", center=True):
        import jax
        import numpy as np
        import scipy.signal

        x = jax.numpy.asarray(x)
        try:
            win = (np.ones(fft_length) if window is None else np.pad(np.asarray(
                scipy.signal.get_window(window, sequence_length) if isinstance(window, str)
                else window, np.float64), _centred(fft_length, sequence_length)))
        except Exception:  # noqa: BLE001 - a window that is a tracer: Keras' own form
            win = None
        if win is None or win.shape != (fft_length,) or str(x.dtype) not in (
                "float32", "float64") or (isinstance(window, str)
                                          and window not in ("hann", "hamming")):
            return keras_stft(x, sequence_length, sequence_stride, fft_length, window, center)
        if center:
            pad = [(0, 0)] * (x.ndim - 1) + [(fft_length // 2, fft_length // 2)]
            x = jax.numpy.pad(x, pad, mode="reflect")
        bins = fft_length // 2 + 1
        angle = 2 * np.pi * np.outer(np.arange(fft_length), np.arange(bins)) / fft_length
        kernel = np.concatenate([win[:, None] * np.cos(angle), -win[:, None] * np.sin(angle)],
                                axis=1)[:, None, :]  # (width, 1 channel in, 2 * bins out)
        out = jax.lax.conv_general_dilated(
            x.reshape(-1, x.shape[-1], 1), jax.numpy.asarray(kernel, x.dtype),
            (sequence_stride,), "VALID", dimension_numbers=("NWC", "WIO", "NWC"),
            precision=jax.lax.Precision.HIGHEST)
        out = out.reshape(x.shape[:-1] + out.shape[1:])
        return out[..., :bins], out[..., bins:]

    return stft


def _centred(fft_length, sequence_length):
    """The zeros either side of a window of ``sequence_length`` in a frame of ``fft_length``
    (as Keras pads it)."""
    left = (fft_length - sequence_length) // 2
    return (left, fft_length - sequence_length - left)


def broadcast_pixel(keras_resize):
    """``keras_resize`` (Keras' JAX ``image.resize``), a 1 x 1 image broadcast
    (:func:`cle._core.keras_internals.pixel_resize_on_jax`)."""
    def resize(images, size, interpolation="bilinear", antialias=False,
               crop_to_aspect_ratio=False, pad_to_aspect_ratio=False, fill_mode="constant",
               fill_value=0.0, data_format=None):
        import jax
        import keras

        images = jax.numpy.asarray(images)
        last = (data_format or keras.config.image_data_format()) == "channels_last"
        spatial = images.shape[-3:-1] if last else images.shape[-2:]
        if images.ndim in (3, 4) and tuple(spatial) == (1, 1) and len(size) == 2 \
                and not pad_to_aspect_ratio and interpolation in _RESIZES:
            shape = (images.shape[:-3] + tuple(size) + images.shape[-1:] if last
                     else images.shape[:-2] + tuple(size))
            return jax.numpy.broadcast_to(images, shape)
        return keras_resize(images, size, interpolation, antialias, crop_to_aspect_ratio,
                            pad_to_aspect_ratio, fill_mode, fill_value, data_format)

    return resize


#: The interpolations Keras' JAX resize has (each gives a one-pixel image's value everywhere).
_RESIZES = ("nearest", "bilinear", "bicubic", "lanczos3", "lanczos5")


def _one_row_by_matrix(a, b) -> bool:
    """Whether ``a @ b`` is of one row of rank 4 or more by a float matrix (:func:`cle._core.keras_internals.pixel_matmul_on_jax`)."""
    import math

    import jax

    return a.ndim >= 4 and b.ndim == 2 and math.prod(a.shape[:-1]) == 1 and all(
        jax.numpy.issubdtype(t.dtype, jax.numpy.floating) for t in (a, b))


def _as_convolution(a, b):
    """``a @ b`` (:func:`_one_row_by_matrix`) as a 1 x 1 convolution."""
    import jax

    out = jax.lax.conv_general_dilated(
        a.reshape(1, 1, 1, a.shape[-1]), b.reshape(1, 1, *b.shape), (1, 1), "VALID",
        dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=jax.lax.Precision.HIGHEST)
    return out.reshape(a.shape[:-1] + b.shape[-1:])


def pixel_convolution(keras_matmul):
    """``keras_matmul`` (Keras' JAX ``numpy.matmul``), one row of rank 4 or more by a matrix a
    1 x 1 convolution (:func:`cle._core.keras_internals.pixel_matmul_on_jax`)."""
    def matmul(x1, x2):
        import jax

        a, b = jax.numpy.asarray(x1), jax.numpy.asarray(x2)
        return _as_convolution(a, b) if _one_row_by_matrix(a, b) else keras_matmul(x1, x2)

    return matmul


def pixel_einsum(keras_einsum):
    """``keras_einsum`` (Keras' JAX ``numpy.einsum``), ``"abcd,de->abce"`` of one row of rank 4
    or more by a matrix a 1 x 1 convolution (:func:`cle._core.keras_internals.pixel_matmul_on_jax`)."""
    def einsum(subscripts, *operands, **kwargs):
        import jax

        spec = subscripts.replace(" ", "")
        if len(operands) == 2 and not kwargs and "->" in spec and "." not in spec:
            (left, right), out = spec.split("->")[0].split(","), spec.split("->")[1]
            a, b = (jax.numpy.asarray(t) for t in operands)
            letters = left + right[1:]
            if len(set(letters)) == len(letters) and len(right) == 2 and right[0] == left[-1] \
                    and out == left[:-1] + right[1] and _one_row_by_matrix(a, b):
                return _as_convolution(a, b)
        return keras_einsum(subscripts, *operands, **kwargs)

    return einsum


def last_axis_softmax(keras_softmax):
    """``keras_softmax`` (Keras' JAX ``nn.softmax``) over an axis other than the last computed
    over the last axis of the tensor with that axis moved last, then moved back
    (:func:`cle._core.keras_internals.last_axis_softmax_on_jax`)."""
    def softmax(x, axis=-1):
        import jax

        ndim = getattr(x, "ndim", None)
        if not isinstance(axis, int) or not isinstance(ndim, int) or ndim < 2 \
                or axis % ndim == ndim - 1 or type(x).__name__ == "BCOO":
            return keras_softmax(x, axis=axis)
        x, axis = jax.numpy.asarray(x), axis % ndim
        moved = keras_softmax(jax.numpy.moveaxis(x, axis, -1), axis=-1)
        return jax.numpy.moveaxis(moved, -1, axis)

    return softmax
