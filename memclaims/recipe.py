"""A recipe: workload + scale + techniques, resolved into the settings the runner uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from memclaims import techniques as registry
from memclaims.errors import UsageError
from memclaims.workloads import Scale, Workload, workload as find_workload


@dataclass(frozen=True)
class Recipe:
    workload: Workload
    scale: Scale
    techniques: tuple[str, ...]  # canonical: registry order, ("fabric",) for the reference
    precision: str
    batch_size: int  # examples per optimizer step
    accumulation_steps: int
    optimizer: str
    init_on_device: bool
    plain_pytorch: bool
    # Multi-device (memclaims.distributed); defaults keep single-device recipes unchanged.
    sharded: bool = False
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    delayed_init: bool = False

    @property
    def id(self) -> str:
        return f"{self.workload.name}-{self.scale.name}/{'+'.join(self.techniques)}"

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


def resolve(workload_name: str, scale_name: str, technique_names: Iterable[str]) -> Recipe:
    work = find_workload(workload_name)
    scale = work.scale(scale_name)
    names = registry.canonical(technique_names)
    chosen = [registry.BY_NAME[n] for n in names]

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
        init_on_device=any(t.init_on_device for t in chosen),
        plain_pytorch=any(t.plain_pytorch for t in chosen),
        sharded=any(t.sharded for t in chosen),
        activation_checkpointing=any(t.activation_checkpointing for t in chosen),
        cpu_offload=any(t.cpu_offload for t in chosen),
        delayed_init=any(t.delayed_init for t in chosen),
    )


def parse_id(recipe_id: str) -> Recipe:
    """The inverse of ``Recipe.id``: ``vit-smoke/bf16-true+sgd``."""
    head, sep, tail = recipe_id.partition("/")
    workload_name, dash, scale_name = head.rpartition("-")
    if not sep or not dash or not tail:
        raise UsageError(f"malformed recipe id {recipe_id!r}; expected WORKLOAD-SCALE/TECHNIQUE[+TECHNIQUE...]")
    return resolve(workload_name, scale_name, tail.split("+"))
