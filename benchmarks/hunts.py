"""What the hunts' modules after hunt9 (``hunt10_models`` ...) share: their folder of the zoo's
cache of trained models, and the ``build(name)`` that takes "base@k" for the k-th other draw of
calibration inputs (:func:`hunt9_models.cal_seed`, :func:`hunt8_models.cal_seed`; their
held-out inputs stay the same).
"""
from __future__ import annotations

import os
import sys

import zoo_models as ZM
import hunt8_models as H8
import hunt9_models as H9


def caches(folder):
    """``(cached, cached_weights)`` in the zoo cache's ``folder``: ``cached(name, train)``, the
    zoo's ``.keras`` cache (:func:`zoo_models._cached`), and ``cached_weights(name, make,
    train)``, hunt9's cache of weights only, for models rebuilt in code
    (:func:`hunt9_models._cached_weights`). A model's key is its name alone."""
    def cached(name, train):
        return ZM._cached(os.path.join(folder, name), train)

    def cached_weights(name, make, train):
        return H9._cached_weights(name, make, train, folder=folder)

    return cached, cached_weights


def builder(models, module):
    """The ``build(name) -> (model, ZooData)`` of the hunt module named ``module`` with its
    ``models`` (``{name: builder}``): "base@k" sets ``DRAW`` to k there (``bench_zoo.py`` takes
    NAME@K for a module that has one) and in hunt9's and hunt8's modules, whose draws of
    calibration inputs the data helpers read."""
    def build(name):
        base, _, draw = name.partition("@")
        sys.modules[module].DRAW = H9.DRAW = H8.DRAW = int(draw or 0)
        return models[base]()

    return build
