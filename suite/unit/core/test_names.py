"""The contract's names (memclaims.core.names): which sim profile a run that names none predicts for."""

from __future__ import annotations

import pytest

from memclaims.core.names import ARTICLE_PROFILE, INSTALLED_TORCH_PROFILE, SIM_PROFILES, sim_tier_profile


@pytest.mark.parametrize("workload", ["vit", "vit-h14", "distilbert", "bigbird", "hf:gpt2",
                                      "hf:llama(hidden_size=64,num_hidden_layers=2)"])
def test_the_built_in_workloads_sim_tier_predicts_the_article(workload: str) -> None:
    """Their committed sim baselines (baselines/measured/sim-article.json) are the article profile's."""
    assert sim_tier_profile(workload) == ARTICLE_PROFILE == "article"


def test_a_user_workloads_sim_tier_predicts_the_installed_torch() -> None:
    assert sim_tier_profile("clusters-mlp") == INSTALLED_TORCH_PROFILE == "current"
    assert sim_tier_profile("demo-transformer") == "current"


@pytest.mark.parametrize("workload", ["vit", "clusters-mlp"])
def test_a_chosen_profile_wins_for_every_workload(workload: str) -> None:
    assert sim_tier_profile(workload, "h100") == "h100"


def test_both_defaults_are_profiles() -> None:
    assert {ARTICLE_PROFILE, INSTALLED_TORCH_PROFILE} <= set(SIM_PROFILES)
