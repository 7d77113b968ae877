"""memclaims.report.series: the chain's floor from what each added technique says it removes (``Hooks.removes``),
and the bars each technique says how to run where it cannot run as published (``Hooks.stand_in``)."""

from __future__ import annotations

import pytest

from memclaims.pytest.testing import fake_record
from memclaims.report import series

pytestmark = pytest.mark.cpu


def _peak(record):  # type: ignore[no-untyped-def]
    return record.peak_allocated_bytes


def test_the_floor_takes_what_each_added_technique_removes() -> None:
    """Of the bar before's 1,000 B (400 B model state, 600 B the rest): FSDP over 4 ranks leaves a quarter of
    both, checkpointing none of the rest: 100 B."""
    before = fake_record("vit-smoke/fabric", techniques=["fabric"], param_bytes=100, grad_bytes=100,
                         optimizer_state_bytes=200, peak_allocated_bytes=1000)
    after = fake_record("vit-smoke/fsdp+activation-checkpointing", techniques=["fsdp", "activation-checkpointing"],
                        devices=4, peak_allocated_bytes=500)
    value, why = series.floor(before, after, _peak)
    assert value == pytest.approx(0.1)
    assert why.endswith("(4 ranks divide both; checkpointing removes every activation)")
    assert series.step(before, after, _peak, None).passed is True
    offloaded = fake_record("vit-smoke/fsdp+cpu-offload", techniques=["fsdp", "cpu-offload"], devices=4)
    assert series.floor(before, offloaded, _peak)[0] == pytest.approx(0.6 / 4)  # no model state left, 1/4 the rest


def test_a_bar_a_device_cannot_run_as_published_runs_as_its_techniques_say() -> None:
    bars = {bar.named.name: bar for bar in series.plan("cpu", "smoke")}
    # cpu-offload is dropped, and where that leaves the bar before's recipe the bar does not run.
    assert bars["vit-h14-fsdp-checkpointing-offload"].techniques is None
    assert bars["vit-h14-fsdp-checkpointing-offload"].why_not == "CPU offload moves parameters off a GPU: needs --device cuda"
    assert "cpu-offload" not in (bars["distilbert-after"].techniques or ())
    assert bars["distilbert-before"].techniques == ("16-mixed",)  # DeepSpeed's: the same recipe on one process
    gpu = {bar.named.name: bar for bar in series.plan("cuda", "article")}
    assert gpu["distilbert-before"].techniques == ("16-mixed", "deepspeed-zero2")
    assert gpu["vit-h14-fsdp-checkpointing-offload"].techniques == (
        "16-mixed", "fsdp", "activation-checkpointing", "cpu-offload")


def _phases(forward: int, optimizer_step: int) -> dict[str, dict[str, int]]:
    return {"forward": {"allocated_bytes": forward}, "optimizer_step": {"allocated_bytes": optimizer_step}}


@pytest.mark.parametrize(("forward", "peak", "holds"), [(600, 1000, True), (900, 1000, False), (600, 1001, False)],
                         ids=["forward-falls", "forward-stays", "peak-rises"])
def test_checkpointing_holds_where_its_forward_falls_under_a_peak_it_leaves(forward: int, peak: int,
                                                                              holds: bool) -> None:
    """A smoke-scale FSDP rank (the ViT-H/14 series' checkpointing bar): its peak is the fp32 optimizer step,
    which checkpointing leaves, so the peak stays equal; the bar holds when its forward falls, says by how much,
    and fails when the forward does not fall or the peak rises."""
    before = fake_record("vit-h14-smoke/fsdp", techniques=["fsdp"], devices=2, peak_allocated_bytes=1000,
                         phases=_phases(forward=900, optimizer_step=1000))
    after = fake_record("vit-h14-smoke/fsdp+activation-checkpointing", techniques=["fsdp", "activation-checkpointing"],
                        devices=2, peak_allocated_bytes=peak, phases=_phases(forward=forward, optimizer_step=peak))
    verdict = series.step(before, after, _peak, None)
    assert verdict.passed is holds, verdict.detail
    assert ("the forward phase falls to 0.667 of the bar before's (600 / 900 B)" in verdict.detail) is (holds and
                                                                                                       peak == 1000)
    plain = fake_record("vit-h14-smoke/fsdp+bf16-true", techniques=["fsdp", "bf16-true"], devices=2,
                        peak_allocated_bytes=1000, phases=_phases(forward=600, optimizer_step=1000))
    assert series.step(before, plain, _peak, None).passed is False  # no added technique names the forward
