"""The optimizer's implementation (issue #42, item 3): for-loop, foreach and fused Adam, AdamW and SGD.

Each on the cpu tier at smoke scale, visibly at work and against its stored baseline; the cpu tier's step
temporaries (the optimizer_step phase's growth above its start in a step after the first, exact tensor bytes)
equal, byte for byte, the sim's replay of the same recipe with the CPU's kernels, for every optimizer and
implementation on the ViT and DistilBERT (CI keeps Adam on the ViT, the nightly the rest); the article-scale
replays against their baselines (nightly); and the fused flag silently ignored or never passed, named by recipe,
metric and phase.

The claims from torch's docstrings are suite/cases/test_claims.py's (``optimizer-*``).
"""

from __future__ import annotations

import pytest

from memclaims.baselines.compare import compare
from memclaims.measure import active
from memclaims.measure import optimizers as built
from memclaims.pytest.records import RecordCache
from memclaims.recipes.recipe import resolve
from memclaims.run import run_recipe
from memclaims.sim import simulate
from memclaims.techniques.optimizer_impl import IMPLEMENTATIONS, torch_flags

# What the cpu tier and the sim both observe of an implementation (the sim adds its allocator's rounding).
OBSERVED = ("foreach", "fused", "largest_parameter_bytes", "group_parameter_bytes", "measured_step",
            "step_temporary_bytes")
# (workload, optimizer technique): the recipe's optimizer, Adam where none is named. CI runs the ViT's Adam
# (suite/conftest.py's CI_STEP_TEMPORARIES), the nightly every pair.
STEP_TEMPORARIES = [(workload, optimizer) for workload in ("vit", "distilbert")
                    for optimizer in ((), ("adamw",), ("sgd",))]


def _id(case: tuple[str, tuple[str, ...]]) -> str:
    workload, optimizer = case
    return f"{workload}-{optimizer[0] if optimizer else 'adam'}"


@pytest.mark.cpu
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_implementation_is_active_and_matches_its_baseline(implementation: str, record_cache: RecordCache,
                                                           baseline_check, record_property) -> None:
    recipe = resolve("vit", "smoke", (implementation,))
    record = record_cache.get("cpu", recipe)
    assert active.problems(recipe, record) == []
    seen = record.by_technique[implementation]
    assert {key: seen[key] for key in ("foreach", "fused")} == torch_flags(implementation)
    assert seen["measured_step"] == record.memory_steps >= 2
    record_property("step_temporary_bytes", seen["step_temporary_bytes"])
    baseline_check.check(f"cpu:{record.recipe}", record, record_property)


@pytest.mark.cpu
@pytest.mark.sim
@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("step_temporaries", STEP_TEMPORARIES, ids=_id)
def test_cpu_step_temporaries_are_the_sims_replay(step_temporaries: tuple[str, tuple[str, ...]], implementation: str,
                                                  record_cache: RecordCache, record_property) -> None:
    """The cpu tier's exact step temporaries are the sim's replay of the same recipe with the CPU's kernels
    (profile cpu-kernels), byte for byte, and so are the optimizer's flags and the parameters it steps."""
    workload, optimizer = step_temporaries
    recipe = resolve(workload, "smoke", (*optimizer, implementation))
    # The ViT's Adam is the baseline case's own Record; the others are measured without their accuracy phase.
    measured = record_cache.get("cpu", recipe) if step_temporaries == ("vit", ()) else record_cache.memory("cpu", recipe)
    predicted = simulate(recipe, profile="cpu-kernels", memory_steps=measured.memory_steps)
    cpu, sim = measured.by_technique[implementation], predicted.by_technique[implementation]
    record_property("cpu_step_temporary_bytes", cpu["step_temporary_bytes"])
    record_property("sim_step_temporary_bytes", sim["step_temporary_bytes"])
    record_property("sim_step_temporary_allocated_bytes", sim["step_temporary_allocated_bytes"])
    assert {key: sim[key] for key in OBSERVED} == {key: cpu[key] for key in OBSERVED}
    assert active.problems(recipe, measured) == active.problems(recipe, predicted) == []
    # The allocator model rounds each temporary up to its blocks (512 B): never below the tensors.
    assert sim["step_temporary_allocated_bytes"] >= sim["step_temporary_bytes"]


@pytest.mark.sim
@pytest.mark.slow  # three ViT-L/16 replays, 15-60 s each on 2 shared cores; CI keeps the smoke-scale replays above
def test_article_replays_follow_the_chosen_implementation(record_cache: RecordCache, baseline_check,
                                                          record_property) -> None:
    """ViT-L/16 at batch 64 (the article's 01-2 with each implementation): the forward still sets the peak, the
    optimizer step's own peak falls from foreach (the reference's replay, the article profile's 2023-06 era: two
    parameter-sized temporaries) to the for-loop (two of the largest parameter, beside the previous one's) to fused
    (none); each against its baseline."""
    get = {name: record_cache.get("sim", resolve("vit", "article", (name,))) for name in (*IMPLEMENTATIONS, "fabric")}
    for name in IMPLEMENTATIONS:
        assert active.problems(resolve("vit", "article", (name,)), get[name]) == []
        baseline_check.check(f"sim:{get[name].recipe}", get[name], record_property)
    step = {name: get[name].phases["optimizer_step"]["allocated_bytes"] for name in get}
    assert step["fused"] < step["for-loop"] < step["foreach"] == step["fabric"]
    params = get["fused"].param_bytes
    assert get["foreach"].by_technique["foreach"]["step_temporary_bytes"] == 2 * params  # the 2023-06 foreach
    assert get["fused"].by_technique["fused"]["step_temporary_bytes"] == 0
    assert len({record.peak_allocated_bytes for record in get.values()}) == 1  # the forward's peak, unchanged


# --- injected faults ------------------------------------------------------------------------------------------


def inject_fused_runs_foreach(monkeypatch: pytest.MonkeyPatch) -> None:
    """``fused=True`` silently ignored: Adam's dispatch runs the foreach step instead of the fused kernel (the
    param groups still say fused), as a dispatch table that drops an entry would."""
    import torch.optim.adam as adam

    # Looked up when called, as adam() looks up its steps: the sim's optimizer era replaces foreach's.
    monkeypatch.setattr(adam, "_fused_adam", lambda *args, **kwargs: adam._multi_tensor_adam(*args, **kwargs))


def inject_flags_not_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The implementation never reaches torch.optim: the optimizer is built with torch's default flags, as a
    wrapper that stops forwarding a keyword would (Lightning's strategies pass theirs through kwargs)."""
    monkeypatch.setattr(built, "torch_flags", lambda implementation: {})


FUSED = resolve("vit", "smoke", ("fused",))


@pytest.mark.cpu
def test_fused_flag_silently_ignored_fails_the_fused_case_named(record_cache: RecordCache, monkeypatch) -> None:
    clean = record_cache.get("cpu", FUSED)
    inject_fused_runs_foreach(monkeypatch)
    injected = run_recipe(FUSED, record_cache.options("cpu"))[0]
    params = injected.by_technique["fused"]["group_parameter_bytes"][0]
    assert active.problems(FUSED, injected) == [
        f"vit-smoke/fused: fused is not active: step_temporary_bytes is {params:,} B in phase optimizer_step (step "
        f"{injected.memory_steps}): the fused kernel keeps no parameter-sized temporary, and this is at least the "
        "largest parameter's 12,288 B"]
    comparison = compare(injected, clean, case_id=f"cpu:{FUSED.id}")
    failing = {result.metric for result in comparison.failures}
    assert "phases.optimizer_step.allocated_bytes" in failing
    assert "cpu:vit-smoke/fused: phases.optimizer_step.above_start_bytes got worse" in comparison.message()


@pytest.mark.sim
def test_fused_flag_silently_ignored_on_the_sim_is_named(monkeypatch) -> None:
    clean = simulate(FUSED, memory_steps=2)
    inject_fused_runs_foreach(monkeypatch)
    injected = simulate(FUSED, memory_steps=2)
    # The article profile replays the 2023-06 foreach in its place: two tensor lists of the parameters.
    assert active.problems(FUSED, injected) == [
        "vit-smoke/fused: fused is not active: step_temporary_bytes is 157,008 B in phase optimizer_step (step 2): "
        "the fused kernel keeps no parameter-sized temporary, and this is at least the largest parameter's 12,288 B"]
    comparison = compare(injected, clean, case_id=f"sim:{FUSED.id}")
    assert "sim:vit-smoke/fused: phases.optimizer_step.above_start_bytes got worse" in comparison.message()


@pytest.mark.sim
def test_flags_never_passed_to_the_optimizer_are_named(monkeypatch) -> None:
    inject_flags_not_passed(monkeypatch)
    record = simulate(FUSED, memory_steps=2)
    assert active.problems(FUSED, record)[0] == (
        "vit-smoke/fused: fused is not active: the optimizer's param groups say foreach=None, fused=None in phase "
        "optimizer_step; fused is foreach=False, fused=True")
