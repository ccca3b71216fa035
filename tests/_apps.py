"""Every model constructor that ``keras.applications`` exposes, found programmatically, and the
smallest square input each accepts (shared by tests/test_all_applications.py and
scripts/applications_report.py)."""

from __future__ import annotations

import inspect

import keras

# Sizes tried in order; the first one the constructor accepts is used.
_SIZES = (32, 71, 75)


def application_constructors() -> dict:
    """``{name: constructor}`` for every public callable of a ``keras.applications`` submodule
    that builds a model (takes ``weights`` and ``input_shape``), sorted by name."""
    found = {}
    modules = [keras.applications] + [
        getattr(keras.applications, n) for n in dir(keras.applications)
        if inspect.ismodule(getattr(keras.applications, n))
    ]
    for mod in modules:
        for name in dir(mod):
            fn = getattr(mod, name)
            if name.startswith("_") or not callable(fn) or inspect.isclass(fn):
                continue
            try:
                params = inspect.signature(fn).parameters
            except (TypeError, ValueError):
                continue
            if "weights" in params and "input_shape" in params:
                found[name] = fn
    return dict(sorted(found.items()))


def build_smallest(ctor, **kwargs):
    """``(model, size)``: the model built at the smallest accepted ``size × size × 3`` input,
    ``weights=None``."""
    err = None
    for size in _SIZES:
        try:
            return ctor(weights=None, input_shape=(size, size, 3), **kwargs), size
        except ValueError as e:  # input too small for this architecture
            err = e
    raise err
