"""What a measurement is asked for besides the recipe: ``memclaims.run.run_recipe(recipe, options)``.

The defaults that follow from a recipe (measured steps, the accuracy schedule) are resolved here,
once, for every engine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memclaims.core.errors import UsageError
from memclaims.core.names import SEED, SIM_MEMORY_STEPS

if TYPE_CHECKING:
    from memclaims.recipes.recipe import Recipe

DEVICES = ("cpu", "cuda")  # real devices; "sim" is no device, measure() replays on fake tensors
# How long a sharded run's rank may go without progress (a phase begun or ended) before the run is
# stopped (memclaims.measure.launcher, memclaims.measure.heartbeat).
DEFAULT_TIMEOUT_S = 300.0
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
    # Evaluate after every epoch of an "epochs" accuracy schedule too, as the course's Trainer logs
    # (Record.epoch_evaluations: eval loss, accuracy, F1); one-device runs only. The command line's
    # ``memclaims run --evaluate-each-epoch`` (core/settings.py's option table).
    evaluate_each_epoch: bool = False
    profile: str = "article"  # the simulated GPU of --device sim (memclaims.sim.profiles)
    timeout_s: float | None = DEFAULT_TIMEOUT_S  # how long a rank may make no progress (None: no limit)
    # The sim only (``SIM_ONLY``):
    # What the allocator can get from the device (a card's memory less the CUDA context): past it the
    # allocator model frees its cache and retries as torch does (the Record's notes count the retries),
    # and raises OutOfMemory naming the phase where torch would. None: unlimited.
    limit_bytes: int | None = None
    # Record the allocator model's history (one-device recipes): ``measure``'s result carries it
    # (``Measurement.allocator_events``, in the terms of torch's, memclaims.gpu.alloc_trace).
    allocator_events: bool = False
    # Replay only the recipe's load, as the 07 scripts load the model (07_03 for an init-module recipe,
    # else 07_01), with the stock head: a Record of the load phase alone (memory_steps 0).
    load_only: bool = False


# The options only the simulated GPU takes, with their defaults (a real run refuses the others).
SIM_ONLY = {"limit_bytes": None, "allocator_events": False, "load_only": False}
# The recipes of the 07 scripts' load-only runs (``load_only``), by the load they replay.
LOAD_RECIPES = {"build-then-convert": ("16-true",), "init-module": ("16-true", "init-module")}


def default_devices(device: str) -> int:
    """Ranks of a sharded run when none are asked for: every visible GPU, or 2 CPU processes."""
    if device == "cuda":
        import torch  # where the device is asked about: the claim catalogue names recipes without torch

        return max(1, torch.cuda.device_count())
    return CPU_DEFAULT_DEVICES


def evaluates(recipe: Recipe, options: RunOptions) -> bool:
    """Whether a run trains and scores an accuracy phase: asked for, and the recipe computes in its own
    way (an allocator setting alone does not: its accuracy is the reference's; the paged AdamW8bit's is
    AdamW8bit's: ``Technique.computes_as``)."""
    return options.evaluate and not recipe.numerics_neutral


def accuracy_schedule(recipe: Recipe, options: RunOptions) -> dict[str, Any]:
    """What the accuracy phase trains and tests; the Record declares it (``accuracy_schedule``).

    ``epochs``: whole epochs and the whole test set (the article's way; asked for with
    accuracy_epochs or accuracy_full_epochs, or where the scale has no budget). ``steps``: the
    scale's budget, a fixed number of optimizer steps and at most so many test examples.
    ``plateau``: the scale trains to its plateau (``Scale.plateau``) and the run kept its schedule,
    so its accuracy is compared with the baseline (memclaims.baselines.compare); elsewhere it is reported.
    """
    scale = recipe.scale
    if options.accuracy_epochs or options.accuracy_full_epochs or scale.accuracy_steps is None:
        epochs = options.accuracy_epochs or scale.accuracy_epochs
        return {"kind": "epochs", "epochs": epochs, "optimizer_steps": None, "test_examples": None,
                "plateau": scale.plateau and epochs == scale.accuracy_epochs}
    steps = scale.accuracy_steps
    if recipe.techniques == DIVERGING_RECIPE and scale.divergence_steps:
        steps = max(steps, scale.divergence_steps)
    return {"kind": "steps", "epochs": None, "optimizer_steps": steps, "test_examples": scale.accuracy_test_examples,
            "plateau": False}


def memory_steps(recipe: Recipe, steps: int | None, device: str) -> int:
    """The optimizer steps the probes measure: ``steps`` (--steps, --memclaims-steps), else the default:
    the recipe's scale's on a real device, ``SIM_MEMORY_STEPS`` on the sim. Every engine asks here."""
    if steps is None:
        steps = SIM_MEMORY_STEPS if device == "sim" else recipe.scale.memory_steps
    if steps < 1:
        raise UsageError(f"--steps must be at least 1 (got {steps})")
    return steps


def resolve_memory_steps(recipe: Recipe, options: RunOptions) -> int:
    """The optimizer steps the probes measure for ``options`` (``memory_steps``)."""
    return memory_steps(recipe, options.memory_steps, options.device)


def check_device(device: str) -> None:
    if device not in DEVICES:
        raise UsageError(f"unknown device {device!r}; valid devices: {', '.join(DEVICES)}")
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda needs a CUDA GPU, and torch sees none on this machine")
