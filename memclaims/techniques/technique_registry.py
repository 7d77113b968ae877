"""The technique registry: every memory-saving technique, its entry (``base.Technique``) in the order case ids
name them, and the rules of combining them.

The entries of the core choices (precision, batch, optimizer, loop) are written here; every other technique's is
its module's ``ENTRY`` (``memclaims/techniques/__init__.py``). Cases, combinations and the CLI are all generated
from ``TECHNIQUES``, so adding a technique is its module and one line here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cache
from itertools import combinations

from memclaims.core.errors import UsageError
from memclaims.techniques import (
    accelerate_loop,
    activation_checkpointing,
    activation_offload,
    cpu_offload,
    deepspeed_zero2,
    delayed_init,
    distributed_data_parallel,
    expandable_segments,
    fsdp,
    fsdp2,
    fused_linear_ce,
    hf_trainer,
    init_module,
    lightning_trainer,
    lora,
    optimizer_impl,
    optimizer_in_backward,
    paged_adamw8bit,
    qlora,
    qlora_no_double_quant,
    selective_checkpointing,
    tensor_parallel,
    torchao_adamw,
)

# The registry's names where its readers import them (explicit re-exports).
from memclaims.techniques.base import FABRIC, PYTORCH
from memclaims.techniques.base import FP32 as FP32
from memclaims.techniques.base import TRUE_HALF_PRECISIONS as TRUE_HALF_PRECISIONS
from memclaims.techniques.base import Technique as Technique
from memclaims.techniques.fsdp import HYBRID_NODES as HYBRID_NODES
from memclaims.techniques.fsdp import SHARDINGS as SHARDINGS
from memclaims.techniques.fsdp import reshard_after_forward as reshard_after_forward
from memclaims.techniques.fsdp import shard_group_size as shard_group_size
from memclaims.techniques.shared_conflicts import FSDP1_SHARDINGS as FSDP1_SHARDINGS
from memclaims.techniques.shared_conflicts import FSDP2_TECHNIQUES as FSDP2_TECHNIQUES
from memclaims.techniques.shared_conflicts import FSDP_SHARDINGS as FSDP_SHARDINGS

TECHNIQUES: tuple[Technique, ...] = (
    Technique("pytorch", "plain PyTorch loop, fp32, Adam (no Fabric)", "01_pytorch-vit",
              group="loop", stack=PYTORCH, alone=True),
    Technique("fabric", "the same loop through Lightning Fabric, fp32: the reference recipe",
              "01-2_pytorch-fabric", group="loop", alone=True),
    # The training stacks that run the loop themselves (issue #42): after the article's own loops in case ids.
    hf_trainer.ENTRY,
    accelerate_loop.ENTRY,
    lightning_trainer.ENTRY,
    Technique("16-mixed", "float16 automatic mixed precision", "02_mixed-precision",
              group="precision", precision="16-mixed",
              aliases=("16", "fp16")),  # Lightning's legacy 16 and TrainingArguments(fp16=True) are float16 AMP
    Technique("bf16-mixed", "bfloat16 automatic mixed precision", "02_mixed-precision (bf16 variant)",
              group="precision", precision="bf16-mixed",
              aliases=("bf16",)),  # Lightning's bf16 and TrainingArguments(bf16=True) are bfloat16 AMP
    Technique("16-true", "parameters and activations in float16 (diverges to NaN in the article)",
              "02_mixed-precision (text: 16-true)", group="precision", precision="16-true"),
    Technique("bf16-true", "parameters and activations in bfloat16", "03_bfloat16",
              group="precision", precision="bf16-true"),
    Technique("small-batch", "batch size divided by 4 (64 -> 16 at article scale)",
              "04_lower-batchsize", batch_divisor=4),
    Technique("grad-accum", "gradient accumulation over the scale's micro-batches (4: a quarter of the "
              "batch each), same effective batch", "05_gradient-accum", accumulates=True),
    Technique("sgd", "SGD lr 0.01 without momentum + cosine schedule instead of Adam",
              "06_sgd-with-scheduler", group="optimizer", optimizer="sgd"),
    # The course's lesson "Mixed precision training with 8-bit Adam" (distilbert-base-cased).
    Technique("adamw", "AdamW, weight decay on all but LayerNorm weights and biases (the course's "
              "recipe)", "course: 8-bit Adam (AdamW)", group="optimizer", optimizer="adamw"),
    Technique("adam8bit", "bitsandbytes Adam8bit: both Adam states in 8 bits, block-wise quantized",
              "course: 8-bit Adam lesson", group="optimizer", optimizer="adam8bit",
              requires=frozenset({"bitsandbytes"})),
    Technique("adamw8bit", "bitsandbytes AdamW8bit: AdamW with 8-bit block-wise quantized states",
              "course: 8-bit Adam lesson", group="optimizer", optimizer="adamw8bit",
              requires=frozenset({"bitsandbytes"})),
    paged_adamw8bit.ENTRY,
    Technique("adafactor", "transformers Adafactor: factored second moment, no first moment",
              "course: 8-bit Adam (Adafactor)", group="optimizer", optimizer="adafactor"),
    *optimizer_impl.ENTRIES,
    init_module.ENTRY,
    # Before FSDP's: a 2-D recipe (tensor-parallel + fsdp2) is run by tensor-parallel's strategy (Recipe.distributed,
    # the first strategy in this order), which shards over the data-parallel dimension with fsdp2's settings.
    tensor_parallel.ENTRY,
    *fsdp.ENTRIES,
    *fsdp2.ENTRIES,
    distributed_data_parallel.ENTRY,
    deepspeed_zero2.ENTRY,
    activation_checkpointing.ENTRY,
    cpu_offload.ENTRY,
    delayed_init.ENTRY,
    activation_offload.ENTRY,
    optimizer_in_backward.ENTRY,
    expandable_segments.ENTRY,
    lora.ENTRY,
    qlora.ENTRY,
    qlora_no_double_quant.ENTRY,
    fused_linear_ce.ENTRY,
    selective_checkpointing.ENTRY,
    *torchao_adamw.ENTRIES,
)

BY_NAME: dict[str, Technique] = {t.name: t for t in TECHNIQUES}
REFERENCE = FABRIC

# The article's cumulative single-GPU chain, 02 -> 06: each entry changes the previous by one thing
# (01-2, the REFERENCE, comes before it). The one table of the chain's recipes; each step's logged
# script and numbers are its row in memclaims/resources/published.json (``published.chain_row``).
ARTICLE_CHAIN: tuple[tuple[str, ...], ...] = (
    ("16-mixed",),
    ("bf16-true",),
    ("bf16-true", "small-batch"),
    ("bf16-true", "small-batch", "grad-accum"),
    ("bf16-true", "small-batch", "grad-accum", "sgd"),
)
# The article's table from its reference: 01-2 -> 06, the one definition every reader of the chain
# imports (the claims, the time model, gpu-check, reproduce, candidate, releases).
CHAIN: tuple[tuple[str, ...], ...] = ((REFERENCE,), *ARTICLE_CHAIN)


def _aliases() -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """The stacks' names for techniques (each entry's ``aliases``, TrainingArguments' ``optim`` values from
    ``optimizer_impl.TRAINER_OPTIMS``) -> the techniques each means; and the names given two meanings -> their
    choices (refused as ambiguous). A name that is a technique's own is never an alias."""
    meanings: dict[str, set[tuple[str, ...]]] = {}
    for entry in TECHNIQUES:
        for alias in entry.aliases:
            meanings.setdefault(alias, set()).add((entry.name,))
    for optim, built in optimizer_impl.TRAINER_OPTIMS.items():
        meanings.setdefault(optim, set()).add(built.techniques)
    plain = {alias: next(iter(m)) for alias, m in meanings.items() if len(m) == 1 and alias not in BY_NAME}
    ambiguous = {alias: tuple(sorted("+".join(c) for c in m)) for alias, m in meanings.items()
                 if len(m) > 1 and alias not in BY_NAME}
    return plain, ambiguous


# ``adamw_bnb_8bit`` -> ("adamw8bit",), ``adamw_torch_fused`` -> ("adamw", "fused"), ``fp16`` -> ("16-mixed",).
ALIASES, AMBIGUOUS = _aliases()
# Names of the stacks that mean no technique of memclaims, each with why (one line, not "unknown").
NO_TECHNIQUE: dict[str, str] = {
    **dict.fromkeys(("32", "32-true"), "is fp32, the reference's precision: give no precision technique"),
    **dict.fromkeys(("64", "64-true"), "(float64) is no technique memclaims measures; its precisions: "
                    + ", ".join(t.name for t in TECHNIQUES if t.group == "precision")),
}


def unalias(names: Iterable[str]) -> tuple[list[str], list[str]]:
    """The technique names ``names`` mean (a stack's alias replaced by its techniques, in place), and one
    ``"alias -> technique"`` note per alias used, for the front end to say once. An ambiguous alias or a name
    that means no technique is a UsageError naming the choices."""
    resolved: list[str] = []
    notes: list[str] = []
    for name in names:
        if name in BY_NAME:
            resolved.append(name)
        elif name in ALIASES:
            resolved += ALIASES[name]
            notes.append(f"{name} -> {'+'.join(ALIASES[name])}")
        elif name in AMBIGUOUS:
            raise UsageError(f"technique {name!r} is ambiguous: it means {' or '.join(AMBIGUOUS[name])}; "
                             "name one of them")
        elif name in NO_TECHNIQUE:
            raise UsageError(f"technique {name!r} {NO_TECHNIQUE[name]}")
        else:
            technique(name)  # raises: unknown, with the closest names
    return resolved, notes


def technique(name: str) -> Technique:
    try:
        return BY_NAME[name]
    except KeyError:
        from memclaims.core.suggest import did_you_mean

        raise UsageError(f"unknown technique {name!r}"
                         + did_you_mean(name, [*BY_NAME, *ALIASES], f"memclaims list shows all {len(BY_NAME)}")
                         ) from None


def canonical(names: Iterable[str]) -> tuple[str, ...]:
    """Validate a set of technique names and return them in registry order.

    The empty set and ``("fabric",)`` both mean the reference recipe and canonicalise to
    ``("fabric",)`` so that a recipe has exactly one id.
    """
    chosen = [technique(n) for n in dict.fromkeys(names)]
    problem = violation(chosen)
    if problem:
        raise UsageError(f"invalid combination {'+'.join(t.name for t in chosen)}: {problem}")
    if not chosen:
        return (REFERENCE,)
    names = {t.name for t in chosen}  # by name: comparing the entries themselves compares every field
    return tuple(t.name for t in TECHNIQUES if t.name in names)


def violation(chosen: list[Technique]) -> str | None:
    """The validity rule a combination breaks, or None when it is valid."""
    names = {t.name for t in chosen}
    for t in chosen:
        if t.alone and len(chosen) > 1:
            return f"{t.name!r} is a whole recipe by itself and combines with no other technique"
        missing = t.needs - names
        if missing:
            return f"{t.name!r} needs {', '.join(sorted(missing))}"
        for named, reason in t.conflicts:  # a technique's name, or a group's (every technique of it)
            other = next((c.name for c in chosen if named in (c.name, c.group)), None)
            if other is not None:
                return f"{t.name!r} does not combine with {other!r}: {reason}"
    groups: dict[str, list[str]] = {}
    for t in chosen:
        if t.group:
            groups.setdefault(t.group, []).append(t.name)
    for group, members in groups.items():
        if len(members) > 1:
            return f"at most one {group} technique per recipe (got {', '.join(members)})"
    return None


def single_process() -> tuple[Technique, ...]:
    """Techniques that run in one process; the multi-device ones have their own (dist) cases."""
    ranked = {t.name for t in TECHNIQUES if t.distributed}
    return tuple(t for t in TECHNIQUES if t.name not in ranked and not t.needs & ranked)


@dataclass(frozen=True)
class _RuleMasks:
    """``violation``'s rules over a pool as bit masks (bit i: the pool's i-th technique): what each technique
    excludes (alone, conflicts both ways, its group), what it needs, the techniques needing one outside the pool
    (never valid) and every technique some other needs."""

    excludes: tuple[int, ...]
    needs: tuple[int, ...]
    impossible: int
    needed: int


def _rule_masks(pool: tuple[Technique, ...]) -> _RuleMasks:
    index = {t.name: i for i, t in enumerate(pool)}
    everyone = (1 << len(pool)) - 1
    excludes = [0] * len(pool)
    needs = [0] * len(pool)
    impossible = 0
    for i, t in enumerate(pool):
        if t.alone:
            excludes[i] |= everyone & ~(1 << i)
        for j, other in enumerate(pool):
            if j != i and (other.alone or (t.group and t.group == other.group)
                           or t.conflict_with(other) is not None or other.conflict_with(t) is not None):
                excludes[i] |= 1 << j
        for need in t.needs:
            if need in index:
                needs[i] |= 1 << index[need]
            else:
                impossible |= 1 << i
    needed = 0
    for mask in needs:
        needed |= mask
    return _RuleMasks(tuple(excludes), tuple(needs), impossible, needed)


def valid_combinations(pool: tuple[Technique, ...] = TECHNIQUES) -> Iterator[tuple[str, ...]]:
    """Every valid non-empty combination of ``pool``, in a stable order (by size, then registry order: the order
    of ``itertools.combinations``). One walk over the pool in order on ``_rule_masks``' bits: a prefix that
    breaks a rule no further technique mends (alone, a conflict, two of a group, a need left behind) is not
    extended, so the registry's 2^n subsets stay affordable (the whole registry's 101,241 in about a second)."""
    rules = _rule_masks(pool)
    names = [t.name for t in pool]
    by_size: list[list[tuple[str, ...]]] = [[] for _ in range(len(pool) + 1)]

    def walk(start: int, chosen: list[str], chosen_bits: int, forbidden: int, required: int) -> None:
        # Pre-order in pool order: each size's combinations come out in lexicographic (combinations') order.
        for i in range(start, len(pool)):
            bit = 1 << i
            if required & (bit - 1) & ~chosen_bits:
                return  # a technique the chosen need lies behind, unchosen: no extension meets it
            if (forbidden | rules.impossible) & bit or rules.needs[i] & (bit - 1) & ~chosen_bits:
                continue
            extended, bits, needs = [*chosen, names[i]], chosen_bits | bit, required | rules.needs[i]
            if needs & ~bits == 0:
                by_size[len(extended)].append(tuple(extended))
            walk(i + 1, extended, bits, forbidden | rules.excludes[i], needs)

    walk(0, [], 0, 0, 0)
    for combos in by_size:
        yield from combos


@cache
def count_valid(pool: tuple[Technique, ...] = TECHNIQUES) -> int:
    """How many valid non-empty combinations ``pool`` has, ``len(list(valid_combinations(pool)))``, counted
    without listing them (``memclaims list`` and the pytest header show the full matrix's size: 55,737
    combinations take a second to list, a count milliseconds). The same rules as ``violation``, as bit masks
    (``_rule_masks``); a dynamic programme over the pool in order, its state what the choices so far forbid and
    require of the techniques ahead and which of the needed techniques they chose. Written here: no library
    counts a registry's rule set."""
    rules = _rule_masks(pool)
    excludes, needs, impossible, needed = rules.excludes, rules.needs, rules.impossible, rules.needed

    @cache
    def ways(i: int, forbidden: int, required: int, chosen_needed: int) -> int:
        if i == len(pool):
            return 1 if not required else 0
        bit = 1 << i
        total = 0 if required & bit else ways(i + 1, forbidden, required, chosen_needed)  # leave i out
        if not forbidden & bit and not impossible & bit:
            behind = needs[i] & (bit - 1)
            if behind & ~chosen_needed == 0:  # what i needs among the earlier ones was chosen
                ahead = ~((bit << 1) - 1)
                total += ways(i + 1, (forbidden | excludes[i]) & ahead, (required | needs[i]) & ahead,
                              chosen_needed | (bit & needed))
        return total

    return ways(0, 0, 0, 0) - 1  # less the empty combination


def compatible_pairs(pool: tuple[Technique, ...]) -> set[frozenset[str]]:
    return {
        frozenset(pair)
        for pair in combinations((t.name for t in pool), 2)
        if violation([BY_NAME[n] for n in pair]) is None
    }


def pairwise_cover(pool: tuple[Technique, ...]) -> list[tuple[str, ...]]:
    """A small set of valid combinations of ``pool`` in which every compatible pair appears at least once.

    Greedy set cover (largest number of still-uncovered pairs first, ties by the stable order of
    ``valid_combinations``); deterministic, so case ids never move between runs.
    """
    uncovered = compatible_pairs(pool)
    candidates = [c for c in valid_combinations(pool) if len(c) >= 2]
    cover: list[tuple[str, ...]] = []
    while uncovered:
        best = max(candidates, key=lambda c: len(uncovered & {frozenset(p) for p in combinations(c, 2)}))
        cover.append(best)
        uncovered -= {frozenset(p) for p in combinations(best, 2)}
    return cover


def singles(pool: tuple[Technique, ...] = TECHNIQUES) -> list[tuple[str, ...]]:
    """Each technique on its own, together with the techniques it needs (offload needs fsdp)."""
    return list(dict.fromkeys(canonical((t.name, *sorted(t.needs))) for t in pool))


def default_selection(pool: tuple[Technique, ...] | None = None) -> list[tuple[str, ...]]:
    """What the tiers run by default: every single technique ``in_default``, the article's chain, a
    pairwise cover of the techniques ``in_cover``."""
    pool = single_process() if pool is None else pool
    selected: dict[tuple[str, ...], None] = dict.fromkeys(singles(tuple(t for t in pool if t.in_default)))
    for step in ARTICLE_CHAIN:
        selected[canonical(step)] = None
    for combo in pairwise_cover(tuple(t for t in pool if t.in_cover)):
        selected[combo] = None
    return list(selected)


def full_matrix(pool: tuple[Technique, ...] | None = None) -> list[tuple[str, ...]]:
    return list(_full_matrix(single_process() if pool is None else pool))


_REGISTRY_ORDER = {t.name: index for index, t in enumerate(TECHNIQUES)}


@cache
def _full_matrix(pool: tuple[Technique, ...]) -> tuple[tuple[str, ...], ...]:
    # Cached: tens of thousands of combinations, asked by every pytest session's header. valid_combinations
    # yields valid ones in the pool's order: each put in registry order (canonical()'s), not validated twice.
    return tuple(tuple(sorted(combo, key=_REGISTRY_ORDER.__getitem__)) for combo in valid_combinations(pool))


# The named selections of technique combinations (pytest's --memclaims-matrix, ``memclaims
# benchmark --matrix``, ``memclaims list``'s case counts); memclaims.core.settings.Matrix names them
# for the options' table.
SELECTIONS: dict[str, Callable[[], list[tuple[str, ...]]]] = {
    "singles": lambda: singles(single_process()),
    "default": lambda: default_selection(),
    "full": lambda: full_matrix(),
}


def selection(name: str) -> list[tuple[str, ...]]:
    """The combinations the selection ``name`` runs (``SELECTIONS``)."""
    try:
        select = SELECTIONS[name]
    except KeyError:
        raise UsageError(f"unknown selection {name!r}; valid selections: {', '.join(SELECTIONS)}") from None
    return select()


def selection_size(name: str) -> int:
    """How many combinations the selection ``name`` runs; the full matrix counted, not listed (``count_valid``)."""
    if name == "full":
        return count_valid(single_process())
    return len(selection(name))
