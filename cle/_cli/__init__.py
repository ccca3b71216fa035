"""Tier 6, the command line and the demo (above the public modules, which it uses)."""
