"""What watching costs, asserted by what runs rather than by time (a 2-core CI box is too noisy for a timed bound;
``scripts/watch-overhead`` times it): no cyclic collection per step, one psutil handle, and the cpu probe's tracker
(MemTracker without its per-module statistics) counting the bytes torch's MemTracker counts."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker
from torch.utils.checkpoint import checkpoint

import memclaims
from memclaims.measure import host
from memclaims.measure.probes import _frozen_aware_tracker


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        nn.functional.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 4, (8,))).backward()
        optimizer.step()
        optimizer.zero_grad()


def _collections_while_watching(steps: int, monkeypatch: pytest.MonkeyPatch) -> int:
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters())
    calls = []
    collect = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *args: calls.append(args) or collect(*args))
    with memclaims.watch(model, optimizer):
        _train(model, optimizer, steps)
    monkeypatch.setattr(gc, "collect", collect)
    return len(calls)


def test_watching_collects_garbage_once_not_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two collections a phase boundary were the watch's largest cost (issue #50: about 38 % of it).
    assert _collections_while_watching(1, monkeypatch) == _collections_while_watching(6, monkeypatch) == 1


def test_the_host_counters_make_one_psutil_handle_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import psutil

    made = []
    process = psutil.Process
    monkeypatch.setattr(psutil, "Process", lambda *args: made.append(args) or process(*args))
    monkeypatch.setattr(host, "_PROCESS", [])
    for _ in range(5):
        host.read_counters(collect=False)
    assert len(made) == 1


def _checkpointed() -> nn.Module:
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.block, self.head = inner, nn.Linear(16, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(checkpoint(self.block, x, use_reentrant=False))  # recomputed in backward

    return Net()


@pytest.mark.parametrize("build", [_model, _checkpointed], ids=["mlp", "activation-checkpointing"])
def test_the_probes_tracker_counts_what_memtracker_counts(build: Callable[[], nn.Module]) -> None:
    """The same steps under torch's MemTracker and under the cpu probe's tracker: the same current and peak bytes by
    category after every phase (activation checkpointing's recomputation in backward counted as activations)."""

    def readings(tracker_class: type[Any]) -> list[Any]:
        model = build()
        optimizer = torch.optim.AdamW(model.parameters())
        generator = torch.Generator().manual_seed(1)
        tracker = tracker_class()
        tracker.track_external(model, optimizer)
        seen = []
        with tracker:
            for _ in range(2):
                tracker.reset_mod_stats()
                loss = nn.functional.cross_entropy(model(torch.randn(8, 16, generator=generator)),
                                                   torch.randint(0, 4, (8,), generator=generator))
                seen.append((tracker.get_tracker_snapshot("current"), tracker.get_tracker_snapshot("peak")))
                loss.backward()
                seen.append((tracker.get_tracker_snapshot("current"), tracker.get_tracker_snapshot("peak")))
                optimizer.step()
                optimizer.zero_grad()
                del loss
                seen.append((tracker.get_tracker_snapshot("current"), tracker.get_tracker_snapshot("peak")))
        return seen

    assert readings(_frozen_aware_tracker()) == readings(MemTracker)
