"""What a measurement is asked for besides the recipe: ``memclaims.measure.measure(recipe, options)``.

The defaults that follow from a recipe (measured steps, the accuracy schedule) are resolved here,
once, for every engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch

from memclaims.errors import UsageError
from memclaims.launcher import DEFAULT_TIMEOUT_S
from memclaims.recipe import Recipe
from memclaims.workloads import SEED

DEVICES = ("cpu", "cuda")  # real devices; "sim" is no device, measure() replays on fake tensors
CPU_DEFAULT_DEVICES = 2  # ranks of a sharded CPU run: what the 2-core CI machine can run
DIVERGING_RECIPE = ("16-true",)  # claim 3: the article's 16-true run went NaN near batch 300


@dataclass(frozen=True)
class RunOptions:
    device: str = "cpu"  # cpu, cuda or sim
    memory_steps: int | None = None  # None: the scale's default
    evaluate: bool = True
    accuracy_epochs: int | None = None  # None: the scale's default
    data_dir: str | os.PathLike[str] | None = None
    seed: int = SEED  # the article's; other seeds measure the spread that tolerances come from
    # Processes (CPU) or GPUs of a sharded recipe's run; None: ``default_devices``.
    devices: int | None = None
    # Whole epochs for accuracy even where the scale has a budgeted schedule (the weekly run).
    accuracy_full_epochs: bool = False
    profile: str = "article"  # the simulated GPU of --device sim (memclaims.sim.profiles)
    timeout_s: float | None = DEFAULT_TIMEOUT_S  # how long a sharded run's ranks may take (None: no limit)


def default_devices(device: str) -> int:
    """Ranks of a sharded run when none are asked for: every visible GPU, or 2 CPU processes."""
    if device == "cuda":
        return max(1, torch.cuda.device_count())
    return CPU_DEFAULT_DEVICES


def accuracy_schedule(recipe: Recipe, options: RunOptions) -> dict[str, Any]:
    """What the accuracy phase trains and tests; the Record declares it (``accuracy_schedule``).

    ``epochs``: whole epochs and the whole test set (the article's way; asked for with
    accuracy_epochs or accuracy_full_epochs, or where the scale has no budget). ``steps``: the
    scale's budget, a fixed number of optimizer steps and at most so many test examples.
    """
    scale = recipe.scale
    if options.accuracy_epochs or options.accuracy_full_epochs or scale.accuracy_steps is None:
        return {"kind": "epochs", "epochs": options.accuracy_epochs or scale.accuracy_epochs,
                "optimizer_steps": None, "test_examples": None}
    steps = scale.accuracy_steps
    if recipe.techniques == DIVERGING_RECIPE and scale.divergence_steps:
        steps = max(steps, scale.divergence_steps)
    return {"kind": "steps", "epochs": None, "optimizer_steps": steps, "test_examples": scale.accuracy_test_examples}


def resolve_memory_steps(recipe: Recipe, options: RunOptions) -> int:
    """The optimizer steps the probes measure: the option, else the scale's default."""
    steps = options.memory_steps if options.memory_steps is not None else recipe.scale.memory_steps
    if steps < 1:
        raise UsageError(f"--steps must be at least 1 (got {steps})")
    return steps


def check_device(device: str) -> None:
    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r}; valid devices: {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda needs a CUDA GPU, and torch sees none on this machine")
