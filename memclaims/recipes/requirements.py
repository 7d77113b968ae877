"""What a case needs from the machine, and the one readable reason when the machine lacks it.

Every test that cannot run everywhere declares its needs (``@pytest.mark.requires(...)``, or a
recipe's needs derived by :func:`memclaims.run.needs`); the pytest plugin evaluates them once, at
collection, and turns what is unmet into one skip whose reason joins every unmet need and says
what to install or pass. Nothing else decides whether a case skips: no test body and no fixture
calls ``pytest.skip``. ``memclaims list`` and the named recipes ask the same functions.

bitsandbytes has one check, :func:`memclaims.core.machine.bitsandbytes_problem`: a real tiny 8-bit optimizer step on the
device, cached per process. Importing is not enough: a build without a backend for the device
imports fine and fails at the first step, and such a case must skip, not fail.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memclaims.core.errors import UsageError
from memclaims.core.machine import DEVICES, Machine
from memclaims.core.names import tier_device
from memclaims.techniques import technique_registry as registry

if TYPE_CHECKING:
    pass

# What to install, per importable package a case may need (name as imported -> what pip installs).
INSTALL = {"bitsandbytes": "pip install 'bitsandbytes>=0.45'",  # pyproject.toml's bound
           "torchvision": "pip install the torchvision built for the installed torch",
           "transformers": "pip install transformers",
           "deepspeed": "pip install 'memclaims[deepspeed]'", "torchao": "pip install 'torchao>=0.11'", "xdist": "pip install pytest-xdist",
           "mkdocs": "pip install -e '.[docs]'", "material": "pip install -e '.[docs]'"}
# Registry capabilities that are an operation of the installed torch (the technique's ``requires``), each
# checked by running it (memclaims.core.machine.torch_feature_problem).
TORCH_FEATURES = frozenset({"linear_cross_entropy"})
# Registry capabilities that are an importable package and nothing more (the technique's ``requires``).
PACKAGE_CAPABILITIES = frozenset({"deepspeed", "torchao"})
# Why an opt-in option exists: a case that costs too much to run unasked says so in its reason.
OPT_IN_WHY = {"vit-h14": "633M parameters at 518 px; the published bars used 4 GPUs",
              "download": "needs internet; never in CI"}
# The cpu tier's 16-mixed case: there is nothing of its own to measure, whatever the machine has.
FP16_MIXED_ON_CPU = ("Lightning runs 16-mixed as bf16-mixed on the CPU (no float16 AMP there); "
                     "the bf16-mixed case measures what would run")


@dataclass(frozen=True)
class Needs:
    """What one case needs. Combine with ``|``; :func:`needs` builds one from keyword arguments."""

    cuda_devices: int = 0  # at least this many CUDA devices
    bitsandbytes: frozenset[str] = frozenset()  # devices on which an 8-bit optimizer step must work
    packages: frozenset[str] = frozenset()  # importable packages (deepspeed, xdist)
    options: frozenset[str] = frozenset()  # opt-in memclaims options, without --memclaims-
    paths: frozenset[str] = frozenset()  # files the operating system must provide
    torch_features: frozenset[str] = frozenset()  # operations of the installed torch (TORCH_FEATURES)
    # What no install changes: the case cannot run in this configuration (the catalogue's
    # "not on this tier", a recipe the sim cannot replay). Kept in order; the reason starts with them.
    unsupported: tuple[str, ...] = field(default=())

    def __or__(self, other: Needs) -> Needs:
        return Needs(cuda_devices=max(self.cuda_devices, other.cuda_devices),
                     bitsandbytes=self.bitsandbytes | other.bitsandbytes, packages=self.packages | other.packages,
                     options=self.options | other.options, paths=self.paths | other.paths,
                     torch_features=self.torch_features | other.torch_features,
                     unsupported=tuple(dict.fromkeys(self.unsupported + other.unsupported)))


NOTHING = Needs()


def _names(value: str | Iterable[str]) -> frozenset[str]:
    # A lone string is one name, not its characters: requires(packages="xdist").
    return frozenset([value] if isinstance(value, str) else value)


def needs(cuda_devices: int = 0, bitsandbytes: str | Iterable[str] = (), packages: str | Iterable[str] = (),
          options: str | Iterable[str] = (), paths: str | Iterable[str] = (),
          unsupported: str | Iterable[str] = (), torch_features: str | Iterable[str] = ()) -> Needs:
    """A :class:`Needs` from the ``requires`` marker's keywords; strings stand for one item."""
    devices = _names(bitsandbytes)
    if not devices <= set(DEVICES):
        raise UsageError(f"requires(bitsandbytes=...) takes devices {', '.join(DEVICES)}; got {sorted(devices)}")
    features = _names(torch_features)
    if not features <= TORCH_FEATURES:
        raise UsageError(f"requires(torch_features=...) takes {', '.join(sorted(TORCH_FEATURES))}; got {sorted(features)}")
    if cuda_devices < 0:
        raise UsageError(f"requires(cuda_devices=...) must be 0 or more, got {cuda_devices}")
    reasons = (unsupported,) if isinstance(unsupported, str) else tuple(unsupported)
    return Needs(cuda_devices=cuda_devices, bitsandbytes=devices, packages=_names(packages),
                 options=_names(options), paths=_names(paths), unsupported=reasons, torch_features=features)


# --- what a recipe needs ------------------------------------------------------------------------

def for_techniques(techniques: Iterable[str], tier: str) -> Needs:
    """What running ``techniques`` on ``tier`` (cpu, sim or gpu) needs, from the registry's
    ``requires``: a technique that requires CUDA moves the run to the GPU; an 8-bit optimizer needs
    bitsandbytes working on the device the run uses; what a technique says no run on that device can have
    (its ``unsupported_on``: DeepSpeed on the CPU) is unsupported. The sim needs no device (see
    :func:`memclaims.run.needs`)."""
    names = tuple(techniques)
    unregistered = tuple(f"technique {t!r} is not registered yet" for t in names if t not in registry.BY_NAME)
    capabilities: set[str] = set()
    for name in names:
        if name in registry.BY_NAME:
            capabilities |= registry.BY_NAME[name].requires
    # The sim replays torch's own operations on fake tensors: it needs them as much as a device does.
    result = Needs(unsupported=unregistered, torch_features=frozenset(capabilities & TORCH_FEATURES))
    if tier == "sim":
        return result
    unknown = capabilities - {"cuda", "bitsandbytes", *PACKAGE_CAPABILITIES, *TORCH_FEATURES}
    if unknown:  # a new capability in the registry must be mapped here, not silently ignored
        raise UsageError(f"memclaims.recipes.requirements does not know the capabilities {sorted(unknown)}")
    device = "cuda" if "cuda" in capabilities else tier_device(tier)
    refused = (registry.BY_NAME[n].hooks.unsupported_on(device) for n in names if n in registry.BY_NAME)
    result |= Needs(unsupported=tuple(dict.fromkeys(reason for reason in refused if reason)))
    return result | Needs(cuda_devices=1 if device == "cuda" else 0,
                          bitsandbytes=frozenset({device}) if "bitsandbytes" in capabilities else frozenset(),
                          packages=frozenset(capabilities & PACKAGE_CAPABILITIES))


def _cuda_reason(wanted: int, seen: int) -> str:
    if seen == 0:
        what = "a CUDA GPU" if wanted == 1 else f"{wanted} CUDA devices"
        return f"needs {what}: torch.cuda.is_available() is False on this machine (a CUDA build of torch on an NVIDIA GPU)"
    return f"needs {wanted} CUDA devices; torch sees {seen} (run on a machine with {wanted} GPUs)"


def unmet(required: Needs, machine: Machine | None = None) -> list[str]:
    """Every need ``machine`` (this process by default) does not meet, each saying what to install
    or pass; empty when the case can run."""
    here = machine or Machine()
    reasons = list(required.unsupported)
    cuda_seen = here.cuda_devices() if required.cuda_devices or "cuda" in required.bitsandbytes else 0
    if cuda_seen < required.cuda_devices:
        reasons.append(_cuda_reason(required.cuda_devices, cuda_seen))
    for device in sorted(required.bitsandbytes):
        if device == "cuda" and cuda_seen < 1:
            if not required.cuda_devices:
                reasons.append(_cuda_reason(1, 0))
            continue  # the CUDA reason says it all; stepping on no device says nothing more
        problem = here.bitsandbytes(device)
        if problem:
            reasons.append(f"needs bitsandbytes' 8-bit optimizers on the {device.upper()}: {problem} "
                           f"(install a build with a {device.upper()} backend: {INSTALL['bitsandbytes']})")

    def package(name: str) -> str | None:
        problem = here.package(name)
        return problem and f"needs {name}: {problem} ({INSTALL.get(name, f'pip install {name}')})"

    def option(name: str) -> str | None:
        why = f" ({OPT_IN_WHY[name]})" if name in OPT_IN_WHY else ""
        return None if here.opted_in(name) else f"runs only when asked: add --memclaims-{name}{why}"

    def feature(name: str) -> str | None:
        problem = here.torch_feature(name)
        return problem and f"needs {problem}"

    def path(name: str) -> str | None:
        return None if here.has_path(name) else f"needs {name}, which this machine does not have"

    # Each kind of named need, in the order the reasons are said: the machine's problem with each, by name.
    for names, problem_with in ((required.packages, package), (required.options, option),
                                (required.torch_features, feature), (required.paths, path)):
        reasons.extend(said for name in sorted(names) if (said := problem_with(name)))
    return reasons


def reason(required: Needs, machine: Machine | None = None) -> str | None:
    """The one skip reason: every unmet need joined in one line, or None when all are met."""
    return "; ".join(unmet(required, machine)) or None
