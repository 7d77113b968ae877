"""selective-checkpointing (issue #43: torch's selective activation checkpointing with torchtitan's op-level policy)
on the ViT: at smoke scale on the cpu tier and at article scale on the simulated GPU, each run visibly at work,
with the losses of the recipe without checkpointing, and against its stored baseline; the policy's choices on one
block; and SAC that silently saves nothing (full checkpointing) or everything (no recomputation) named by recipe,
metric and phase.

The claim from torch's docstring is suite/cases/test_claims.py's (``selective-checkpointing-between-none-and-full``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from memclaims.baselines.compare import compare
from memclaims.core.errors import UsageError
from memclaims.core.record import Record
from memclaims.measure import active
from memclaims.measure.runner import run
from memclaims.pytest.records import RecordCache
from memclaims.recipes.recipe import resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.techniques import selective_checkpointing as sac

# One worker measures the Records its tests and its claims (suite/cases/test_claims.py) share.
pytestmark = pytest.mark.xdist_group("selective-checkpointing")

SAC = ("selective-checkpointing",)
TIERS = [pytest.param("cpu", marks=pytest.mark.cpu), pytest.param("sim", marks=pytest.mark.sim)]


def _scale(tier: str) -> str:
    return "smoke" if tier == "cpu" else "article"


def _get(record_cache: RecordCache, tier: str, techniques: tuple[str, ...]) -> Record:
    return record_cache.get(tier, resolve("vit", _scale(tier), techniques))


@pytest.mark.parametrize("tier", TIERS)
def test_sac_is_active_and_matches_its_baseline(tier, record_cache, baseline_check, record_property) -> None:
    recipe = resolve("vit", _scale(tier), SAC)
    record = _get(record_cache, tier, SAC)
    without = record_cache.memory(tier, resolve("vit", _scale(tier), ("fabric",)))
    assert active.problems(recipe, record, {sac.NAME: without}) == []
    seen = record.by_technique[sac.NAME]
    # torchtitan's policy on torchvision's EncoderBlock, per block and forward pass: the packed q/k/v projection
    # (mm) and the MLP's first linear (addmm) saved, the attention saved; the output projection and the MLP's
    # second linear (the second and fourth matmuls) left to recompute.
    blocks = 2 if tier == "cpu" else 24  # vit-smoke's layers, ViT-L/16's
    forwards = record.memory_steps * recipe.accumulation_steps * blocks
    assert seen["saved_ops"] == {"aten._scaled_dot_product_flash_attention_for_cpu.default": forwards,
                                 "aten.addmm.default": forwards, "aten.mm.default": forwards}
    assert seen["recompute_ops"]["aten.addmm.default"] == 2 * forwards
    assert "aten.mm.default" not in seen["recomputed_ops"]  # saved: served from SAC's cache
    baseline_check.check(f"{tier}:{record.recipe}", record, record_property)


@pytest.mark.cpu
def test_sac_trains_as_the_recipe_without_checkpointing(record_cache) -> None:
    """Recomputation replays the forward (RNG state included): the same losses, bit for bit on the CPU."""
    plain = record_cache.memory("cpu", resolve("vit", "smoke", ("fabric",)))
    selective = _get(record_cache, "cpu", SAC)
    assert selective.memory_losses and selective.memory_losses == plain.memory_losses


@pytest.mark.cpu
@pytest.mark.parametrize(("other", "why"), [
    ("activation-checkpointing", "both checkpoint the same blocks"),
    ("activation-offload", "SAC's saved outputs bypass save_on_cpu's saved-tensor hooks"),
    ("fsdp", "one-device engines only"),
])
def test_what_it_does_not_combine_with_is_refused_with_the_reason(other: str, why: str) -> None:
    with pytest.raises(UsageError, match=why):
        resolve("vit", "smoke", (*SAC, other))


@pytest.mark.cpu
def test_the_policy_saves_every_other_matmul_and_the_attention_with_the_gradients_of_none() -> None:
    """On one pre-LN block (four matmuls: the packed q/k/v projection, the output projection, the MLP's two; SDPA):
    the first and third matmul and the attention saved, the second and fourth marked for recomputation; the
    backward reruns no saved op (the projection's mm and the attention never), and the gradients are those of
    the block without checkpointing."""
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    block = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=True)
    x = torch.randn(3, 5, 16, requires_grad=True)
    expected = torch.autograd.grad(block(x).sum(), (x, *block.parameters()))
    observed = sac.SacWatch()
    out = checkpoint(block, x, use_reentrant=False, context_fn=observed.context_fn)
    grads = torch.autograd.grad(out.sum(), (x, *block.parameters()))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, expected))
    attention = "aten._scaled_dot_product_flash_attention_for_cpu.default"
    assert observed.saved == {"aten.mm.default": 1, "aten.addmm.default": 1, attention: 1}
    assert observed.recompute["aten.addmm.default"] == 2 and "aten.mm.default" not in observed.recompute
    assert "aten.mm.default" not in observed.recomputed and attention not in observed.recomputed
    assert all(n <= observed.recompute[op] for op, n in observed.recomputed.items())
    assert observed.recomputed["aten.relu.default"] == 1  # the cheap ops run again


def inject_sac_policy_ignored(monkeypatch: pytest.MonkeyPatch, decision: Any) -> None:
    """SAC that silently drops the policy's answers for ``decision`` (every op recomputed: full checkpointing,
    or every op saved: nothing recomputed), as a torch whose caching mode stopped reading the policy would: the
    policy still runs and counts what it asked for."""
    import torch.utils.checkpoint as checkpoint

    original = checkpoint.create_selective_checkpoint_contexts

    def ignoring(policy: Any, *args: Any, **kwargs: Any) -> Any:
        def overruled(ctx: Any, func: Any, *a: Any, **k: Any) -> Any:
            policy(ctx, func, *a, **k)
            return decision
        return original(overruled, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "create_selective_checkpoint_contexts", ignoring)


@pytest.mark.cpu
@pytest.mark.parametrize(("decision", "named"), [
    ("PREFER_RECOMPUTE", ("by_technique.selective-checkpointing.recomputed_ops ran ops again in phase backward more "
                          "often than the policy marked them", "aten.mm.default: 10, 0")),
    ("MUST_SAVE", ("by_technique.selective-checkpointing.recomputed_ops is empty after phase backward",
                   "peak_allocated_bytes", "phases.forward.above_start_bytes")),
], ids=["saves-nothing", "saves-everything"])
def test_a_policy_sac_ignores_is_caught(decision: str, named: tuple[str, ...], record_cache, monkeypatch) -> None:
    from torch.utils.checkpoint import CheckpointPolicy

    clean = record_cache.memory("cpu", resolve("vit", "smoke", SAC))
    plain = record_cache.memory("cpu", resolve("vit", "smoke", ("fabric",)))
    inject_sac_policy_ignored(monkeypatch, getattr(CheckpointPolicy, decision))
    recipe = resolve("vit", "smoke", SAC)
    injected = run(recipe, RunOptions(device="cpu", evaluate=False))
    comparison = compare(injected, clean, case_id=f"cpu:{injected.recipe}")
    problems = active.problems(recipe, injected, {sac.NAME: plain})
    message = "\n".join(([comparison.message()] if comparison.failures else []) + problems)
    assert any(line.startswith("vit-smoke/selective-checkpointing: selective-checkpointing is not active: ")
               for line in problems), message
    for text in named:
        assert text in message, message

