"""Heavy tails of the check's errors (issue #41, "never a figure the data contradicts"): on
the zoo, a PReLU net on photo crops claimed 40.5 dB (90 % interval 35.5 to 46.2) and read
30.2 on a thousand new crops, one of which held two thirds of the noise. The check's own
inputs show such a tail: their largest errors fall off as a power law. The interval reaches
down to what a thousand new inputs read in all but one draw of twenty when that law goes on
(:mod:`cle._measure.tails`); on a light tail it stays about as the bootstrap sets it.

The worlds below are simulated: per-input noise energies drawn from a known law, the check
on 64 of them, the real figure on a thousand more.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
from keras import layers as L

import cle
from cle import quantization as Q
from cle._measure import check as C
from cle._measure import tails as T

from conftest import no_tflite_on_torch

DRAWS = 24


def _case(noise):
    """Reference and test outputs ``(N, 1)`` whose per-input noise energy is ``noise``."""
    ref = np.ones((len(noise), 1))
    return ref, ref + np.sqrt(noise)[:, None]


def _world(xi):
    """A law of per-input noise energies: exponential (``xi`` None) or a power law of index
    ``xi`` above 1e-5."""
    if xi is None:
        return lambda rng, n: rng.exponential(1e-4, n)
    return lambda rng, n: 1e-5 * (1.0 - rng.random(n)) ** -xi


def _draws(xi):
    """Per draw: the check's interval on 64 inputs (bootstrap only, then as the check sets
    it) and the real figure of a thousand new inputs of the same law."""
    law, out = _world(xi), []
    for seed in range(DRAWS):
        rng = np.random.default_rng(seed)
        ref, y = _case(law(rng, 64))
        new = law(rng, 1000)
        (checked,) = C.check_outputs([ref], [y], ["out"], ["values"])
        out.append((C.sqnr_interval(ref, y), checked, 10 * np.log10(1000 / new.sum())))
    return out


@pytest.mark.parametrize("xi", [None, 0.3])
def test_a_light_tail_leaves_the_bootstrap_interval_about_as_it_is(xi):
    """A light tail moves the lower end by a fraction of a dB in the median draw (the index
    its eight largest errors allow reaches some way up), never the upper end."""
    draws = _draws(xi)
    moved = [bootstrap[0] - checked.sqnr_interval[0] for bootstrap, checked, _ in draws]
    assert min(moved) >= 0 and np.median(moved) < 1.0 and max(moved) < 8.0
    assert all(checked.sqnr_interval[1] == bootstrap[1] for bootstrap, checked, _ in draws)


@pytest.mark.parametrize("xi", [1.5, 2.0])
def test_a_heavy_tail_reaches_down_to_what_a_thousand_new_inputs_read(xi):
    draws = _draws(xi)
    covered_before = sum(real >= bootstrap[0] for bootstrap, _, real in draws)
    covered = sum(real >= checked.sqnr_interval[0] for _, checked, real in draws)
    # the bootstrap alone covers the thousand inputs' figure about half the time or less;
    # with the tail's lower end, in at least two draws of three (a 64-input fit of the law
    # is rough: the aim is 95 %, reached on the zoo, not in a world without bound)
    assert covered_before <= DRAWS * 0.6
    assert covered >= DRAWS * 2 / 3
    for bootstrap, checked, _ in draws:  # only the lower end moves, and only down
        assert checked.sqnr_interval[1] == bootstrap[1]
        assert checked.sqnr_interval[0] <= bootstrap[0]
    # and not without bound: finite (how far below is the next test's: as far as needed)
    below = [real - checked.sqnr_interval[0] for _, checked, real in draws]
    assert np.isfinite(below).all()


@pytest.mark.parametrize("xi", [0.6, 1.2])
def test_the_lower_end_covers_what_it_says_in_a_power_law_world(xi):
    """The lower end is the figure all but 5 % of sets of a thousand new inputs read: in
    worlds where the errors follow a power law, it covers the thousand inputs' figure in
    about 95 % of draws of 64 check inputs, neither far fewer (the index fitted to eight
    errors, used as if known, covered 73-77 %) nor nearly all (an interval wider than the
    inputs say)."""
    law, covered, n = _world(xi), 0, 100
    for seed in range(n):
        rng = np.random.default_rng(1000 + seed)
        ref, y = _case(law(rng, 64))
        real = 10 * np.log10(1000 / law(rng, 1000).sum())
        (checked,) = C.check_outputs([ref], [y], ["out"], ["values"])
        covered += real >= checked.sqnr_interval[0]
    assert 0.88 <= covered / n <= 0.99


def test_the_fit_reads_the_index_of_a_power_law():
    noise = _world(1.5)(np.random.default_rng(0), 4096)
    xi, threshold, k = T.tail_index(noise)
    assert k == round(T.TAIL_SHARE * 4096)
    assert xi == pytest.approx(1.5, rel=0.1)
    assert threshold == np.sort(noise)[::-1][k]


def test_few_inputs_or_exact_ones_fit_no_tail():
    rng = np.random.default_rng(0)
    assert T.tail_index(rng.exponential(size=T.MIN_INPUTS - 1)) is None
    noise = np.zeros(64)
    noise[:3] = 1.0  # most inputs exact
    assert T.tail_index(noise) is None
    assert T.heavy_tail(np.ones(64), noise) is None
    (checked,) = C.check_outputs(*[[a] for a in _case(noise)], ["out"], ["values"])
    np.testing.assert_equal(checked.sqnr_interval, C.sqnr_interval(*_case(noise)))


def test_probabilities_bound_the_drawn_errors():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(64, 6, 6, 5))
    p = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    assert T.noise_cap(p, "probabilities") == pytest.approx(2.0 * 36)  # 2 per pixel's row
    sigmoid = 1 / (1 + np.exp(-logits))
    assert T.noise_cap(sigmoid, "probabilities") == pytest.approx(6 * 6 * 5)  # 1 per entry
    assert T.noise_cap(p, "values") is None  # values in [0, 1] need not stay there
    assert T.noise_cap(logits, "logits") is None
    noise = _world(2.0)(rng, 64) * 1e4  # a law whose drawn errors reach past the bound
    cap = 2.0
    capped = T.new_figures(np.ones(64), noise, cap)
    assert np.all(capped >= 10 * np.log10(1.0 / cap) - 1e-9)
    assert np.median(capped) > np.median(T.new_figures(np.ones(64), noise))


def test_a_softmax_outputs_check_draws_its_errors_within_their_bound():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(64, 4)) * 4
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    q = p.copy()
    worst = rng.permutation(64)[:8]  # a few decisions moved, most untouched but for round-off
    q[worst] = np.roll(p[worst], 1, axis=1)
    q += rng.normal(scale=1e-4, size=q.shape)
    (checked,) = C.check_outputs([p], [q], ["classes"], ["probabilities"])
    signal, noise = C.energies(p, q)
    capped = T.heavy_tail(signal, noise, 2.0)
    assert capped is not None and capped.floor > T.heavy_tail(signal, noise).floor
    assert checked.sqnr_interval[0] == min(capped.floor, C.sqnr_interval(p, q)[0])


def test_no_signal_or_an_overflowing_law_gives_no_lower_end():
    rng = np.random.default_rng(0)
    noise = _world(2.0)(rng, 64)
    assert T.heavy_tail(np.zeros(64), noise) is None  # no signal: nothing to reach down from
    steep = noise.copy()
    steep[:4] = 1e300  # a law so steep that its draws overflow
    tail = T.heavy_tail(np.ones(64), steep)
    assert tail is None or np.isfinite(tail.floor)
    ref, y = _case(_world(None)(rng, T.MIN_INPUTS))  # as few inputs as fit a tail
    assert T.tail_index(y[:, 0] - 1.0) is not None


def test_the_report_says_what_the_tail_does_to_the_figure():
    rng = np.random.default_rng(0)
    heavy, light = _world(2.0)(rng, 64), _world(None)(rng, 64)
    refs, tests = zip(*[_case(heavy), _case(light)])
    outputs = C.check_outputs(list(refs), list(tests), ["heavy", "light"], ["values"] * 2)
    checked = {"reference": refs, "test": tests, "outputs": outputs}
    (said,) = T.tail_caveats(checked, ["heavy", "light"])
    figures = T.new_figures(np.ones(64), heavy)
    assert said.startswith("output 'heavy': a few of the check's inputs hold most of its error")
    assert f"index {T.tail_index(heavy)[0]:.1f})" in said
    assert f"{np.quantile(figures, 0.5, method='inverted_cdf'):.1f} dB" in said
    assert f"{outputs[0].sqnr_interval[0]:.1f} dB or less one time in 20" in said
    assert outputs[0].sqnr_interval[0] < outputs[0].sqnr_db - T.SAID_DB


def _outlier_inputs(n, seed):
    """Feature vectors each scaled by a factor with a power-law tail: a few inputs far larger
    than the rest, which a build calibrated on the others clips."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 16)) * (1.0 - rng.random((n, 1))) ** -0.7
    return x.astype("float32")


@no_tflite_on_torch
def test_cle_quantize_reaches_down_for_a_heavy_tail_and_says_so():
    """End to end, with data: a regression head whose inputs have a power-law scale. The
    cross-fitted check sees the tail in its own inputs; the report's interval reaches down for
    it and a warning says so; a thousand new inputs of the same law read below the figure
    and above that lower end."""
    keras.utils.set_random_seed(0)
    inp = keras.Input((16,), name="features")
    hidden = L.Dense(32, activation="relu", name="hidden")(inp)
    model = keras.Model(inp, L.Dense(4, name="out")(hidden), name="outliers")
    content, report = cle.quantize(model, _outlier_inputs(64, 0))
    (out,) = report.outputs
    (said,) = [w for w in report.warnings if "fall off as a power law" in w]
    assert said.startswith("output 'out': a few of the check's inputs hold most of its error")
    assert f"{out.sqnr_interval[0]:.1f} dB or less one time in 20" in said
    new = _outlier_inputs(1000, 1)
    ref, y = model.predict(new, verbose=0), Q.run_tflite(content, new)
    real = 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - y) ** 2.0))
    assert out.sqnr_interval[0] < real < out.sqnr_db - T.SAID_DB
