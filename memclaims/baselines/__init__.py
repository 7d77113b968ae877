"""Baselines: the store of measured Records (one format, one writer, under a lock), the
direction-aware comparison with them, and the measured noise of a numerics change.

May import ``core`` only: a verdict on Records needs no engine."""
