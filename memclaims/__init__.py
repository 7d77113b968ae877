"""memclaims: published memory-saving claims for PyTorch training, as regression tests."""

from memclaims.core.library_noise import quiet_library_deprecations
from memclaims.core.offline import quiet_hub_kernels

__version__ = "0.1.0"

# Before anything of memclaims imports bitsandbytes (in every process that imports memclaims: a command,
# a pytest session, a spawned rank): its hub-kernel warning at import is noise here (memclaims.core.offline).
quiet_hub_kernels()
# And torch's deprecation of what torchao's import does (memclaims.core.library_noise).
quiet_library_deprecations()
