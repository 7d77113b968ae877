"""A recipe: workload + scale + techniques, resolved into the settings the runner uses."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from typing import Any

from memclaims.core.errors import UsageError
from memclaims.techniques import technique_registry as registry
from memclaims.techniques.base import (
    FABRIC,
    BuildsOptimizer,
    Hooks,
    LoopOrder,
    Stack,
    Strategy,
    StrategyPlan,
    TechniqueParameters,
)
from memclaims.workloads.registry import workload as find_workload
from memclaims.workloads.types import Scale, Workload


@dataclass(frozen=True)
class Sizes:
    """Size knobs (``--batch-size``, ``--seq-len`` / ``--image-size``, ``--accumulation-steps``);
    None keeps the scale's own value. Set knobs appear in the recipe id, so baselines never collide."""

    batch_size: int | None = None  # examples per optimizer step, before small-batch divides it
    seq_len: int | None = None
    image_size: int | None = None
    accumulation_steps: int | None = None  # micro-batches per step under grad-accum

    # Field -> its short name in recipe ids (``vit-smoke[batch=8,image=32]/fabric``), and back.
    ID_NAMES = {"batch_size": "batch", "seq_len": "seq", "image_size": "image", "accumulation_steps": "accum"}

    def suffix(self) -> str:
        parts = [f"{self.ID_NAMES[f.name]}={getattr(self, f.name)}" for f in fields(self)
                 if getattr(self, f.name) is not None]
        return f"[{','.join(parts)}]" if parts else ""

    @classmethod
    def parse(cls, text: str) -> Sizes:
        """The inverse of ``suffix`` without its brackets: ``batch=8,image=32``."""
        by_short = {short: name for name, short in cls.ID_NAMES.items()}
        values: dict[str, int] = {}
        for part in filter(None, text.split(",")):
            key, _, value = part.partition("=")
            if key not in by_short or not value.isdigit() or int(value) < 1:
                raise UsageError(f"malformed size {part!r} in a recipe id; expected NAME=POSITIVE_INTEGER with "
                                 f"NAME one of {', '.join(by_short)}")
            values[by_short[key]] = int(value)
        return cls(**values)


@dataclass(frozen=True)
class Recipe:
    workload: Workload
    scale: Scale
    techniques: tuple[str, ...]  # canonical: registry order, ("fabric",) for the reference
    precision: str
    batch_size: int  # examples per optimizer step
    accumulation_steps: int
    optimizer: str
    # The training stack that runs the loop: a ``loop`` technique's name (``fabric``, the reference, where the
    # recipe names none; ``pytorch``, ``hf-trainer``, ``accelerate``, ``lightning-trainer``).
    stack: str
    numerics_neutral: bool = False  # only techniques that compute as others do (Technique.computes_as)
    sizes: Sizes = Sizes()
    # How torch steps the optimizer: "for-loop", "foreach" or "fused" (memclaims.techniques.optimizer_impl);
    # None: torch's own default for the device (for-loop on the CPU, foreach on CUDA), as before the choice existed.
    optimizer_impl: str | None = None
    # What the recipe asks of its techniques beyond their names (``Technique.parameters``: lora's rank, ...), by
    # technique name; only what differs from the workload's defaults, so that the id says exactly what was asked.
    parameters: tuple[tuple[str, TechniqueParameters], ...] = ()

    @property
    def id(self) -> str:
        techniques = "+".join(f"{name}{self._suffix(name)}" for name in self.techniques)
        return f"{self.workload.name}-{self.scale.name}{self.sizes.suffix()}/{techniques}"

    def _suffix(self, name: str) -> str:
        asked = self.parameters_of(name)
        return "" if asked is None else str(asked.suffix())

    def parameters_of(self, name: str) -> TechniqueParameters | None:
        """What the recipe asks of its technique ``name`` (its ``Technique.parameters``' value), or None."""
        return dict(self.parameters).get(name)

    @property
    def hooks(self) -> tuple[Hooks, ...]:
        """What the recipe's techniques do to a run (memclaims.techniques.base), in registry order."""
        return tuple(registry.BY_NAME[name].hooks for name in self.techniques)

    @property
    def distributed(self) -> Strategy | None:
        """How the recipe runs on several ranks: its strategy technique's hooks (memclaims.techniques.base.Strategy),
        which the multi-rank engines ask; None: it runs on one device."""
        return next((hooks for hooks in self.hooks if isinstance(hooks, Strategy)), None)

    @property
    def optimizer_owner(self) -> BuildsOptimizer | None:
        """The technique that builds the recipe's optimizer itself (``memclaims.techniques.base.BuildsOptimizer``:
        torchao's); None: the optimizer is one the engines' builder knows (memclaims.measure.optimizers)."""
        return next((hooks for hooks in self.hooks if isinstance(hooks, BuildsOptimizer)), None)

    @property
    def stack_hooks(self) -> Stack | None:
        """The hooks of the stack that runs the recipe's loop itself (memclaims.techniques.base.Stack), which the door
        runs on its driver; None: Fabric's or plain PyTorch's loop (memclaims.measure.runner)."""
        return next((hooks for hooks in self.hooks if isinstance(hooks, Stack)), None)

    @property
    def loop_order(self) -> LoopOrder:
        """The order the recipe's loop runs a step in (where it zeroes the gradients, ...): its stack's, or the
        article scripts' (Fabric, plain PyTorch)."""
        stack = self.stack_hooks
        return LoopOrder() if stack is None else stack.loop_order(self)

    def strategy_plan(self, world: int) -> StrategyPlan:
        """What the recipe's ``world`` ranks execute: its strategy's plan as each of its techniques changes it
        (``Hooks.plan_strategy``, registry order)."""
        strategy = self.distributed
        if strategy is None:
            raise UsageError(f"{self.id} runs on one device: it has no strategy to plan")
        plan = strategy.plan(self, world)
        for hooks in self.hooks:
            plan = hooks.plan_strategy(plan)
        return plan

    @property
    def converters(self) -> tuple[Hooks, ...]:
        """``hooks`` in the order their ``convert_module`` and ``sim_adapt`` change the model."""
        return tuple(sorted(self.hooks, key=lambda hooks: hooks.convert_order))

    @property
    def micro_batch_size(self) -> int:
        return self.batch_size // self.accumulation_steps

    def record_fields(self) -> dict[str, Any]:
        """The Record fields the recipe decides by itself, whichever engine runs it."""
        return dict(recipe=self.id, workload=self.workload.name, scale=self.scale.name,
                    techniques=list(self.techniques), batch_size=self.batch_size,
                    accumulation_steps=self.accumulation_steps)

    @property
    def learning_rate(self) -> float:
        return self.scale.sgd_learning_rate if self.optimizer == "sgd" else self.scale.learning_rate


def sized_scale(work: Workload, scale: Scale, sizes: Sizes, accumulates: bool) -> Scale:
    """The scale with the size knobs applied, or UsageError naming a knob the workload cannot take."""
    if sizes.image_size is not None and work.size_knob != "image":
        takes = f"it takes --{'seq-len' if work.size_knob == 'seq' else 'batch-size'}" if work.size_knob else \
            "it has no image or sequence size knob"
        raise UsageError(f"workload {work.name!r} takes no --image-size (it is not an image model); {takes}")
    if sizes.seq_len is not None and work.size_knob != "seq":
        raise UsageError(f"workload {work.name!r} takes no --seq-len (it is not a text model)"
                         + ("; it takes --image-size" if work.size_knob == "image" else ""))
    if sizes.accumulation_steps is not None and not accumulates:
        raise UsageError(f"--accumulation-steps {sizes.accumulation_steps} needs the grad-accum technique "
                         "(-t grad-accum), which splits each batch into that many micro-batches")
    # Each knob by name, so that replace() can check it against its Scale field's type.
    sized = scale if sizes == Sizes() else replace(
        scale,
        batch_size=scale.batch_size if sizes.batch_size is None else sizes.batch_size,
        image_size=scale.image_size if sizes.image_size is None else sizes.image_size,
        seq_len=scale.seq_len if sizes.seq_len is None else sizes.seq_len,
        accumulation_steps=scale.accumulation_steps if sizes.accumulation_steps is None else sizes.accumulation_steps)
    if work.check_scale is not None:
        work.check_scale(sized)
    return sized


def workload_refusal(work: Workload, names: Iterable[str]) -> str | None:
    """Why ``work`` cannot take one of the techniques ``names`` (the registry's ``workload_needs``), or None."""
    for name in names:
        needed = registry.technique(name).workload_needs
        if needed is not None and getattr(work, needed[0]) is None:
            return f"technique {name!r} does not run on workload {work.name!r}: {needed[1]}"
    return None


def for_workload(workload_name: str, selection: Iterable[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """The combinations of ``selection`` that workload ``workload_name`` takes: a tier's cases leave out
    the techniques a workload cannot take (``lora`` on a ViT), as ``resolve`` refuses them."""
    work = find_workload(workload_name)
    return [combo for combo in selection if workload_refusal(work, combo) is None]


def _asked(work: Workload, technique_names: Iterable[str],
           given: Iterable[TechniqueParameters]) -> tuple[list[str], dict[str, TechniqueParameters]]:
    """The technique names without their parameters (``lora[r=4]`` -> ``lora``) and what is asked of each: in a name
    (a recipe id), or ``given`` (an option's object, for the technique of the recipe that takes its kind)."""
    names: list[str] = []
    asked: dict[str, TechniqueParameters] = {}
    for text in technique_names:
        bracketed = _BRACKETED.match(text)
        name = bracketed.group("name") if bracketed else text
        names.append(name)
        if bracketed:
            kind = registry.technique(name).parameters
            if kind is None:
                raise UsageError(f"technique {name!r} takes no parameters; {text!r} gives some")
            asked[name] = kind.parse(bracketed.group("values"))
    for value in given:
        takers = [n for n in names if registry.technique(n).parameters is type(value)]
        if not takers:
            kinds = [t.name for t in registry.TECHNIQUES if t.parameters is type(value)]
            raise UsageError(f"{value.options()}: for {' or '.join('-t ' + k for k in kinds)}, which the recipe "
                             f"({'+'.join(names) or 'the reference'}) does not have")
        asked.update(dict.fromkeys(takers, value))
    return names, {name: value.beyond(work) for name, value in asked.items()}


def applicable(parameters: Iterable[TechniqueParameters], names: Iterable[str]) -> tuple[TechniqueParameters, ...]:
    """Those of ``parameters`` a technique of ``names`` takes: what an option asks, given to a matrix's or fit's
    combinations that have a technique to take it (lora's rank to the lora and qlora ones)."""
    kinds = {registry.technique(name).parameters for name in names}
    return tuple(value for value in parameters if type(value) in kinds)


def resolve(workload_name: str, scale_name: str, technique_names: Iterable[str], sizes: Sizes = Sizes(),
            parameters: Iterable[TechniqueParameters] = ()) -> Recipe:
    """The recipe; ``parameters``: what is asked of its techniques beyond their names (``Technique.parameters``'
    values, e.g. ``lora.LoraParameters(r=4)``), each for the recipe's technique that takes it."""
    work = find_workload(workload_name)
    plain, asked = _asked(work, technique_names, parameters)
    names = registry.canonical(plain)
    chosen = [registry.BY_NAME[n] for n in names]
    refused = workload_refusal(work, names)
    if refused:
        raise UsageError(refused)
    scale = sized_scale(work, work.scale(scale_name), sizes, any(t.accumulates for t in chosen))

    batch_size = scale.batch_size
    accumulation_steps = 1
    for t in chosen:
        batch_size //= t.batch_divisor
        if t.accumulates:
            accumulation_steps *= scale.accumulation_steps
    if batch_size % accumulation_steps or batch_size < accumulation_steps:
        raise UsageError(
            f"invalid combination {'+'.join(names)} at scale {scale.name!r}: batch {batch_size} "
            f"cannot be split into {accumulation_steps} micro-batches"
        )
    return Recipe(
        workload=work,
        scale=scale,
        techniques=names,
        precision=next((t.precision for t in chosen if t.precision), registry.FP32),
        batch_size=batch_size,
        accumulation_steps=accumulation_steps,
        optimizer=next((t.optimizer for t in chosen if t.optimizer), "adam"),
        optimizer_impl=next((t.optimizer_impl for t in chosen if t.optimizer_impl), None),
        stack=next((t.stack for t in chosen if t.stack), FABRIC),
        numerics_neutral=bool(chosen) and all(t.computes_as is not None for t in chosen),
        sizes=sizes,
        parameters=tuple((name, asked[name]) for name in names if name in asked and asked[name].suffix()),
    )


_SIZED_HEAD = re.compile(r"^(?P<head>.*?)\[(?P<sizes>[^\[\]]*)\]$")
_BRACKETED = re.compile(r"^(?P<name>[^\[\]]+)\[(?P<values>[^\[\]]*)\]$")
# A "+" between techniques, not one inside a technique's brackets (``lora[targets=q_proj+v_proj]``).
_BETWEEN_TECHNIQUES = re.compile(r"\+(?![^\[]*\])")


def parse_id(recipe_id: str) -> Recipe:
    """The inverse of ``Recipe.id``: ``vit-smoke/bf16-true+sgd``, ``vit-smoke[batch=8]/fabric``,
    ``hf:gpt2(n_layer=2)-smoke/bf16-true``, ``hf:llama-article/bf16-true+lora[r=4,targets=q_proj+v_proj]``."""
    head, sep, tail = recipe_id.rpartition("/")  # no "/" in a technique's parameters (LoraParameters.checked)
    sizes = Sizes()
    sized = _SIZED_HEAD.match(head)
    if sized:
        head, sizes = sized.group("head"), Sizes.parse(sized.group("sizes"))
    workload_name, dash, scale_name = head.rpartition("-")
    if not sep or not dash or not tail:
        raise UsageError(f"malformed recipe id {recipe_id!r}; expected WORKLOAD-SCALE[SIZES]/TECHNIQUE[+TECHNIQUE...]")
    return resolve(workload_name, scale_name, _BETWEEN_TECHNIQUES.split(tail), sizes)

