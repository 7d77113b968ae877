"""memclaims: published memory-saving claims for PyTorch training, as regression tests."""

from memclaims.core.offline import quiet_hub_kernels

__version__ = "0.1.0"

# Before anything of memclaims imports bitsandbytes (in every process that imports memclaims: a command,
# a pytest session, a spawned rank): its hub-kernel warning at import is noise here (memclaims.core.offline).
quiet_hub_kernels()
