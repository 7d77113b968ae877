"""This repository's CI-time policy: which of its parametrized cases are ``slow``, left to the nightly run
(``pytest -n 2``) and deselected by CI's ``pytest -n 2 -m "not slow"``.

The policy is the repository's, not the plugin's: memclaims' plugin (installed into users' projects) marks
no case ``slow``; the hook below marks this suite's cases from each item's parameters (its callspec).
A test that is slow whatever its parameters carries ``@pytest.mark.slow`` itself (suite/README.md).
"""

from __future__ import annotations

import pytest

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
# torchao-low-bit-state-bytes and torchao-low-bit-peak-falls-by-state on the sim replay ViT-L/16 with AdamW and each of
# torchao's three, whose eager steps on fake tensors take about 10 s of CPU each; their cpu cases (vit-smoke, the
# same relations on exact bytes) and suite/cases/techniques/test_torchao_adamw.py's sim replay at smoke scale run in CI.
NIGHTLY_CLAIMS = frozenset({("sim", "batch-1-further-75"), ("cpu", "lora-few-trainable-parameters"),
                            ("cpu", "fused-linear-ce-logits-never-whole"), ("sim", "torchao-low-bit-state-bytes"),
                            ("sim", "torchao-low-bit-peak-falls-by-state")})


def nightly_only(params: dict[str, object]) -> bool:
    """Whether a case with these parameters (an item's ``callspec.params``) is left to the nightly run."""
    from memclaims.claims.catalogue import Claim

    tier, techniques, converged, claim = (params.get(k) for k in ("tier", "techniques", "converged", "claim"))
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


# First, so that -m "not slow" (pytest's own modifyitems) sees the marks.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is not None and nightly_only(callspec.params):
            item.add_marker(pytest.mark.slow)
