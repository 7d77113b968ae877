"""User workloads on the sim through ``define()`` alone: models built from the ``nn`` modules people
use, replayed on fake tensors and checked against the cpu tier's exact bytes; the one-line refusal
of a model that cannot be built on fake tensors; fake batches shaped from a real one; FSDP on N ranks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from fixtures import demo_transformer as demo
from fixtures.user_module_zoo import ZOO, workload
from memclaims import sim
from memclaims.core.errors import UsageError
from memclaims.measure.runner import run
from memclaims.recipes.recipe import resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.run import run_recipe
from memclaims.workloads import user as user_workloads
from memclaims.workloads.batch_shapes import BatchShapes
from memclaims.workloads.types import Scale

pytestmark = pytest.mark.sim


@pytest.fixture
def registered(request: pytest.FixtureRequest) -> Iterator[str]:
    name: str = request.param
    user_workloads.register(workload(name))
    yield name
    user_workloads.forget(name)


@pytest.mark.parametrize("registered", list(ZOO), indirect=True)
def test_replay_matches_the_cpu_tiers_exact_bytes(registered: str) -> None:
    """With the CPU's kernels the sim's live-byte peak is the real run's, within the 1 % the text
    workloads meet (test_replay_text_models.py); SGD without momentum, as there (no foreach temporaries)."""
    recipe = resolve(registered, "smoke", ["sgd"])
    measured = run(recipe, RunOptions(device="cpu", memory_steps=2, evaluate=False))
    predicted = sim.simulate(recipe, profile="cpu-kernels", memory_steps=2)
    assert predicted.param_count == measured.param_count
    assert (predicted.param_bytes, predicted.grad_bytes) == (measured.param_bytes, measured.grad_bytes)
    assert predicted.phases["train"]["live_bytes"] == pytest.approx(measured.peak_allocated_bytes, rel=0.01)


@pytest.fixture
def demo_transformer() -> Iterator[str]:
    made = user_workloads.register(demo.make())
    yield made.name
    user_workloads.forget(made.name)


def test_lightnings_demo_transformer_replays_the_cpu_tiers_bytes(demo_transformer: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's demo Transformer (its FSDP guide's model), built and run through ``define()``: its labels are
    flattened over the tokens, and ``nn.TransformerDecoder`` reads its mask's values to see that it is causal, which
    the sim computes from the constants the mask is made of (issue #43). Against the cpu tier's exact bytes: the
    states equal, the live peak within 1 % of the real one, plus at most the last step's log-probabilities, which
    the sim's loop keeps bound until the next forward as the article's scripts do (the cpu engine's loop drops them;
    where the peak falls decides whether they count)."""
    checks: list[bool] = []
    detect = nn.modules.transformer._detect_is_causal_mask

    def spied(mask: Any, is_causal: Any = None, size: Any = None) -> bool:
        checks.append(detect(mask, is_causal, size))
        return checks[-1]

    monkeypatch.setattr(nn.modules.transformer, "_detect_is_causal_mask", spied)
    recipe = resolve(demo_transformer, "smoke", ["sgd"])
    measured = run(recipe, RunOptions(device="cpu", memory_steps=2, evaluate=False))
    real_checks, checks[:] = list(checks), []
    predicted = sim.simulate(recipe, profile="cpu-kernels", memory_steps=2)
    # The decoder's mask was read and found causal (the encoder's check sees no mask: False), as in the real run.
    assert checks == real_checks and True in checks
    assert (predicted.param_bytes, predicted.grad_bytes) == (measured.param_bytes, measured.grad_bytes)
    assert predicted.step_examples == measured.step_examples == recipe.batch_size  # examples, not tokens
    log_probabilities = recipe.batch_size * demo.SEQUENCE * demo.VOCAB * 4
    live = predicted.phases["train"]["live_bytes"]
    assert 0.99 * measured.peak_allocated_bytes <= live <= 1.01 * (measured.peak_allocated_bytes + log_probabilities)


class ReadsAValue(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 2)
        self.scale = float(self.fc.weight.abs().max())  # a value: fake tensors have none

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(x) * self.scale
        return out


def test_a_model_that_reads_values_while_built_is_refused_in_one_line() -> None:
    made = user_workloads.define("reads-a-value", num_classes=2, block_class=nn.Linear,
                                 build_model=lambda scale: ReadsAValue(),
                                 train_data=lambda scale: [(torch.zeros(4), 0)] * 4,
                                 test_data=lambda scale: [(torch.zeros(4), 0)] * 4)
    user_workloads.register(made)
    try:
        with pytest.raises(UsageError) as refused:
            sim.simulate(resolve("reads-a-value", "smoke", []))
    finally:
        user_workloads.forget("reads-a-value")
    message = str(refused.value)
    assert "\n" not in message and "workload 'reads-a-value' on fake tensors" in message
    assert "test_replay_user_modules.ReadsAValue (" in message and "test_replay_user_modules.py:" in message


def _scale(batch: int) -> Scale:
    return Scale("smoke", "", batch_size=batch, learning_rate=0.1, sgd_learning_rate=0.1, memory_steps=2,
                 accuracy_epochs=1)


def _rows(size: int) -> list[tuple[torch.Tensor, int]]:
    return [(torch.ones(2 + i % 5, dtype=torch.long), i) for i in range(size)]


def _pad(rows: list[tuple[torch.Tensor, int]]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    ids = nn.utils.rnn.pad_sequence([r for r, _ in rows], batch_first=True)
    return {"input_ids": ids, "attention_mask": ids != 0}, torch.tensor([label for _, label in rows])


def test_fake_batches_take_the_shapes_and_dtypes_of_one_real_batch() -> None:
    shapes = BatchShapes("padded", lambda scale: _rows(10), _pad)
    inputs, labels = shapes(_scale(4), 64)
    # The first 4 rows, padded to the longest of them (5), at any batch size; dtypes kept.
    assert inputs["input_ids"].shape == (64, 5) and inputs["input_ids"].dtype == torch.long
    assert inputs["attention_mask"].dtype == torch.bool and labels.shape == (64,)
    images = BatchShapes("images", lambda scale: [(torch.zeros(3, 8, 8, dtype=torch.float16), 1)] * 2, None)
    x, y = images(_scale(16), 5)  # fewer examples than a batch: the set's
    assert (x.shape, x.dtype, y.dtype) == ((5, 3, 8, 8), torch.float16, torch.long)


def test_labels_flattened_over_the_tokens_scale_with_the_batch() -> None:
    """(batch x sequence,) labels, as Lightning's demo Transformer's loss reads them: k positions per example."""
    shapes = BatchShapes("flat-labels", lambda scale: demo.tokens(10, 1), demo.flattened)
    (inputs, target), labels = shapes(_scale(4), 8)
    assert inputs.shape == target.shape == (8, demo.SEQUENCE) and labels.shape == (8 * demo.SEQUENCE,)
    assert labels.dtype == torch.long


def test_a_batch_without_a_leading_batch_dimension_is_refused() -> None:
    shapes = BatchShapes("flat", lambda scale: _rows(4), lambda rows: (torch.zeros(7), torch.zeros(3)))
    with pytest.raises(UsageError, match=r"workload 'flat': a collated tensor of shape \(7,\) does not lead"):
        shapes(_scale(3), 8)
    with pytest.raises(UsageError, match="workload 'single': a collated batch must be .inputs, labels., got Tensor"):
        BatchShapes("single", lambda scale: _rows(4), lambda rows: torch.zeros(4))(_scale(4), 8)


@pytest.mark.parametrize("registered", ["zoo-stacks"], indirect=True)
def test_fsdp_on_a_user_workload_accounts_per_rank(registered: str) -> None:
    """--devices N reaches the sharded replay: each of N ranks keeps a 1/N shard of every unit."""
    recipe = resolve(registered, "smoke", ["fsdp"])
    two, four = (run_recipe(recipe, RunOptions(device="sim", memory_steps=2, devices=n))[0] for n in (2, 4))
    assert (two.devices, four.devices, two.param_count) == (2, 4, four.param_count)
    assert two.param_bytes == pytest.approx(4 * two.param_count / 2, rel=0.01)  # fp32 shards, padding aside
    assert four.param_bytes == pytest.approx(4 * four.param_count / 4, rel=0.01)
