"""Tier 2, the target room: everything that knows the ``.tflite`` format and the runtimes that
run it, and nothing else does. TF Lite's converter in two steps and its private calls
(:mod:`~cle._tflite.converter`, :mod:`~cle._tflite.internals`), the flatbuffer graph and its
alignment (:mod:`~cle._tflite.flatgraph`), the weights as stored (:mod:`~cle._tflite.weight_store`),
the switchable simulation of a file (:mod:`~cle._tflite.quant_sim`), the map of Keras layers to
its operators (:mod:`~cle._tflite.layer_map`) and the LiteRT runs (:mod:`~cle._tflite.runtime`).
It reaches ``_math`` and ``_core`` only (tests/test_layout.py)."""
