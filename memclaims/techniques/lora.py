"""lora: peft's LoRA adapters (issue #27): base weights frozen, rank-8 adapters on the workload's attention
projections, its classification head trained (``modules_to_save``).

Its parameters (issue #53), by peft's ``LoraConfig`` names: ``r``, ``lora_alpha``, ``lora_dropout``,
``target_modules``. A workload states its defaults (``Workload.lora_targets``; ``define(lora=...)``), memclaims'
``DEFAULTS`` fill the rest; a recipe asks others (``LoraParameters``: ``--lora-r`` and the rest on the command line,
``--memclaims-lora-*`` in pytest) and its id says them, ``lora[r=4,targets=q_proj+v_proj]``, so that it has
baselines of its own; what equals the workload's default is left out of the id, which keeps every stored id.

``peft.get_peft_model`` runs right after the model is built (``memclaims.techniques.impl.peft_adapters``; on the sim's fake
tensors ``memclaims.techniques.impl.peft_adapters_fake``), before the optimizer sees the parameters. What shows it: the
trainable share of the parameters and an optimizer state only the trainable ones can hold (``trainable_parameters``
and ``total_parameters`` in the technique's part of the Record, ``by_technique["lora"]``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from memclaims.core.errors import UsageError
from memclaims.techniques.base import Hooks, Observed, Say, Technique, observations
from memclaims.techniques.shared_conflicts import STRATEGY

if TYPE_CHECKING:
    import torch
    from torch import nn

    from memclaims.core.record import Record
    from memclaims.core.settings import Settings
    from memclaims.recipes.recipe import Recipe
    from memclaims.techniques.engine_protocols import PhaseProbe, RealRun, SimSession
    from memclaims.workloads.types import Workload

NAME = "lora"  # the technique's registry name, and its part of the Record (``by_technique``)

# At most this fraction of the parameters trainable (rank-8 adapters on two projections per layer and the
# head: 5.6 % of the 2-layer, 64-wide smoke DistilBERT, whose head is a large share of it; 1.1 % of the
# article one; everything trainable, when the base weights were not frozen, is 100 %), and per trainable
# parameter at most Adam's two moments in fp32, plus one 8-byte step count per parameter tensor.
LORA_MAX_TRAINABLE = 0.10
LORA_STATE_BYTES_PER_TRAINABLE = 8
LORA_STEP_BYTES_PER_TENSOR = 8

# memclaims' defaults where a workload states none; every stored lora Record ran them. peft's own LoraConfig
# defaults are r=8, lora_alpha=8, lora_dropout=0.0; alpha 16 (scale 2) and dropout 0.1 are its examples' choice.
DEFAULTS: dict[str, object] = {"r": 8, "lora_alpha": 16, "lora_dropout": 0.1}
# peft's name -> its short name in a recipe id, and the command-line option that sets it (pytest's: --memclaims-...).
ID_NAMES = {"r": "r", "lora_alpha": "alpha", "lora_dropout": "dropout", "target_modules": "targets"}
OPTIONS = {"r": "--lora-r", "lora_alpha": "--lora-alpha", "lora_dropout": "--lora-dropout",
           "target_modules": "--lora-targets"}
_NOT_IN_NAMES = set("()/[],=+ ")  # what a recipe id reserves


def _number(value: float) -> str:
    return f"{value:g}"


@dataclass(frozen=True)
class LoraParameters:
    """What a recipe asks of the adapters beyond its workload's defaults (``Technique.parameters`` of lora and
    qlora), by peft's ``LoraConfig`` names; None: the workload's default."""

    r: int | None = None
    lora_alpha: float | None = None
    lora_dropout: float | None = None
    target_modules: tuple[str, ...] | None = None

    def suffix(self) -> str:
        """The recipe id's part after the technique's name: ``[r=4,alpha=8,targets=q_proj+v_proj]``; "" for none."""
        parts = []
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None:
                text = "+".join(value) if isinstance(value, tuple) else _number(value)
                parts.append(f"{ID_NAMES[item.name]}={text}")
        return f"[{','.join(parts)}]" if parts else ""

    @classmethod
    def parse(cls, text: str) -> LoraParameters:
        """The inverse of ``suffix`` without its brackets: ``r=4,targets=q_proj+v_proj``."""
        by_short = {short: name for name, short in ID_NAMES.items()}
        values: dict[str, str] = {}
        for part in filter(None, text.split(",")):
            key, _, value = part.partition("=")
            if key not in by_short or not value:
                raise UsageError(f"malformed lora parameter {part!r} in a recipe id; expected NAME=VALUE with NAME "
                                 f"one of {', '.join(by_short)}")
            values[by_short[key]] = value
        return cls.from_text(**values)

    @classmethod
    def from_text(cls, r: str | None = None, lora_alpha: str | None = None, lora_dropout: str | None = None,
                  target_modules: str | None = None, separator: str = "+") -> LoraParameters:
        """The parameters as typed (an option's value, a recipe id's), each checked: a bad one is a UsageError
        naming its option and the value."""
        def number(name: str, text: str | None) -> float | None:
            if text is None:
                return None
            try:
                value = float(text)
            except ValueError:
                value = math.nan
            if not math.isfinite(value):
                raise UsageError(f"{OPTIONS[name]} {text}: expected a number")
            return value

        rank = number("r", r)
        if rank is not None and rank != int(rank):
            raise UsageError(f"{OPTIONS['r']} {r}: expected a positive integer (peft's LoraConfig r)")
        targets = None if target_modules is None else tuple(t.strip() for t in target_modules.split(separator))
        return cls(r=None if rank is None else int(rank), lora_alpha=number("lora_alpha", lora_alpha),
                   lora_dropout=number("lora_dropout", lora_dropout), target_modules=targets).checked()

    def checked(self, spelling: Mapping[str, str] = OPTIONS) -> LoraParameters:
        """Itself, or UsageError naming the option (``spelling``: by field), the value and what it takes."""
        if self.r is not None and self.r <= 0:
            raise UsageError(f"{spelling['r']} {self.r}: expected a positive integer (peft's LoraConfig r, the "
                             "adapters' rank)")
        if self.lora_alpha is not None and self.lora_alpha <= 0:
            raise UsageError(f"{spelling['lora_alpha']} {_number(self.lora_alpha)}: expected a number above 0 (peft's "
                             "LoraConfig lora_alpha; the adapters' output is scaled by lora_alpha / r)")
        if self.lora_dropout is not None and not 0 <= self.lora_dropout < 1:
            raise UsageError(f"{spelling['lora_dropout']} {_number(self.lora_dropout)}: expected a probability in "
                             "[0, 1) (peft's LoraConfig lora_dropout)")
        if self.target_modules is not None:
            bad = [t for t in self.target_modules if not t or _NOT_IN_NAMES & set(t)]
            if bad or not self.target_modules:
                raise UsageError(f"{spelling['target_modules']} {','.join(self.target_modules)}: expected module "
                                 "names separated by commas (peft's LoraConfig target_modules, matched as suffixes "
                                 "of the model's module names, e.g. q_proj,v_proj)")
        return self

    def options(self) -> str:
        """The options that asked these values: ``--lora-r, --lora-targets``."""
        return ", ".join(OPTIONS[item.name] for item in fields(self) if getattr(self, item.name) is not None)

    def described(self, workload: Workload) -> str:
        """The adapters' parameters on ``workload`` in words, as peft names them: ``r=8, lora_alpha=16,
        lora_dropout=0.1, target_modules=q_lin,v_lin``."""
        chosen = effective(workload, self)
        targets = ",".join(chosen["target_modules"]) if chosen["target_modules"] else \
            "peft's default for the model type"
        return (f"r={chosen['r']}, lora_alpha={_number(chosen['lora_alpha'])}, "
                f"lora_dropout={_number(chosen['lora_dropout'])}, target_modules={targets} (peft's LoraConfig)")

    def beyond(self, workload: Workload) -> LoraParameters:
        """Only what differs from ``workload``'s defaults (what the recipe id says)."""
        defaults = effective(workload, LoraParameters())
        return replace(self, **{item.name: None for item in fields(self)
                                if getattr(self, item.name) is not None
                                and getattr(self, item.name) == defaults[item.name]})


def asked_by(chosen: Settings) -> tuple[LoraParameters, ...]:
    """What ``--lora-r`` and the rest ask (pytest's ``--memclaims-lora-*``); () where none is given."""
    given = {"r": chosen.lora_r, "lora_alpha": chosen.lora_alpha, "lora_dropout": chosen.lora_dropout,
             "target_modules": chosen.lora_targets}
    if all(value is None for value in given.values()):
        return ()
    return (LoraParameters.from_text(**{name: None if value is None else str(value) for name, value in given.items()},
                                     separator=","),)


def effective(workload: Workload, asked: LoraParameters | None) -> dict[str, Any]:
    """The adapters' ``LoraConfig`` keyword arguments for ``workload`` under ``asked``: asked, else the workload's,
    else ``DEFAULTS`` (``target_modules`` None: peft's default for the model's type; a tuple as a list)."""
    targets = workload.lora_targets
    if targets is None:
        raise UsageError(f"workload {workload.name!r} names no modules for LoRA adapters (Workload.lora_targets)")
    LoraParameters(targets.r, targets.lora_alpha, targets.lora_dropout, targets.target_modules).checked(
        {name: f"workload {workload.name!r}'s lora {name}" for name in OPTIONS})  # define(lora=...)'s values
    asked = asked or LoraParameters()
    chosen: dict[str, object] = {}
    for name in ("r", "lora_alpha", "lora_dropout", "target_modules"):
        value = getattr(asked, name)
        own = getattr(targets, name)
        chosen[name] = value if value is not None else own if own is not None else DEFAULTS.get(name)
    chosen["modules_to_save"] = targets.modules_to_save
    return chosen


def asked_of(recipe: Recipe, name: str) -> LoraParameters | None:
    """The parameters ``recipe`` asks of its technique ``name`` (lora or qlora)."""
    asked = recipe.parameters_of(name)
    return asked if isinstance(asked, LoraParameters) else None


class Lora(Hooks):
    convert_order = 2  # after the fused loss's head bypass: the adapters go on the model the loss trains
    name = "lora"  # the entry whose parameters (``Recipe.parameters_of``) these hooks read

    def convert_module(self, model: nn.Module, engine: RealRun) -> nn.Module:
        from memclaims.techniques.impl import peft_adapters as lora

        recipe = engine.recipe  # frozen base, adapters and head trainable
        return lora.apply(model, recipe.workload.name, effective(recipe.workload, asked_of(recipe, self.name)),
                          asked_of(recipe, self.name) is not None)

    def reference_module(self, model: nn.Module, workload: Workload) -> nn.Module:
        from memclaims.techniques.impl import peft_adapters as lora

        return lora.apply(model, workload.name, effective(workload, None), False)

    def observe(self, engine: RealRun, model: nn.Module, optimizer: torch.optim.Optimizer,
                probe: PhaseProbe) -> Observed:
        from memclaims.techniques.impl import peft_adapters as lora

        return self.adapted(lora.parameter_fields(model))

    def adapted(self, counts: dict[str, object]) -> Observed:
        """The adapted model's counts (``peft_adapters.parameter_fields``) as the Record's parts: lora's parameter
        elements that require a gradient (the adapters and the trained head) and all of them (frozen base weights
        included), counted on the model as the load phase left it."""
        return observations(NAME, trainable_parameters=counts["trainable_parameters"],
                            total_parameters=counts["total_parameters"])

    def expected_grad_bytes(self, record: Record, bytes_per_param: int, expected: int) -> int:
        # Gradients for the trainable parameters only: the frozen base weights get none.
        trainable = record.observed(NAME, "trainable_parameters")
        return trainable * bytes_per_param if trainable is not None else expected

    def accuracy_reported_only(self, record: Record) -> bool:
        # Adapters on a frozen, randomly initialised base (no cached pretrained weights) barely move it
        # (smoke DistilBERT: 0.50 after 3 epochs); the lora case is about memory.
        return record.weights == "random"

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        trainable, total = record.observed(NAME, "trainable_parameters"), record.observed(NAME, "total_parameters")
        if trainable is None or not total:
            say(f"trainable_parameters is {trainable}, total_parameters {total} after phase load: the run saw no "
                "adapted model")
            return
        if trainable / total >= LORA_MAX_TRAINABLE:
            say(f"trainable_parameters is {trainable:,} of {total:,} ({trainable / total:.1%}) after phase load, "
                f"not below {LORA_MAX_TRAINABLE:.0%}: the base weights were not frozen")
        bound = LORA_STATE_BYTES_PER_TRAINABLE * trainable + LORA_STEP_BYTES_PER_TENSOR * record.param_tensor_count
        if record.optimizer_state_bytes > bound:
            say(f"optimizer_state_bytes is {record.optimizer_state_bytes:,} B after phase optimizer_step, above "
                f"the {bound:,} B that {trainable:,} trainable parameters can hold: the optimizer kept state for "
                "frozen base weights")

    def sim_adapt(self, model: nn.Module, recipe: Recipe, move: Callable[[nn.Module, torch.dtype | None], None]) -> nn.Module:
        from memclaims.techniques.impl.peft_adapters_fake import apply

        asked = asked_of(recipe, self.name)
        return apply(model, recipe.workload.name, effective(recipe.workload, asked), asked is not None,
                     lambda module, dtype: move(module, dtype))

    def sim_observe(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                    session: SimSession) -> Observed:
        from memclaims.techniques.impl.peft_adapters import parameter_fields

        return self.adapted(parameter_fields(model))


# memclaims' own: the adapters are put on the model in the one-device load (memclaims.measure.pipeline,
# memclaims.sim.replay); the ranks' engines build theirs without them.
_RANKS_DO_NOT_ADAPT = "memclaims applies the LoRA adapters in the one-device engines only; the multi-rank engines build the model without them"
CONFLICTS: tuple[tuple[str, str], ...] = (
    (STRATEGY, _RANKS_DO_NOT_ADAPT),
    ("optimizer-in-backward", "memclaims' in-backward step counts one step per parameter per backward; the frozen "
                              "base weights get no gradient, so their post-accumulate hooks never fire"),
)
WORKLOADS = ("lora_targets", "peft's LoRA adapters go on the attention projections of the text workloads "
             "(distilbert, distilbert-cased, bigbird: q_lin/v_lin, query/value) and of hf: models (peft's "
             "default target modules for their model type) and of user workloads that name theirs "
             "(memclaims.workloads.user.define's lora={'target_modules': [...]}); this workload names no modules to "
             "adapt")

# peft.get_peft_model(model, LoraConfig(r=8, lora_alpha=16, ...)) right after the model is built: the base
# weights frozen, rank-8 adapters on the workload's attention projections, its head trained (modules_to_save).
ENTRY = Technique(NAME, "peft LoRA: base weights frozen, rank-8 adapters (lora_alpha 16, dropout 0.1) on the "
                  "attention's query and value projections, the classification head trained (--lora-r, --lora-alpha, "
                  "--lora-dropout, --lora-targets)", "peft docs: LoRA", group="adapter",
                  in_cover=False, conflicts=CONFLICTS, workload_needs=WORKLOADS, parameters=LoraParameters,
                  hooks=Lora())
