"""Tier 1, core: reading a Keras model (the graph view), the one rebuild, layer layouts and
semantics, weights, model checks, what the backend can run, and atomic file writes."""
