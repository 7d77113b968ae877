"""The `sim` tier: the article's single-GPU ViT-L/16 table, and the ViT-H/14 series' one-GPU bar,
predicted on fake tensors, without a GPU.

Every number is deterministic, so the bands below are about the model's fidelity, not noise.
Each recipe is simulated once per module (``sims``) and shared by the row and claim tests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from fixtures.messages import differs
from memclaims.core import published
from memclaims.core.errors import OutOfMemory, UsageError
from memclaims.core.record import GRADIENTS, OPTIMIZER_STATE, PARAMETERS, Record
from memclaims.pytest.records import RecordCache
from memclaims.recipes.recipe import Recipe, resolve
from memclaims.report.published_table import A10G_TOTAL_MEMORY_BYTES
from memclaims.sim import PROFILES, LoadResult, simulate, simulate_load

pytestmark = pytest.mark.sim

GB = 1e9  # the article prints max_memory_reserved() / 1e9
MIB = 2**20

# Accepted predicted/published: +-5 % on every logged row (01 -> 06). On 05 the article profile
# replays the 2023-06 nightly's foreach Adam (memclaims.sim.eras), whose out-of-place ``denom``
# holds a second parameter-sized temporary (0.61 GB in bf16) in the step; with micro-batches of 4
# that step, not the activations, sets the peak (see test_row_05_peak_is_the_2023_adam_step).
# Today's Adam (profile ``current``) predicts 0.855.
BAND = (0.95, 1.05)
# Row ("01-2" of script "01-2_pytorch-fabric") -> (techniques, published peak reserved GB, band):
# every logged row of the chain in memclaims/resources/published.json.
ROWS: dict[str, tuple[tuple[str, ...], float, tuple[float, float]]] = {
    entry["script"].split("_")[0]: (tuple(entry["techniques"]), entry["peak_reserved_gb"], BAND)
    for entry in published.data()["vit_chain"] if entry.get("peak_reserved_gb") is not None
}
# The 07 scripts: (load mode, published GB), +-5 %.
LOAD_ROWS = {script: (mode, published.row("model_loading", script)["load_peak_reserved_gb"])
             for script, mode in (("07_01", "build-then-convert"), ("07_03", "init-module"))}


@pytest.fixture(scope="module")
def sims(record_cache: RecordCache) -> Callable[[tuple[str, ...]], Record]:
    """Each article-scale recipe is simulated once per session, shared with the sim claims."""

    def get(techniques: tuple[str, ...]) -> Record:
        return record_cache.get("sim", resolve("vit", "article", techniques))

    return get


# The tests that read ``loads`` run on one worker under -n (--dist loadgroup): the two 07 loads simulated once.
LOADS_GROUP = pytest.mark.xdist_group("sim-loads")


@pytest.fixture(scope="module")
def loads() -> dict[str, LoadResult]:
    """Each 07 load simulated once per module (a few seconds each), shared by the load tests."""
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


@LOADS_GROUP
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


# The repo's later ViT-H/14 series (518 px, 16-mixed, batch 4): a figure read off the bars (+-0.1 GB),
# replayed as the article's torch (its FSDP bars need the nightly's missing rate limiter). On an A100 the
# one-GPU bar's replay allocates 20.25 GB at the peak and reserves 26.38 (1.167), the excess being
# fragmentation around the 2023-06 Adam step's two fp32 temporaries; the published 22.6 lies between
# the two. On a 24 GB card torch frees its cache and retries, and the bar stops at the allocator's
# limit (published_table: explained if the unrecorded card was an A10G).
VIT_H14_ONE_GPU = published.lookup("@vit_h14_series/rows/0/peak_reserved_gb")


def test_vit_h14_one_gpu_bar_between_the_replays_allocated_and_reserved_peaks(baseline_check, record_property):
    record = simulate(resolve("vit-h14", "article", ("16-mixed",)), profile="article")
    predicted = record.peak_reserved_total_bytes / GB
    record_property("published_gb", VIT_H14_ONE_GPU)
    record_property("predicted_gb", round(predicted, 4))
    assert record.param_count == 632_202_250  # vit_h_14 at 518 px with the 10-class head
    assert record.peak_allocated_bytes <= VIT_H14_ONE_GPU * GB <= record.peak_reserved_total_bytes
    assert 1.10 <= predicted / VIT_H14_ONE_GPU <= 1.22, f"ViT-H/14 one GPU: {predicted:.3f} GB vs {VIT_H14_ONE_GPU}"
    baseline_check.check(f"sim:{record.recipe}", record, record_property)


def test_vit_h14_one_gpu_bar_on_an_a10g_stops_at_the_allocators_limit():
    limit = A10G_TOTAL_MEMORY_BYTES - 600_000_000  # a CUDA context of 0.6 GB
    record = simulate(resolve("vit-h14", "article", ("16-mixed",)), profile="article", limit_bytes=limit)
    predicted = record.peak_reserved_total_bytes / GB
    assert record.peak_reserved_total_bytes <= limit
    assert abs(predicted / VIT_H14_ONE_GPU - 1) <= 0.05, f"ViT-H/14 on an A10G: {predicted:.3f} GB vs {VIT_H14_ONE_GPU}"
    assert any("freed" in note and "retried" in note for note in record.notes), record.notes


def test_under_a_limit_the_sim_retries_like_torch_or_runs_out_of_memory_naming_the_phase():
    recipe = resolve("vit", "gpusmoke", ())
    free = simulate(recipe)
    capped = simulate(recipe, limit_bytes=free.peak_reserved_total_bytes - 30 * MIB)
    assert free.peak_allocated_bytes <= capped.peak_reserved_total_bytes < free.peak_reserved_total_bytes
    assert capped.peak_allocated_bytes == free.peak_allocated_bytes  # the same tensors, fewer cached segments
    with pytest.raises(OutOfMemory) as starved:
        simulate(recipe, limit_bytes=free.peak_allocated_bytes - MIB)
    assert (starved.value.recipe_id, starved.value.phase) == (recipe.id, "train")
    assert "allocator limited to" in str(starved.value) and starved.value.requested_bytes
    with pytest.raises(OutOfMemory) as loading:
        simulate(recipe, limit_bytes=free.param_bytes // 2)
    assert loading.value.phase == "load"
    sharded = resolve("vit", "smoke", ("fsdp",))
    with pytest.raises(OutOfMemory) as rank_0:
        simulate(sharded, limit_bytes=MIB)
    assert rank_0.value.recipe_id == sharded.id


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
    # At least the state; at most the state and the 2023 step's two parameter-sized temporaries.
    assert adam.optimizer_state_bytes <= saved <= adam.optimizer_state_bytes + 2 * adam.param_bytes


@LOADS_GROUP
def test_claim_init_module_load_at_most_0_6_of_build_then_convert(loads):
    assert loads["07_03"].peak.reserved_bytes <= 0.6 * loads["07_01"].peak.reserved_bytes


@LOADS_GROUP
def test_load_rows_are_the_stock_1000_class_model(loads):
    for result in loads.values():
        assert result.param_count == 304_326_632  # ARTICLE.md, derived row
    # Built then converted: the fp32 copy is on the device; init_module never holds it.
    assert loads["07_01"].peak.live_bytes >= 4 * 304_326_632
    assert loads["07_03"].peak.live_bytes < 2.01 * 304_326_632


@LOADS_GROUP
def test_the_doors_load_only_records_are_the_07_replays(loads):
    """``run_recipe(recipe, RunOptions(device="sim", load_only=True))``, how every caller asks for a 07 row:
    the load replay's numbers as a Record of its load phase alone."""
    from memclaims.recipes.run_options import LOAD_RECIPES, RunOptions
    from memclaims.run import run_recipe

    for row, (mode, _) in LOAD_ROWS.items():
        (record,) = run_recipe(resolve("vit", "article", LOAD_RECIPES[mode]), RunOptions(device="sim", load_only=True))
        peak = loads[row].peak
        assert (record.peak_reserved_bytes, record.peak_allocated_bytes, record.load_peak_bytes) == (
            peak.reserved_bytes, peak.allocated_bytes, peak.allocated_bytes)
        assert (record.param_count, record.param_bytes, record.memory_steps, record.grad_bytes) == (
            loads[row].param_count, loads[row].param_bytes, 0, 0)
        assert record.phases == {"load": {"allocated_bytes": peak.allocated_bytes, "above_start_bytes": peak.allocated_bytes,
                                          "reserved_bytes": peak.reserved_bytes, "live_bytes": peak.live_bytes}}
        assert f"load only ({mode}" in record.notes[1]


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


@LOADS_GROUP
def test_two_article_load_runs_are_identical(loads):
    assert simulate_load("init-module") == loads["07_03"]


# --- errors ------------------------------------------------------------------------------------


def test_unknown_profile_lists_the_valid_ones():
    with pytest.raises(UsageError) as error:
        simulate(resolve("vit", "smoke", []), profile="h100-2030")
    message = str(error.value)
    assert "h100-2030" in message and all(name in message for name in PROFILES)
    assert "\n" not in message


@pytest.mark.parametrize("workload, techniques", [("vit", ("fsdp", "adam8bit"))])
def test_recipes_it_cannot_simulate_say_why(workload, techniques):
    with pytest.raises(UsageError, match="sim device cannot run"):
        simulate(resolve(workload, "article", techniques))


def test_bad_load_mode_names_the_valid_ones():
    with pytest.raises(UsageError, match="build-then-convert"):
        simulate_load("teleport")


# --- cross-check against the cpu tier's exact accounting --------------------------------------

# fp32 + Adam, mixed precision (autocast), the true-half chain with accumulation and SGD, transformers'
# Adafactor (its per-parameter step's temporaries), and checkpointing on one device (the recompute).
CROSS_CHECK = [("fabric",), ("16-mixed",), ("bf16-true", "small-batch", "grad-accum", "sgd"), ("adafactor",),
               ("activation-checkpointing",)]


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
    from memclaims.measure import runner

    recipe = resolve("vit", "smoke", techniques)
    measured = runner.run(recipe, runner.RunOptions(device="cpu", evaluate=False))
    predicted = simulate(recipe, profile="cpu-kernels", memory_steps=measured.memory_steps)
    live = max(phase.get("live_bytes", 0) for phase in predicted.phases.values())
    expected = measured.peak_allocated_bytes - _host_only_bytes(recipe, measured)
    assert live == pytest.approx(expected, rel=1e-3)
    assert predicted.param_bytes == measured.param_bytes
    assert predicted.optimizer_state_bytes == measured.optimizer_state_bytes
    assert predicted.recomputed_linear_calls == measured.recomputed_linear_calls  # the same blocks recomputed


# --- the optimizer step by era (memclaims.sim.eras) ---------------------------------------------


def test_row_05_peak_is_the_2023_adam_step(sims):
    """Row 05's figure is set in the optimizer step, by the 2023 nightly's out-of-place ``denom``
    (``_foreach_add.Scalar``), with two parameter-sized temporaries alive beside the Adam state."""
    record = row(sims, "05")
    site = next(note for note in record.notes if note.startswith("reserved peak set"))
    assert "in the optimizer step" in site and "_foreach_add.Scalar" in site, site
    temporaries = record.breakdown["activations_and_temporaries"]
    assert 2 * record.param_bytes <= temporaries < 2.1 * record.param_bytes


def _step_peak_above_start(era: str, weight_decay: float, decoupled: bool) -> tuple[int, list]:
    """Peak live bytes of one foreach Adam(W) step on real CPU tensors, and the updated values."""
    import torch

    from memclaims.sim.allocator import CachingAllocator
    from memclaims.sim.eras import optimizer_era
    from memclaims.sim.profiles import profile as find_profile
    from memclaims.sim.tracker import DeviceMemory

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in ((64, 32), (32,), (5000,))]
    for p in params:
        p.grad = torch.randn_like(p)
    kind = torch.optim.AdamW if decoupled else torch.optim.Adam
    optimizer = kind(params, lr=1e-2, weight_decay=weight_decay, foreach=True)
    memory = DeviceMemory(CachingAllocator(), find_profile("cpu-kernels"))
    with memory, optimizer_era(era):
        for _ in range(2):  # the second step runs with the state already there
            memory.reset_peaks()
            start = memory.tensor_bytes
            memory.in_optimizer = True
            optimizer.step()
            memory.in_optimizer = False
    return memory.peak_tensor_bytes - start, [p.detach().clone() for p in params]


# (weight decay, AdamW, parameter-sized temporaries the 2023-06 step holds beyond today's): the
# out-of-place ``denom``; with Adam's L2 decay also the gradient copy, which today's step deletes.
ERA_CASES = [(0.0, False, 1), (0.1, False, 2), (0.1, True, 1)]


@pytest.mark.parametrize("weight_decay, decoupled, extra", ERA_CASES, ids=["adam", "adam-l2", "adamw"])
def test_2023_adam_step_holds_more_parameter_sized_temporaries(weight_decay, decoupled, extra):
    """The reconstruction computes what today's Adam computes, and holds ``extra`` more copies of
    the parameters' size in the step (what the July 2023 stack saved)."""
    import torch

    param_bytes = 4 * (64 * 32 + 32 + 5000)
    installed, values_installed = _step_peak_above_start("installed", weight_decay, decoupled)
    era, values_era = _step_peak_above_start("2023-06", weight_decay, decoupled)
    assert era - installed == extra * param_bytes
    for new, old in zip(values_era, values_installed):
        torch.testing.assert_close(new, old)


def test_unknown_optimizer_era_names_the_valid_ones():
    from memclaims.sim.eras import ERAS, optimizer_era

    with pytest.raises(ValueError) as error:
        with optimizer_era("1999-01"):
            pass
    assert "1999-01" in str(error.value) and all(era in str(error.value) for era in ERAS)


def test_profiles_name_their_optimizer_era():
    from memclaims.sim.eras import ERAS

    assert PROFILES["article"].optimizer_era == "2023-06"
    assert PROFILES["current"].optimizer_era == "installed"
    assert all(p.optimizer_era in ERAS for p in PROFILES.values())


# --- 8-bit optimizers (memclaims.sim.eight_bit) -----------------------------------------------

EIGHT_BIT_CASES = [("adam8bit",), ("bf16-true", "adamw8bit")]


@pytest.mark.requires(bitsandbytes="cpu")
@pytest.mark.parametrize("techniques", EIGHT_BIT_CASES, ids=["+".join(t) for t in EIGHT_BIT_CASES])
def test_eight_bit_state_is_bitsandbytes_own_on_the_cpu(techniques):
    """The sim's 8-bit state (layout arithmetic) is byte for byte what a real bitsandbytes optimizer
    holds after training the same model on the CPU, and the whole replay's live peak matches the
    cpu tier's within 0.2 % (bitsandbytes' step counters are Python ints: nothing on the host side)."""
    import dataclasses

    from memclaims.core.optim_state import eight_bit_layout
    from memclaims.measure import runner

    recipe = resolve("vit", "smoke", techniques)
    measured = runner.run(recipe, runner.RunOptions(device="cpu", evaluate=False))
    predicted = simulate(recipe, profile="cpu-kernels", memory_steps=measured.memory_steps)
    assert predicted.optimizer_state_bytes == measured.optimizer_state_bytes
    from memclaims.workloads.vit import VIT_FAMILIES

    model = VIT_FAMILIES["vit"].architecture("smoke", recipe.workload.num_classes)
    # bitsandbytes' layout at the threshold the smoke scale passes it (SMOKE_MIN_8BIT_SIZE), so that it quantizes
    layout = dataclasses.replace(eight_bit_layout(), min_8bit_size=recipe.scale.min_8bit_size)
    assert predicted.optimizer_state_bytes == layout.total_bytes((p.numel() for p in model.parameters()),
                                                                 every_tensor=False)
    live = predicted.phases["train"]["live_bytes"]
    # Within 0.2 %: with quantized state (bf16-true + adamw8bit) the replay's live peak is 1,280 B
    # (0.10 %) above the CPU's; with fp32 state they were equal. Not explained yet.
    assert live == pytest.approx(measured.peak_allocated_bytes, rel=2e-3)
    assert any("bitsandbytes" in note for note in predicted.notes)


@pytest.mark.requires(bitsandbytes="cpu")
def test_eight_bit_state_at_article_scale_is_a_quarter_of_adams():
    adam8 = simulate(resolve("vit", "article", ["bf16-true", "small-batch", "adam8bit"]), memory_steps=1)
    # bf16 Adam state is 4 B per parameter; 8-bit is 2 B plus absmax and the small fp32 tensors.
    assert 2 * adam8.param_count < adam8.optimizer_state_bytes < 2.1 * adam8.param_count


@pytest.mark.requires(bitsandbytes="cpu")
@pytest.mark.parametrize("name", ["adam8bit", "adamw8bit"])
def test_eight_bit_state_model_matches_a_real_step_tensor_for_tensor(name):
    """On a model with both 8-bit (>= min_8bit_size) and fp32-state tensors, and a bf16 one, the
    model's state has every key, dtype and shape a real bitsandbytes step creates on the CPU."""
    import torch

    from memclaims.core.optim_state import count_every_tensor, eight_bit_layout
    from memclaims.measure import optimizers, tensors
    from memclaims.sim import eight_bit

    def model() -> torch.nn.Module:
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(128, 64), torch.nn.LayerNorm(64), torch.nn.Linear(64, 4097))

    real_model, modelled = model(), model()
    real, _ = optimizers.build(name, real_model, 1e-3, 10)
    state_model = eight_bit.build(name, modelled, 1e-3, eight_bit_layout())
    for m, optimizer in ((real_model, real), (modelled, state_model)):
        for p in m.parameters():
            p.grad = torch.ones_like(p)
        optimizer.step()
    shapes = [{k: (v.dtype, tuple(v.shape)) for k, v in state.items() if isinstance(v, torch.Tensor)}
              for state in real.state.values()]
    assert shapes == [{k: (v.dtype, tuple(v.shape)) for k, v in state.items() if isinstance(v, torch.Tensor)}
                      for state in state_model.state.values()]
    assert tensors.storage_bytes(tensors.optimizer_state_tensors(real)) == \
        tensors.storage_bytes(tensors.optimizer_state_tensors(state_model))
    assert count_every_tensor(real) == count_every_tensor(state_model)


# --- sharded rows (memclaims.sim.sharded: FSDP1 rank 0 of 4, per-rank accounting) ---------------

SHARDED = {"08": ("fsdp", "activation-checkpointing"),
           "09": ("fsdp", "activation-checkpointing", "cpu-offload"),
           "11": ("fsdp", "activation-checkpointing", "cpu-offload", "delayed-init")}


@pytest.fixture(scope="module")
def sharded_records(sims: Callable[[tuple[str, ...]], Record]) -> dict[str, Record]:
    """Rank 0 of the sharded replays 08, 09 and 11, simulated once per session (``sims``: shared with the sim
    claims and the FSDP technique files, which read the same article rows)."""
    return {name: sims(techniques) for name, techniques in SHARDED.items()}


def test_sharded_rank_holds_a_quarter_of_the_model(sharded_records):
    from memclaims.sim.sharded import WORLD_SIZE

    record = sharded_records["08"]
    assert (record.devices, record.rank) == (WORLD_SIZE, 0)
    full = 4 * record.param_count  # fp32
    # Each unit's flat parameter is padded to a multiple of the world size: at most W - 1 elements each.
    assert full / WORLD_SIZE <= record.param_bytes <= full / WORLD_SIZE + 4 * WORLD_SIZE * 25
    assert record.optimizer_state_bytes == 2 * record.param_bytes  # Adam over the shards (step counters on the host)
    assert record.grad_bytes == record.param_bytes


def test_offload_leaves_no_parameters_gradients_or_state_on_the_device(sharded_records):
    plain, offload = sharded_records["08"], sharded_records["09"]
    assert offload.param_bytes == offload.grad_bytes == offload.optimizer_state_bytes == 0
    assert offload.peak_reserved_total_bytes < plain.peak_reserved_total_bytes
    # What left the device is on the host, by category: the rank's fp32 shard, its sharded gradient
    # and Adam's two states over it (plus the step counters, which the device never held).
    assert plain.host_state_bytes == {}
    moved = offload.host_state_bytes
    assert moved[PARAMETERS] == moved[GRADIENTS] == plain.param_bytes, moved
    assert 2 * plain.param_bytes <= moved[OPTIMIZER_STATE] <= 2 * plain.param_bytes + 4 * 1024, moved


def test_delayed_init_equals_offload_as_published(sharded_records):
    # 09 and 11 both published 6.03 GB: init_module(empty_init=False) under FSDPStrategy builds on the host.
    assert sharded_records["11"].peak_reserved_total_bytes == sharded_records["09"].peak_reserved_total_bytes


SHARDED_SCRIPTS = {"08": "08_fsdp-with-01-2", "09": "09_fsdp-cpu-offload-with-01-2", "11": "11_delay-allocation"}


def published_gb(script: str) -> float:
    from memclaims.report.published_table import published

    value: float = published()[("peak_reserved_gb", script)]
    return value


def sharded_ratio(record: Record, script: str) -> float:
    return record.peak_reserved_total_bytes / GB / published_gb(script)


def _point_prediction(record: Record, published_gb: float, low: float, high: float) -> float:
    """The timeline's reserved peak (memclaims.sim.timeline) against the published figure: its ratio, asserted
    within [low, high] (each test states what it measured)."""
    ratio = record.peak_reserved_total_bytes / GB / published_gb
    assert low <= ratio <= high, f"{record.recipe}: {ratio:.3f} of published, expected {low}-{high}"
    return ratio


def test_fsdp_row_08_is_a_point_prediction(sharded_records, baseline_check, record_property):
    """Row 08 with FSDP1 as the 2023-06 nightly ran it, on the timeline: no rate limiter, and the CPU far ahead
    of the GPU, so the unsharded buffers freed with record_stream wait for the GPU: 1.026 of published."""
    record = sharded_records["08"]
    record_property("ratio", round(_point_prediction(record, published_gb(SHARDED_SCRIPTS["08"]), 0.95, 1.10), 4))
    baseline_check.check(f"sim:{record.recipe}", record, record_property)


@pytest.mark.parametrize("name", ["09", "11"])
def test_fsdp_offload_rows_are_point_predictions(sharded_records, name, baseline_check, record_property):
    """Offload rows on the timeline: 0.893 of published, just outside +-10 % (the closing note of issue #29
    says what is left: the whole backward already runs ahead here)."""
    record = sharded_records[name]
    record_property("ratio", round(_point_prediction(record, published_gb(SHARDED_SCRIPTS[name]), 0.86, 0.95), 4))
    baseline_check.check(f"sim:{record.recipe}", record, record_property)


def test_text_fsdp_after_row_on_the_timeline(record_property):
    """bonus_distilbert-after on the sim (FSDP1 x4 + offload, bf16-true, 3 x 4): 0.724 of published, not
    explained by the timeline (the untimed band reaches published)."""
    from memclaims.recipes.named import NAMED_RECIPES
    from memclaims.report.published_table import published

    recipe = NAMED_RECIPES["distilbert-after"]
    record = simulate(resolve(recipe.workload, "article", recipe.techniques))
    assert record.param_bytes == record.grad_bytes == record.optimizer_state_bytes == 0  # offload
    published_gb = published()[("peak_reserved_gb", "bonus_distilbert-after")]
    record_property("ratio", round(_point_prediction(record, published_gb, 0.70, 0.78), 4))


VIT_H14_FSDP = {"FSDP": ("16-mixed", "fsdp"),
                "+ activation checkpointing": ("16-mixed", "fsdp", "activation-checkpointing"),
                "+ CPU offload": ("16-mixed", "fsdp", "activation-checkpointing", "cpu-offload")}


@pytest.mark.parametrize("change", list(VIT_H14_FSDP))
def test_vit_h14_fsdp_bars_are_point_predictions(change, record_property):
    """The repo's ViT-H/14 FSDP bars on the article's profile (no rate limiter; Lightning of 2023: 16-mixed
    all-gathers fp32), on the timeline: 0.999 / 0.983 / 0.981 of the bars."""
    from memclaims.report.published_table import published

    record = simulate(resolve("vit-h14", "article", VIT_H14_FSDP[change]), profile="article")
    published_gb = published()[("vit_h14_gb", change)]
    record_property("ratio", round(_point_prediction(record, published_gb, 0.90, 1.10), 4))


def test_fsdp_with_checkpointing_far_below_one_gpu(sharded_records, sims):
    # Claim 10: FSDP + activation checkpointing on 4 GPUs, 26.84 -> 6.59 GB per GPU.
    assert reserved(sharded_records["08"]) < 0.3 * reserved(row(sims, "01-2"))


def test_sharded_accumulation_reduce_scatters_every_micro_batch():
    # The bonus "after" scripts accumulate under FSDP without no_backward_sync: the sharded gradient
    # exists from the first micro-batch and the step runs over it (smoke scale: the same code path).
    record = simulate(resolve("vit", "smoke", ["fsdp", "grad-accum"]))
    assert record.grad_bytes == record.param_bytes > 0
    assert record.optimizer_state_bytes == 2 * record.param_bytes


# --- the whole published table (memclaims reproduce --device sim --all) -------------------------


def test_published_accessor_reads_every_number_the_table_names():
    from memclaims.report.published_table import SPECS, published

    numbers = published()
    for spec in SPECS:
        assert spec.key in numbers, spec.key
        assert isinstance(numbers[spec.key], (int, float)), spec.key


def test_table_predicts_every_row():
    from memclaims.report.published_table import SPECS

    assert [s.row for s in SPECS if s.predict is None] == []
    # Rows outside the band carry their explanation (the sharded text rows included).
    assert all(s.residual for s in SPECS if s.row.startswith(("08", "09", "11", "bonus_", "ViT-H/14 ")))


def test_deepspeed_zero2_row_below_published_within_the_replays_own_shortfall(baseline_check, record_property):
    """bonus_distilbert-before by per-rank accounting (memclaims.sim.replays.zero), within [0.90, 1.00] of published.

    Upper edge 1.00: every term is memory DeepSpeed holds at the backward's peak on one rank; what is not
    modelled (allocator placement of the two reduce buckets, the reduction stream's free blocks, DeepSpeed
    temporaries) only adds, so above published would mean a term counted twice. Lower edge 0.90: two thirds
    of the prediction are the one-GPU half-precision replay's activations, and the sim's one-GPU
    half-precision rows (02-04) run 5-7 % low; the other third is exact arithmetic. 0.90 is that shortfall
    on the whole plus about 0.1 GB for DeepSpeed's unmodelled allocations. 0.933 now."""
    from memclaims.measure import active
    from memclaims.recipes.named import NAMED_RECIPES
    from memclaims.recipes.recipe import resolve
    from memclaims.recipes.run_options import RunOptions
    from memclaims.report.published_table import published
    from memclaims.run import run_recipe
    from memclaims.sim.replays.zero import DISTILBERT_ONE_GPU, predict_distilbert_before

    before = NAMED_RECIPES["distilbert-before"]
    recipe = resolve(before.workload, before.scale, before.techniques)  # 16-mixed + deepspeed-zero2
    record = run_recipe(recipe, RunOptions(device="sim", profile="article"))[0]
    one_gpu = run_recipe(resolve(*DISTILBERT_ONE_GPU), RunOptions(device="sim", profile="article"))[0]
    terms = predict_distilbert_before(one_gpu)
    # The technique's case through the one door is the accounting of the named row, term for term.
    assert record.breakdown == dataclasses.asdict(terms) and record.peak_reserved_total_bytes == terms.total
    assert record.devices == before.devices and active.problems(recipe, record) == []
    published_bytes = published()[("peak_reserved_gb", "bonus_distilbert-before")] * GB
    ratio = terms.total / published_bytes
    record_property("ratio", round(ratio, 4))
    assert terms.fp32_master == terms.fp32_grad_partition == terms.adam_states // 2 == terms.fp16_model // 2  # W = 4
    assert 0.90 <= ratio <= 1.00, f"bonus_distilbert-before: {ratio:.3f} ({terms})"
    baseline_check.check(f"sim:{record.recipe}", record, record_property)


def test_ddp_rank_is_the_one_gpu_run_plus_its_gradient_buckets(sims, record_cache, baseline_check, record_property):
    """bigbird-before's strategy at the article's ViT scale: a DDP rank holds the whole model, its gradients
    and Adam state as one GPU does, plus gradient buckets (gradient_as_bucket_view=False, as Lightning
    leaves it): one more gradient-sized set, each bucket its own segment (rounded up to 2 MiB at most)."""
    from memclaims.sim.ddp import bucket_numels

    single = sims(("fabric",))
    record = record_cache.get("sim", resolve("vit", "article", ("ddp",)))
    for key in ("param_bytes", "grad_bytes", "optimizer_state_bytes"):
        assert getattr(record, key) == getattr(single, key), differs(record, key, getattr(single, key))
    added = record.peak_reserved_total_bytes - single.peak_reserved_total_bytes
    count = len(bucket_numels(_vit_article_parameters()))
    assert single.grad_bytes <= added <= single.grad_bytes + count * 2 * 2**20, (
        f"{record.recipe}: {added:,} B above the one-GPU run; buckets hold {single.grad_bytes:,} B in {count} segments")
    baseline_check.check(f"sim:{record.recipe}", record, record_property)


def _vit_article_parameters() -> list[torch.Tensor]:
    recipe = resolve("vit", "article", [])
    with torch.device("meta"):
        model, _ = recipe.workload.build_model(recipe.scale)
    return list(model.parameters())


def test_table_rows_in_band_or_explained():
    from memclaims.report.published_table import build_table, markdown

    cheap = {"07_01", "07_03", "07 derived fp32", "Adam8bit state", "Adam8bit state (measured)", "AdamW state",
             "8-bit estimate", "bonus_distilbert-before"}
    rows = build_table(only=cheap, jobs=1)  # one process: spawning workers costs more than these rows
    assert {r.row for r in rows} == cheap
    for r in rows:
        assert r.predicted is not None, r.row
        assert r.inside or r.residual, r.row
        assert r.cpu_s is not None
    before = next(r for r in rows if r.row == "bonus_distilbert-before")
    assert before.residual.startswith("DeepSpeed ZeRO-2 rank 0 by per-rank accounting")
    measured = next(r for r in rows if r.row == "Adam8bit state (measured)")
    assert measured.predicted == measured.published  # exact bytes: 134,082,160
    text = markdown(rows)
    assert "0 pending" in text and "| course | AdamW state |" in text



def test_table_prints_the_untimed_band_and_step_times_beside_the_point_prediction():
    from memclaims.report.published_table import Row, markdown

    row = Row("article", "08", "FSDP", "GB", 6.59, predicted=6.763, lower=5.61, upper=8.036,
              predicted_step_s=1.6, published_step_s=1.885)
    outside = Row("article", "09", "offload", "GB", 6.03, predicted=5.388, lower=4.234, upper=6.661)
    assert row.inside and not row.bounded and row.step_ratio == pytest.approx(1.6 / 1.885)
    assert not outside.inside and outside.bounded and outside.step_ratio is None
    text = markdown([row, outside])
    assert "6.763 (untimed 5.610 to 8.036)" in text and "| 1.600 / 1.885 |" in text
    assert "1 of 2 published numbers within +-5 %, 1 within +-10 %, 1 more within the untimed replay's band" in text


# --- claim mixed-precision-keeps-fp32-ops on the sim -----------------------------------------------


def test_sim_autocast_keeps_the_cuda_fp32_ops_in_fp32():
    """The sim's emulated CUDA autocast (memclaims.sim.autocast) runs a linear in bfloat16 but keeps
    softmax, layer_norm and a loss in float32, as CUDA's fp32 lists do: not every op goes to 16 bits."""
    import torch.nn.functional as F

    from memclaims.sim.autocast import cuda_autocast

    torch.manual_seed(0)
    layer, x = torch.nn.Linear(8, 8), torch.randn(2, 8)
    with cuda_autocast(torch.bfloat16):
        hidden = layer(x)
        dtypes = {"linear": hidden.dtype, "softmax": F.softmax(hidden, -1).dtype,
                  "layer_norm": F.layer_norm(hidden, (8,)).dtype, "mse_loss": F.mse_loss(hidden, hidden).dtype}
    assert dtypes == {"linear": torch.bfloat16, "softmax": torch.float32, "layer_norm": torch.float32,
                      "mse_loss": torch.float32}, dtypes
