"""The technique registry, its validity rules, combination generation and recipe ids."""

from __future__ import annotations

from itertools import combinations

import pytest

from memclaims.core import techniques as registry
from memclaims.core.errors import UsageError
from memclaims.recipes.recipe import parse_id, resolve


def test_names_are_the_public_contract() -> None:
    core = ["pytorch", "fabric", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "small-batch",
            "grad-accum", "sgd", "init-module"]
    assert [t.name for t in registry.TECHNIQUES if t.name in core] == core
    assert len(registry.BY_NAME) == len(registry.TECHNIQUES), "technique names must be unique"


@pytest.mark.parametrize("names, rule", [
    (["bf16-true", "16-true"], "at most one precision technique"),
    (["sgd", "fabric"], "combines with no other technique"),
    (["pytorch", "bf16-true"], "combines with no other technique"),
    (["nope"], "unknown technique 'nope'; valid techniques: pytorch, fabric"),
])
def test_invalid_combinations_name_the_rule(names: list[str], rule: str) -> None:
    with pytest.raises(UsageError, match=rule):
        registry.canonical(names)


def test_empty_and_fabric_are_the_same_reference_recipe() -> None:
    assert registry.canonical([]) == registry.canonical(["fabric"]) == ("fabric",)


def test_canonical_order_is_registry_order_and_deduplicated() -> None:
    assert registry.canonical(["sgd", "bf16-true", "sgd"]) == ("bf16-true", "sgd")


def test_every_generated_combination_is_valid_and_unique() -> None:
    full = registry.full_matrix()
    assert len(full) == len(set(full))
    for combo in full:
        assert registry.canonical(combo) == combo


def test_pairwise_cover_covers_every_compatible_pair() -> None:
    pool = registry.single_process()
    covered = {frozenset(p) for combo in registry.pairwise_cover(pool) for p in combinations(combo, 2)}
    assert registry.compatible_pairs(pool) <= covered


def test_default_selection_holds_singles_and_the_article_chain() -> None:
    selection = registry.default_selection()
    for single in registry.singles(registry.single_process()):
        assert (single in selection) == all(registry.technique(name).in_default for name in single), single
    for step in registry.ARTICLE_CHAIN:
        assert registry.canonical(step) in selection
    assert len(selection) < len(registry.full_matrix())


def test_selection_is_deterministic() -> None:
    assert registry.default_selection() == registry.default_selection()


def test_selections_by_name() -> None:
    assert list(registry.SELECTIONS) == ["singles", "default", "full"]  # --memclaims-matrix's values
    assert registry.selection("singles") == registry.singles(registry.single_process())
    assert registry.selection("default") == registry.default_selection()
    assert registry.selection("full") == registry.full_matrix()
    with pytest.raises(UsageError, match="valid selections: singles, default, full"):
        registry.selection("pairs")


def test_every_chain_step_has_its_logged_row() -> None:
    from memclaims.core import published

    scripts = [published.chain_row(step)["script"] for step in ((registry.REFERENCE,), *registry.ARTICLE_CHAIN)]
    assert scripts == ["01-2_pytorch-fabric", "02_mixed-precision", "03_bfloat16", "04_lower-batchsize",
                       "05_gradient-accum", "06_sgd-with-scheduler"]
    with pytest.raises(UsageError, match="no logged vit_chain row runs 16-true"):
        published.chain_row(("16-true",))  # the text's NaN run logged no figure


def test_recipe_resolution_follows_the_article() -> None:
    chain_end = resolve("vit", "article", ["bf16-true", "small-batch", "grad-accum", "sgd"])
    assert (chain_end.batch_size, chain_end.micro_batch_size, chain_end.accumulation_steps) == (16, 4, 4)
    assert chain_end.optimizer == "sgd" and chain_end.learning_rate == 0.01
    assert chain_end.precision == "bf16-true"
    reference = resolve("vit", "article", [])
    assert (reference.batch_size, reference.precision, reference.optimizer) == (64, "32-true", "adam")
    assert reference.learning_rate == 5e-5


def test_recipe_id_round_trips() -> None:
    recipe = resolve("vit", "smoke", ["sgd", "bf16-true"])
    assert recipe.id == "vit-smoke/bf16-true+sgd"
    assert parse_id(recipe.id) == recipe


@pytest.mark.parametrize("bad", ["", "vit", "vit-smoke", "vit/sgd", "vit-huge/sgd", "bert-smoke/sgd"])
def test_malformed_recipe_ids_are_usage_errors(bad: str) -> None:
    with pytest.raises(UsageError):
        parse_id(bad)
