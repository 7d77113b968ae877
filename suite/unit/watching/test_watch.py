"""memclaims.watch around plain PyTorch loops: the phases it tells from hooks, the Record, the leak, the phases never
seen, and the CUDA path against faked allocator statistics."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import memclaims
from memclaims.core.errors import UsageError
from memclaims.measure.probes import CudaProbe
from memclaims.measure.steady import leak
from memclaims.watching.session import PhasesNotSeen, Watch

STEPS = 4


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def _train(model: nn.Module, optimizer: torch.optim.Optimizer, *, keep: list[Any] | None = None,
           steps: int = STEPS, step: bool = True, backward: bool = True) -> None:
    """The user's loop, as a user writes it; ``keep`` holds each loss with its graph (the leak of issue #50)."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        inputs, targets = torch.randn(8, 16, generator=generator), torch.randint(0, 4, (8,), generator=generator)
        loss = nn.functional.cross_entropy(model(inputs), targets)
        if keep is not None:
            keep.append(loss)
        if backward:
            loss.backward()
        if step:
            optimizer.step()
        optimizer.zero_grad()


def test_a_plain_loop_gives_the_record_of_memclaims_own_runs() -> None:
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters())
    with memclaims.watch(model, optimizer, name="plain") as watched:
        _train(model, optimizer)
        with torch.no_grad():
            model(torch.zeros(8, 16))
    record = watched.record
    params = sum(p.numel() * 4 for p in model.parameters())
    assert (record.recipe, record.workload, record.batch_size, record.memory_steps) == ("plain", "Sequential", 8, STEPS)
    assert (record.param_bytes, record.grad_bytes) == (params, params)
    assert record.optimizer_state_bytes == 2 * params + 4 * len(list(model.parameters()))  # AdamW's moments + steps
    assert {"load", "train", "forward", "backward", "optimizer_step", "zero_grad", "evaluation"} <= set(record.phases)
    assert set(record.step_peaks) == {"forward", "backward", "optimizer_step", "zero_grad"}  # evaluation is no step
    assert all(len(peaks) == STEPS for peaks in record.step_peaks.values())
    assert record.load_peak_bytes == params  # the model as handed over
    assert record.breakdown["parameters"] == params and record.breakdown["optimizer_state"] > 0
    # The step order memclaims' loop measures: a step's peak rises from forward to the optimizer step.
    phases = record.phases
    assert phases["forward"]["allocated_bytes"] < phases["backward"]["allocated_bytes"] \
        < phases["optimizer_step"]["allocated_bytes"] == phases["train"]["allocated_bytes"]
    assert record.host_peak_bytes and record.host_steps and record.final_loss is not None
    assert leak(record) is None


def test_a_loss_kept_with_its_graph_every_step_is_named_a_leak() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    kept: list[Any] = []
    with memclaims.watch(model, optimizer, name="leaky") as watched:
        _train(model, optimizer, keep=kept)
    found = leak(watched.record)
    assert found is not None and "leaky: phases.forward.allocated_bytes grows across steps (a leak)" in found


@pytest.mark.parametrize(("missing", "loop"), [("optimizer_step", {"step": False}), ("backward", {"backward": False})])
def test_a_run_without_a_phase_fails_naming_it(missing: str, loop: dict[str, bool]) -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(PhasesNotSeen, match=rf"no {missing}(, no optimizer_step)? was seen"):
        with memclaims.watch(model, optimizer):
            _train(model, optimizer, steps=1, **loop)


def test_an_empty_watch_names_every_phase_and_the_error_in_the_block_wins() -> None:
    model = _model()
    with pytest.raises(PhasesNotSeen, match="no forward, no backward, no optimizer_step was seen"):
        with memclaims.watch(model):
            pass
    with pytest.raises(KeyError):  # the user's own error is not hidden behind the watch's
        with memclaims.watch(model):
            raise KeyError("mine")


def test_a_closure_step_opens_the_optimizer_step_after_its_backward() -> None:
    """Lightning's automatic optimization: forward and backward run inside optimizer.step(closure)."""
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs, targets = torch.randn(8, 16), torch.randint(0, 4, (8,))

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), targets)
        loss.backward()
        return loss

    with memclaims.watch(model, optimizer) as watched:
        for _ in range(3):
            optimizer.step(closure)
    assert watched.phases.driver.sequence[:4] == ["zero_grad", "forward", "backward", "optimizer_step"]
    assert watched.record.memory_steps == 3 and len(watched.record.step_peaks["optimizer_step"]) == 3


def test_the_hooks_and_wraps_are_gone_after_the_watch() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    backward = torch.autograd.backward
    with memclaims.watch(model, optimizer):
        _train(model, optimizer, steps=1)
    assert torch.autograd.backward is backward
    assert "zero_grad" not in vars(model) and "zero_grad" not in vars(optimizer)
    from torch.nn.modules import module
    from torch.optim import optimizer as optim_module

    assert not module._global_forward_pre_hooks and not optim_module._global_optimizer_pre_hooks


class _Allocator:
    """torch.cuda's allocator statistics, faked: each reset starts a new peak, which grows by 1,000 per reading."""

    def __init__(self) -> None:
        self.live, self.peak = 100, 100

    def synchronize(self) -> None:
        self.peak += 1_000

    def empty_cache(self) -> None:
        pass

    def reset_peak_memory_stats(self) -> None:
        self.peak = self.live

    def memory_allocated(self) -> int:
        return self.live

    def max_memory_allocated(self) -> int:
        return self.peak

    def max_memory_reserved(self) -> int:
        return 2 * self.peak


def test_the_cuda_path_reads_the_allocator_per_phase_and_splits_the_model_states() -> None:
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters())
    with Watch(model, optimizer, device="cuda", probe=CudaProbe(_Allocator())) as watched:
        _train(model, optimizer, steps=2)
    record = watched.record
    assert (record.device, record.probe) == ("cuda", "cuda-allocator")
    assert all(record.phases[name]["reserved_bytes"] == 2 * record.phases[name]["allocated_bytes"]
               for name in ("forward", "backward", "optimizer_step", "zero_grad"))
    assert record.peak_reserved_bytes is not None and record.peak_reserved_total_bytes is not None
    assert record.breakdown["optimizer_state"] == record.optimizer_state_bytes


def test_a_device_memclaims_does_not_measure_is_one_line() -> None:
    with pytest.raises(UsageError, match="device 'meta' is not measured"):
        memclaims.watch(_model(), device="meta")


def test_one_watch_at_a_time_and_one_left_open_is_closed() -> None:
    from memclaims.watching.session import close_left_open

    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    backward = torch.autograd.backward
    left = memclaims.watch(model, optimizer, name="left")
    left.__enter__()  # as a Trainer whose train() raised leaves its callback's watch
    with pytest.raises(UsageError, match="the watch 'left' is still open; one watch at a time"):
        with memclaims.watch(model, optimizer):
            pass
    assert close_left_open() == ["left"] and torch.autograd.backward is backward
    with memclaims.watch(model, optimizer):  # a new one opens, and works
        _train(model, optimizer, steps=1)


def test_evaluation_batches_between_steps_are_one_phase_and_training_resumes() -> None:
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with memclaims.watch(model, optimizer) as watched:
        for _ in range(3):
            _train(model, optimizer, steps=1)
            model.eval()
            with torch.no_grad():
                for _ in range(3):  # an evaluation loop: each batch a call of the model
                    model(torch.randn(8, 16))
            model.train()
    sequence = watched.phases.driver.sequence
    assert sequence[:5] == ["forward", "backward", "optimizer_step", "zero_grad", "evaluation"]
    assert sequence.count("forward") == 3 and sequence.count("evaluation") == 3
    assert watched.record.step_peaks["forward"] and len(watched.record.step_peaks["forward"]) == 3


def test_a_model_built_inside_the_watch_is_measured_in_its_load_phase() -> None:
    """Item 1's "load where the model is built inside it": the build's allocations are the load phase's peak (here a
    scratch buffer of 1 MB the builder frees again), and the model and optimizer it made train as any."""
    scratch_bytes = 2**20

    def build() -> nn.Module:
        scratch = torch.empty(scratch_bytes // 4)  # what a conversion or a checkpoint's read holds for a while
        model = _model()
        del scratch
        return model

    with memclaims.watch(build, lambda model: torch.optim.AdamW(model.parameters()), name="built") as watched:
        _train(watched.model, watched.optimizer)
    record = watched.record
    params = sum(p.numel() * 4 for p in watched.model.parameters())
    assert isinstance(watched.optimizer, torch.optim.AdamW) and record.memory_steps == STEPS
    assert record.load_peak_bytes == scratch_bytes + params and record.param_bytes == params
    assert record.optimizer_state_bytes == 2 * params + 4 * len(list(watched.model.parameters()))
    assert record.phases["load"]["allocated_bytes"] == scratch_bytes + params


def test_a_builder_that_returns_no_model_is_one_line() -> None:
    with pytest.raises(UsageError, match=r"the function given as model returned int, not a torch.nn.Module"):
        with memclaims.watch(lambda: 3):
            pass
    with pytest.raises(UsageError, match="model must be a torch.nn.Module or a function that builds one, got Tensor"):
        memclaims.watch(torch.zeros(2))  # type: ignore[arg-type]
    model = _model()  # the failed open left no watch behind
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with memclaims.watch(model, optimizer):
        _train(model, optimizer, steps=1)
