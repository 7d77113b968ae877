"""The releases preflight: the installed releases are tested, not their version numbers.

Each package of the locked releases (``STACK``: the packages, not the training stack a recipe runs on) is
imported and runs its smallest real operation (``memclaims.core.machine.stack_problem``, cached per process): a torch backward, a
torchvision operator (``torchvision.ops.nms`` on two boxes: its C++ operators must have registered
beside this torch), a Lightning Fabric setup, backward and step of a tiny ``nn.Linear`` on the CPU,
a torchmetrics Accuracy update, a transformers config -> model build and forward of a tiny
DistilBERT, and a bitsandbytes 8-bit optimizer step (``bitsandbytes_problem``).
A table of which versions pair would refuse working releases (torchvision 0.29.2 runs beside torch
2.15.0) and accept a broken build of the right number.

What a failure stops: a package every run needs (torch; Lightning trains every recipe; torchmetrics
scores accuracy) or one the session's workload needs (:func:`memclaims.core.names.workload_packages`) stops pytest with
one line (``message``). Any other is one header line, and the cases that need it skip through the
``requires`` machinery (``memclaims.recipes.requirements``: a package need). bitsandbytes never stops a
run (no workload needs it): a build without a backend for the device is common, and the 8-bit
cases skip with its reason.
An *installed* torchvision that fails at import stops every run: Lightning and torchmetrics import
it when it is installed, and fail with it; a *missing* one skips only the ViT workloads.

Cost, measured on 2 shared CPU cores: 10.2 s in a fresh process, all but 0.12 s of it the imports
(torch 2.4 s, torchvision 2.3 s, lightning 4 s, transformers' DistilBERT 0.5 s, bitsandbytes 2.4 s),
which a session collecting this suite makes anyway; with the stack imported already, 0.12 s. Every
pytest start and every xdist worker runs it once (cached per process).
"""

from __future__ import annotations

from collections.abc import Iterable

from memclaims.core.machine import STACK, StackProblem, stack_problem
from memclaims.core.names import workload_packages
from memclaims.techniques.technique_registry import TECHNIQUES

__all__ = ["STACK", "StackProblem", "message", "note", "problems", "stopping"]

# Every real run needs these: Fabric trains every recipe, torchmetrics scores its accuracy.
EVERY_RUN = ("torch", "lightning", "torchmetrics")
# What the built-in workloads need beyond EVERY_RUN; ``hf:<model_type>`` needs transformers. A
# user's workload needs what its own code imports: the preflight cannot know it.
# Who needs a package, for the header line of a failure that does not stop the session.
USED_BY = {"torchvision": "the ViT workloads (vit, vit-h14)",
           "transformers": "the text workloads (distilbert, distilbert-cased, bigbird, hf:<model_type>)",
           "bitsandbytes": "the techniques that need it (" + ", ".join(
               t.name for t in TECHNIQUES if "bitsandbytes" in t.requires) + ")"}


def problems(packages: Iterable[str] = STACK) -> list[StackProblem]:
    """Every stack package that does not work here, in STACK order; with torch broken, only torch
    (everything else would fail with it)."""
    torch = stack_problem("torch")
    if torch is not None:
        return [torch]
    return [p for p in (stack_problem(name) for name in STACK if name in set(packages)) if p is not None]


def stopping(found: Iterable[StackProblem], workload: str) -> bool:
    """Whether ``found`` stops a session that runs ``workload``: a package every run needs, or one
    the workload needs, does not work."""
    needed = set(EVERY_RUN) | set(workload_packages(workload))
    return any(p.package in needed for p in found)


def message(found: Iterable[StackProblem]) -> str:
    """The one line that stops the session: every problem, the root causes first."""
    ordered = sorted(found, key=lambda p: (p.because_of is not None, STACK.index(p.package)))
    return "memclaims: the installed packages cannot run the suite: " + "; ".join(p.line() for p in ordered)


def note(found: StackProblem) -> str:
    """The header line of a problem that does not stop the session."""
    return f"memclaims: {found.line()}; the cases of {USED_BY.get(found.package, 'it')} skip with that reason"
