"""The one Record builder: what an engine measured, assembled into a Record the same way for every engine.

Every engine measures named phases through a ``probes.PhaseRecorder`` (the real probes over the CUDA
allocator or the CPU's tensor accounting, the sim over its allocator model) and hands them here with
what it knows besides: ``memclaims.measure.pipeline`` for the real engines (Fabric on one device, CPU
and CUDA ranks), ``memclaims.sim.replay`` for the simulated GPU (one device, FSDP rank 0, and the
load-only replay of the 07 scripts). What follows from the phases (the load peak, the run's peaks, the
``phases`` entries) is derived here, once, so that a field means the same whichever engine filled it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memclaims.core.record import Record
from memclaims.core.tested_versions import version_fields

if TYPE_CHECKING:  # annotations only: the builder sits below the probes in the import layers
    from memclaims.measure.probes import PhasePeak
    from memclaims.recipes.recipe import Recipe

TOP_PHASES = ("load", "train", "accuracy")  # the recipe's own phases, in order; the step phases lie inside train
# The recipe's own phases the sim replays: no accuracy (fake tensors have no values to score).
SIM_PHASES = TOP_PHASES[:2]


def failed_phase(finished: Collection[str], phases: Sequence[str] = TOP_PHASES) -> str:
    """The phase an out-of-memory error is blamed on, by every engine: the first of the recipe's own
    ``phases`` (in order) that had not finished; the last one where all had."""
    return next((name for name in phases if name not in finished), phases[-1])


# What a run that watched no loss records (the sim: fake tensors have no value to read).
NO_LOSS: Mapping[str, object] = {"final_loss": None, "nan_loss": False, "nan_step": None}


def phase_fields(phases: Mapping[str, PhasePeak]) -> dict[str, dict[str, Any]]:
    """The Record's ``phases``: every phase's contract keys (``PhasePeak.entry``: allocated_bytes,
    above_start_bytes, reserved_bytes), and for the recipe's own phases the further peaks its reader
    folds (the sim's ``live_bytes``; the real probes fold none)."""
    return {name: {**peak.entry(), **(peak.extra if name in TOP_PHASES else {})} for name, peak in phases.items()}


def _largest(values: list[int | None]) -> int | None:
    """The largest, or None where a phase did not measure it (reserved bytes on the CPU)."""
    return None if any(v is None for v in values) else max(v for v in values if v is not None)


def build_record(recipe: Recipe, *, device: str, device_name: str, probe: str, precision: str, memory_steps: int,
                 param_count: int, param_tensor_count: int, phases: Mapping[str, PhasePeak],
                 step_peaks: Mapping[str, list[int]], peak_reserved_total_bytes: int | None,
                 weights: str, data: str, notes: list[str], observed: Mapping[str, Any],
                 breakdown: Mapping[str, int] | None = None, reference_load_peak_bytes: int | None = None,
                 accuracy: float | None = None, epoch_evaluations: list[dict[str, float]] | None = None,
                 losses: Mapping[str, Any] = NO_LOSS,
                 step_time_s: float | None = None, host_peak_bytes: int | None = None,
                 host_steps: Mapping[str, Mapping[str, Mapping[str, list[int]]]] | None = None,
                 environment: Mapping[str, Any] | None = None, accuracy_schedule: Mapping[str, Any] | None = None,
                 devices: int = 1, rank: int = 0) -> Record:
    """The Record of one run of ``recipe``.

    ``phases``: the recorder's phases, ``load`` always and ``train`` unless only the load ran; the
    load peak, the peaks allocated and reserved (the largest of load and train) and the ``phases``
    entries come from them. ``observed``: the model state bytes (param_bytes, grad_bytes,
    optimizer_state_bytes) and what the run saw of its techniques (``pipeline.observed_fields``, the
    loop's ``measured_fields``). ``losses``: the loop's ``loss_fields``. ``breakdown``: by category at
    the training peak; the train phase's where not given. ``peak_reserved_total_bytes``: the article's
    figure, reserved memory never reset (the engine knows how to read it)."""
    own = [phases[name] for name in ("load", "train") if name in phases]
    train = phases.get("train")
    return Record(
        **recipe.record_fields(),
        # What the engine passes through as it is, grouped: the device, the model's size.
        device=device, device_name=device_name, probe=probe, precision=precision, memory_steps=memory_steps,
        param_count=param_count, param_tensor_count=param_tensor_count,
        load_peak_bytes=phases["load"].allocated_bytes,
        peak_allocated_bytes=max(p.allocated_bytes for p in own),
        peak_reserved_bytes=_largest([p.reserved_bytes for p in own]),
        peak_reserved_total_bytes=peak_reserved_total_bytes,
        reference_load_peak_bytes=reference_load_peak_bytes,
        accuracy=accuracy,
        epoch_evaluations=[dict(e) for e in epoch_evaluations or []],
        **losses,
        step_time_s=step_time_s, weights=weights, data=data,
        **version_fields(),
        host_peak_bytes=host_peak_bytes,
        host_steps={counter: {name: {key: list(v) for key, v in entry.items()} for name, entry in by_phase.items()}
                    for counter, by_phase in (host_steps or {}).items()},
        devices=devices, rank=rank,
        environment=dict(environment or {}),
        phases=phase_fields(phases),
        step_peaks={name: list(peaks) for name, peaks in step_peaks.items()},
        breakdown=dict(breakdown if breakdown is not None else train.breakdown if train else {}),
        notes=notes,
        accuracy_schedule=dict(accuracy_schedule or {}),
        **observed,
    )
