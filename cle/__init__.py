"""keras-cle: prepare Keras 3 convolutional networks for INT8 post-training quantization
without data (Nagel et al. 2019, "Data-Free Quantization through Weight Equalization and
Bias Correction").

Stage one, batch-norm folding::

    import cle
    folded_pairs, folded_model = cle.fold_all_batch_norms(model)
    for skip in folded_pairs.skipped:
        print(skip.bn.name, skip.reason)

``import cle`` is cheap: it imports neither Keras nor TensorFlow. The public names below are
loaded on first access (PEP 562 ``__getattr__``), so ``cle --help`` answers at once. What
``import cle`` does guarantee is that the layers our transforms insert (``ClippedReLU``, the
folded training layers) are registered with Keras as soon as Keras is imported, before or
after ``cle``: a model written by :func:`equalize_model` loads with plain
``keras.models.load_model`` in any process that has run ``import cle``, and
:func:`load_model` loads it without that knowledge.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys

# The package version: the one source (pyproject.toml reads it from here).
__version__ = "0.1.0.dev0"

# Public name -> module that defines it (loaded on first access).
_EXPORTS = {
    "AnalysisReport": "cle.analysis",
    "analyze": "cle.analysis",
    "BatchNormFoldReport": "cle.batch_norm_fold",
    "QuantizeReport": "cle.quantization",
    "quantize": "cle.quantization",
    "load_calibration": "cle.quantization",
    "FoldedPair": "cle.batch_norm_fold",
    "FoldedPairs": "cle.batch_norm_fold",
    "SkippedBatchNorm": "cle.batch_norm_fold",
    "find_foldable_batch_norms": "cle.batch_norm_fold",
    "fold_all_batch_norms": "cle.batch_norm_fold",
    "fold_given_batch_norms": "cle.batch_norm_fold",
    "BiasCorrectionRecord": "cle.bias_correction",
    "bn_stats_from_folded_pairs": "cle.bias_correction",
    "bn_stats_from_report": "cle.bias_correction",
    "correct_bias": "cle.bias_correction",
    "BiasAbsorption": "cle.cross_layer_equalization",
    "ClsSetInfo": "cle.cross_layer_equalization",
    "CrossLayerScaling": "cle.cross_layer_equalization",
    "EqualizationReport": "cle.cross_layer_equalization",
    "HighBiasFold": "cle.cross_layer_equalization",
    "NotExactError": "cle.cross_layer_equalization",
    "equalize_model": "cle.cross_layer_equalization",
    "replace_relu6_with_clipped_relu": "cle.cross_layer_equalization",
    "replace_relu6_with_relu": "cle.cross_layer_equalization",
    "ClippedReLU": "cle.layers",
    "StableActivation": "cle.layers",
    "ChannelAffine": "cle.layers",
    "FakeQuant": "cle.training_fold",
    "FoldedConv1D": "cle.training_fold",
    "FoldedConv2D": "cle.training_fold",
    "FoldedDense": "cle.training_fold",
    "FoldedDepthwiseConv1D": "cle.training_fold",
    "FoldedDepthwiseConv2D": "cle.training_fold",
    "export_folded": "cle.training_fold",
    "fuse_for_training": "cle.training_fold",
}

#: Modules whose import registers Keras serializables (``package="cle"``).
_SERIALIZABLE_MODULES = ("cle.layers", "cle.training_fold")

__all__ = sorted(_EXPORTS) + ["custom_objects", "load_model"]


#: Public submodules, also loaded on first access (``cle.quantization.evaluate``).
_SUBMODULES = ("analysis", "batch_norm_fold", "bias_correction", "cli", "cross_layer_equalization", "demo",
               "layers", "pretrained", "quantization", "training_fold")


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"cle.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cle' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later accesses skip __getattr__
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | set(_SUBMODULES))


def custom_objects() -> dict:
    """Every Keras class cle can put into a model, by class name (imports Keras).

    For ``keras.models.load_model(path, custom_objects=cle.custom_objects())`` or
    ``keras.saving.custom_object_scope``; :func:`load_model` does this for you.
    """
    return _objects()


def _objects() -> dict:
    import keras

    _register()
    return {key.split(">", 1)[1]: obj for key, obj in keras.saving.get_custom_objects().items()
            if key.startswith("cle>")}


def load_model(path, custom_objects=None, compile=False, safe_mode=True):
    """``keras.models.load_model`` that knows cle's layers (e.g. ``ClippedReLU``).

    It reads every file the ``cle`` commands read, legacy HDF5 included: it does not compile
    the model unless asked (a legacy file's training config, e.g. an optimizer saved with
    Keras 2 arguments such as ``lr``, is then never read); cle's transforms need no compiled
    model.

    Args:
        path: a ``.keras`` (or legacy ``.h5`` / ``.hdf5``) file, e.g. written by
            ``cle equalize``.
        custom_objects: your own custom classes/functions, if the model has any; they take
            precedence over cle's.
        compile: also restore the training configuration (optimizer, loss, metrics), as
            ``keras.models.load_model(compile=True)`` does. Default False.
        safe_mode: passed to ``keras.models.load_model``; False lets Keras run Python code
            stored in the file (``Lambda`` layers): only for files you trust.

    Returns:
        the ``keras.Model``.
    """
    import keras

    objects = _objects()
    objects.update(custom_objects or {})
    return keras.models.load_model(path, custom_objects=objects, compile=compile,
                                   safe_mode=safe_mode)


def _register():
    for module in _SERIALIZABLE_MODULES:
        importlib.import_module(module)


class _RegisterAfterKeras(importlib.abc.MetaPathFinder):
    """Registers cle's layers right after ``keras`` itself is imported, so that importing
    ``cle`` does not import Keras (and TensorFlow) but a later ``keras.models.load_model``
    still finds ``ClippedReLU``."""

    def find_spec(self, name, path=None, target=None):
        if name != "keras":
            return None
        try:
            return self._wrapped_spec(name, path, target)
        except Exception:  # noqa: BLE001 - never in the way of `import keras`
            _remove_hook()
            return None  # the next finder imports Keras as if the hook had never been there

    def _wrapped_spec(self, name, path, target):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _RegisteringLoader(spec.loader)
        return spec


class _RegisteringLoader(importlib.abc.Loader):
    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # Keras sees its own loader, as if we were not here.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _remove_hook()
        try:
            _register()
        except Exception as exc:  # noqa: BLE001 - Keras itself is imported: never fail that
            import warnings

            warnings.warn(f"keras-cle could not register its layers with Keras "
                          f"({type(exc).__name__}: {exc}); Keras is imported, but loading a "
                          "model that holds cle layers will fail until that is fixed",
                          RuntimeWarning, stacklevel=2)


def _remove_hook():
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _RegisterAfterKeras)]


if "keras" in sys.modules:
    _register()
elif not any(isinstance(f, _RegisterAfterKeras) for f in sys.meta_path):
    sys.meta_path.insert(0, _RegisterAfterKeras())
