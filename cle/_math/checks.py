"""Checks of plain argument values (numpy only): each returns the checked value or raises
the ``ValueError`` that names the argument and echoes what was received."""

from __future__ import annotations

import numpy as np

MIN_BITS, MAX_BITS = 2, 32


def check_bits(bits, name="bits"):
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or not (
        MIN_BITS <= bits <= MAX_BITS
    ):
        raise ValueError(
            f"`{name}` must be an integer from {MIN_BITS} to {MAX_BITS}. "
            f"Received: {name}={bits!r}"
        )
    return int(bits)


def check_bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"`{name}` must be True or False. Received: {name}={value!r}")
    return bool(value)


def check_inputs(x, sample_shape, name):
    """``x`` as a float32 array whose samples match ``sample_shape`` (None/-1 = any size)."""
    try:
        arr = np.asarray(x, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise ValueError(
            f"`{name}` must be a numeric array. Received: {name} of type {type(x).__name__}"
        ) from exc
    sample_shape = tuple(sample_shape)
    ok = arr.ndim == len(sample_shape) + 1 and all(
        d is None or d < 0 or d == s for d, s in zip(sample_shape, arr.shape[1:])
    )
    if not ok:
        expected = "(N, " + ", ".join("?" if d is None or d < 0 else str(d) for d in sample_shape)
        raise ValueError(
            f"`{name}` must be a batch of model inputs of shape {expected.rstrip(', ')}). "
            f"Received: {name} with shape {arr.shape}"
        )
    return arr


def check_pair(reference, test):
    ref = np.asarray(reference, dtype=np.float64)
    tst = np.asarray(test, dtype=np.float64)
    if ref.shape != tst.shape or ref.size == 0:
        raise ValueError(
            "`reference` and `test` must be non-empty arrays of the same shape. "
            f"Received: reference with shape {ref.shape}, test with shape {tst.shape}"
        )
    return ref, tst
