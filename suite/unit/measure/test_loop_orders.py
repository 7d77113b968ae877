"""memclaims.measure.loop's training loop in each stack's order (techniques.base.LoopOrder), as the sim replays the
stacks: the phases of every step in the order the stack runs them, where the gradients are zeroed, the Trainer's
gradient clipping and its micro-batches fetched a window at a time; the scripts' order unchanged (05's first step
after one micro-batch)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from memclaims.measure.loop import TrainingLoop, prefetched
from memclaims.techniques.base import ZERO_AFTER_STEP, ZERO_AT_WINDOW_START, LoopOrder


class _Loop(TrainingLoop):
    def __init__(self, accumulation: int, order: LoopOrder) -> None:
        super().__init__(accumulation, order)
        self.grads_at_forward: list[bool] = []
        self.model: nn.Module | None = None

    def forward_loss(self, model: nn.Module, inputs: Any, targets: torch.Tensor) -> torch.Tensor:
        self.grads_at_forward.append(any(p.grad is not None for p in model.parameters()))
        return F.cross_entropy(model(inputs), targets)


def _run(accumulation: int, order: LoopOrder, steps: int = 3) -> tuple[list[str], _Loop]:
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loop = _Loop(accumulation, order)
    seen: list[str] = []

    @contextmanager
    def phase(name: str) -> Iterator[None]:
        seen.append(name)
        yield

    batches = ((torch.randn(2, 4), torch.tensor([0, 1])) for _ in range(100))
    loop.train(model, optimizer, None, batches, steps, phase=phase)
    return seen, loop


@pytest.mark.parametrize("order", [LoopOrder(ZERO_AFTER_STEP), LoopOrder(ZERO_AT_WINDOW_START),
                                   LoopOrder(ZERO_AFTER_STEP, clips_gradients=True, prefetches=True)])
@pytest.mark.parametrize("accumulation", [1, 3])
def test_every_step_runs_the_stacks_phases_in_its_order(order: LoopOrder, accumulation: int) -> None:
    seen, loop = _run(accumulation, order)
    assert seen == order.step_phases(accumulation) * 3
    # Every step takes a whole window (the scripts' 05 takes one micro-batch first).
    assert (loop.step_examples, loop.step_micro_batches) == (2 * accumulation, accumulation)
    firsts = loop.grads_at_forward[accumulation::accumulation]  # the first forward of steps 2 and 3
    assert firsts == [order.gradients_in_forward(accumulation)] * 2


def test_the_scripts_order_is_the_article_loops() -> None:
    seen, loop = _run(1, LoopOrder())
    assert seen == ["forward", "zero_grad", "backward", "optimizer_step"] * 3
    seen, loop = _run(3, LoopOrder(), steps=2)
    # 05: the first step after one micro-batch, then every third; zero_grad after the step.
    assert seen == ["forward", "backward", "optimizer_step", "zero_grad",
                    *["forward", "backward"] * 3, "optimizer_step", "zero_grad"]
    assert loop.grads_at_forward == [False, False, True, True]


def test_clipping_bounds_the_gradient_norm_before_the_step() -> None:
    order = LoopOrder(ZERO_AFTER_STEP, clips_gradients=True, max_grad_norm=1e-3)
    loop = _Loop(1, order)
    model = nn.Linear(4, 3)
    model.weight.grad, model.bias.grad = torch.full((3, 4), 5.0), torch.full((3,), 5.0)
    loop.clip(model)
    norm = torch.linalg.vector_norm(torch.cat([model.weight.grad.flatten(), model.bias.grad]))
    assert norm == pytest.approx(1e-3, rel=1e-3)


def test_prefetching_holds_a_whole_window_before_its_first_micro_batch() -> None:
    made: list[int] = []

    def source() -> Iterator[int]:
        for index in range(5):
            made.append(index)
            yield index

    fetched = prefetched(source(), 2)
    assert next(fetched) == 0 and made == [0, 1]  # both micro-batches of the window exist before the first runs
    assert list(fetched) == [1, 2, 3, 4] and made == [0, 1, 2, 3, 4]  # a short last window too
