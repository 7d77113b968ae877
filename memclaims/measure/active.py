"""Is every technique of a recipe visibly at work in its Record?

A technique that silently does nothing (an 8-bit optimizer that keeps 32-bit state, a batch size
the loader ignores, an init_module that builds in fp32 anyway) leaves the memory numbers of a
smaller recipe looking plausible; only what the run observed tells. ``problems`` reads the
observed fields of a Record (memclaims.measure.loop and memclaims.measure.runner fill them) and names each
technique whose effect is missing. Every case that runs a recipe asserts it is empty.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from memclaims.core.precision import PRECISIONS
from memclaims.core.record import Record
from memclaims.measure.optimizers import EIGHT_BIT
from memclaims.techniques import technique_registry as registry
from memclaims.techniques.base import ChecksRanks, JudgesParameterBytes

if TYPE_CHECKING:
    from memclaims.recipes.recipe import Recipe

# What the linear layers compute in under each half precision, as the Record names dtypes.
HALF_DTYPE = {name: str(p.compute_dtype).removeprefix("torch.") for name, p in PRECISIONS.items()
              if p.compute_dtype != PRECISIONS["32-true"].compute_dtype}
TRUE_HALF = tuple(name for name, p in PRECISIONS.items() if p.true_half)


def problems(recipe: Recipe, record: Record, without: Mapping[str, Record] | None = None) -> list[str]:
    """One line per technique of ``recipe`` whose effect ``record`` does not show.

    ``without[name]``: the Record of the same recipe without technique ``name``, for the effects
    only a comparison shows (activation checkpointing lowers what the forward pass saves).
    """
    found: list[str] = []

    def say(technique: str, text: str) -> None:
        found.append(f"{record.recipe}: {technique} is not active: {text}")

    def saying(technique: str) -> Callable[[str], None]:
        return lambda text: say(technique, text)

    single = record.devices == 1
    _precision(recipe, record, single, say)
    _batch(recipe, record, say)
    # The optimizer, a core field of the recipe: its technique is the one that chose it.
    chose = next((name for name in recipe.techniques if registry.technique(name).optimizer == recipe.optimizer), None)
    if recipe.optimizer == "sgd" and record.optimizer_state_bytes != 0:
        say("sgd", f"optimizer_state_bytes is {record.optimizer_state_bytes:,} B; plain SGD keeps no state")
    if chose is not None and recipe.optimizer in EIGHT_BIT and not (
            record.device == "sim" and not record.optimizer_state_by_dtype):  # the sim observes no dtypes
        name = chose
        quantized = record.optimizer_state_by_dtype.get("uint8", 0)
        if quantized == 0:
            say(name, f"no uint8 optimizer state (state bytes by dtype {record.optimizer_state_by_dtype}, "
                      f"min_8bit_size {record.min_8bit_size}): every state stayed 32-bit")
        elif single and record.optimizer_state_bytes > 4 * record.param_count:
            say(name, f"optimizer_state_bytes {record.optimizer_state_bytes:,} B is above 4 B per parameter "
                      f"({record.param_count:,} parameters); 8-bit Adam keeps about 2")
    for name, hooks in zip(recipe.techniques, recipe.hooks):  # each technique's own check (memclaims.techniques)
        hooks.check(recipe, record, (without or {}).get(name) if hooks.compare_without() else None, saying(name))
    return found


def rank_problems(records: Sequence[Record]) -> list[str]:
    """What only the ranks of one run together show (``ChecksRanks.rank_check``: DDP's gradients, all-reduced, are
    bit for bit the same on every rank after the backward)."""
    names = dict.fromkeys(name for record in records for name in record.techniques)
    checks = (registry.technique(name).hooks for name in names)
    return [line for hooks in checks if isinstance(hooks, ChecksRanks) for line in hooks.rank_check(records)]


def _precision(recipe: Recipe, record: Record, single: bool,
               say: Callable[[str, str], None]) -> None:
    ran = record.precision  # on the CPU Lightning runs 16-mixed as bf16-mixed; the Record says so
    if any(isinstance(hooks, JudgesParameterBytes) and hooks.judges_parameter_bytes(record) for hooks in recipe.hooks):
        pass  # parameters stored in a technique's own dtype (qlora's 4-bit base): its own check counts them
    elif ran in TRUE_HALF:
        if single and record.param_bytes != 2 * record.param_count:
            say(recipe.precision, f"param_bytes {record.param_bytes:,} B is not 2 B x {record.param_count:,} "
                                  "parameters: the parameters are not half precision")
    elif single and record.param_bytes != 4 * record.param_count:
        say(recipe.precision, f"param_bytes {record.param_bytes:,} B is not 4 B x {record.param_count:,} "
                              "parameters: the parameters are not float32")
    if record.device == "sim" and not record.compute_dtypes:
        return  # the sim does not observe dtypes; its parameter bytes are checked above
    expected = HALF_DTYPE.get(ran, "float32")
    if record.compute_dtypes != [expected]:
        technique = ran if ran in HALF_DTYPE else "fp32 (no precision technique)"
        say(technique, f"the linear layers computed in {record.compute_dtypes or 'nothing observed'}, "
                       f"expected [{expected!r}]")


def _batch(recipe: Recipe, record: Record, say: Callable[[str, str], None]) -> None:
    if record.device == "sim" and record.step_examples is None:
        return  # the sim builds its inputs from the recipe; nothing to observe
    technique = "small-batch" if "small-batch" in recipe.techniques else "batch size"
    if record.step_examples != recipe.batch_size:
        say(technique, f"the last measured optimizer step consumed {record.step_examples} examples, "
                       f"expected the recipe's batch of {recipe.batch_size}")
    if record.step_micro_batches != recipe.accumulation_steps:
        technique = "grad-accum" if recipe.accumulation_steps > 1 else "optimizer step per batch"
        say(technique, f"the optimizer stepped after {record.step_micro_batches} micro-batches, "
                       f"expected {recipe.accumulation_steps}")
