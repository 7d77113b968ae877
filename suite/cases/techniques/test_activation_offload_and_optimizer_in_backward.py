"""activation-offload and optimizer-in-backward (issue #27) on the simulated GPU, at the article's scale
(ViT-L/16, batch 64): each replay visibly at work, against its stored baseline, and a fault that
silently disables either is named by recipe, metric and phase.

The claims from the techniques' own sources are suite/cases/test_claims.py's (``activation-offload-saved-on-host``,
``optimizer-in-backward-gradients``); here is what the replay must show besides.
"""

from __future__ import annotations

import pytest
from torch.autograd.graph import saved_tensors_hooks

from fixtures.injections import inject_post_accumulate_hooks_lost
from memclaims.baselines.compare import compare
from memclaims.core.record import Record
from memclaims.measure import active
from memclaims.pytest.records import RecordCache
from memclaims.recipes.recipe import resolve
from memclaims.sim import simulate
from memclaims.techniques.impl.saved_tensor_offload_fake import SimulatedOffload

pytestmark = pytest.mark.sim

RECIPES = {
    "activation-offload": ("activation-offload",),
    "optimizer-in-backward": ("optimizer-in-backward",),
    "both": ("activation-offload", "optimizer-in-backward"),
}


def _get(record_cache: RecordCache, techniques: tuple[str, ...]) -> Record:
    return record_cache.get("sim", resolve("vit", "article", techniques))


@pytest.mark.parametrize("name", list(RECIPES))
def test_replay_is_active_and_matches_its_baseline(name, record_cache, baseline_check, record_property) -> None:
    recipe = resolve("vit", "article", RECIPES[name])
    record = _get(record_cache, RECIPES[name])
    assert active.problems(recipe, record) == []
    baseline_check.check(f"sim:{record.recipe}", record, record_property)


def test_together_they_save_more_than_either(record_cache) -> None:
    peaks = {name: _get(record_cache, t).peak_allocated_bytes for name, t in RECIPES.items()}
    assert peaks["both"] < min(peaks["activation-offload"], peaks["optimizer-in-backward"]), peaks
    # The step in backward leaves the optimizer step phase nothing to allocate.
    fused = _get(record_cache, RECIPES["optimizer-in-backward"])
    assert fused.phases["optimizer_step"]["above_start_bytes"] == 0


def _judge(name: str, clean: Record) -> str:
    injected = simulate(resolve("vit", "article", RECIPES[name]))
    comparison = compare(injected, clean, case_id=f"sim:{injected.recipe}")
    lines = [comparison.message()] if comparison.failures else []
    return "\n".join(lines + active.problems(resolve("vit", "article", RECIPES[name]), injected))


def test_offload_that_keeps_saved_tensors_on_the_device_is_caught(record_cache, monkeypatch) -> None:
    """Hooks that pack a tensor as it is: the replay's saved tensors stay in device memory."""
    clean = _get(record_cache, RECIPES["activation-offload"])
    monkeypatch.setattr(SimulatedOffload, "hooks", lambda self: saved_tensors_hooks(lambda t: t, lambda t: t))
    message = _judge("activation-offload", clean)
    for named in ("vit-article/activation-offload", "phases.forward.above_start_bytes", "offloaded_activation_bytes is 0 B",
                  "phase forward"):
        assert named in message, message


def test_step_in_backward_whose_hooks_are_lost_is_caught(record_cache, monkeypatch) -> None:
    clean = _get(record_cache, RECIPES["optimizer-in-backward"])
    inject_post_accumulate_hooks_lost(monkeypatch)
    message = _judge("optimizer-in-backward", clean)
    for named in ("vit-article/optimizer-in-backward", "phases.optimizer_step.above_start_bytes",
                  "backward_optimizer_steps", "phase backward"):
        assert named in message, message
