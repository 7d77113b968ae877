"""Lightning's FSDP configuration on the CPU ranks and the sim (issue #44): the CPU ranks execute, and the sim
replays, what Lightning's ``FSDPStrategy`` and the ``FSDPPrecision`` Fabric pairs with it configure
(``Strategy.configured``, memclaims.techniques.impl.lightning_fsdp_plan), so that a change in Lightning's FSDP layer
moves a dist-tier number or fails a check there.

Each change of fixtures/injections.py's ``LIGHTNING_FSDP_CHANGES`` patches Lightning's own code, as an upstream release
would change it, in every rank of one process group of 2 CPU ranks (one group for all of them: starting ranks costs
seconds). Each changed run is judged against the same recipe measured unchanged in that group (not a stored baseline,
so these hold on any machine: ``memclaims.baselines.compare`` with the dist tier's tolerances) and by the active checks,
and is named by recipe, rank, metric and phase (the nightly: the group is over CI's budget). The same change on the sim (profile ``current``: the installed
Lightning's configuration) moves its replay too. The recipe is the article's 08 (ViT, FSDP + activation checkpointing)
in bf16-mixed, so that one recipe carries every setting: the MixedPrecision, the auto-wrap and the checkpointing policies.

| change to Lightning | upstream | fails on the dist tier (rank 0 and rank 1) | and on the sim |
|---|---|---|---|
| FSDPPrecision's MixedPrecision keeps the parameters in fp32 | Lightning 2.1-2.5's "*-mixed" (until PR #21361); issue #19721's extra memory | phases.forward.allocated_bytes, peak_allocated_bytes (forward) | phases.forward.allocated_bytes |
| FSDPStrategy's auto-wrap policy dropped | a keyword lost on its way to FSDP | fsdp's active check: forward_unsharded_params (forward); peak_allocated_bytes | forward_unsharded_params (active), peaks |
| FSDPStrategy's checkpointing policy dropped | the same | activation-checkpointing's active check: recomputed_linear_calls (backward); phases.forward.above_start_bytes (forward) | phases.forward.* |
| ``cpu_offload=True`` ignored | the same | the configuration case (cpu_offload.offload_params, setup): the CPU ranks cannot offload | param_bytes (load) |
| a new FSDP keyword (``limit_all_gathers=False``) | Lightning passing a setting of its own | refused by name before any rank runs | refused by name |
| control: a patch that changes nothing | | green | green |
"""

from __future__ import annotations

import re

import pytest

from fixtures.injections import LIGHTNING_FSDP_CHANGES, run_ranks_changed
from memclaims.baselines.compare import compare
from memclaims.core.record import Record
from memclaims.measure import active
from memclaims.recipes.recipe import Recipe, resolve
from memclaims.sim import simulate
from memclaims.techniques.fsdp import Fsdp
from memclaims.techniques.impl.lightning_fsdp_plan import UnexecutedSetting

WORLD = 2
# The article's 08 recipe in bf16-mixed: Lightning's MixedPrecision, auto-wrap and checkpointing policies at once.
RECIPE = resolve("vit", "smoke", ("bf16-mixed", "fsdp", "activation-checkpointing"))
# The changes run on the CPU ranks (the others cannot: offload needs a GPU; a new keyword is refused up front).
ON_RANKS = ("no change", "mixed precision in fp32", "auto-wrap policy dropped", "checkpointing policy dropped")
SIM_PROFILE = "current"  # the installed Lightning's configuration (the article's profile replays 2023's dtypes)

# One worker under -n (--dist loadgroup): the module's process group runs once.
pytestmark = pytest.mark.xdist_group("lightning-fsdp-changes")

# The process group of ``ranks`` (5 runs of RECIPE on 2 CPU ranks) is over CI's budget for this branch: starting
# the ranks alone costs about 18 s of CPU per rank on this shared 2-core box (importing torch, Lightning, torchvision),
# each run 1.2-1.9 s more (measured with getrusage of the ranks, under load 12-16). The nightly runs it; CI holds the
# changes on the sim (test_the_sim_replays_a_change_...) and on what Lightning configures (test_cpu_offload_ignored_is_named,
# test_a_keyword_no_engine_executes_is_refused_by_name, suite/unit/techniques/test_fsdp.py), and CI's dist cases
# (suite/cases/test_sharding.py) execute what Lightning configures against their per-rank baselines.


def _strategy(recipe: Recipe) -> Fsdp:
    strategy = recipe.distributed
    assert isinstance(strategy, Fsdp), recipe.id
    return strategy


@pytest.fixture(scope="module")
def ranks() -> dict[str | None, list[Record]]:
    """Every rank's Record of RECIPE unchanged (None) and under each change of ON_RANKS, in one process group."""
    runs: list[tuple[str | None, Recipe]] = [(None, RECIPE), *((change, RECIPE) for change in ON_RANKS)]
    # Two measured steps: the second step's peak (gradients and Adam state alive in the forward) at 2/5 of the cost.
    return dict(zip([change for change, _ in runs], run_ranks_changed(runs, WORLD, timeout_s=600, steps=2)))


def _verdict(changed: Record, clean: Record) -> list[str]:
    """What the suite says of a changed rank: its comparison with the unchanged rank, then every active check."""
    case = f"sim:{changed.recipe}" if changed.device == "sim" else f"dist-cpu:{changed.baseline_key}"
    comparison = compare(changed, clean, case_id=case)
    lines = [line for line in comparison.message().splitlines()
             if not line.startswith("environment since")] if comparison.failures else []
    # activation-checkpointing's comparison with the recipe without it is the sharding case's (test_sharding.py).
    lines += [f"{case}: {line}" for line in active.problems(RECIPE, changed)
              if "no Record of the same recipe without it" not in line]
    return lines


@pytest.mark.dist
@pytest.mark.cpu
@pytest.mark.slow  # the rank group: nightly (above)
def test_ranks_execute_what_lightning_configures(ranks) -> None:
    """The unchanged ranks: active, and their Records say what Lightning configured, which they executed."""
    for record in ranks[None]:
        assert _verdict(record, record) == []
        described = [note for note in record.notes if note.startswith("as Lightning ")]
        assert described and "MixedPrecision(param_dtype=bfloat16, reduce_dtype=bfloat16" in described[0], record.notes
        assert "auto_wrap_policy=ModuleWrapPolicy({EncoderBlock})" in described[0], described
        assert "activation checkpointing auto_wrap_policy=ModuleWrapPolicy({EncoderBlock})" in described[0], described


@pytest.mark.dist
@pytest.mark.cpu
@pytest.mark.slow  # the rank group: nightly (above)
def test_control_no_change_stays_green(ranks) -> None:
    for clean, unchanged in zip(ranks[None], ranks["no change"]):
        verdict = _verdict(unchanged, clean)
        assert verdict == [], "\n".join(verdict)
        comparison = compare(unchanged, clean)
        assert all(r.verdict in ("ok", "info") for r in comparison.results), comparison.rows()


# What each change must be named by on every rank: (the text naming the metric, the phase it names; None: a whole-run
# metric, no phase).
NAMED_ON_RANKS: dict[str, list[tuple[str, str | None]]] = {
    "mixed precision in fp32": [("phases.forward.allocated_bytes got worse", "forward"),
                                ("peak_allocated_bytes got worse", None)],
    "auto-wrap policy dropped": [("fsdp is not active: forward_unsharded_params", "phase forward"),
                                 ("peak_allocated_bytes got worse", None)],
    "checkpointing policy dropped": [("activation-checkpointing is not active: no nn.Linear ran inside the first "
                                      "backward pass", "backward"),
                                     ("phases.forward.above_start_bytes got worse", "forward")],
}


# What the same change does to the sim's replay of RECIPE at smoke scale: a metric it moves, else (the MixedPrecision:
# a few kB of all-gathered smoke blocks, within the tolerance of a 69 MB replay) what its Record says it all-gathered
# (article scale moves its numbers: test_the_sim_replays_lightnings_mixed_precision_at_article_scale, nightly).
NAMED_ON_SIM = {
    "mixed precision in fp32": "all-gathers in torch.float32, reduce-scatters in torch.bfloat16",
    "auto-wrap policy dropped": "fsdp is not active: forward_unsharded_params",
    "checkpointing policy dropped": "peak_allocated_bytes got worse",
}


@pytest.mark.dist
@pytest.mark.cpu
@pytest.mark.slow  # the rank group: nightly (above)
@pytest.mark.parametrize("change", list(NAMED_ON_RANKS))
def test_a_change_to_lightnings_fsdp_configuration_fails_named(change, ranks, record_property) -> None:
    """The change fails every rank's case, named by recipe, rank, metric and phase."""
    for rank, (clean, changed) in enumerate(zip(ranks[None], ranks[change])):
        message = "\n".join(_verdict(changed, clean))
        record_property(f"rank{rank}", message)
        assert f"dist-cpu:{RECIPE.id}@{WORLD}/rank{rank}: " in message, message
        for metric, phase in NAMED_ON_RANKS[change]:
            line = next((line for line in message.splitlines() if metric in line), None)
            assert line is not None and (phase is None or phase in line), (
                f"{change}: {metric} ({phase}) not named:\n{message}")


@pytest.fixture(scope="module")
def clean_sim() -> Record:
    """RECIPE replayed on the sim with Lightning as installed: what each changed replay is judged against."""
    return simulate(RECIPE, profile=SIM_PROFILE)


@pytest.mark.sim
def test_the_sim_replays_lightnings_configuration_unchanged(clean_sim) -> None:
    """The control on the sim: Lightning as installed says none of what the changes make it say."""
    said = [*_verdict(clean_sim, clean_sim), *clean_sim.notes]
    assert not any(text in line for line in said for text in NAMED_ON_SIM.values()), "\n".join(said)


@pytest.mark.sim
@pytest.mark.parametrize("change", list(NAMED_ON_SIM))
def test_the_sim_replays_a_change_to_lightnings_fsdp_configuration(change, clean_sim, monkeypatch) -> None:
    """The sim reads the same configuration as the CPU ranks: the change moves its replay, named (and the replay of
    Lightning as installed does not say it)."""
    unchanged = [*_verdict(clean_sim, clean_sim), *clean_sim.notes]
    assert not any(NAMED_ON_SIM[change] in line for line in unchanged), "\n".join(unchanged)
    LIGHTNING_FSDP_CHANGES[change](monkeypatch)
    changed_sim = simulate(RECIPE, profile=SIM_PROFILE)
    said = [*_verdict(changed_sim, clean_sim), *changed_sim.notes]
    assert any(NAMED_ON_SIM[change] in line for line in said), "\n".join(said)


@pytest.mark.sim
@pytest.mark.slow  # two FSDP replays of ViT-L/16 (104 s each measured on a shared, loaded 2-core box); CI holds the
# smoke replay's notes instead
def test_the_sim_replays_lightnings_mixed_precision_at_article_scale(monkeypatch) -> None:
    """The article's 08 recipe in bf16-mixed on the sim (profile current, the installed Lightning's configuration):
    FSDPPrecision's MixedPrecision kept in fp32 all-gathers every block in fp32: rank 0's peak allocated goes from
    2.31 to 3.60 GB (decimal, +55.6 %)."""
    recipe = resolve("vit", "article", RECIPE.techniques)
    clean = simulate(recipe, profile=SIM_PROFILE)
    LIGHTNING_FSDP_CHANGES["mixed precision in fp32"](monkeypatch)
    comparison = compare(simulate(recipe, profile=SIM_PROFILE), clean, case_id=f"sim:{recipe.id}")
    failing = {r.metric for r in comparison.failures}
    assert {"peak_allocated_bytes", "phases.train.allocated_bytes"} <= failing, comparison.message()


# The article's FSDP recipes (08, 09, 11), the ViT-H/14 series' and FSDP1's other sharding strategies: what Lightning
# configures for each is what it asks, CPU offload included, which no CPU rank can run.
CONFIGURED = [("vit", ("fsdp",)), ("vit", ("fsdp", "activation-checkpointing")),
              ("vit", ("fsdp", "activation-checkpointing", "cpu-offload")),
              ("vit", ("fsdp", "activation-checkpointing", "cpu-offload", "delayed-init")),
              ("vit-h14", ("16-mixed", "fsdp", "activation-checkpointing", "cpu-offload")), ("bigbird", ("fsdp",)),
              ("vit", ("fsdp-shard-grad-op",)), ("vit", ("fsdp-no-shard",)), ("vit", ("fsdp-hybrid",))]


def _configuration_problems(recipe: Recipe) -> list[str]:
    asked = recipe.strategy_plan(WORLD)
    return _strategy(recipe).configuration_problems(recipe, asked, _strategy(recipe).configured(asked, recipe,
                                                                                               "bf16-mixed"))


@pytest.mark.dist
@pytest.mark.cpu
@pytest.mark.parametrize("workload, techniques", CONFIGURED,
                         ids=[f"cpu:{w}-smoke/{'+'.join(t)}@{WORLD}ranks" for w, t in CONFIGURED])
def test_lightning_configures_what_the_recipe_asks(workload, techniques) -> None:
    recipe = resolve(workload, "smoke", techniques)
    assert _configuration_problems(recipe) == []


@pytest.mark.dist
@pytest.mark.cpu
def test_cpu_offload_ignored_is_named(monkeypatch) -> None:
    """Offload cannot run on CPU ranks (cpu-offload needs a GPU): the configuration case names the change, and the
    sim, which replays the offload Lightning configures, holds the shards on the device."""
    recipe = resolve("vit", "smoke", ("fsdp", "activation-checkpointing", "cpu-offload"))
    clean_sim = simulate(recipe, profile=SIM_PROFILE)
    LIGHTNING_FSDP_CHANGES["cpu_offload ignored"](monkeypatch)
    problems = _configuration_problems(recipe)
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{recipe.id}@{WORLD}, every rank: cpu_offload.offload_params is False as Lightning"), problems
    assert "the recipe asks True (phase setup" in problems[0], problems
    comparison = compare(simulate(recipe, profile=SIM_PROFILE), clean_sim, case_id=f"sim:{recipe.id}")
    message = comparison.message()
    assert f"sim:{recipe.id}: param_bytes got worse than its baseline: baseline 0 B" in message, message


@pytest.mark.dist
@pytest.mark.cpu
def test_a_keyword_no_engine_executes_is_refused_by_name(monkeypatch) -> None:
    """Lightning passing FSDP a keyword the CPU ranks' fully_shard and the sim do not execute stops both, named."""
    from memclaims.measure.distributed import CpuShardedEngine
    from memclaims.recipes.run_options import RunOptions

    LIGHTNING_FSDP_CHANGES["new FSDP keyword"](monkeypatch)
    with pytest.raises(UnexecutedSetting, match=rf"^{re.escape(RECIPE.id)}: Lightning .* passes limit_all_gathers=False "
                                               "to FullyShardedDataParallel: neither the CPU ranks' fully_shard nor"):
        CpuShardedEngine(RECIPE, RunOptions(device="cpu", evaluate=False, devices=WORLD), 0, WORLD)
    with pytest.raises(UnexecutedSetting, match="limit_all_gathers=False"):
        simulate(RECIPE, profile=SIM_PROFILE)
