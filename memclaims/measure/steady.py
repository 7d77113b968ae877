"""Steady state: from the second optimizer step on, every step phase must peak where step 2 did.

Step 1 creates the optimizer state and the first gradients, so it differs; every later step holds
the same tensors as step 2 at the same moments. A peak that grows from step to step is a leak
(a tensor kept per step: a loss history holding its graph, a cache keyed by step). On the cpu tier
the accounting is exact, so any growth, even of a few bytes, is one.
"""

from __future__ import annotations

from memclaims.core.record import Record

# Phases that run once per micro-batch; the others once per optimizer step (zero_grad runs once
# per micro-batch only without accumulation, where a micro-batch is a step).
MICRO_BATCH_PHASES = ("forward", "backward")


def _period(record: Record, phase: str) -> int:
    return record.accumulation_steps if phase in MICRO_BATCH_PHASES else 1


def leak(record: Record) -> str | None:
    """A failure message naming each phase whose peak grows after step 2, with bytes per step;
    None when every measured step repeats step 2 (or fewer than 3 steps were measured)."""
    lines = []
    for phase, peaks in sorted(record.step_peaks.items()):
        period = _period(record, phase)
        # Occurrence 0 is step 1 (05 steps after its first micro-batch); step k covers the
        # occurrences 1 + (k - 2) * period .. (k - 1) * period.
        cycles = [peaks[start:start + period] for start in range(1, len(peaks), period)]
        cycles = [c for c in cycles if len(c) == period]
        if len(cycles) < 2:
            continue
        reference = cycles[0]
        grown = [(index, cycle) for index, cycle in enumerate(cycles[1:], start=1)
                 if any(now > then for now, then in zip(cycle, reference))]
        if not grown:
            continue
        last_index, last = len(cycles) - 1, cycles[-1]
        growth = max(last) - max(reference)
        per_step = growth / last_index
        lines.append(
            f"{record.recipe}: phases.{phase}.allocated_bytes grows across steps (a leak): "
            f"step 2 peak {max(reference):,} B, step {last_index + 2} peak {max(last):,} B, "
            f"{per_step:+,.0f} B per step; first growth at step {grown[0][0] + 2}; "
            f"per-step peaks {[max(c) for c in cycles]}"
        )
    return "\n".join(lines) if lines else None
