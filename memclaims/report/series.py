"""The ViT-H/14 series and the LLM bonus rows in ``memclaims reproduce --all`` (cpu and cuda).

Each series is a list of the named recipes (memclaims.recipes.named: their techniques and published
numbers), each bar measured on this machine and shown as its ratio to the series' first bar, the
published ratio beside it. What the tier cannot run as published is substituted and said so
(smoke scale, CPU ranks for GPUs, bf16-mixed for 16-mixed, and what each technique says of itself on the
device, ``Hooks.stand_in``: no CPU offload, DeepSpeed on CUDA only).

Verdict of a bar, against the bar before it (as the chain's rows): the ratio must be below 1 (the
direction the article reports) and at or above a floor derived from the exact bytes of the bar
before: what the added techniques could remove at most. Sharding over N ranks divides parameters,
gradients, optimizer state and (the batch split across ranks) activations by N at best; bf16-true
halves an fp32 or mixed-precision run's model state and activations at best; micro-batches of 1/m
divide activations by m at best; the techniques added say what they remove at most (``Hooks.removes``):
activation checkpointing every activation, CPU offload the model state. A ratio below that floor means the
accounting lost bytes; a
ratio at or above 1 means the technique saved nothing, except where a technique names the phase it removes from
(``Removal.phase``: checkpointing, the forward's activations): a peak equal to the byte holds when that phase
falls, as the peak then lies in a phase the technique does not touch (a smoke-scale FSDP rank's fp32 optimizer
step, the bf16 all-gathers Lightning configures keeping the forward below it). The published ratios (4 GPUs, article
scale) are shown, not asserted: the scale and the number of ranks change them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memclaims.core.record import Record
from memclaims.recipes.named import NAMED_RECIPES, NamedRecipe
from memclaims.recipes.recipe import Recipe, resolve
from memclaims.techniques import technique_registry as registry
from memclaims.techniques.base import Removal
from memclaims.workloads.registry import workload as find_workload

# (series, title, named recipes in bar order)
SERIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("vit-h14", "ViT-H/14 at 518 px, 16-mixed, batch 4 per GPU (figure, bars read to about +-0.1 GB)",
     ("vit-h14-one-gpu", "vit-h14-fsdp", "vit-h14-fsdp-checkpointing", "vit-h14-fsdp-checkpointing-offload")),
    ("distilbert", "DistilBERT on IMDb, before -> after (LLM bonus)", ("distilbert-before", "distilbert-after")),
    ("bigbird", "BigBird on IMDb, before -> after (LLM bonus)", ("bigbird-before", "bigbird-after")),
)
HALF_FROM = frozenset({"32-true", "16-mixed", "bf16-mixed"})  # model state in fp32
TRUE_HALF = frozenset({"16-true", "bf16-true"})

# Measures recipes on a device: one list of Records per recipe (rank 0 first; one for a single process).
MeasureFn = Callable[[Sequence[Recipe], str], list[list[Record]]]


@dataclass(frozen=True)
class Bar:
    series: str
    named: NamedRecipe
    techniques: tuple[str, ...] | None  # what runs on this device; None: it cannot run here
    substitutions: tuple[str, ...]  # what differs from the published run, in words
    why_not: str = ""  # why the bar does not run here


def plan(device: str, scale: str) -> list[Bar]:
    """Every bar of every series, with what runs on ``device`` at ``scale`` and what is substituted."""
    bars = []
    for series, _title, names in SERIES:
        previous: tuple[str, ...] | None = None
        for name in names:
            named = NAMED_RECIPES[name]
            techniques, subs, why = named.techniques, [], ""
            if scale != named.scale:
                subs.append(f"{scale} scale (published: {named.scale})")
            if device == "cpu" and "16-mixed" in techniques:
                subs.append("bf16-mixed for 16-mixed (Lightning has no float16 AMP on the CPU)")
            workload = find_workload(named.workload)
            for technique in named.techniques:  # what a technique says of itself where it cannot run as published
                stand_in = registry.technique(technique).hooks.stand_in(workload, device)
                if stand_in is None:
                    continue
                if stand_in.dropped:
                    kept = tuple(t for t in techniques if t != technique)
                    if kept == previous:
                        techniques, why = (), stand_in.refused
                        break
                    techniques = kept
                subs.append(stand_in.said)
            if any(registry.technique(technique).distributed for technique in techniques):
                subs.append(f"CPU ranks (gloo) instead of {named.devices} GPUs" if device == "cpu"
                            else f"every GPU of this machine instead of {named.devices}")
            subs += [f"without {need.split(' (')[0]}" for need in named.extra_needs]
            if techniques:
                previous = techniques
            bars.append(Bar(series, named, techniques or None, tuple(subs), why))
    return bars


def recipes(bars: Sequence[Bar], scale: str) -> dict[str, Recipe]:
    """Named recipe -> the recipe that runs here, for the bars that run."""
    return {b.named.name: resolve(b.named.workload, scale, b.techniques) for b in bars if b.techniques is not None}


@dataclass(frozen=True)
class Step:
    passed: bool | None  # None: no verdict (the first bar, or a bar that did not run)
    detail: str


def _state(record: Record) -> int:
    return record.param_bytes + record.grad_bytes + record.optimizer_state_bytes


def removals(before: Record, after: Record) -> list[Removal]:
    """What each technique ``after`` adds to ``before`` says it removes at most (registry order)."""
    added = set(after.techniques) - set(before.techniques)
    found = (registry.technique(name).hooks.removes(after) for name in registry.BY_NAME if name in added)
    return [removal for removal in found if removal is not None]


def floor(before: Record, after: Record, peak: Callable[[Record], int]) -> tuple[float, str]:
    """The lowest ratio peak(after) / peak(before) the techniques ``after`` adds could reach, and why."""
    state, total = _state(before), peak(before)
    activations = max(0, total - state)
    state_f = act_f = 1.0
    why = []
    if after.precision in TRUE_HALF and before.precision in HALF_FROM:
        state_f, act_f = 0.5, 0.5
        why.append("half precision halves both")
    micro_before = before.batch_size // before.accumulation_steps
    micro_after = after.batch_size // after.accumulation_steps
    if micro_after < micro_before:
        act_f *= micro_after / micro_before
        why.append(f"micro-batch {micro_before} -> {micro_after}")
    for removal in removals(before, after):
        state_f, act_f = state_f * removal.state, act_f * removal.rest
        why.append(removal.why)
    value = (state * state_f + activations * act_f) / total
    return value, (f"floor {value:.3f}: of the bar before's {total:,} B, model state {state:,} B x {state_f:g} "
                   f"+ the rest {activations:,} B x {act_f:g} ({'; '.join(why) or 'nothing removable'})")


def _phase_lowered(before: Record, after: Record) -> str:
    """The fall, in words, of the phase a technique ``after`` adds removes from (``Removal.phase``); "" when it did
    not fall, no added technique names a phase, or a Record has no phases. ``step`` reads it where the peak stayed
    equal: the peak then lies in a phase the added techniques leave as it was."""
    for removal in removals(before, after):
        was, now = (r.phases.get(removal.phase or "", {}).get("allocated_bytes") for r in (before, after))
        if was and now is not None and now < was:
            return (f"the peak lies in a phase the added techniques leave; the {removal.phase} phase falls to "
                    f"{now / was:.3f} of the bar before's ({now:,} / {was:,} B)")
    return ""


def step(before: Record | None, after: Record | None, peak: Callable[[Record], int],
         published_ratio: float | None) -> Step:
    """The bar's verdict against the bar before it: below it, and not below the derived floor."""
    if after is None:
        return Step(None, "")
    if before is None:
        return Step(None, "no bar before it ran here: no ratio to judge")
    shown = f"; published {published_ratio:.3f} (4 GPUs, article scale: shown, not asserted)" \
        if published_ratio is not None else "; no published ratio (the bar before did not run)"
    no_verdict = next((removal.no_verdict for removal in removals(before, after) if removal.no_verdict), None)
    if no_verdict:
        return Step(None, no_verdict + shown)
    ratio = peak(after) / peak(before)
    low, why = floor(before, after, peak)
    lowered = _phase_lowered(before, after) if ratio == 1 else ""
    if lowered:
        where = f"within band ({lowered})"
    elif ratio >= 1:
        where = f"outside, {ratio - 1:+.3f} above the bar before"
    elif ratio < low:
        where = f"outside, {low - ratio:.3f} below the floor"
    else:
        where = "within band"
    return Step(where.startswith("within band"),
                f"{after.recipe} / {before.recipe}: ratio {ratio:.3f} ({peak(after):,} / {peak(before):,} B, rank 0); "
                f"band [{low:.3f}, 1) ({why}); {where}" + shown)
