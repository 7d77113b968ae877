"""memclaims: published memory-saving claims for PyTorch training, as regression tests."""

from memclaims.core.library_noise import quiet_library_deprecations
from memclaims.core.offline import quiet_hub_kernels

__version__ = "0.1.0"

# Before anything of memclaims imports bitsandbytes (in every process that imports memclaims: a command,
# a pytest session, a spawned rank): its hub-kernel warning at import is noise here (memclaims.core.offline).
quiet_hub_kernels()
# And torch's deprecation of what torchao's import does (memclaims.core.library_noise).
quiet_library_deprecations()


# The public API beyond the command line and the pytest plugin, imported on first use so that ``import memclaims`` stays
# cheap (no torch): ``memclaims.watch(model, optimizer)`` and the stacks' callbacks (memclaims.watching). A name, not
# an import: the core layer imports nothing above it (ARCHITECTURE.md).
_PUBLIC = ("watch", "Watch", "PhasesNotSeen", "TrainerWatch", "LightningWatch")


def __getattr__(name: str) -> object:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'memclaims' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module("memclaims.watching"), name)
