"""Host steady state: after warm-up, the process must not grow on the host from step to step.

``memclaims.measure.steady`` holds device memory to exact repetition; host memory cannot be held so:
the resident set moves by page-sized amounts as glibc and torch's CPU allocator grow and trim their
heaps, and Python's block count by the objects libraries create and drop lazily. So growth is judged
against the measured noise of identical steps (``THRESHOLDS``), per counter of
``memclaims.measure.host``:

- the growth per step is the median of the step-to-step differences of the level at the end of each
  optimizer step, over the steady steps (step 2 on); the median ignores one late warm-up jump and a
  real leak moves every difference;
- the phase is named by what it gains per step above the same phase of a clean reference Record of the
  same recipe (its baseline, or the regression tests' clean run): in a steady step every phase's
  gain is freed again later in the step, so a level that grows says that the step leaks, and only a
  clean run of the same recipe says which phase's gain did not come back.
"""

from __future__ import annotations

import statistics

from memclaims.core.record import Record
from memclaims.measure.host import BYTE_COUNTERS, GAINED, LEVEL, MALLOC, PYTHON_BLOCKS, RSS
from memclaims.measure.steady import MICRO_BATCH_PHASES

MIB = 1024 * 1024
# Growth per step that fails a case, per counter. Measured on this project's 2-core CI class
# (x86_64 avx2, torch 2.14.1, Lightning 2.6.6), vit-smoke/{fabric, grad-accum, adamw}, 8 measured steps,
# 2 runs each in one process (Record.host_steps of each, memory_steps=8): the median step-to-step growth of the
# step-end level was at most 14 KiB (RSS) and 50 blocks; single differences reached 1.05 MiB and 379
# blocks (the first steady step). malloc_bytes, measured the same way on an x86_64 avx512-bf16 machine
# (the same vit recipes and distilbert-smoke/bf16-true): medians at most 4.4 KiB, single differences
# up to 48 KiB, one of 9.2 MiB (distilbert's last step, once in 8 runs; the median passes over it).
# The thresholds stand above all of that and below the regressions they are for: a few MiB per
# step, a few thousand small objects per step.
THRESHOLDS = {RSS: 2 * MIB, MALLOC: 1 * MIB, PYTHON_BLOCKS: 1000}
UNITS = {RSS: "B", MALLOC: "B", PYTHON_BLOCKS: "blocks"}


def _period(record: Record, phase: str) -> int:
    return record.accumulation_steps if phase in MICRO_BATCH_PHASES else 1


def _per_step(record: Record, phase: str, values: list[int], last: bool) -> list[int]:
    """One value per optimizer step: a micro-batch phase's last (levels) or summed (gains)
    occurrence of each step. Occurrence 0 is step 1 (05 steps after its first micro-batch)."""
    period = _period(record, phase)
    steps = [values[:1]] + [values[start:start + period] for start in range(1, len(values), period)]
    steps = [s for s in steps if len(s) == (1 if s is steps[0] else period)]
    return [s[-1] if last else sum(s) for s in steps]


def growth_per_step(record: Record, counter: str) -> float | None:
    """Median step-to-step growth of the level at the end of each optimizer step (step 2 on);
    None with fewer than 3 steps or no host measurement."""
    phases = record.host_steps.get(counter, {})
    if "optimizer_step" not in phases:
        return None
    # The step's last phase: optimizer_step, or zero_grad where it follows the step (accumulation).
    last_phase = "zero_grad" if record.accumulation_steps > 1 and "zero_grad" in phases else "optimizer_step"
    levels = _per_step(record, last_phase, phases[last_phase][LEVEL], last=True)[1:]
    if len(levels) < 3:
        return None
    return float(statistics.median(b - a for a, b in zip(levels, levels[1:])))


def phase_gains(record: Record, counter: str) -> dict[str, float]:
    """Each phase's mean gain per steady optimizer step (step 2 on)."""
    result = {}
    for phase, entry in record.host_steps.get(counter, {}).items():
        gains = _per_step(record, phase, entry[GAINED], last=False)[1:]
        if gains:
            result[phase] = statistics.mean(gains)
    return result


def _fmt(counter: str, value: float) -> str:
    if counter in BYTE_COUNTERS:
        return f"{value:+,.0f} B ({value / MIB:+.2f} MiB)"
    return f"{value:+,.0f} {UNITS[counter]}"


def leak(record: Record, reference: Record | None = None) -> str | None:
    """A failure message per counter whose step-end level grows beyond its threshold, naming the
    phase (against ``reference``, a clean Record of the same recipe) and the growth per step."""
    lines = []
    for counter, threshold in THRESHOLDS.items():
        growth = growth_per_step(record, counter)
        if growth is None or growth <= threshold:
            continue
        gains = phase_gains(record, counter)
        clean = phase_gains(reference, counter) if reference is not None else {}
        if clean:
            excess = {phase: gain - clean.get(phase, 0.0) for phase, gain in gains.items()}
            phase = max(excess, key=lambda p: excess[p])
            where = (f"in phase {phase} ({_fmt(counter, excess[phase])} per step above a clean run "
                     f"of the recipe)")
        else:
            where = ("in a phase this run cannot name (no clean reference with host_steps: refresh the "
                     "baseline); gains per step by phase " + ", ".join(
                         f"{p} {_fmt(counter, g)}" for p, g in sorted(gains.items())))
        lines.append(f"{record.recipe}: host memory grows across steps (a host leak): {counter} "
                     f"{_fmt(counter, growth)} per step {where}; threshold {_fmt(counter, threshold)} per "
                     f"step (memclaims.measure.host_steady.THRESHOLDS)")
    return "\n".join(lines) if lines else None
