"""Tier 4, the real networks: checkpoint reading, the architectures they load into, photos."""
