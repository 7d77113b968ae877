"""A watched run's Record, assembled by memclaims' one Record builder (``memclaims.measure.record_builder``).

What a recipe decides by itself in memclaims' own runs (``Recipe.record_fields``) the watch reads off the run: the
Record's ``recipe`` is the watch's name, ``workload`` the model's class, ``batch_size`` the rows of the first training
forward, ``accumulation_steps`` the forwards per optimizer step (the first step's), ``techniques`` none.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from memclaims.core.record import Record, device_name, environment_facts
from memclaims.measure import probes as probe_module
from memclaims.measure import tensors
from memclaims.measure.pipeline import never_reset_reserved
from memclaims.measure.record_builder import build_record
from memclaims.watching.phases import StepPhases

if TYPE_CHECKING:
    from memclaims.watching.on_sim import SimProbe

USER = "user"  # the Record's scale, weights and data: the user's own, which memclaims did not choose


class WatchedRun:
    """The recipe side of a watched run (duck-typed for ``build_record``, which asks only ``record_fields``)."""

    def __init__(self, name: str, model: nn.Module, phases: StepPhases) -> None:
        self.id, self.model, self.phases = name, model, phases

    def record_fields(self) -> dict[str, Any]:
        micro = self.phases.micro_batches
        return dict(recipe=self.id, workload=type(self.model).__name__, scale=USER, techniques=[],
                    batch_size=self.phases.batch_size or 0, accumulation_steps=max(micro[0] if micro else 1, 1))


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _loss_fields(losses: list[float]) -> dict[str, Any]:
    nan_step = next((index for index, loss in enumerate(losses) if not math.isfinite(loss)), None)
    return dict(final_loss=_number(losses[-1]) if losses else None, nan_loss=nan_step is not None, nan_step=nan_step,
                memory_losses=[_number(loss) for loss in losses])


def _bytes_by(values: Sequence[torch.Tensor], key: Callable[[torch.Tensor], str],
              count: Callable[[Iterator[torch.Tensor]], int]) -> dict[str, int]:
    """``tensors.bytes_by`` with the storages counted by ``count`` (by identity on the sim)."""
    return {name: count(t for t in values if key(t) == name) for name in sorted({key(t) for t in values})}


def build(run: WatchedRun, model: nn.Module, phases: StepPhases, probe: probe_module.Probe, *, device: str,
          host_peak_bytes: int | None, host_steps: Mapping[str, Mapping[str, Mapping[str, list[int]]]],
          sim: SimProbe | None = None) -> Record:
    params = list(model.parameters())
    count = tensors.storage_bytes if sim is None else sim.storage_bytes
    state = [t for optimizer in phases.optimizers for t in tensors.optimizer_state_tensors(optimizer)]
    losses = _loss_fields(phases.losses)
    timed = phases.step_times[1:] or phases.step_times  # the first step warms up
    first = params[0].dtype if params else None
    record_run: Any = run  # build_record's recipe: only its record_fields are read
    if sim is not None:  # the sim's device, its never-reset reserved peak, what stood in for values read
        chosen = sim.session.profile
        fields: dict[str, Any] = dict(
            device_name=f"simulated {chosen.gpu}", peak_reserved_total_bytes=sim.session.allocator.stats.reserved_high_water,
            notes=sim.notes(), environment={})
    else:
        fields = dict(device_name=device_name(device), peak_reserved_total_bytes=never_reset_reserved(probe.phases),
                      notes=[], environment=environment_facts(device))
    return build_record(
        record_run, device=device, probe=probe.name,
        precision=str(first).removeprefix("torch.") if first is not None else "unknown",
        memory_steps=phases.optimizer_steps, param_count=sum(p.numel() for p in params), param_tensor_count=len(params),
        phases=probe.phases, step_peaks=probe.step_peaks,
        weights=USER, data=USER, losses={k: v for k, v in losses.items() if k != "memory_losses"},
        step_time_s=statistics.median(timed) if timed else None, host_peak_bytes=host_peak_bytes,
        host_steps=host_steps, **fields,
        observed=dict(
            param_bytes=count(iter(params)),
            grad_bytes=phases.grad_bytes or 0,
            optimizer_state_bytes=count(iter(state)),
            optimizer_state_by_dtype=_bytes_by(state, tensors.dtype_name, count),
            param_bytes_by_device=_bytes_by(params, tensors.device_type, count),
            memory_losses=losses["memory_losses"],
            step_micro_batches=phases.micro_batches[-1] if phases.micro_batches else None,
        ))
