"""memclaims.sim.repeat: replayed micro-batches leave the allocator exactly where running them would."""

from __future__ import annotations

import pytest
import torch

from memclaims.recipes.recipe import Sizes, resolve
from memclaims.sim import repeat, simulate
from memclaims.sim.allocator import CachingAllocator
from memclaims.sim.profiles import PROFILES
from memclaims.sim.repeat import RepeatedMicroBatches
from memclaims.sim.tracker import DeviceMemory

pytestmark = pytest.mark.cpu

MB = 2**20


def device() -> DeviceMemory:
    return DeviceMemory(CachingAllocator(PROFILES["article"].allocator), PROFILES["article"])


def tracked(memory: DeviceMemory, nbytes: int) -> torch.Tensor:
    tensor = torch.empty(nbytes, dtype=torch.uint8)
    memory.track(tensor)
    return tensor


def accumulate(memory: DeviceMemory, repeats: RepeatedMicroBatches, batches: int,
               sizes: dict[int, tuple[int, int]] | None = None, leak: bool = False) -> None:
    """A training loop's shape: a temporary per micro-batch, and an output kept until the next one
    replaces it (as the scripts keep ``logits``); ``sizes`` changes a micro-batch's requests,
    ``leak`` keeps every output until the loop ends (a list that grows per micro-batch)."""
    kept = None
    leaked = []
    for batch in range(batches):
        if repeats.replay(batch):
            continue
        with repeats.running(batch):
            temporary_bytes, output_bytes = (sizes or {}).get(batch, (3 * MB, 5 * MB))
            temporary = tracked(memory, temporary_bytes)
            output = tracked(memory, output_bytes)
            del temporary
            if leak:
                leaked.append(output)
            kept = output
    del kept


def run(batches: int, sizes: dict[int, tuple[int, int]] | None = None,
        leak: bool = False) -> tuple[DeviceMemory, RepeatedMicroBatches]:
    """``batches`` micro-batches of a loop stepping every 7th (0, 7, ...)."""
    memory = device()
    repeats = RepeatedMicroBatches(memory, accumulation_steps=7)
    accumulate(memory, repeats, batches, sizes, leak)
    return memory, repeats


def test_replayed_micro_batches_free_what_the_running_ones_would() -> None:
    memory, repeats = run(9)
    assert repeats.replayed == 5  # 3 to 7; 8 runs and frees what the last replayed one kept
    assert memory.tensor_bytes == 0 and memory.allocator.stats.allocated == 0
    assert memory.allocator.next_handle == 1 + 9 * 2  # every micro-batch made its two allocations


def test_micro_batches_that_differ_all_run() -> None:
    _, repeats = run(9, sizes={2: (3 * MB, 6 * MB)})
    assert repeats.pattern is None and repeats.replayed == 0


def test_an_allocation_outliving_the_next_micro_batch_stops_the_replay() -> None:
    """Micro-batches 1 and 2 record alike, but what each keeps lives on: no one micro-batch's pattern."""
    memory, repeats = run(9, leak=True)
    assert repeats.pattern is None and repeats.replayed == 0
    assert memory.tensor_bytes == 0


def test_without_three_micro_batches_per_step_nothing_is_recorded() -> None:
    memory = device()
    repeats = RepeatedMicroBatches(memory, accumulation_steps=2)
    accumulate(memory, repeats, 5)
    assert repeats.records == {} and repeats.replayed == 0


def test_a_replayed_sharded_recipe_predicts_what_running_every_micro_batch_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The bonus "after" techniques (FSDP x4 + offload, bf16-true) at smoke scale, 8 micro-batches of 1."""
    recipe = resolve("distilbert", "smoke", ("bf16-true", "grad-accum", "fsdp", "cpu-offload", "delayed-init"),
                     Sizes(batch_size=8, accumulation_steps=8))
    replayed = simulate(recipe)
    assert any(note.startswith("6 micro-batches replayed") for note in replayed.notes)  # 3 to 8
    monkeypatch.setattr(repeat.RepeatedMicroBatches, "replay", lambda self, batch_index: False)
    ran = simulate(recipe)
    assert not any("micro-batches replayed" in note for note in ran.notes)
    for field in ("peak_reserved_total_bytes", "peak_reserved_bytes", "peak_allocated_bytes", "breakdown", "phases"):
        assert getattr(replayed, field) == getattr(ran, field), field
