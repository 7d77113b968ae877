"""for-loop, foreach, fused: how torch steps the recipe's Adam, AdamW or SGD (torch.optim's ``foreach=`` and
``fused=``), and what each keeps in the step beside the state.

torch.optim implements these optimizers three ways: a for-loop over the parameters (``foreach=False``), multi-tensor
``_foreach_*`` ops over all of them at once (``foreach=True``), and one fused kernel per device and dtype
(``fused=True``). Without either flag torch picks by device: foreach on CUDA, the for-loop on the CPU. The
choice sets the optimizer step's temporaries (research Q4, torch 2.14, measured on the CPU): Adam's and AdamW's
for-loop holds two tensors of one parameter at a time (``sqrt`` and its division: 2x the largest parameter),
foreach one tensor list as large as all the parameters (``_foreach_sqrt``: 1x their bytes), fused none; SGD
without momentum keeps none in any of them.

The implementation is a core field of the recipe (``Recipe.optimizer_impl``, None: torch's default for the
device), set by these techniques' entries and read by ``memclaims.measure.optimizers.build``, as the optimizer
itself is (``memclaims/techniques/__init__.py``). The choice's table (``torch_flags``) is plain data in ``memclaims.core.optimizer_choices``; this module owns the
mapping of transformers' ``TrainingArguments(optim=...)`` names onto it (``trainer_optim``), and the hooks that
show the choice ran: the optimizer's param groups as built, and the temporaries of a measured step after the
first (the optimizer_step phase's growth above its start, ``PhaseRecorder.step_growth``), in the Record's
``by_technique`` part.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from memclaims.core.errors import UsageError
from memclaims.core.optimizer_choices import IMPLEMENTATIONS as IMPLEMENTATIONS
from memclaims.core.optimizer_choices import TORCH_IMPLEMENTED as TORCH_IMPLEMENTED
from memclaims.core.optimizer_choices import torch_flags as torch_flags
from memclaims.techniques import optimizer_in_backward
from memclaims.techniques.base import Hooks, Observed, Say, Technique, observations

if TYPE_CHECKING:
    import torch
    from torch import nn

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.techniques.engine_protocols import PhaseProbe, RealRun, SimSession

# The optimizers whose step the implementations shape (Adam's ``sqrt`` and division); SGD without momentum keeps no
# temporary in any implementation, so only its param groups can show which one runs.
_SHAPED = ("adam", "adamw")
OPTIMIZER_STEP = "optimizer_step"  # the training step's phase (memclaims.measure.loop.STEP_PHASES)


def implementation_of(foreach: bool | None, fused: bool | None) -> str | None:
    """The implementation a param group's flags ask torch for; None where they leave it to torch (by device)."""
    if fused:
        return "fused"
    if foreach:
        return "foreach"
    return "for-loop" if foreach is False else None


# --- transformers' TrainingArguments(optim=...) --------------------------------------------------------------


class TrainerOptim(NamedTuple):
    """What a ``TrainingArguments(optim=...)`` name builds, in memclaims' techniques (``-t`` names)."""

    optimizer: str  # the optimizer technique: "adamw", "sgd", "adafactor", "adamw8bit", "paged-adamw8bit"
    implementation: str | None  # "fused", ...; None: torch's default for the device (or no torch optimizer)

    @property
    def techniques(self) -> tuple[str, ...]:
        """The technique names a recipe takes for it (``memclaims.recipes.recipe.resolve``)."""
        return (self.optimizer,) if self.implementation is None else (self.optimizer, self.implementation)


# transformers 5.x's Trainer (trainer_optimizer.py's handlers): adamw_torch is torch's AdamW with neither flag,
# adamw_torch_fused adds fused=True, sgd is torch's SGD (no momentum unless optim_args say so), adafactor
# transformers' Adafactor without its relative step, and the bitsandbytes names bnb's AdamW with optim_bits=8
# (is_paged for paged_adamw_8bit): AdamW8bit and PagedAdamW8bit.
TRAINER_OPTIMS: dict[str, TrainerOptim] = {
    "adamw_torch": TrainerOptim("adamw", None),
    "adamw_torch_fused": TrainerOptim("adamw", "fused"),
    "sgd": TrainerOptim("sgd", None),
    "adafactor": TrainerOptim("adafactor", None),
    "adamw_bnb_8bit": TrainerOptim("adamw8bit", None),
    "adamw_8bit": TrainerOptim("adamw8bit", None),
    "paged_adamw_8bit": TrainerOptim("paged-adamw8bit", None),
}


def trainer_optim(optim: object) -> TrainerOptim:
    """The (optimizer, implementation) techniques of a ``TrainingArguments.optim`` value: a name
    (``"adamw_torch_fused"``) or transformers' ``OptimizerNames`` member. ``adamw_torch_fused`` ->
    ``("adamw", "fused")``, ``adamw_torch`` -> ``("adamw", None)``, torch's default for the device (the for-loop on
    the CPU, foreach on CUDA), ``adamw_bnb_8bit`` -> ``("adamw8bit", None)``. A name whose optimizer memclaims does
    not run (lion, galore, torchao's, paged 32-bit, ...) is a UsageError naming the ones it maps."""
    name = str(getattr(optim, "value", optim))
    try:
        return TRAINER_OPTIMS[name]
    except KeyError:
        raise UsageError(f"TrainingArguments optim {name!r} builds no optimizer memclaims runs; mapped names: "
                         f"{', '.join(TRAINER_OPTIMS)}") from None


# --- what shows the implementation ran --------------------------------------------------------------------------


def _parameter_bytes(params: Iterable[Any]) -> list[int]:
    return [int(p.numel()) * int(p.element_size()) for p in params]


def _one(values: list[object]) -> object:
    """The groups' common value, or all of them where they differ."""
    return values[0] if len(set(values)) == 1 else values


class OptimizerImplementation(Hooks):
    """The hooks of one implementation (``name``): what the built optimizer and a measured step show of it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def _observed(self, optimizer: torch.optim.Optimizer, local: Callable[[Any], Any], growth: list[dict[str, int]],
                  temporaries_key: str) -> dict[str, object]:
        groups = optimizer.param_groups
        # Each param group is stepped by its own call (AdamW's course groups: two), so foreach's tensor lists are
        # a group's parameters, not all of them.
        sizes = [_parameter_bytes(local(p) for p in group["params"]) for group in groups]
        # The first step creates the state; a later one adds only its temporaries (None: one step measured).
        last = growth[-1] if len(growth) >= 2 else None
        return {
            "foreach": _one([group.get("foreach") for group in groups]),
            "fused": _one([group.get("fused") for group in groups]),
            "largest_parameter_bytes": max((size for group in sizes for size in group), default=0),
            "group_parameter_bytes": [sum(group) for group in sizes],
            "measured_step": len(growth),
            "step_temporary_bytes": None if last is None else last[temporaries_key],
        }

    def observe(self, engine: RealRun, model: nn.Module, optimizer: torch.optim.Optimizer,
                probe: PhaseProbe) -> Observed:
        # cpu: exact tensor bytes (MemTracker); cuda: the caching allocator's, rounded as it allocates.
        observed = self._observed(optimizer, engine.local, probe.step_growth.get(OPTIMIZER_STEP, []), "allocated_bytes")
        return observations(self.name, **observed)

    def sim_observe(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                    session: SimSession) -> Observed:
        growth = session.recorder.step_growth.get(OPTIMIZER_STEP, [])
        # Live tensor bytes, exact (what the cpu tier counts), and the allocator model's, rounded as CUDA's.
        observed = self._observed(optimizer, lambda p: p, growth, "live_bytes")
        return observations(self.name, **observed,
                            step_temporary_allocated_bytes=growth[-1]["allocated_bytes"] if len(growth) >= 2 else None)

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        seen = record.by_technique.get(self.name)
        if not seen:
            say(f"the Record has no by_technique.{self.name}: the optimizer's implementation was not observed")
            return
        expected = torch_flags(self.name)
        if (seen.get("foreach"), seen.get("fused")) != (expected["foreach"], expected["fused"]):
            say(f"the optimizer's param groups say foreach={seen.get('foreach')}, fused={seen.get('fused')} in phase "
                f"{OPTIMIZER_STEP}; {self.name} is foreach={expected['foreach']}, fused={expected['fused']}")
        if record.observed(optimizer_in_backward.NAME, "backward_optimizer_steps") or recipe.optimizer not in _SHAPED:
            # Stepped inside backward (optimizer-in-backward), or SGD: no temporaries tell the implementations apart.
            return
        temporaries = seen.get("step_temporary_bytes")
        if temporaries is None:
            if seen.get("measured_step") or record.devices == 1:
                say(f"{seen.get('measured_step', 0)} optimizer step(s) measured in phase {OPTIMIZER_STEP}: the first "
                    "creates the state, so no step showed its temporaries alone (measure 2 or more)")
            # else: the sim's sharded replays measure no step phases (load and train only); the flags above hold.
            return
        problem = step_shape_problem(self.name, temporaries, seen["largest_parameter_bytes"],
                                     max(seen["group_parameter_bytes"], default=0))
        if problem:
            say(f"step_temporary_bytes is {temporaries:,} B in phase {OPTIMIZER_STEP} (step {seen['measured_step']}): "
                f"{problem}")


def step_shape_problem(name: str, temporaries: int, largest: int, group: int) -> str | None:
    """Why ``temporaries`` (an Adam or AdamW step's, after the first) is not the implementation ``name``'s shape,
    given the largest parameter's bytes and the largest param group's (what one call steps); None where it is."""
    if name == "fused":
        if temporaries < largest:
            return None
        return f"the fused kernel keeps no parameter-sized temporary, and this is at least the largest parameter's {largest:,} B"
    if name == "foreach":
        if temporaries >= group:
            return None
        return (f"foreach keeps a temporary of every parameter of a param group at once (a tensor list), at least the "
                f"largest group's {group:,} B")
    # The for-loop: one parameter's temporaries at a time. Where two of the largest parameter are a whole group,
    # its bytes cannot be told from foreach's, and only the lower bound holds.
    if temporaries >= largest and (temporaries < group or 2 * largest >= group):
        return None
    return (f"the for-loop keeps one parameter's temporaries at a time: at least the largest parameter's {largest:,} B "
            f"and less than the largest param group's {group:,} B (what foreach keeps)")


# Where torch's foreach= and fused= do not reach the step.
_CONFLICTS: tuple[tuple[str, str], ...] = (
    *((eight_bit, "bitsandbytes' 8-bit optimizers step with their own block-wise kernels; torch.optim's foreach= "
                  "and fused= are not theirs")
      for eight_bit in ("adam8bit", "adamw8bit", "paged-adamw8bit")),
    *((low_bit, "torchao's low-bit AdamW steps its quantized states with its own kernels; torch.optim's foreach= and "
                "fused= are not theirs")
      for low_bit in ("ao-adamw8bit", "ao-adamw4bit", "ao-adamw-fp8")),
    ("adafactor", "transformers' Adafactor steps one parameter at a time in Python and takes no foreach= or fused="),
    ("deepspeed-zero2", "DeepSpeed builds and steps its own optimizer over its partitioned fp32 master weights, "
                        "not torch.optim's"),
)

_SUMMARIES = {
    "for-loop": "torch.optim steps Adam, AdamW or SGD one parameter at a time (foreach=False, fused=False; torch's "
                "default on the CPU): one parameter's temporaries at a time",
    "foreach": "torch.optim steps Adam, AdamW or SGD with multi-tensor _foreach ops over all parameters (foreach=True; "
               "torch's default on CUDA): Adam's temporaries as large as all parameters",
    "fused": "torch.optim steps Adam, AdamW or SGD in one fused kernel per device and dtype (fused=True): no "
             "parameter-sized temporaries",
}

ENTRIES: tuple[Technique, ...] = tuple(
    Technique(name, _SUMMARIES[name], "torch.optim docs: algorithm implementations", group="optimizer-impl",
              optimizer_impl=name, in_cover=False, in_default=False, conflicts=_CONFLICTS,
              hooks=OptimizerImplementation(name))
    for name in IMPLEMENTATIONS)
