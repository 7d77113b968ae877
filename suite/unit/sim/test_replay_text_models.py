"""Transformers models on the sim: the replay checked against the cpu tier's exact bytes, the
bonus scripts' text models at article scale, and CUDA's autocast policy where CPU autocast differs."""

from __future__ import annotations

import pytest
import torch

from memclaims import sim
from memclaims.measure.runner import run
from memclaims.recipes.recipe import Sizes, resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.sim.autocast import cuda_autocast

pytestmark = pytest.mark.sim


def test_cuda_autocast_policy_on_the_cpu() -> None:
    a = torch.randn(4, 4)
    with cuda_autocast(torch.float16):
        product = a @ a
        assert product.dtype == torch.float16  # matmul: half, as both policies
        assert torch.nn.functional.softmax(product, dim=-1).dtype == torch.float32  # fp32_set_opt_dtype
        assert product.softmax(-1).dtype == torch.float32 and product.sum().dtype == torch.float32
        assert product.pow(3).dtype == torch.float32  # fp32 list (gelu_new's pow)
        assert torch.nn.functional.layer_norm(product, (4,)).dtype == torch.float32
        assert torch.softmax(product, -1, dtype=torch.float16).dtype == torch.float16  # a named dtype wins


@pytest.mark.parametrize(("name", "techniques"), [("hf:bert", ("bf16-true", "sgd")), ("distilbert", ("sgd",))])
def test_replay_matches_the_cpu_tiers_exact_bytes(name: str, techniques: tuple[str, ...]) -> None:
    """With the CPU's kernels and no GPU extras, the sim's live-byte peak is the real run's.

    SGD without momentum: the optimizer step has no temporaries, so the comparison is not
    about foreach (the sim replays the GPU's foreach path, a CPU run takes the per-tensor one)."""
    recipe = resolve(name, "smoke", techniques, Sizes(seq_len=32))
    measured = run(recipe, RunOptions(device="cpu", memory_steps=2, evaluate=False))
    predicted = sim.simulate(recipe, profile="cpu-kernels", memory_steps=2)
    assert predicted.param_count == measured.param_count
    assert (predicted.param_bytes, predicted.grad_bytes) == (measured.param_bytes, measured.grad_bytes)
    live = predicted.phases["train"]["live_bytes"]  # the whole training phase: every step phase is inside it
    assert live == pytest.approx(measured.peak_allocated_bytes, rel=0.01)


def test_distilbert_at_the_bonus_settings() -> None:
    """bonus_distilbert-before's single-GPU analogue: batch 12 of 512 tokens, 16-mixed, eager attention."""
    recipe = resolve("distilbert", "article", ["16-mixed"])
    record = sim.simulate(recipe)
    assert record.param_count == 66_955_010  # distilbert-base-uncased with a 2-label head (SIMULATION.md)
    # exp_avg and exp_avg_sq in fp32, and one fp32 `step` per tensor (as AdamW in ARTICLE.md)
    assert record.optimizer_state_bytes == 2 * 4 * record.param_count + 4 * record.param_tensor_count
    states = record.param_bytes + record.grad_bytes + record.optimizer_state_bytes
    # Activations of 12 x 512 tokens dominate: more than the model states, less than 10x them.
    assert states < record.peak_reserved_total_bytes < 10 * states
    shorter = sim.simulate(resolve("distilbert", "article", ["16-mixed"], Sizes(seq_len=256)))
    assert shorter.peak_reserved_total_bytes < record.peak_reserved_total_bytes  # the --seq-len knob reaches the sim


def test_checkpointing_and_adafactor_on_one_device_replay_the_cpu_tier(monkeypatch: pytest.MonkeyPatch) -> None:
    """A transformers model checkpointed through its own switch, stepped by transformers' Adafactor:
    the sim's state bytes are the cpu tier's exactly (and Adafactor's factored layout), its live peak
    within 0.1 % (the tolerance the fp32 Adam and SGD rows of suite/cases/test_sim_article.py's cross-check meet), the same
    linears recomputed in backward; and a checkpointing that does nothing is named."""
    from memclaims.core.optim_state import adafactor_bytes
    from memclaims.measure import active
    from memclaims.techniques.impl import block_checkpointing as checkpointing

    recipe = resolve("hf:bert", "smoke", ("adafactor", "activation-checkpointing"), Sizes(seq_len=32))
    measured = run(recipe, RunOptions(device="cpu", memory_steps=2, evaluate=False))
    predicted = sim.simulate(recipe, profile="cpu-kernels", memory_steps=2)
    params = list(recipe.workload.architecture(recipe.scale, recipe.workload.num_classes).parameters())
    assert predicted.optimizer_state_bytes == measured.optimizer_state_bytes == adafactor_bytes(params)
    assert predicted.phases["train"]["live_bytes"] == pytest.approx(measured.peak_allocated_bytes, rel=1e-3)
    assert predicted.recomputed_linear_calls == measured.recomputed_linear_calls > 0
    assert any("activation_checkpointing_enable" in note for note in predicted.notes)

    plain = sim.simulate(resolve("hf:bert", "smoke", ("adafactor",), Sizes(seq_len=32)), profile="cpu-kernels",
                         memory_steps=2)
    without = {"activation-checkpointing": plain}
    assert active.problems(recipe, predicted, without) == []
    monkeypatch.setattr(checkpointing, "enable", lambda model, workload: "checkpointing skipped")
    skipped = sim.simulate(recipe, profile="cpu-kernels", memory_steps=2)
    found = active.problems(recipe, skipped, without)
    assert any("nothing was recomputed" in line for line in found), found
    assert any("forward.above_start_bytes" in line for line in found), found
