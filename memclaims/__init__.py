"""memclaims: published memory-saving claims for PyTorch training, as regression tests."""

__version__ = "0.1.0"
