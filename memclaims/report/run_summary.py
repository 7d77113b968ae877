"""What ``memclaims run`` prints for a person: what it resolved, the peak with its unit, the model states and the
per-phase peaks as a small table; the full Record only with ``--json``.

Pure text from a Record (or a sharded run's Records): no measurement here. Written by hand: no library formats a
memclaims Record. GB are decimal (1e9 B, the article's ``max_memory_reserved() / 1e9``), GiB binary (2^30 B).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from memclaims.core.record import GRADIENTS, PARAMETERS

if TYPE_CHECKING:
    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe

GB, GIB = 10**9, 2**30
MB, MIB = 10**6, 2**20
UNITS_NOTE = "GB = 1e9 B, GiB = 2^30 B; the full Record: memclaims run ... --json"
# The step phases in the order a step runs them, then the whole-run ones; a phase not listed comes after.
_PHASE_ORDER = ("load", "forward", "backward", "clip_grad_norm", "optimizer_step", "zero_grad", "train",
                "evaluation")


def size(value: int | None) -> str:
    """``5.51 GB (5.13 GiB)``; below 0.1 GB in MB and MiB; ``-`` for None."""
    if value is None:
        return "-"
    if abs(value) >= GB // 10:
        return f"{value / GB:.2f} GB ({value / GIB:.2f} GiB)"
    return f"{value / MB:.2f} MB ({value / MIB:.2f} MiB)"


def profile_words(name: str) -> str:
    """``profile 'current' (A100 with today's torch defaults: ...), replaying torch ..., bitsandbytes ...``: which
    simulated GPU and which releases of the libraries that move memory answer (a profile's eras included: ``--era``,
    ``memclaims.core.library_eras``), as run, fit, reproduce and fidelity say it."""
    from memclaims.sim import profile

    chosen = profile(name)
    releases = ", ".join(f"{library} {release}" for library, release in chosen.releases().items())
    return f"profile {name!r} ({chosen.summary}), replaying {releases}"


def _column_unit(values: Sequence[int | None]) -> tuple[str, int]:
    """One decimal unit for a table's byte columns: GB where the largest is 0.1 GB or more, else MB."""
    largest = max((abs(v) for v in values if v is not None), default=0)
    return ("GB", GB) if largest >= GB // 10 else ("MB", MB)


def _cell(value: int | None, scale: int) -> str:
    return "-" if value is None else f"{value / scale:.3f}"


def resolved_lines(recipe: Recipe, record: Record, device_words: str, aliases: Sequence[str] = ()) -> list[str]:
    """What the run was: the recipe id, the workload and scale, batch and size, precision, the device."""
    scale = recipe.scale
    sizes = [f"{name} {value}" for name, value in (("sequence length", scale.seq_len),
                                                    ("image size", scale.image_size)) if value is not None]
    techniques = ", ".join(recipe.techniques)
    if aliases:
        techniques += f" ({', '.join(aliases)})"
    batch = f"batch {recipe.batch_size}"
    if recipe.accumulation_steps > 1:
        batch += f" in {recipe.accumulation_steps} micro-batches of {recipe.batch_size // recipe.accumulation_steps}"
    return [
        f"{record.recipe}",
        f"  workload     {recipe.workload.name}, scale {scale.name}: {scale.summary}",
        f"  techniques   {techniques}",
        *_parameters_lines(recipe),
        f"  run          {batch}{', ' + ', '.join(sizes) if sizes else ''}, precision {record.precision}, "
        f"stack {recipe.stack}, {record.memory_steps} optimizer steps measured",
        f"  device       {device_words}",
    ]


def _parameters_lines(recipe: Recipe) -> list[str]:
    """What each technique that takes parameters ran with, the defaults included (lora's rank, ...)."""
    from memclaims.techniques import technique_registry as registry

    lines = []
    for name in recipe.techniques:
        kind = registry.technique(name).parameters
        if kind is not None:
            asked = recipe.parameters_of(name) or kind()
            lines.append(f"  {name:<12} {asked.described(recipe.workload)}")
    return lines


def _parameter_line(record: Record) -> str:
    """The parameter count a person means: a 4-bit weight by its original shape, not its packed storage."""
    # What peft's adapted model showed (lora's part of the Record; qlora's: its 4-bit weights).
    packed = record.observed("qlora", "quantized_parameter_bytes")
    trainable, counted = (record.observed("lora", key) for key in ("trainable_parameters", "total_parameters"))
    if packed is not None:
        total = f"{counted:,} {PARAMETERS}" if counted is not None else PARAMETERS
        shown = f", {trainable:,} trainable" if trainable is not None else ""
        return (f"{total}{shown} ({record.param_count:,} elements as stored: 4-bit weights packed two to a byte, "
                f"{size(packed)} of them)")
    shown = f", {trainable:,} trainable" if trainable is not None and trainable != record.param_count else ""
    return f"{record.param_count:,} parameters in {record.param_tensor_count} tensors{shown}"


def memory_lines(record: Record) -> list[str]:
    """The answer first (the peak with its unit), the model states, then the per-phase peaks as a table."""
    lines: list[str] = []
    if record.peak_reserved_total_bytes is not None:
        lines.append(f"peak reserved   {size(record.peak_reserved_total_bytes)}   loading included, the figure the "
                     "article prints (max_memory_reserved)")
    elif record.peak_reserved_bytes is not None:
        lines.append(f"peak reserved   {size(record.peak_reserved_bytes)}")
    exact = " (exact tensor bytes)" if record.device == "cpu" else ""
    lines.append(f"peak allocated  {size(record.peak_allocated_bytes)}{exact}")
    lines.append(f"load peak       {size(record.load_peak_bytes)}")
    lines.append(f"model           {_parameter_line(record)}")
    lines.append(f"  parameters {size(record.param_bytes)}, gradients {size(record.grad_bytes)}, "
                 f"optimizer state {size(record.optimizer_state_bytes)}")
    lines += phase_table(record)
    step = record.predicted_step_s if record.predicted_step_s is not None else record.step_time_s
    if step is not None:
        lines.append(f"step time       {step:.3f} s{' (predicted)' if record.predicted_step_s is not None else ''}")
    if record.accuracy is not None:
        lines.append(f"accuracy        {record.accuracy * 100:.2f} %")
    if record.nan_loss:
        lines.append(f"loss            NaN from step {record.nan_step}")
    return lines


def phase_table(record: Record) -> list[str]:
    """Each phase's peaks: allocated, above what was live when it began, reserved where the device has it."""
    if not record.phases:
        return []
    order = {name: index for index, name in enumerate(_PHASE_ORDER)}
    names = sorted(record.phases, key=lambda n: (order.get(n, len(order)), n))
    reserved = any(record.phases[n].get("reserved_bytes") is not None for n in names)
    columns = ("allocated_bytes", "above_start_bytes", *(("reserved_bytes",) if reserved else ()))
    unit, scale = _column_unit([record.phases[n].get(c) for n in names for c in columns])
    headers = ("allocated", "above start", "reserved")[:len(columns)]
    lines = [f"  {'phase (' + unit + ')':<16}" + "".join(f"{h:>13}" for h in headers)]
    for name in names:
        lines.append(f"  {name:<16}" + "".join(f"{_cell(record.phases[name].get(c), scale):>13}" for c in columns))
    return lines


def summary(recipe: Recipe, record: Record, device_words: str, aliases: Sequence[str] = ()) -> list[str]:
    """One process's run: what it resolved, then its memory."""
    return [*resolved_lines(recipe, record, device_words, aliases), *memory_lines(record), UNITS_NOTE]


def sharded_summary(recipe: Recipe, records: Sequence[Record], device_words: str,
                    aliases: Sequence[str] = ()) -> list[str]:
    """A sharded run: rank 0's resolution and memory (the article's figure), then one line per rank and the
    largest over ranks, each a short table row."""
    first = records[0]
    lines = resolved_lines(recipe, first, device_words + f", {len(records)} ranks", aliases)
    lines.append("rank 0 (the article's figure):")
    lines += [f"  {line}" for line in memory_lines(first)]
    reserved = any(r.peak_reserved_bytes is not None for r in records)
    fields: list[tuple[str, str]] = [("peak_allocated_bytes", "allocated"),
                                     *((("peak_reserved_bytes", "reserved"),) if reserved else ()),
                                     ("param_bytes", PARAMETERS), ("grad_bytes", GRADIENTS),
                                     ("optimizer_state_bytes", "optim state")]
    values = [[getattr(r, f) for f, _ in fields] for r in records]
    unit, scale = _column_unit([v for row in values for v in row])
    lines.append(f"  {'rank (' + unit + ')':<16}" + "".join(f"{h:>13}" for _, h in fields))
    for record, row in zip(records, values, strict=True):
        lines.append(f"  {record.rank:<16}" + "".join(f"{_cell(v, scale):>13}" for v in row))
    largest = [max((v for v in column if v is not None), default=None) for column in zip(*values, strict=True)]
    lines.append(f"  {'max over ranks':<16}" + "".join(f"{_cell(v, scale):>13}" for v in largest))
    lines.append(UNITS_NOTE)
    return lines
