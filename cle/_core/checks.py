"""Checks of the model a public function is given: a ``keras.Model``, with as many inputs
and outputs as the function takes."""

from __future__ import annotations

import keras


def check_model(model):
    if not isinstance(model, keras.Model):
        raise TypeError(
            "Expected a keras.Model (Functional or Sequential). "
            f"Received: model of type {type(model).__name__}"
        )


def check_single_io(model, what):
    if len(model.inputs) != 1 or len(model.outputs) != 1:
        raise ValueError(
            f"{what} supports models with one input and one output. Received: model "
            f"'{model.name}' with {len(model.inputs)} inputs and {len(model.outputs)} outputs"
        )
