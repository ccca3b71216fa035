"""cle._math.order: the ends of a sample and np.quantile's figures, exactly, without a whole
partition where a threshold from a subsample settles it."""

import numpy as np
import pytest

from cle._math import order


def _samples():
    rng = np.random.default_rng(7)
    n = 1 << 18
    yield "normal", rng.standard_normal(n).astype(np.float32)
    yield "relu zeros", np.maximum(rng.standard_normal(n), 0).astype(np.float32)
    yield "cauchy float64", rng.standard_cauchy(n)
    yield "few values, many ties", np.round(rng.standard_normal(n) * 2).astype(np.float32)
    yield "sorted", np.sort(rng.standard_normal(n)).astype(np.float32)
    yield "constant", np.full(n, 3.5, np.float32)
    yield "integers", rng.integers(-1000, 1000, n)
    yield "short", rng.standard_normal(37).astype(np.float32)
    # The strided subsample holds the smallest values: its threshold is not far enough in, and
    # the whole sample is partitioned instead.
    misled = np.zeros(n, np.float32)
    misled[::n // order.SUBSAMPLE] = -100.0 - np.arange(order.SUBSAMPLE, dtype=np.float32)
    yield "misleading subsample", misled


SAMPLES = dict(_samples())


@pytest.mark.parametrize("name", SAMPLES)
@pytest.mark.parametrize("k", [1, 2, 27, 300])
def test_ends_are_the_partitions_ends(name, k):
    x = SAMPLES[name]
    k = min(k, x.size)
    low = order.smallest(x, k)
    high = order.largest(x, k)
    assert low.dtype == x.dtype and high.dtype == x.dtype
    np.testing.assert_array_equal(low, np.sort(np.partition(x, k - 1)[:k]))
    np.testing.assert_array_equal(high, np.sort(np.partition(x, x.size - k)[x.size - k:]))


@pytest.mark.parametrize("name", SAMPLES)
@pytest.mark.parametrize("qs", [[1e-4, 1 - 1e-4], [0.0, 1.0], [1e-3], [0.25, 0.5, 0.75],
                                [0.9999, 1e-4]])
def test_quantiles_are_numpys_bit_for_bit(name, qs):
    x = SAMPLES[name]
    want = np.quantile(x, qs)
    got = order.quantiles(x, qs)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_quantiles_of_a_two_dimensional_sample_read_it_flat():
    x = SAMPLES["normal"].reshape(64, -1)
    np.testing.assert_array_equal(order.quantiles(x, [1e-4, 1 - 1e-4]),
                                  np.quantile(x, [1e-4, 1 - 1e-4]))


@pytest.mark.parametrize("name", ["normal", "relu zeros", "cauchy float64", "sorted"])
def test_the_tails_of_a_large_sample_do_not_partition_it_whole(monkeypatch, name):
    """The point of the module: a sample of a million values gives its 1e-4 tails without the
    whole partition (the fallback raises here); ReLU zeros are counted as ties."""
    def whole(*_):
        raise AssertionError("partitioned the whole sample")

    monkeypatch.setattr(order, "_whole", whole)
    x = np.tile(SAMPLES[name], 4)
    order.quantiles(x, [1e-4, 1 - 1e-4])
    order.smallest(x, 120)
    order.largest(x, 120)


def test_misleading_subsample_takes_the_whole_partition(monkeypatch):
    calls = []
    whole = order._whole
    monkeypatch.setattr(order, "_whole", lambda *a: calls.append(1) or whole(*a))
    order.smallest(SAMPLES["misleading subsample"], 200)
    assert calls


def test_asking_for_more_values_than_there_are_is_an_error():
    with pytest.raises(ValueError, match="cannot take 5 values from the ends of 3"):
        order.smallest(np.arange(3.0), 5)
