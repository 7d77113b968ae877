"""What this process has: CUDA devices, bitsandbytes stepping on a device, packages that work.

Apart from :mod:`memclaims.recipes.requirements` (what a case needs) because the optimizers ask the same
bitsandbytes question when they build, and the requirements ask the sim what it can replay, which
builds optimizers: one module for both would be an import cycle. The training stack's packages are
checked by running their smallest real operation (:func:`stack_problem`); what a failure means for
a session is :mod:`memclaims.pytest.release_preflight`'s.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path
from types import TracebackType
from typing import Any

from memclaims.core.errors import UsageError

DEVICES = ("cpu", "cuda")
# The training stack, in the order each builds on the one before; a failure names the first broken one.
STACK = ("torch", "torchvision", "lightning", "torchmetrics", "transformers", "bitsandbytes")


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@cache
def bitsandbytes_problem(device: str = "cpu") -> str | None:
    """Why bitsandbytes' 8-bit optimizers cannot step on ``device`` here, or None when they can.

    One tiny Adam8bit step on a tensor at bitsandbytes' default 8-bit threshold (4096 elements),
    so the quantized path runs, not the fp32 fallback for small tensors. Cached per process and
    device: the runner calls it before any measured phase, so a case's bytes never include it.
    """
    if device not in DEVICES:
        raise UsageError(f"bitsandbytes runs on {', '.join(DEVICES)}, not {device!r}")
    if device == "cuda" and cuda_device_count() < 1:
        return "there is no CUDA device to step on"
    try:
        import bitsandbytes as bnb
    except Exception as error:  # ImportError, or a broken native library raising at import
        return f"bitsandbytes does not import: {type(error).__name__}: {error}"
    import torch

    try:
        probe = torch.nn.Parameter(torch.ones(4096, device=device))
        eight_bit: Any = bnb.optim  # untyped: its optimizers are looked up, not imported
        optimizer = eight_bit.Adam8bit([probe], lr=1e-3)
        probe.grad = torch.ones_like(probe)
        optimizer.step()
    except Exception as error:
        return (f"bitsandbytes {getattr(bnb, '__version__', '?')} has no working {device.upper()} backend for "
                f"8-bit optimizers: {type(error).__name__}: {error}")
    finally:
        if device == "cuda":
            torch.cuda.empty_cache()  # the probe's blocks must not stay reserved in a GPU case
    return None


@dataclass(frozen=True)
class StackProblem:
    """A stack package that does not work here."""

    package: str
    version: str | None  # None: not installed
    error: str  # what failed: "does not import ...: Type: first line", "imports, but ... fails: ..."
    because_of: str | None = None  # the package whose failure this one follows from (it imports it)

    def line(self) -> str:
        if self.version is None:
            return f"{self.package} is not installed"
        if self.because_of:
            return f"{self.package} {self.version} imports {self.because_of} and fails with it"
        return f"{self.package} {self.version} {self.error}"


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _first_line(error: BaseException) -> str:
    text = (str(error).strip().splitlines() or [""])[0][:200]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


# --- the smallest real operation of each package ---------------------------------------------------

def _torch() -> None:
    import torch

    layer = torch.nn.Linear(2, 2)
    layer(torch.ones(1, 2)).sum().backward()


def _torchvision() -> None:
    import torch
    import torchvision

    boxes = torch.tensor([[0.0, 0.0, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
    kept = torchvision.ops.nms(boxes, torch.tensor([1.0, 0.5]), 0.5).tolist()
    if kept != [0]:
        raise RuntimeError(f"kept boxes {kept} of two identical ones, expected [0]")


def _lightning() -> None:
    import torch
    from lightning.fabric import Fabric

    # As memclaims.measure.runner builds it for a CPU run.
    fabric = Fabric(accelerator="cpu", devices=1, precision="32-true")
    module = torch.nn.Linear(2, 2)
    model, optimizer = fabric.setup(module, torch.optim.SGD(module.parameters(), lr=0.1))
    fabric.backward(model(torch.ones(1, 2)).sum())
    optimizer.step()


def _torchmetrics() -> None:
    import torch
    import torchmetrics

    accuracy = torchmetrics.Accuracy(task="multiclass", num_classes=2)
    accuracy.update(torch.tensor([0, 1]), torch.tensor([0, 1]))
    if float(accuracy.compute()) != 1.0:
        raise RuntimeError("Accuracy of two right predictions is not 1")


def _transformers() -> None:
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    # The path of the hf: and text workloads: a config, a model built from it, a forward.
    config = AutoConfig.for_model("distilbert", vocab_size=16, dim=8, hidden_dim=16, n_layers=1, n_heads=2,
                                  max_position_embeddings=8)
    logits = AutoModelForSequenceClassification.from_config(config)(torch.tensor([[1, 2, 3]])).logits
    if tuple(logits.shape) != (1, 2):
        raise RuntimeError(f"a 2-label model gave logits of shape {tuple(logits.shape)}")


def _bitsandbytes() -> None:
    problem = bitsandbytes_problem("cpu")  # cached: the cases' requirements ask the same question
    if problem:
        raise RuntimeError(problem)


_OPERATIONS: dict[str, tuple[str, Callable[[], None]]] = {
    "torch": ("a backward through nn.Linear", _torch),
    "torchvision": ("torchvision.ops.nms on 2 boxes", _torchvision),
    "lightning": ("a Fabric setup, backward and step on the CPU", _lightning),
    "torchmetrics": ("an Accuracy update", _torchmetrics),
    "transformers": ("a tiny DistilBERT built from its config", _transformers),
    "bitsandbytes": ("an 8-bit Adam step on the CPU", _bitsandbytes),
}


def _packages_in(error: BaseException) -> set[str]:
    """The top-level packages whose code raised ``error`` or the errors it was raised from (a lazy
    importer, such as transformers', re-raises another package's failure as its own)."""
    found: set[str] = set()
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        trace: TracebackType | None = current.__traceback__
        while trace is not None:
            found.add(str(trace.tb_frame.f_globals.get("__name__", "")).split(".")[0])
            trace = trace.tb_next
        pending += [current.__cause__, current.__context__]
    return found


def _cause(package: str, error: BaseException) -> str | None:
    """The package before ``package`` in STACK that failed here and whose code ``error`` ran through."""
    failed_before = {p for p in STACK[:STACK.index(package)] if stack_problem(p) is not None}
    cause = [p for p in STACK if p in failed_before & _packages_in(error)]
    return cause[0] if cause else None


@cache
def stack_problem(package: str) -> StackProblem | None:
    """Why ``package`` of the STACK does not work here: its import, then its smallest real operation;
    None when both work. Cached per process (a pytest session, an xdist worker, the requirements
    of its cases all ask)."""
    version = _version(package)
    if version is None:
        return StackProblem(package, None, "is not installed")
    beside = "" if package == "torch" else f" beside torch {_version('torch')}"
    what, operation = _OPERATIONS[package]
    try:
        importlib.import_module(package)
    except Exception as error:  # any failure is the finding: ImportError, a native library's RuntimeError
        return StackProblem(package, version, f"does not import{beside}: {_first_line(error)}", _cause(package, error))
    try:
        operation()
    except Exception as error:
        return StackProblem(package, version, f"imports, but {what} fails: {_first_line(error)}", _cause(package, error))
    return None


@cache
def package_problem(name: str) -> str | None:
    """Why ``name`` does not work here, or None. Importing, not finding: a package whose native
    part is broken is found and still fails; a package of the training stack also runs its smallest
    operation (:func:`stack_problem`, whose answer the session's preflight has cached already)."""
    if name in STACK:
        found = stack_problem(name)
        return None if found is None else found.line()
    try:
        importlib.import_module(name)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


def linear_cross_entropy_problem() -> str | None:
    """What the fused-linear-ce technique needs that the installed torch lacks, or None: a tiny chunked call on the CPU that must
    equal the reference loss (running it, not reading the version)."""
    import torch
    import torch.nn.functional as F

    fused = getattr(F, "linear_cross_entropy", None)
    options = getattr(torch.nn, "LinearCrossEntropyOptions", None)
    if fused is None or options is None:
        return (f"torch.nn.functional.linear_cross_entropy with LinearCrossEntropyOptions, which torch "
                f"{torch.__version__} lacks (torch 2.14.1 has it: upgrade torch)")
    generator = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(16, 4, generator=generator), torch.randn(32, 4, generator=generator)
    targets = torch.randint(0, 32, (16,), generator=generator)
    try:
        chunked = fused(hidden, weight, targets, options=options(batch_chunk_size=4, chunking_method=None))
    except Exception as error:  # any failure of the op is the reason
        return (f"a working torch.nn.functional.linear_cross_entropy; in torch {torch.__version__} it fails: "
                f"{type(error).__name__}: {error}")
    reference = F.cross_entropy(hidden @ weight.T, targets)
    if not torch.allclose(chunked, reference, rtol=1e-5, atol=1e-6):
        return (f"a correct torch.nn.functional.linear_cross_entropy; in torch {torch.__version__} its chunked "
                f"path gives {float(chunked)} where the reference gives {float(reference)}")
    return None


@cache
def torch_feature_problem(name: str) -> str | None:
    """Why the installed torch cannot run the operation ``name`` (memclaims.recipes.requirements.TORCH_FEATURES),
    or None; each checked by running it once per process."""
    if name == "linear_cross_entropy":
        return linear_cross_entropy_problem()
    raise ValueError(f"unknown torch feature {name!r}")


class Machine:
    """What this process has. Each probe runs only when a need asks for it (the bitsandbytes step
    and a package import are not free); the module's functions are looked up at call time, so a
    test can replace one with monkeypatch."""

    def __init__(self, opted_in: Callable[[str], bool] = lambda name: False, cuda_devices: int | None = None) -> None:
        self.opted_in = opted_in
        self._cuda_devices = cuda_devices  # None: ask torch; a number: "a machine with N GPUs"

    def cuda_devices(self) -> int:
        return cuda_device_count() if self._cuda_devices is None else self._cuda_devices

    def bitsandbytes(self, device: str) -> str | None:
        return bitsandbytes_problem(device)

    def package(self, name: str) -> str | None:
        return package_problem(name)

    def torch_feature(self, name: str) -> str | None:
        return torch_feature_problem(name)

    def has_path(self, path: str) -> bool:
        return Path(path).exists()
