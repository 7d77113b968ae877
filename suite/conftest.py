"""This repository's CI-time policy: which of its parametrized cases are ``slow``, left to the nightly run
(``pytest -n 2``) and deselected by CI's ``pytest -n 2 -m "not slow"``.

The policy is the repository's, not the plugin's: memclaims' plugin (installed into users' projects) marks
no case ``slow``; the hook below marks this suite's cases from each item's parameters (its callspec).
A test that is slow whatever its parameters carries ``@pytest.mark.slow`` itself (suite/README.md).
"""

from __future__ import annotations

import pytest

from memclaims.measure import host

# The technique matrix (suite/cases/test_technique_matrix.py): the pairwise cover's longest chains train
# for accuracy at 4x the micro-batches (small-batch, grad-accum) and recompute every block (checkpointing):
# 20-30 s each on the cpu tier with 2 cores. They run in the nightly; CI keeps their sim cases and every
# technique's own cpu case.
LONG_ON_CPU = frozenset({"small-batch", "grad-accum", "activation-checkpointing"})

# The converged recipes too slow for CI's 15 minutes on 2 cores (small-batch trains 4x the steps of the
# others: 50 to 90 s): suite/cases/test_accuracy.py's case and suite/cases/test_claims.py's accuracy
# claims that read one; the nightly checks them.
NIGHTLY_CONVERGED = (("small-batch",),)

# Claims whose Records cost too much for CI's 15 minutes on 2 cores (suite/cases/test_claims.py); the nightly checks them.
# batch-1-further-75 on the sim replays micro-batch 1 of the article chain (about 30 s) for a verdict
# that is an expected failure (the sim predicts a few percent, not 75 %).
# lora-few-trainable-parameters on the cpu tier trains and scores DistilBERT smoke with and without the adapters
# (about 10 s); its sim case, suite/cases/techniques/test_lora.py's cpu baseline and sim injection run in CI.
# fused-linear-ce-logits-never-whole on the cpu tier trains GPT-2 smoke with and without the fused loss (about
# 10 s); its sim case and suite/cases/techniques/test_fused_linear_ce.py's cpu baseline and sim injection run in CI.
# qlora-nf4-storage and qlora-double-quant-saving on the cpu tier train and score DistilBERT smoke with its 4-bit base
# with and without double quantization (about 12 s each); their sim cases, the checks on constructed Records and
# suite/cases/techniques/test_qlora.py's cpu baselines of both run in CI.
# The training stacks' claims (issue #42): on the cpu tier they train DistilBERT smoke (the ViT for Accelerate's)
# through a stack and through Fabric with accuracy (five Records: 180 s under this machine's load), on the sim they
# replay two article-scale recipes each (ViT-L/16 for Accelerate's: 57 s under load, 13 s for Lightning's, 10 s for the
# HF Trainer's). CI keeps each stack's cpu case, baseline and injection (suite/cases/techniques/test_hf_trainer.py,
# test_accelerate.py, test_lightning_trainer.py), the course's claims through them, and the HF Trainer's sim baseline.
# torchao-low-bit-state-bytes and torchao-low-bit-peak-falls-by-state on the sim replay ViT-L/16 with AdamW and each of
# torchao's three, whose eager steps on fake tensors take about 10 s of CPU each; their cpu cases (vit-smoke, the
# same relations on exact bytes) and suite/cases/techniques/test_torchao_adamw.py's sim replay at smoke scale run in CI.
NIGHTLY_CLAIMS = frozenset({("sim", "batch-1-further-75"), ("cpu", "lora-few-trainable-parameters"),
                            ("cpu", "fused-linear-ce-logits-never-whole"),
                            ("cpu", "lightning-trainer-same-loop"), ("cpu", "accelerate-accumulate-same-loop"),
                            ("cpu", "hf-trainer-gradients-freed-before-forward"),
                            ("cpu", "hf-trainer-fused-adamw-default"),
                            ("sim", "lightning-trainer-same-loop"), ("sim", "accelerate-accumulate-same-loop"),
                            ("sim", "hf-trainer-gradients-freed-before-forward"), ("sim", "hf-trainer-fused-adamw-default"),
                            ("cpu", "qlora-nf4-storage"), ("cpu", "qlora-double-quant-saving"),
                            ("sim", "torchao-low-bit-state-bytes"), ("sim", "torchao-low-bit-peak-falls-by-state")})

# Claims that read the Records of a technique's own cases, in their xdist group (pytest.ini's --dist loadgroup): one
# worker measures each Record once for both. The course's 8-bit counts through its Trainer path and Accelerate loop
# read suite/cases/techniques/test_hf_trainer.py's and test_accelerate.py's Records.
SHARED_RECORDS = {("cpu", "course-adam8bit-128"): "course-stacks", ("cpu", "course-adam8bit-elements"): "course-stacks"}

# suite/cases/techniques/test_optimizer_impl.py's cpu-against-sim step temporaries, per (workload, optimizer
# techniques): CI keeps the ViT's Adam (the baseline cases' own Records and three smoke replays, a few seconds);
# the other five pairs train 15 more smoke recipes (2-4 s each on 2 cores), which the nightly checks.
CI_STEP_TEMPORARIES = frozenset({("vit", ())})


def nightly_only(params: dict[str, object]) -> bool:
    """Whether a case with these parameters (an item's ``callspec.params``) is left to the nightly run."""
    from memclaims.claims.catalogue import Claim

    tier, techniques, converged, claim = (params.get(k) for k in ("tier", "techniques", "converged", "claim"))
    step_temporaries = params.get("step_temporaries")
    if step_temporaries is not None and step_temporaries not in CI_STEP_TEMPORARIES:
        return True  # test_optimizer_impl.py's cpu-against-sim case of another workload or optimizer
    if tier == "cpu" and isinstance(techniques, tuple) and LONG_ON_CPU <= set(techniques):
        return True  # the technique matrix's case (the plugin's parametrization of tier, techniques)
    if tier == "cpu" and converged in NIGHTLY_CONVERGED:
        return True  # test_accuracy.py's converged case
    if isinstance(claim, Claim):
        if (tier, claim.name) in NIGHTLY_CLAIMS:
            return True
        if tier == "cpu" and claim.kind == "accuracy" and claim.check is not None:
            return any(key in NIGHTLY_CONVERGED for key in claim.check.recipes_on(tier))
    return False


# The stress run (suite/e2e/test_stress_dist_verdicts.py: every dist-tier verdict CI runs, in ten whole pytest
# sessions, about 15 min on 2 cores): only where -m names it (`pytest -m stress`, the nightly's own step); any other
# selection, the nightly's `pytest -n 2` and CI's `-m "not slow"` among them, leaves it out (deselected).
STRESS = "stress"


def stress_asked(config: pytest.Config) -> bool:
    return STRESS in (config.getoption("markexpr", None) or "")


# First, so that -m "not slow" (pytest's own modifyitems) sees the marks.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and nightly_only(callspec.params):
            item.add_marker(pytest.mark.slow)
        if callspec is not None:
            group = shared_group(callspec.params)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))
    stress = [item for item in items if item.get_closest_marker(STRESS)]
    if stress and not stress_asked(config):
        config.hook.pytest_deselected(items=stress)
        items[:] = [item for item in items if not item.get_closest_marker(STRESS)]


def shared_group(params: dict[str, object]) -> str | None:
    """The xdist group of a claim's case that reads a technique case's Records (``SHARED_RECORDS``), or None."""
    from memclaims.claims.catalogue import Claim

    claim = params.get("claim")
    return SHARED_RECORDS.get((str(params.get("tier")), claim.name)) if isinstance(claim, Claim) else None


# Before each test: what exists (the imported stack, the collected items, the session's Records) goes to the cyclic
# collector's permanent generation (memclaims.measure.host.freeze_heap), once and again after a test whose run unfroze
# it. The cpu tier's runs collect garbage at their phase boundaries (memclaims.measure.probes, .host): a full
# collection of a worker's heap (about 700,000 objects once this suite is collected) costs about 0.27 CPU s, four per
# run, about a quarter of a smoke run's CPU; with the heap frozen each scans only the objects made since. Nothing a
# collection could free is frozen (collected first), and a run's own objects never are: its set-up comes after
# (HostSteps.frozen unfreezes at its end, so the next test collects and freezes again). Records are the same: the
# runs' collections free what they freed before.
@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    host.keep_heap_frozen()


# The same for the collection: the imported stack (torch, transformers, Lightning) frozen once configured, the
# collected items once collected. Python's own full collections while the suite is collected (its thresholds: each
# time the long-lived objects grew by a quarter) then scan only what collection made: about 3 CPU s less of
# each worker's 15 to collect CI's selection.
def pytest_configure(config: pytest.Config) -> None:
    host.freeze_heap()


def pytest_collection_finish(session: pytest.Session) -> None:
    host.freeze_heap()
