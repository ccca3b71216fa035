"""The input range found from the model itself (cle._measure.input_range), on the zoo of user
models (tests/_zoo.py: BN statistics measured on real crops of each model's convention, as
training leaves them, saved and loaded back): its preprocessing layers, or its first batch
norm's statistics snapped to a convention that covers them; "cannot tell" otherwise."""

from __future__ import annotations

import numpy as np
import pytest

import _zoo
from cle._measure import input_range as IR

from conftest import no_tflite_on_torch

pytestmark = no_tflite_on_torch  # the zoo's models run on TensorFlow and JAX

SIZE = 64  # small crops: the builds take seconds (the zoo fixture's default size)


@pytest.mark.parametrize("name, source", [
    ("rescale255_cnn", "its preprocessing layers (Rescaling 'rescale') expect 0..255"),
    ("normalization_cnn", "its preprocessing layers (Normalization 'imagenet_normalization') "
                          "expect 0..255"),
    ("unit_cnn", "the [0, 1] convention"),
    ("tf_cnn", "the tf ([-1, 1]) convention"),
    ("torch_cnn", "the torch (ImageNet mean/std) convention"),
    ("caffe_vgg_bn", "the caffe (BGR minus the ImageNet mean) convention"),
    ("raw_cnn", "the raw (0..255) convention"),
    ("sequential_tf", "the tf ([-1, 1]) convention"),  # a loaded Sequential: several nodes
])
def test_each_convention_is_found(zoo, name, source):
    (found,) = IR.infer_input_ranges(zoo(name))
    lo, hi = _zoo.true_input_ranges(name)[0]
    assert (found.lo, found.hi) == pytest.approx((lo, hi), abs=1e-4 * (hi - lo))
    assert found.sure and found.source.endswith(source), found.source


def test_each_input_of_a_two_input_model(zoo):
    found = IR.infer_input_ranges(zoo("two_input"))
    assert [r.name for r in found] == ["view", "thumb"]
    assert [(r.lo, r.hi) for r in found] == [(0.0, 255.0), (-1.0, 1.0)]
    assert "Rescaling 'rescale'" in found[0].source and "'b_stem_bn'" in found[1].source


def _rescaled(scale, offset, low, high, channels=1, bn=True):
    """Rescaling -> Conv2D -> BatchNormalization whose statistics are those of the conv's
    output on natural-image-like inputs spread over [low, high]."""
    import keras

    keras.utils.set_random_seed(1)
    inp = keras.Input((8, 8, channels))
    h = keras.layers.Conv2D(4, 3)(keras.layers.Rescaling(scale, offset, name="rescale")(inp))
    if not bn:
        return keras.Model(inp, h)
    norm = keras.layers.BatchNormalization()
    model = keras.Model(inp, norm(h))
    p = IR.natural_images(64, 8, 8, channels, seed=2).astype("float32") / 255.0
    y = keras.Model(inp, h).predict(low + (high - low) * p, verbose=0)
    norm.moving_mean.assign(y.mean(axis=(0, 1, 2)))
    norm.moving_variance.assign(y.var(axis=(0, 1, 2)))
    return model


@pytest.mark.parametrize("scale, offset, low, high", [(1 / 16, 0.0, 0.0, 16.0),
                                                      (2 / 16, -1.0, 0.0, 16.0),
                                                      (1 / 4095, 0.0, 0.0, 4095.0),
                                                      (1 / 80, 0.0, -80.0, 0.0)])
def test_a_rescaling_of_raw_values_gives_the_range_it_maps_onto_a_usual_one(scale, offset, low,
                                                                            high):
    """hunt6: digits (counts 0..16) through ``Rescaling(1/16)``. The candidates' scores took
    0..255 for the input (the range nearest unit scale after the layer), every activation
    range came out over ten times too wide, and the file without data read 10.7 dB where TF
    Lite's converter with data read 31.8. A chain that scales every channel alike and maps 0
    to the lower end of [0, 1] or [−1, 1] gives the input the values it maps onto that range
    (12-bit counts too); where 0 goes to 0, [−top, top] maps onto [−1, 1] as well (a
    spectrogram in decibels, −80..0, through ``Rescaling(1/80)``: helper-29's review), and
    the first batch norm's fitted centre decides; without a batch norm it is a guess."""
    (found,) = IR.infer_input_ranges(_rescaled(scale, offset, low, high))
    top = (1.0 - offset) / scale
    expected = (-top, top) if low < 0 else (0.0, top)
    assert (found.lo, found.hi) == pytest.approx(expected) and found.sure, found.source
    assert found.source.startswith(f"its preprocessing layers (Rescaling 'rescale') map "
                                   f"[{expected[0]:.4g}, {top:.4g}] onto "
                                   f"{'[-1, 1]' if offset or low < 0 else '[0, 1]'}")
    assert found.convention is None
    (guess,) = IR.infer_input_ranges(_rescaled(scale, offset, low, high, bn=False))
    assert guess.sure == bool(offset), guess.source  # [0, 1] or [-1, 1]: a guess without one


def test_a_rescaling_onto_a_usual_range_keeps_the_candidates_answer():
    import keras

    inp = keras.Input((8, 8, 3))
    h = keras.layers.Rescaling(1 / 127.5, -1.0, name="rescale")(inp)
    (usual,) = IR.infer_input_ranges(keras.Model(inp, keras.layers.BatchNormalization()(
        keras.layers.Conv2D(4, 3)(h))))
    assert (usual.lo, usual.hi) == (0.0, 255.0) and usual.source.endswith("expect 0..255")


@pytest.mark.parametrize("crop", ["CenterCrop", "Resizing", "Cropping2D"])
def test_a_crop_or_resize_before_the_rescaling_is_passed_through(crop):
    """hunt11: grayscale crops through ``CenterCrop`` before ``Rescaling(1/255)``. The chain
    asked every step to keep its shape, so it ended at the crop, and ``cle.quantize`` without
    data refused the model for an unknown input range (with 0..255 stated, the file read 3 dB
    above the plain converter's with data). A layer that crops or resizes the spatial axes
    keeps each channel's constant: the chain goes through it."""
    import keras

    make = {"CenterCrop": lambda: keras.layers.CenterCrop(6, 6, name="crop"),
            "Resizing": lambda: keras.layers.Resizing(6, 6, name="crop"),
            "Cropping2D": lambda: keras.layers.Cropping2D(1, name="crop")}[crop]
    inp = keras.Input((8, 8, 1))
    h = keras.layers.Rescaling(1 / 255, name="rescale")(make()(inp))
    (found,) = IR.infer_input_ranges(keras.Model(inp, keras.layers.BatchNormalization()(
        keras.layers.Conv2D(4, 3)(h))))
    assert (found.lo, found.hi) == (0.0, 255.0) and found.sure, found.source
    assert found.source == (f"its preprocessing layers ({crop} 'crop' → Rescaling 'rescale') "
                            "expect 0..255")
    inp = keras.Input((8, 8, 1))  # a padding is not passed through: its border is no constant
    h = keras.layers.Rescaling(1 / 255, name="rescale")(keras.layers.ZeroPadding2D(1)(inp))
    (padded,) = IR.infer_input_ranges(keras.Model(inp, keras.layers.Conv2D(4, 3)(h)))
    assert "Rescaling" not in padded.source


def test_an_ensemble_whose_members_rescale_the_input_alike_keeps_the_chain():
    """hunt13's ensemble: three members each read the input through their own
    ``Rescaling(1/255)``. The chain took only an input of one reader, so without data the
    model was refused for an unknown input range. Readers that are one step repeated (one
    class, one configuration, no weights) are followed as one; different ones are not."""
    import keras

    def ensemble(second):
        inp = keras.Input((8, 8, 3))
        outs = [keras.layers.Conv2D(4, 3)(step)
                for step in (keras.layers.Rescaling(1 / 255, name="r0")(inp), second(inp))]
        return keras.Model(inp, keras.layers.Average()(outs))

    (found,) = IR.infer_input_ranges(ensemble(keras.layers.Rescaling(1 / 255, name="r1")))
    assert (found.lo, found.hi) == (0.0, 255.0) and found.sure, found.source
    assert found.source in [f"its preprocessing layers (Rescaling '{name}') expect 0..255"
                            for name in ("r0", "r1")]
    (mixed,) = IR.infer_input_ranges(ensemble(keras.layers.Rescaling(1 / 127.5, -1.0)))
    assert "Rescaling" not in mixed.source and not mixed.sure


def test_a_nonlinear_path_to_the_first_batch_norm_cannot_tell(zoo):
    (found,) = IR.infer_input_ranges(zoo("late_bn_cnn"))
    assert not found.known and not found.sure
    assert found.source.startswith("no preprocessing layer, and the path to its first batch "
                                   "norm '")
    assert found.source.endswith("is not linear (it passes an activation)")


def _low_contrast(p):
    p = np.asarray(p, np.float32)
    m = p.mean(axis=(1, 2, 3), keepdims=True)
    return m + 0.5 * (p - m)


def _dark(p):
    return 0.45 * np.asarray(p, np.float32)


@pytest.mark.parametrize("transform", [_low_contrast, _dark], ids=["low contrast", "dark"])
def test_never_a_convention_narrower_than_the_statistics(zoo, transform):
    """A torch model trained on low-contrast (or dark) images: in torch units its inputs look
    like tf's [-1, 1] in width, and the nearest convention by width, tf, would clip them (it
    did, before the rule that a convention must cover the fit). The answer covers the bulk of
    the data (its 2-98 % range; the fit knows the spread, not the tails) and is no wider than
    1.6 times all of it; it is marked unsure."""
    model = zoo("torch_cnn", SIZE, transform=transform, tag=transform.__name__)
    (found,) = IR.infer_input_ranges(model)
    x = _zoo.inputs("torch_cnn", 64, seed=_zoo.BUILD_SEED, size=SIZE, transform=transform)
    lo, hi = np.quantile(x, [0.02, 0.98])
    assert found.lo <= lo and found.hi >= hi, (found, lo, hi)
    assert found.hi - found.lo < 1.6 * np.ptp(np.quantile(x, [1e-3, 1 - 1e-3])), found
    assert not found.sure and "no usual convention close" in found.source


def test_snap_takes_only_conventions_that_cover_the_fit():
    tf = IR.snap(-1.08, 0.97, "x", "bn")  # a tf model's fit: within the tolerance
    assert (tf.lo, tf.hi, tf.sure) == (-1.0, 1.0, True)
    wide = IR.snap(-1.35, 1.36, "x", "bn")  # nearest by width is tf, which does not cover it
    assert (wide.lo, wide.hi) == pytest.approx((-1.35 - 0.271, 1.36 + 0.271)) and not wide.sure
    dark = IR.snap(-2.09, 0.01, "x", "bn")  # centred far from every convention
    assert not dark.sure and dark.lo < -2.09 and dark.hi > 0.01


def test_a_nearer_convention_that_does_not_cover_the_fit_makes_it_unsure():
    """Sparse digits in [0, 1] fit about [-0.3, 1.08]: [0, 1] is the nearest convention but
    does not cover the fit, and tf's [-1, 1], the nearest that does, cost a distilled file
    more than 3 dB against the converter's. Between the two the answer is unsure (a refusal
    naming input_range), not tf's."""
    r = IR.snap(-0.3, 1.08, "x", "bn", channels=1)
    assert not r.sure and "between tf ([-1, 1]) and [0, 1]" in r.source
    assert IR.snap(-0.045, 0.773, "x", "bn", channels=1).convention == "[0, 1]"


def test_a_grayscale_fit_snaps_only_to_conventions_that_treat_channels_alike():
    """ImageNet's per-channel mean and std say nothing of one channel: a grayscale fit near
    the torch convention's range is "cannot tell" (a custom layer before the first batch norm
    of a grayscale net trained on [0, 1] put its fit there, and the distilled file read
    several dB below the converter's), while tf's [-1, 1] still snaps."""
    assert IR.snap(-1.32, 2.44, "x", "bn").convention == "torch (ImageNet mean/std)"
    gray = IR.snap(-1.32, 2.44, "x", "bn", channels=1)
    assert not gray.sure and gray.convention is None
    tf = IR.snap(-1.08, 0.97, "x", "bn", channels=1)
    assert (tf.lo, tf.hi, tf.sure, tf.convention) == (-1.0, 1.0, True, "tf ([-1, 1])")


def test_natural_inputs_follow_the_convention():
    x = IR.natural_inputs(16, (32, 32, 3), IR.InputRange("x", -123.68, 151.061, "",
                                                        convention="caffe (BGR minus the "
                                                                   "ImageNet mean)"))
    assert x.shape == (16, 32, 32, 3) and x.dtype == np.float32
    # BGR minus the mean: each channel's own range, within the union.
    assert x[..., 0].min() >= -103.94 - 1e-3 and x[..., 2].min() >= -123.68 - 1e-3
    assert x[..., 0].max() <= 255 - 103.939 + 1e-3
    y = IR.natural_inputs(8, (5,), (-3.0, 2.0))  # not an image: uniform in the range
    assert y.shape == (8, 5) and y.min() >= -3 and y.max() <= 2
    z = IR.natural_inputs(4, (3, 16, 16), (0.0, 1.0))  # channels first
    assert z.shape == (4, 3, 16, 16) and 0 <= z.min() and z.max() <= 1


def _log_contrast_spread(x):
    logs = np.log(x.std(axis=(1, 2, 3)))
    q1, q3 = np.percentile(logs, [25, 75])
    return (q3 - q1) / 1.349, np.percentile(logs - np.median(logs), 5)


def test_natural_inputs_differ_in_contrast_as_photos_do():
    # Fields of one contrast never reach a flat image's values, which a model normalizing an
    # image or a patch meets on real photos (a LayerNormalization over positions calibrated on
    # them clipped its reciprocal standard deviation to a third of the real range: hunt5's
    # layernorm_multi_axis). Photos spread by about 0.25 (whole) to 0.6 (small crops), the
    # flattest twentieth of whole photos at about 0.55 times the median contrast or less
    # (benchmarks/bench_contrast.py); the fields' flattest twentieth: 0.67 or less.
    for size in (16, 224):
        x = IR.natural_inputs(128, (size, size, 3), (0.0, 1.0), seed=3)
        s, low = _log_contrast_spread(x)
        assert 0.22 <= s <= 0.6 and low <= -0.4, (size, s, low)
        one = IR.natural_images(128, size, size, seed=3)  # one contrast (the input-range fit's)
        s0, low0 = _log_contrast_spread(np.clip(one, 0, 255))
        assert s0 < 0.15 and low0 > -0.25, (size, s0, low0)
    # The spread keeps the share of the variance between images (the contrast factors
    # renormalized): without it, the final standardization to the pooled std shrank the share.
    for s in (0.0, IR.CONTRAST_SPREAD):
        x = IR.natural_images(2048, 16, 16, seed=4, contrast_spread=s)
        share = x.mean(axis=(1, 2)).var(axis=0) / x.reshape(-1, 3).var(axis=0)
        np.testing.assert_allclose(share, IR.BETWEEN_IMAGE_SHARE, atol=0.04)


# ------------------------------------------------ batch norms trained briefly (bn_moments)

#: Steps at Keras' default momentum that leave a fifth of the start in the statistics.
BRIEF_STEPS, MOMENTUM = 160, 0.99


def _briefly_trained(steps=BRIEF_STEPS, optimizer=True, trainable=True, momentum=MOMENTUM):
    """A conv → BN net whose BN statistics are what ``steps`` training steps from Keras' start
    leave: ``w + (1 - w)`` times the statistics of the BN's input on natural-image-like
    inputs in [0, 1] (``w = MOMENTUM ** steps``), and an optimizer that counts those steps."""
    import keras

    keras.utils.set_random_seed(3)
    inp = keras.Input((32, 32, 3))
    h = keras.layers.Conv2D(16, 3, name="conv")(inp)
    bn = keras.layers.BatchNormalization(momentum=momentum, name="bn")
    out = keras.layers.Dense(3)(keras.layers.GlobalAveragePooling2D()(
        keras.layers.ReLU()(bn(h))))
    model = keras.Model(inp, out)
    x = IR.natural_images(64, 32, 32, seed=1).astype("float32") / 255.0
    y = keras.Model(inp, h).predict(x, verbose=0)
    w = momentum ** steps
    bn.moving_mean.assign((1 - w) * y.mean(axis=(0, 1, 2)))
    bn.moving_variance.assign(w + (1 - w) * y.var(axis=(0, 1, 2)))
    bn.trainable = trainable
    if optimizer:
        model.compile(optimizer=keras.optimizers.Adam(), loss="mse")
        model.optimizer.build(model.trainable_variables)
        model.optimizer.iterations.assign(steps)
    return model, bn


def test_a_briefly_trained_first_batch_norm_gives_the_input_range_with_its_start_out():
    """Keras starts a BN's moving variance at 1; 160 steps at momentum 0.99 leave 20% of it
    in every channel. The fit read those statistics as they are and put a [0, 1] input at the
    torch convention, marked sure (a pre-activation ResNet trained briefly: its file without
    data read 23.7 dB against a claim of 47.1 and the plain converter's 29.9). With the
    optimizer's step count the start is taken out, and the fit finds [0, 1]."""
    from cle._measure import bn_moments

    model, bn = _briefly_trained()
    assert bn_moments.training_steps(model) == BRIEF_STEPS
    assert bn_moments.start_weight(bn, BRIEF_STEPS) == pytest.approx(MOMENTUM ** BRIEF_STEPS)
    (found,) = IR.infer_input_ranges(model)
    assert (found.lo, found.hi, found.sure) == (0.0, 1.0, True), found
    assert "less the 20% their start still holds after 160 training steps" in found.source
    # the premise: the same statistics read as they are put the input elsewhere
    bare, _ = _briefly_trained(optimizer=False)
    assert bn_moments.training_steps(bare) is None
    (raw,) = IR.infer_input_ranges(bare)
    assert (raw.lo, raw.hi) != (0.0, 1.0) and "less the" not in raw.source


def test_the_start_is_taken_out_only_where_the_statistics_can_hold_it():
    from cle._measure import bn_moments

    _, bn = _briefly_trained()
    assert bn_moments.start_weight(bn, None) == 0.0  # no optimizer: read as they are
    assert bn_moments.start_weight(bn, 2000) == 0.0  # 0.99**2000: converged
    mu, var, w = bn_moments.moments(bn, BRIEF_STEPS)
    raw_var = np.asarray(bn.moving_variance)
    assert w > 0.19 and np.allclose(var, (raw_var - w) / (1 - w))
    assert np.allclose(mu, np.asarray(bn.moving_mean) / (1 - w))
    # a channel below w cannot have started at 1 for these steps (a pretrained layer's)
    bn.moving_variance.assign(np.where(np.arange(16) == 0, 0.5 * w, raw_var))
    assert bn_moments.start_weight(bn, BRIEF_STEPS) == 0.0
    # every channel well above w: statistics set from data, not a brief training's
    bn.moving_variance.assign(raw_var + 2 * bn_moments.FLOOR_SLACK * w)
    assert bn_moments.start_weight(bn, BRIEF_STEPS) == 0.0
    _, frozen = _briefly_trained(trainable=False)  # not updated while frozen
    assert bn_moments.start_weight(frozen, BRIEF_STEPS) == 0.0


def test_without_data_batch_norms_that_still_hold_their_start_are_refused():
    """A NASNet-Mobile trained 17 steps (hunt5; its batch norms' momentum is 0.9997) kept 99.5%
    of Keras' starting statistics: the distillation matched statistics that describe no data,
    and its file without data read 19.9 dB where TF Lite's plain converter with data read 24.6.
    Such a model is refused before any work, naming data; one trained as briefly at Keras'
    default momentum (a sixth of the start left) is not, nor one whose step count is unknown."""
    import cle
    from cle._measure import synthetic

    model, _ = _briefly_trained(steps=17, momentum=0.9997)
    with pytest.raises(synthetic.NeedsData, match=r"trained for 17 steps, and at a momentum of "
                       r"0.9997 its batch norms' moving statistics still hold 99.5% of Keras' "
                       r"starting values .* distilled from them; pass calibration_data"):
        cle.quantize(model)
    for fine in (_briefly_trained(steps=17)[0],  # 0.99 ** 17: 84% of the start
                 _briefly_trained(steps=17, momentum=0.9997, optimizer=False)[0]):
        synthetic.check_distillable(fine)
