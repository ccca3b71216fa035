"""The public surface: every default pinned in one table, and docs/api.md checked against the
real signatures.

A change of a public default (issue #9 will change how scales are chosen) must update
``DEFAULTS`` below *and* docs/api.md; these tests fail until both say the same as the code.
"""

import ast
import dataclasses
import inspect
import os
import re

import importlib

import pytest

import cle

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The public modules, as sectioned in docs/api.md.
MODULES = ("analysis", "batch_norm_fold", "cross_layer_equalization", "bias_correction", "layers",
           "quantization", "training_fold", "pretrained")

# The fused training layers share their BN options (those of keras.layers.BatchNormalization).
_FOLDED = {
    "folding_mode": "ema_stats_folding", "ema_freeze_delay": None, "kernel_quantizer": None,
    "momentum": 0.99, "epsilon": 0.001, "center": True, "scale": True,
    "beta_initializer": "zeros", "gamma_initializer": "ones",
    "moving_mean_initializer": "zeros", "moving_variance_initializer": "ones",
    "beta_regularizer": None, "gamma_regularizer": None, "beta_constraint": None,
    "gamma_constraint": None,
}

# Every public callable with at least one defaulted parameter: {qualified name: {param: default}}.
# Callables whose parameters are all required are listed with {} so that a new default shows up.
# Result types (dataclasses, named tuples, lists: FoldedPair(s), EqualizationReport...) are records, not options,
# and are not pinned.
# To update after an intended change: edit the entry, then docs/api.md (test below).
DEFAULTS = {
    # cle.batch_norm_fold
    "batch_norm_fold.fold_all_batch_norms": {},
    "batch_norm_fold.fold_given_batch_norms": {},
    "batch_norm_fold.find_foldable_batch_norms": {},
    # cle.cross_layer_equalization
    "cross_layer_equalization.equalize_model": {
        "relu6": "bound", "high_bias_fold": "none", "margin": 3.0, "return_report": False,
        "bias_correction": "none", "calibration_data": None, "weight_bits": 8,
        "per_channel_weights": True, "objective": "quantized", "activation_bits": 8,
        "activation_ranges": "bn", "progress": None,
    },
    "cross_layer_equalization.replace_relu6_with_relu": {},
    "cross_layer_equalization.replace_relu6_with_clipped_relu": {},
    "cross_layer_equalization.CrossLayerScaling.scale_model": {
        "objective": "weights", "folded_pairs": None, "per_channel_weights": True,
        "weight_bits": 8, "activation_bits": 8},
    "cross_layer_equalization.CrossLayerScaling.scale_cls_sets": {"model": None, "check": True},
    "cross_layer_equalization.CrossLayerScaling.create_cls_set_info_list": {},
    "cross_layer_equalization.ClsSetInfo": {"cls_pair_2": None},
    "cross_layer_equalization.ClsSetInfo.ClsSetLayerPairInfo": {},
    "cross_layer_equalization.HighBiasFold.bias_fold": {
        "margin": 3.0, "absorb_into_padded": False},
    # cle.bias_correction
    "bias_correction.correct_bias": {
        "bn_stats": None, "calibration_data": None, "bits": 8, "per_channel": False,
        "progress": None, "return_report": False},
    "bias_correction.bn_stats_from_report": {},
    "bias_correction.bn_stats_from_folded_pairs": {},
    "bias_correction.expected_relu_normal": {},
    "bias_correction.expected_clipped_normal": {"lo": 0.0, "hi": float("inf")},
    # cle.layers
    "layers.ClippedReLU": {"caps": None, "axis": -1},  # caps None means 6 for every channel
    "layers.StableActivation": {"activation": "softplus"},
    # cle.quantization
    "quantization.quantize": {
        "calibration_data": None, "per_channel": True, "weight_bits": 8, "activation_bits": 8,
        "integer_io": None, "bias_correction": "auto", "ranges": "auto",
        "input_range": None, "compare": False, "seed": 0, "progress": None, "tune": False,
        "rounding": "auto", "output_kinds": None, "target": "litert"},
    "quantization.load_calibration": {"preprocessing": None, "limit": None},
    # cle.analysis
    "analysis.analyze": {
        "calibration_data": None, "per_channel": True, "integer_io": False,
        "bias_correction": "auto", "ranges": "auto", "input_range": None, "seed": 0,
        "layer_inputs": 4, "progress": None, "output_kinds": None},
    "analysis.plot": {"n": 5, "title": None, "note": None},
    "quantization.input_range_of": {},
    "quantization.quantize_kernel": {"bits": 8, "axis": None, "depthwise": False},
    "quantization.fake_quantize_weights": {"bits": 8, "per_channel": False},
    "quantization.convert_to_tflite_int8": {
        "per_channel": True, "num_calibration": None, "integer_io": False},
    "quantization.run_tflite": {"batch_size": 1},
    "quantization.top1_agreement": {},
    "quantization.sqnr_db": {},
    "quantization.weight_range_spread": {},
    "quantization.evaluate": {
        "float_outputs": None, "weight_bits": 8, "tflite": True, "per_channel": (False, True),
        "progress": None, "num_calibration": None},
    # cle.training_fold
    "training_fold.fuse_for_training": {
        "folding_mode": "ema_stats_folding", "ema_freeze_delay": None,
        "kernel_quantizer": None, "return_pairs": False},
    "training_fold.export_folded": {},
    "training_fold.FakeQuant": {"bits": 8, "per_channel": True, "axis": -1},
    **{f"training_fold.{name}": _FOLDED for name in (
        "FoldedConv1D", "FoldedConv2D", "FoldedDense", "FoldedDepthwiseConv1D",
        "FoldedDepthwiseConv2D")},
    # cle.pretrained
    "pretrained.mobilenet_v2_imagenet": {},
    "pretrained.efficientnet_lite1_imagenet": {},
    "pretrained.efficientnet_lite1_weights_path": {},
    "pretrained.preprocess_efficientnet_lite": {},
    "pretrained.load_torch_legacy_checkpoint": {},
    "pretrained.mobilenet_v2_weights_path": {},
    "pretrained.preprocess_imagenet": {},
    "pretrained.center_crop": {"size": 224, "crop_fraction": 0.875},
    "pretrained.sample_images": {"n": 32, "size": 224, "seed": 0},
    "pretrained.sample_photos": {},
}


def _resolve(qualname):
    obj = importlib.import_module("cle." + qualname.split(".")[0])
    for part in qualname.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def _params(obj):
    """Named parameters of a function, or of a class's constructor, without self/*args/**kw."""
    sig = inspect.signature(obj)
    return [p for p in sig.parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"]


def _defaults(obj):
    return {p.name: p.default for p in _params(obj) if p.default is not p.empty}


def test_every_pinned_callable_exists_and_its_defaults_match():
    actual = {name: _defaults(_resolve(name)) for name in DEFAULTS}
    for name, expected in DEFAULTS.items():
        assert actual[name] == expected, (name, actual[name])


@pytest.mark.parametrize("module", MODULES)
def test_every_public_function_is_pinned(module):
    """A new public function or class of a public module must get a row in DEFAULTS."""
    mod = importlib.import_module("cle." + module)
    pinned = {n.split(".", 1)[1].split(".")[0] for n in DEFAULTS if n.startswith(module + ".")}
    public = {
        name for name in mod.__all__
        if inspect.isfunction(getattr(mod, name))
        or (inspect.isclass(getattr(mod, name))
            and not issubclass(getattr(mod, name), BaseException)  # an error: nothing to pin
            and _defaults(getattr(mod, name))
            and not dataclasses.is_dataclass(getattr(mod, name))
            and not issubclass(getattr(mod, name), (tuple, list)))
    }
    assert public <= pinned, sorted(public - pinned)
    # Classes with in-place static methods (AIMET's API) pin the methods.
    for name in pinned:
        obj = getattr(mod, name)
        if inspect.isclass(obj):
            for meth, fn in vars(obj).items():
                if isinstance(fn, staticmethod) and not meth.startswith("_"):
                    assert f"{module}.{name}.{meth}" in DEFAULTS, (name, meth)


# ------------------------------------------------------------------------- docs/api.md

_SIG = re.compile(r"`([A-Za-z_][\w.]*)\(([^`]*?)\)(?: -> [^`]*)?`")


_NOT_API = {"str", "to_dict", "min", "get_folded_weights"}  # methods and formulas in the prose


def _split_top(args):
    """Split at commas outside brackets: "a, b=(1, 2)" -> ["a", " b=(1, 2)"]."""
    parts, depth, cur = [], 0, ""
    for ch in args:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return parts + [cur]


def _doc_signatures():
    """(module, name, [(param, default text or None)]) for every backticked signature in
    docs/api.md, under the module of its section."""
    with open(os.path.join(REPO, "docs", "api.md"), encoding="utf-8") as f:
        text = f.read()
    found, module = [], None
    for line in text.splitlines():
        head = re.match(r"## `cle\.(\w+)`", line)
        if line.startswith("## "):
            module = head.group(1) if head else None
            continue
        if module is None:
            continue
        for name, args in _SIG.findall(line):
            if name in _NOT_API:
                continue
            params = []
            for item in filter(None, (a.strip() for a in _split_top(args))):
                pname, _, default = item.partition("=")
                params.append((pname.strip(), default.strip() or None))
            found.append((module, name, params))
    return found


def test_api_doc_lists_the_real_signatures():
    docs = _doc_signatures()
    assert len(docs) >= 30, docs  # the parser found the tables
    documented = set()
    for module, name, params in docs:
        qualname = f"{module}.{name}"
        obj = _resolve(qualname)
        real = _params(obj)
        assert [p for p, _ in params] == [p.name for p in real], (qualname, params)
        for (pname, default), p in zip(params, real):
            if p.default is p.empty:
                assert default is None, (qualname, pname, default)
            else:
                assert default is not None, (qualname, pname, "default not shown")
                shown = float("inf") if default == "inf" else ast.literal_eval(default)
                assert shown == p.default and type(shown) is type(p.default), (
                    qualname, pname, default, p.default)
        documented.add(qualname)
    # Every pinned callable with a default has its signature in the docs.
    # (The fused training layers take the BatchNormalization options, listed in
    # docs/training_fold.md rather than as a signature.)
    missing = [n for n, d in DEFAULTS.items()
               if d and n not in documented and d is not _FOLDED]
    assert not missing, missing


def test_cle_int8_is_the_former_name_of_quantizations_route():
    import cle.int8
    import cle.quantization

    for name in cle.int8.__all__:
        assert getattr(cle.int8, name) is getattr(cle.quantization, name)
    assert cle.quantize is cle.quantization.quantize
