"""``memclaims fit``: sizes with units, the pruned matrix on the sim, ranking, JSON, plot, extrapolation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memclaims import cli, sim
from memclaims.core.errors import UsageError
from memclaims.recipes.recipe import Sizes, resolve
from memclaims.report import fit

# One worker under -n (--dist loadgroup hands out ungrouped tests one by one, so a module's tests alternate between
# the workers): the module's fit (about 10 s of CPU) runs once, not once per worker.
pytestmark = [pytest.mark.sim, pytest.mark.xdist_group("unit-fit")]

# Wide enough that tensors, not cuBLAS workspaces and segment rounding, decide the peak (fake tensors
# cost the same time at any width); two layers at smoke scale.
TINY = "hf:llama(hidden_size=1024,intermediate_size=2816,num_attention_heads=8,num_key_value_heads=8,vocab_size=32000)"
SIZES = Sizes(seq_len=128)
POOL = ("bf16-true", "small-batch", "sgd", "init-module")  # 15 combinations: a short test


@pytest.mark.parametrize(("text", "expected"), [("24GB", 24 * 10**9), ("80GiB", 80 * 2**30), ("1.5 TB", 15 * 10**11),
                                                ("512MiB", 512 * 2**20), ("100B", 100)])
def test_sizes_say_decimal_or_binary(text: str, expected: int) -> None:
    assert fit.parse_size(text) == expected


@pytest.mark.parametrize("text", ["80G", "80", "GB", "80 gigabytes"])
def test_sizes_without_a_known_unit_are_refused(text: str) -> None:
    with pytest.raises(UsageError, match="valid units: B, KB, MB, GB, TB .* KiB, MiB, GiB, TiB"):
        fit.parse_size(text)


@pytest.mark.parametrize("text", ["-1GB", "0GB", "0.4B", "-0.0GiB"])
def test_sizes_that_are_no_budget_are_refused(text: str) -> None:
    with pytest.raises(UsageError, match=f"--memory {text!r} is not a positive budget"):
        fit.parse_size(text)


def test_article_costs_and_risks_come_from_the_published_logs() -> None:
    ratio, risk = fit.cost(("bf16-true", "small-batch", "grad-accum"))
    assert ratio == pytest.approx(12.91 / 17.88)  # 05's minutes over 01-2's
    assert "diverged to NaN" in fit.cost(("16-true",))[1] and fit.cost(("16-true",))[0] is None
    assert fit.cost(("adamw",))[0] is None  # never timed by the article: unknown, not guessed


@pytest.fixture(scope="module")
def result() -> fit.FitResult:
    reference = sim.simulate(resolve(TINY, "smoke", [], SIZES))
    # Below the fp32 reference, so that some combinations fit and some do not.
    return fit.fit(TINY, int(reference.peak_reserved_total_bytes * 0.7), scale="smoke", sizes=SIZES, only=POOL)


def test_every_prediction_is_compared_with_the_budget(result: fit.FitResult) -> None:
    predicted = [r for r in result.rows if r.status in ("fits", "too big")]
    assert {r.status for r in predicted} == {"fits", "too big"}
    for row in predicted:
        assert row.headroom_bytes == result.memory_bytes - row.peak_reserved_bytes
        assert (row.status == "fits") == (row.peak_reserved_bytes <= result.memory_bytes)
    reference = next(r for r in result.rows if r.techniques == ["fabric"])
    assert reference.status == "too big"


def test_the_matrix_is_pruned_where_a_subset_already_fits(result: fit.FitResult) -> None:
    def chosen(row: fit.FitRow) -> set[str]:
        return set(row.techniques) - {"fabric"}  # the reference is no technique: a subset of all

    fitting = [chosen(r) for r in result.rows if r.status == "fits"]
    for row in result.rows:
        has_fitting_subset = any(f < chosen(row) for f in fitting)
        if row.status == "pruned":
            assert has_fitting_subset, row
        elif row.status in ("fits", "too big") and not row.asked:
            assert not has_fitting_subset, row  # nothing was replayed that a cheaper combination answers
    # The combination asked for (every -t) is what the user would run: predicted although a subset fits.
    asked = [row for row in result.rows if row.asked]
    assert [chosen(row) for row in asked] == [set(POOL)] and asked[0].status in ("fits", "too big")
    assert any(f < set(POOL) for f in fitting)
    assert sum(r.status == "pruned" for r in result.rows) > 0
    # Every combination of the full matrix has a row.
    from memclaims.techniques import technique_registry as techniques

    assert len(result.rows) == len(techniques.full_matrix(tuple(techniques.BY_NAME[n] for n in POOL))) + 1  # + fabric


def test_ranking_puts_fitting_combinations_first(result: fit.FitResult) -> None:
    statuses = [r.status for r in result.ranked()]
    assert statuses[: statuses.count("fits")] == ["fits"] * statuses.count("fits")
    table = fit.table(result)
    assert "decimal (1e9 B)" in table[1] and table[3].split()[1] == "fits"
    # What every prediction assumed, in the header; the article's ViT times are not a Llama's.
    assert f"at smoke scale, batch {result.batch_size} x 128 tokens (--batch-size, --seq-len)" in table[0]
    assert "time x" not in "\n".join(table) and "accuracy risk" not in "\n".join(table)
    assert sum(line.endswith(fit.ASKED) for line in table) == 1 and "+".join(POOL) not in table[-1]


def test_plot_is_written(result: fit.FitResult, tmp_path: Path) -> None:
    fit.plot(result, tmp_path / "fit.png")
    assert (tmp_path / "fit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_extrapolation_is_opt_in_and_over_predicts_within_its_documented_bound() -> None:
    deep = TINY.replace("(", "(num_hidden_layers=8,")
    recipe = resolve(deep, "smoke", ["bf16-true"], SIZES)
    extrapolated, _, how = fit.predict(recipe, "article", exact=False)
    replayed, _, exact_how = fit.predict(recipe, "article", exact=True)
    assert how == "extrapolated from 2 and 4 layers" and exact_how == "replayed"
    # fit.py's docstring and --extrapolate's help state +10 % for this shape: an upper bound, never under.
    assert replayed <= extrapolated <= 1.12 * replayed


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    # A budget the fp32 reference fits: one replay, every other combination pruned.
    assert cli.main(["fit", TINY, "--memory", "100GB", "--scale", "smoke", "--seq-len", "16", "--json",
                     *[f"-t{name}" for name in POOL]]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memory_bytes"] == 100 * 10**9
    statuses = {r["status"] for r in data["rows"]}
    assert "fits" in statuses and "too big" not in statuses
    # The reference fits; the combination asked is predicted too (never pruned), and fits.
    assert [(r["techniques"], r["asked"]) for r in data["rows"] if r["status"] == "fits"] == [
        (["bf16-true", "small-batch", "sgd", "init-module"], True), (["fabric"], False)]  # most headroom first
    assert (data["batch_size"], data["input_size"], data["size_knob"]) == (8, 16, "seq")  # hf smoke: batch 8


def test_a_combination_past_the_budget_is_replayed_under_it_as_torch_retries() -> None:
    # ViT-B-wide gpusmoke fp32: 2192 MiB reserved, 1975 MiB allocated at the peak (the article profile).
    recipe = resolve("vit", "gpusmoke", [], Sizes())
    unlimited = sim.simulate(recipe)
    reserved, allocated = unlimited.peak_reserved_total_bytes, unlimited.peak_allocated_bytes
    budget = reserved - 30 * 2**20
    result = fit.fit("vit", budget, scale="gpusmoke", only=("bf16-true",))
    reference = next(r for r in result.rows if r.techniques == ["fabric"])
    assert reference.status == "fits" and reference.frees_cache, reference
    assert allocated <= reference.peak_reserved_bytes <= budget
    assert f"{reserved / 1e9:.2f} GB reserved without a limit" in reference.note
    assert any(line.split()[1:3] == ["fits,", "retries"] for line in fit.table(result))
    assert "fits only because the allocator frees its cached segments" in fit.table(result)[-1]
    # Below the allocated peak nothing can help: out of memory, too big.
    starved = fit.fit("vit", allocated - 2**20, scale="gpusmoke", only=("bf16-true",))
    row = next(r for r in starved.rows if r.techniques == ["fabric"])
    assert row.status == "too big" and not row.frees_cache and row.peak_reserved_bytes == reserved
    assert "out of memory in the train phase" in row.note


def test_single_device_checkpointing_and_adafactor_are_ranked() -> None:
    """Neither needs fsdp nor a real tensor: both are replayed, and each lowers the reference's peak."""
    reference = sim.simulate(resolve(TINY, "smoke", [], SIZES))
    budget = int(reference.peak_reserved_total_bytes * 0.7)  # the fp32 reference does not fit
    result = fit.fit(TINY, budget, scale="smoke", sizes=SIZES, only=("activation-checkpointing", "adafactor"))
    rows = {"+".join(r.techniques): r for r in result.rows}
    assert set(rows) == {"fabric", "activation-checkpointing", "adafactor", "adafactor+activation-checkpointing"}
    assert all(r.status != "not predicted" for r in rows.values()), [r.note for r in rows.values()]
    for single in ("activation-checkpointing", "adafactor"):
        assert rows[single].status in ("fits", "too big")
        assert rows[single].peak_reserved_bytes < rows["fabric"].peak_reserved_bytes


def test_the_new_techniques_are_considered_by_default() -> None:
    """Without -t, fit's pool is every single-process technique: #27's offload and in-backward too."""
    from memclaims.techniques import technique_registry as registry

    pool = {name for combo in registry.full_matrix() for name in combo}
    assert {"activation-offload", "optimizer-in-backward", "activation-checkpointing", "adafactor"} <= pool
    assert not {t.name for t in registry.TECHNIQUES if t.distributed} & pool


def test_strategies_are_considered_over_n_devices(capsys: pytest.CaptureFixture[str]) -> None:
    """--devices N adds the strategies, each replayed per rank on N simulated GPUs: FSDP's largest rank
    holds less than one GPU's whole model, DDP's more (its gradient buckets)."""
    reference = sim.simulate(resolve(TINY, "smoke", [], SIZES))
    budget = int(reference.peak_reserved_total_bytes * 0.8)  # FSDP's rank: 0.75 of it (2 layers, 4 ranks)
    result = fit.fit(TINY, budget, scale="smoke", sizes=SIZES, only=("fsdp", "ddp"), devices=4)
    rows = {"+".join(r.techniques): r for r in result.rows}
    assert set(rows) == {"fabric", "fsdp", "ddp"} and result.devices == 4
    assert rows["fsdp"].peak_reserved_bytes < rows["fabric"].peak_reserved_bytes < rows["ddp"].peak_reserved_bytes
    assert rows["fsdp"].status == "fits" and rows["ddp"].status == "too big"
    assert "per GPU, strategies over 4 GPUs" in fit.table(result)[0]
    assert "at most one strategy technique per recipe" in (result.apart or "") and "do not combine" in fit.table(result)[-1]
    over_two = fit.fit(TINY, budget, scale="smoke", sizes=SIZES, only=("fsdp",), devices=2)
    assert next(r for r in over_two.rows if r.techniques == ["fsdp"]).peak_reserved_bytes > rows["fsdp"].peak_reserved_bytes
    with pytest.raises(UsageError, match="--devices 1: a strategy \\(fsdp\\) spreads a run over at least 2 GPUs"):
        fit.fit(TINY, budget, scale="smoke", sizes=SIZES, only=("fsdp",), devices=1)


def test_a_stack_among_the_techniques_trains_every_combination() -> None:
    """-t hf-trainer (issue #42): the Trainer is what the user trains with, so every candidate runs through it and the
    Trainer alone is the reference (not Fabric's loop, which would fit first and prune the Trainer's rows)."""
    roomy = fit.fit("distilbert", 10**12, scale="smoke", only=("hf-trainer", "bf16-mixed"))
    rows = {frozenset(r.techniques): r for r in roomy.rows}
    assert set(rows) == {frozenset({"hf-trainer"}), frozenset({"hf-trainer", "bf16-mixed"})}, rows
    assert rows[frozenset({"hf-trainer"})].status == "fits"
    assert rows[frozenset({"hf-trainer", "bf16-mixed"})].status == "fits"  # asked: predicted although the stack fits
    assert rows[frozenset({"hf-trainer", "bf16-mixed"})].asked
    tight = fit.fit("distilbert", 600_000, scale="smoke", only=("hf-trainer", "bf16-mixed"))  # the parameters: 563,976 B
    assert {r.status for r in tight.rows} == {"too big"} and all("hf-trainer" in r.recipe for r in tight.rows)


def test_the_exit_status_says_whether_anything_fits(capsys: pytest.CaptureFixture[str]) -> None:
    """0: something fits; 1: nothing does (a script can ask); the table says why either way."""
    args = ["fit", TINY, "--scale", "smoke", "--seq-len", "16", "-t", "bf16-true"]
    assert cli.main([*args, "--memory", "100GB"]) == 0
    capsys.readouterr()
    assert cli.main([*args, "--memory", "300MB"]) == 1  # above the parameters' floor, below every peak
    statuses = [line.split()[1] for line in capsys.readouterr().out.splitlines()[3:] if line[:4].strip().isdigit()]
    assert statuses and set(statuses) == {"too"}, statuses  # "too big", each row


def test_a_row_names_what_was_asked_of_its_techniques() -> None:
    """A parameterized combination is shown as its recipe id says it (``lora[r=4]``), not as the bare names."""
    row = fit.FitRow(["lora"], "distilbert-smoke/lora[r=4]", "fits", 90_000_000, 80_000_000, 910_000_000, asked=True)
    result = fit.FitResult("distilbert", "smoke", "current", 10**9, 1, "replayed", rows=[row])
    assert any(line.endswith(f" lora[r=4]  {fit.ASKED}") for line in fit.table(result)), fit.table(result)
