"""The technique registry, its validity rules, combination generation and recipe ids.

Also (the second part of this file): the technique registry's rules and generated selections, against an independent oracle: every
subset of the single-process techniques, judged by the rules as the registry states them (one per
group, an `alone` technique by itself, `needs` present, no declared conflict).
"""

from __future__ import annotations

from itertools import chain, combinations, product

import pytest

from memclaims.core.errors import UsageError
from memclaims.recipes.recipe import parse_id, resolve
from memclaims.techniques import technique_registry as registry


def test_names_are_the_public_contract() -> None:
    core = ["pytorch", "fabric", "16-mixed", "bf16-mixed", "16-true", "bf16-true", "small-batch",
            "grad-accum", "sgd", "init-module"]
    assert [t.name for t in registry.TECHNIQUES if t.name in core] == core
    assert len(registry.BY_NAME) == len(registry.TECHNIQUES), "technique names must be unique"


@pytest.mark.parametrize("names, rule", [
    (["bf16-true", "16-true"], "at most one precision technique"),
    (["sgd", "fabric"], "combines with no other technique"),
    (["pytorch", "bf16-true"], "combines with no other technique"),
    (["nope"], "unknown technique 'nope'; memclaims list shows all"),
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


# about 14 s on 2 cores (a greedy cover over the whole pool's 55,000 combinations): nightly; CI keeps
# the cover of the default selection's pool (test_default_selection_*) and the small cover below.
@pytest.mark.slow
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


# --- the rules against an independent oracle ---------------------------------------------------------


T = registry.BY_NAME


def _valid_by_the_rules(names: tuple[str, ...]) -> bool:
    chosen = [T[n] for n in names]
    groups = [t.group for t in chosen if t.group]
    return (len(groups) == len(set(groups)) and not any(t.alone and len(chosen) > 1 for t in chosen)
            and all(t.needs <= set(names) for t in chosen)
            and not any(other in names or other in groups for t in chosen for other, _ in t.conflicts))


def test_single_process_is_every_technique_but_the_sharded_ones_in_registry_order() -> None:
    names = [t.name for t in registry.single_process()]
    assert names == [t.name for t in registry.TECHNIQUES  # every strategy, and what needs a sharded one
                     if t.group != "strategy" and t.name not in ("cpu-offload", "delayed-init", "tensor-parallel")]
    assert "activation-checkpointing" in names  # needs no sharding: it runs on one device


def _at_most_one_per_group(pool: tuple[registry.Technique, ...]) -> list[tuple[str, ...]]:
    """Every non-empty subset of ``pool`` with at most one technique of each group, in ``itertools.combinations``
    order (by size, then registry order): the subsets the rules can accept at all. Enumerated per group, not over all
    2^n subsets: with the training stacks (issue #42) the loop group has five members and 2^n took 145 s."""
    index = {t.name: i for i, t in enumerate(pool)}
    groups: dict[str, list[str]] = {}
    for t in pool:
        groups.setdefault(t.group or t.name, []).append(t.name)  # an ungrouped technique is a group of one
    choices = [[(), *((name,) for name in members)] for members in groups.values()]
    subsets = [tuple(sorted(chain.from_iterable(pick), key=index.__getitem__)) for pick in product(*choices)]
    return sorted((s for s in subsets if s), key=lambda s: (len(s), [index[n] for n in s]))


def test_the_grouped_enumeration_is_every_subset_with_one_per_group() -> None:
    """The enumeration above against all 2^n subsets, on a pool small enough for the latter."""
    pool = tuple(T[n] for n in ("pytorch", "fabric", "hf-trainer", "bf16-true", "16-true", "small-batch", "sgd",
                                "adamw", "grad-accum"))
    every = chain.from_iterable(combinations([t.name for t in pool], k) for k in range(1, len(pool) + 1))
    one_per_group = [s for s in every if len({T[n].group or n for n in s}) == len(s)]
    assert _at_most_one_per_group(pool) == one_per_group


# about 32 s on 2 cores (the brute-force oracle walks every subset with one technique per group): nightly;
# CI keeps test_every_generated_combination_is_valid_and_unique and the needs rules below.
@pytest.mark.slow
def test_full_matrix_is_exactly_the_valid_subsets() -> None:
    pool = registry.single_process()
    expected = [s for s in _at_most_one_per_group(pool) if _valid_by_the_rules(s)]
    assert registry.full_matrix() == expected  # by size, then registry order
    assert list(registry.valid_combinations(pool)) == expected
    assert registry.full_matrix()[:6] == [("pytorch",), ("fabric",), ("hf-trainer",), ("accelerate",),
                                          ("lightning-trainer",), ("16-mixed",)]
    assert ("bf16-true", "small-batch", "grad-accum", "sgd", "init-module") in expected


def test_valid_combinations_of_the_whole_registry_honour_needs() -> None:
    every = list(registry.valid_combinations())
    assert ("cpu-offload",) not in every and ("fsdp", "cpu-offload") in every
    assert ("activation-checkpointing",) in every and ("fsdp", "activation-checkpointing") in every
    assert ("fsdp", "activation-checkpointing", "cpu-offload", "delayed-init") in every
    assert all(_valid_by_the_rules(c) for c in every)
    assert len(every) == len(set(every))


def test_compatible_pairs_and_a_small_pairwise_cover() -> None:
    pool = tuple(T[n] for n in ("bf16-true", "16-true", "small-batch", "sgd"))
    pairs = {frozenset(p) for p in [("bf16-true", "small-batch"), ("bf16-true", "sgd"), ("16-true", "small-batch"),
                                    ("16-true", "sgd"), ("small-batch", "sgd")]}
    assert registry.compatible_pairs(pool) == pairs
    # Greedy: the combination covering most uncovered pairs first, ties by the stable order.
    assert registry.pairwise_cover(pool) == [("bf16-true", "small-batch", "sgd"), ("16-true", "small-batch", "sgd")]
    assert registry.pairwise_cover(tuple(T[n] for n in ("bf16-true", "16-true"))) == []


# about 14 s on 2 cores (the whole pool's cover, as above): nightly.
@pytest.mark.slow
def test_pairwise_cover_of_the_single_process_pool_is_small_and_complete() -> None:
    pool = registry.single_process()
    cover = registry.pairwise_cover(pool)
    pairs = registry.compatible_pairs(pool)
    covered = {frozenset(p) for combo in cover for p in combinations(combo, 2)}
    assert covered >= pairs and all(_valid_by_the_rules(c) for c in cover)
    # Each combination adds a pair the ones before it did not cover (no wasted case).
    seen: set[frozenset[str]] = set()
    for combo in cover:
        new = {frozenset(p) for p in combinations(combo, 2)} - seen
        assert new, combo
        seen |= new
    assert len(cover) < len(pairs) / 2
    assert len(cover[0]) == max(len(c) for c in registry.full_matrix())


@pytest.mark.parametrize(("names", "rule"), [
    (("optimizer-in-backward", "grad-accum"), "accumulation needs the gradients of all micro-batches"),
    (("16-mixed", "optimizer-in-backward"), "GradScaler"),
    (("adamw8bit", "optimizer-in-backward"), "bitsandbytes keeps its 8-bit settings"),
    (("fsdp", "optimizer-in-backward"), "hooks on the original parameters never fire"),
    (("ddp", "optimizer-in-backward"), "before the all-reduce"),
    (("fsdp", "activation-offload"), "do not wrap their forward pass in save_on_cpu"),
])
def test_declared_conflicts_are_invalid_with_their_reason(names: tuple[str, ...], rule: str) -> None:
    with pytest.raises(UsageError, match=rule):
        registry.canonical(names)
    pool = registry.single_process()
    assert not any(set(names) <= set(c) for c in registry.full_matrix(pool))


def test_singles_bring_what_they_need() -> None:
    singles = registry.singles()
    assert singles[:6] == [("pytorch",), ("fabric",), ("hf-trainer",), ("accelerate",), ("lightning-trainer",),
                           ("16-mixed",)]
    assert ("activation-checkpointing",) in singles and ("fsdp", "cpu-offload") in singles  # offload needs fsdp
    assert singles.count(("fsdp",)) == 1 and len(singles) == len(registry.TECHNIQUES)
    assert registry.singles(registry.single_process()) == [(t.name,) if not t.needs else ("qlora", t.name)
                                                           for t in registry.single_process()]
    assert ("qlora", "qlora-no-double-quant") in singles  # the option needs qlora


def test_default_selection_is_singles_then_chain_then_cover_without_repeats() -> None:
    pool = registry.single_process()
    selection = registry.default_selection()
    singles = registry.singles(tuple(t for t in pool if t.in_default))
    # Beside paged-adamw8bit, the optimizer's implementations, the stacks and issue #43's techniques: one more
    # ViT-L/16 case each would pass the nightly's 30 GPU-minutes; their singles run in their own case files and the
    # full matrix.
    assert {t.name for t in pool if not t.in_default} == {"paged-adamw8bit", "for-loop", "foreach", "fused",
                                                          "hf-trainer", "accelerate", "lightning-trainer",
                                                          "qlora-no-double-quant", "selective-checkpointing",
                                                          "ao-adamw8bit", "ao-adamw4bit", "ao-adamw-fp8"}
    assert selection[:len(singles)] == singles
    assert len(selection) == len(set(selection))
    rest = selection[len(singles):]
    chain_steps = [registry.canonical(s) for s in registry.ARTICLE_CHAIN if registry.canonical(s) not in singles]
    assert rest[:len(chain_steps)] == chain_steps
    # The cover is of the techniques in it: the ones added after the article keep out (their singles only).
    covered = tuple(t for t in pool if t.in_cover)
    assert {t.name for t in pool} - {t.name for t in covered} == {"activation-offload", "optimizer-in-backward",
                                                                        "expandable-segments", "paged-adamw8bit",
                                                                        "lora", "qlora", "qlora-no-double-quant", "fused-linear-ce",
                                                                        "for-loop", "foreach", "fused",
                                                                        "hf-trainer", "accelerate", "lightning-trainer",
                                                                        "selective-checkpointing", "ao-adamw8bit",
                                                                        "ao-adamw4bit", "ao-adamw-fp8"}
    cover = [c for c in registry.pairwise_cover(covered) if c not in singles and c not in chain_steps]
    assert rest[len(chain_steps):] == cover
    assert registry.default_selection(pool) == selection
    small = tuple(T[n] for n in ("bf16-true", "small-batch"))
    assert registry.default_selection(small)[:2] == [("bf16-true",), ("small-batch",)]
    assert registry.full_matrix(small) == [("bf16-true",), ("small-batch",), ("bf16-true", "small-batch")]


@pytest.mark.parametrize(("names", "message"), [
    (["cpu-offload", "bf16-true"], "invalid combination cpu-offload+bf16-true: 'cpu-offload' needs fsdp"),
    (["fabric", "sgd"], "invalid combination fabric+sgd: 'fabric' is a whole recipe by itself and combines with no "
                        "other technique"),
    (["sgd", "adamw"], "invalid combination sgd+adamw: at most one optimizer technique per recipe (got sgd, adamw)"),
    (["16-mixed", "bf16-true"], "at most one precision technique per recipe (got 16-mixed, bf16-true)"),
])
def test_each_rule_names_itself(names: list[str], message: str) -> None:
    with pytest.raises(UsageError) as error:
        registry.canonical(names)
    assert message in str(error.value)


def test_violation_and_technique_lookup() -> None:
    assert registry.violation([]) is None
    assert registry.violation([T["pytorch"]]) is None and registry.violation([T["fabric"]]) is None
    assert registry.violation([T["fsdp"], T["activation-checkpointing"], T["cpu-offload"]]) is None
    assert registry.violation([T["bf16-true"], T["small-batch"], T["grad-accum"], T["sgd"]]) is None
    assert registry.technique("sgd") is T["sgd"]
    with pytest.raises(UsageError) as error:
        registry.technique("fp8")
    assert str(error.value) == f"unknown technique 'fp8'; memclaims list shows all {len(T)}"
    assert registry.canonical(["grad-accum", "bf16-true", "grad-accum"]) == ("bf16-true", "grad-accum")
    assert registry.canonical(("fsdp", "activation-checkpointing")) == ("fsdp", "activation-checkpointing")
    assert registry.canonical(()) == ("fabric",)


def test_a_technique_a_workload_cannot_take_is_refused_with_the_reason_and_left_out_of_its_cases() -> None:
    from memclaims.core.errors import UsageError
    from memclaims.recipes.recipe import for_workload, resolve

    needed = registry.BY_NAME["lora"].workload_needs
    assert needed is not None and needed[0] == "lora_targets"
    with pytest.raises(UsageError, match="technique 'lora' does not run on workload 'vit': peft's LoRA adapters"):
        resolve("vit", "smoke", ("lora",))
    assert "lora" in resolve("distilbert", "smoke", ("lora",)).techniques
    default = registry.default_selection()
    assert ("lora",) in default and ("lora",) not in for_workload("vit", default)
    # The text workloads take every technique of it but the causal LM's fused loss; a ViT neither that nor lora.
    assert [c for c in default if c not in for_workload("distilbert", default)] == [("fused-linear-ce",)]
    assert [c for c in default if c not in for_workload("vit", default)] == [("lora",), ("qlora",), ("fused-linear-ce",)]
    assert for_workload("hf:gpt2", default) == default


def test_full_matrix_of_a_pool_in_any_order_names_recipes_in_registry_order() -> None:
    """fit passes its -t pool in the user's order; every combination still reads as its recipe id."""
    pool = (T["activation-checkpointing"], T["adafactor"])
    assert registry.full_matrix(pool) == [("activation-checkpointing",), ("adafactor",),
                                          registry.canonical(("activation-checkpointing", "adafactor"))]


def test_the_count_of_valid_combinations_is_the_walks_without_listing_them() -> None:
    """count_valid (memclaims list's and the pytest header's full-matrix size, in milliseconds) counts what
    valid_combinations lists, on pools that hold every rule: alone, needs (cpu-offload needs fsdp), conflicts,
    groups; and the full registry's known sizes."""
    rules = [T[n] for n in ("pytorch", "fabric", "16-mixed", "bf16-true", "sgd", "adamw8bit", "fused", "foreach",
                            "fsdp", "cpu-offload", "activation-checkpointing", "selective-checkpointing", "lora",
                            "qlora")]
    pools = [tuple(t for t in registry.TECHNIQUES if t in rules), registry.single_process()[:15],
             (T["cpu-offload"], T["bf16-true"])]  # a need outside the pool: never valid
    for pool in pools:
        assert registry.count_valid(pool) == len(list(registry.valid_combinations(pool))), [t.name for t in pool]
    assert registry.count_valid((T["cpu-offload"],)) == 0
    assert registry.selection_size("full") == registry.count_valid(registry.single_process())


# Lists the 55,737 combinations: 0.1 CPU s since valid_combinations walks bit masks (3.4 s before: nightly then).
def test_the_full_matrix_count_is_its_listings_length() -> None:
    assert registry.selection_size("full") == len(registry.full_matrix())


def test_a_conflict_with_the_strategy_group_is_one_with_every_strategy_and_no_name_is_a_groups() -> None:
    """A one-device technique names the strategies' group in its conflicts (``shared_conflicts.STRATEGY``), not each
    strategy, so a strategy added later conflicts with it too; a group's name is no technique's (a conflict naming it
    would be ambiguous). FSDP's shardings are the ``fsdp``-API strategies besides the article's fsdp."""
    from memclaims.techniques.shared_conflicts import FSDP_SHARDINGS, STRATEGY

    strategies = [t for t in registry.TECHNIQUES if t.group == STRATEGY]
    lora, ddp = T["lora"], T["ddp"]
    assert len(strategies) >= 8 and all(lora.conflict_with(s) for s in strategies)
    assert registry.violation([lora, ddp]) == f"'lora' does not combine with 'ddp': {lora.conflict_with(ddp)}"
    assert lora.conflict_with(T["bf16-true"]) is None
    assert not {t.name for t in registry.TECHNIQUES} & {t.group for t in registry.TECHNIQUES}
    assert set(FSDP_SHARDINGS) < {s.name for s in strategies} and "fsdp" not in FSDP_SHARDINGS


def test_each_narrow_protocol_is_implemented_by_the_techniques_that_need_it_only() -> None:
    """The points one technique (or one family) needs sit on a protocol of its own, not on the Hooks every technique
    carries: the engines find them with isinstance, so a technique that lost its method would silently be skipped
    (and one that gained a stray one would be called): each protocol names exactly its techniques."""
    from memclaims.techniques import base

    implementing = {protocol.__name__: sorted(t.name for t in registry.TECHNIQUES if isinstance(t.hooks, protocol))
                    for protocol in (base.SetsAllocator, base.LoadsReference, base.PlacesOnDevice,
                                     base.JudgesParameterBytes, base.BuildsOptimizer, base.SetsUpOptions,
                                     base.ChecksRanks)}
    assert implementing == {
        "SetsAllocator": ["expandable-segments"], "LoadsReference": ["init-module"], "PlacesOnDevice": ["qlora"],
        "JudgesParameterBytes": ["qlora"], "BuildsOptimizer": ["ao-adamw-fp8", "ao-adamw4bit", "ao-adamw8bit"],
        "SetsUpOptions": ["cpu-offload"], "ChecksRanks": ["ddp"]}
