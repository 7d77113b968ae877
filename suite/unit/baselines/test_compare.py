"""memclaims.baselines.compare on constructed Records: the boundaries of every verdict, in both directions.

Memory fails only above +tolerance and is stale only below -tolerance; accuracy fails only below
-tolerance (absolute points); step time is reported unless a threshold is set; a metric the
baseline has and the run lacks fails; losses are compared step by step in both directions."""

from __future__ import annotations

import pytest

from memclaims.baselines import compare as c
from memclaims.pytest.testing import FAKE_PEAK, PLATEAU, fake_record

TOL = 0.005  # the cpu tier's memory tolerance


def _result(comparison: c.Comparison, metric: str) -> c.MetricResult:
    return next(r for r in comparison.results if r.metric == metric)


def _peak(factor: float, **tolerances: float | None) -> c.MetricResult:
    baseline = fake_record(peak_allocated_bytes=1_000_000)
    record = fake_record(peak_allocated_bytes=round(1_000_000 * factor))
    return _result(c.compare(record, baseline, tolerances), "peak_allocated_bytes")


@pytest.mark.parametrize(("factor", "verdict"), [(1.0, c.OK), (1 + TOL, c.OK), (1 + TOL + 1e-6, c.REGRESSION),
                                                 (1.5, c.REGRESSION), (1 - TOL, c.OK), (1 - TOL - 1e-6, c.STALE),
                                                 (0.5, c.STALE)])
def test_memory_verdict_at_and_beyond_the_tolerance(factor: float, verdict: str) -> None:
    result = _peak(factor)
    assert result.verdict == verdict, (factor, result)
    assert result.tolerance == TOL
    assert result.change_pct == pytest.approx((factor - 1) * 100, abs=1e-3)
    assert result.baseline == 1_000_000 and result.now == round(1_000_000 * factor)


def test_memory_tolerance_override_and_zero_tolerance() -> None:
    assert _peak(1.04, peak_allocated_bytes=0.05).verdict == c.OK
    assert _peak(1.06, peak_allocated_bytes=0.05).verdict == c.REGRESSION
    assert _peak(0.94, peak_allocated_bytes=0.05).verdict == c.STALE
    assert _peak(1.000001, peak_allocated_bytes=None).verdict == c.REGRESSION  # no tolerance: any growth
    assert _peak(0.999999, peak_allocated_bytes=0.0).verdict == c.STALE


def test_memory_from_zero_fails_and_zero_to_zero_is_ok() -> None:
    baseline = fake_record(optimizer_state_bytes=0)
    grown = _result(c.compare(fake_record(optimizer_state_bytes=8), baseline), "optimizer_state_bytes")
    assert grown.verdict == c.REGRESSION and grown.change_pct is None
    same = _result(c.compare(fake_record(optimizer_state_bytes=0), baseline), "optimizer_state_bytes")
    assert same.verdict == c.OK and same.change_pct == 0.0


@pytest.mark.parametrize(("now", "verdict"), [(0.50, c.OK), (0.48, c.OK), (0.4799, c.REGRESSION), (0.30, c.REGRESSION),
                                              (0.52, c.OK), (0.5201, c.STALE), (0.9, c.STALE)])
def test_accuracy_is_absolute_points_and_only_a_drop_fails(now: float, verdict: str) -> None:
    converged = c.compare(fake_record(accuracy=now, accuracy_schedule=PLATEAU), fake_record(accuracy=0.5))
    result = _result(converged, "accuracy")
    assert result.verdict == verdict, (now, result)
    assert result.tolerance == 0.02


def test_accuracy_short_of_its_plateau_is_reported_not_asserted() -> None:
    """A smoke run's accuracy moves by points under a numerics change: a drop is reported only."""
    for schedule in ({}, {**PLATEAU, "plateau": False}):
        result = _result(c.compare(fake_record(accuracy=0.30, accuracy_schedule=schedule), fake_record(accuracy=0.5)),
                         "accuracy")
        assert (result.verdict, result.tolerance) == (c.INFO, None), result
        assert "does not train to a plateau" in result.detail and not result.fails(strict=True)


def test_accuracy_tolerance_none_means_exact() -> None:
    def accuracy(now: float) -> c.MetricResult:
        return _result(c.compare(fake_record(accuracy=now, accuracy_schedule=PLATEAU), fake_record(accuracy=0.5),
                                 {"accuracy": None}), "accuracy")

    assert accuracy(0.4999).verdict == c.REGRESSION
    assert accuracy(0.5).verdict == c.OK


def test_step_time_is_reported_unless_a_threshold_is_set() -> None:
    slower, base = fake_record(step_time_s=0.2), fake_record(step_time_s=0.1)
    assert _result(c.compare(slower, base), "step_time_s").verdict == c.INFO
    assert _result(c.compare(slower, base, time_threshold_pct=150.0), "step_time_s").verdict == c.OK
    assert _result(c.compare(slower, base, time_threshold_pct=99.0), "step_time_s").verdict == c.REGRESSION
    assert _result(c.compare(fake_record(step_time_s=0.1), base, time_threshold_pct=0.0), "step_time_s").verdict == c.OK
    assert c.compare(slower, base).verdict == c.OK  # a reported time leaves the case ok


def test_missing_and_new_metrics() -> None:
    baseline = fake_record(peak_reserved_bytes=2000)
    result = _result(c.compare(fake_record(peak_reserved_bytes=None), baseline), "peak_reserved_bytes")
    assert result.verdict == c.MISSING and result.fails(strict=False)
    result = _result(c.compare(baseline, fake_record(peak_reserved_bytes=None)), "peak_reserved_bytes")
    assert result.verdict == c.NEW and not result.fails(strict=True)
    both_absent = c.compare(fake_record(peak_reserved_bytes=None), fake_record(peak_reserved_bytes=None))
    assert "peak_reserved_bytes" not in {r.metric for r in both_absent.results}


def test_fails_strict_and_comparison_verdict_severity() -> None:
    stale = c.MetricResult("peak_allocated_bytes", 10, 5, -50.0, TOL, c.STALE)
    assert not stale.fails(strict=False) and stale.fails(strict=True)
    assert c.MetricResult("x", 1, 2, 100.0, TOL, c.REGRESSION).fails(strict=False)
    assert not c.MetricResult("x", 1, 1, 0.0, TOL, c.OK).fails(strict=True)
    assert not c.MetricResult("x", 1, 2, None, None, c.INFO).fails(strict=True)
    assert not c.MetricResult("x", None, 2, None, None, c.NEW).fails(strict=True)

    def verdict_of(*verdicts: str) -> str:
        return c.Comparison("case", "r", [c.MetricResult("m", 1, 1, 0.0, 0.0, v) for v in verdicts], "").verdict

    assert verdict_of(c.OK, c.INFO) == c.OK
    assert verdict_of(c.NEW, c.STALE, c.OK) == c.STALE
    assert verdict_of(c.STALE, c.MISSING) == c.MISSING
    assert verdict_of(c.MISSING, c.REGRESSION, c.NEW) == c.REGRESSION
    assert verdict_of(c.NEW, c.OK) == c.NEW
    strict = c.Comparison("case", "r", [stale], "", strict=True)
    assert strict.failures == [stale] and c.Comparison("case", "r", [stale], "").failures == []


def test_phase_peaks_use_the_phases_tolerance_then_the_peak_tolerance() -> None:
    phases = {"forward": {"allocated_bytes": 1000, "above_start_bytes": 500, "reserved_bytes": None}}
    grown = {"forward": {"allocated_bytes": 1030, "above_start_bytes": 500, "reserved_bytes": None}}
    base, record = fake_record(phases=phases), fake_record(phases=grown)
    result = _result(c.compare(record, base), "phases.forward.allocated_bytes")
    assert result.verdict == c.REGRESSION and result.tolerance == TOL and result.phase == "forward"
    assert _result(c.compare(record, base), "phases.forward.above_start_bytes").verdict == c.OK
    assert _result(c.compare(record, base, {"peak_allocated_bytes": 0.05}),
                   "phases.forward.allocated_bytes").verdict == c.OK
    assert _result(c.compare(record, base, {"phases": 0.04, "peak_allocated_bytes": 0.0}),
                   "phases.forward.allocated_bytes").verdict == c.OK
    # A rank of a sharded run: its collectives move phase peaks by a few percent.
    ranked = _result(c.compare(fake_record(phases=grown, devices=2), fake_record(phases=phases, devices=2)),
                     "phases.forward.allocated_bytes")
    assert ranked.verdict == c.OK and ranked.tolerance == c.DISTRIBUTED_PHASE_TOLERANCE
    # A real rank's run peak is its largest phase peak, with the same noise; one device and the sim's ranks (no
    # communication timing) keep the tight one.
    assert _result(c.compare(fake_record(phases=grown, devices=2), fake_record(phases=phases, devices=2)),
                   "peak_allocated_bytes").tolerance == c.DISTRIBUTED_PHASE_TOLERANCE
    assert _result(c.compare(fake_record(phases=grown), fake_record(phases=phases)),
                   "peak_allocated_bytes").tolerance == TOL
    sim_rank = {"phases": grown, "devices": 2, "device": "sim"}
    assert _result(c.compare(fake_record(**sim_rank), fake_record(**{**sim_rank, "phases": phases})),
                   "peak_allocated_bytes").tolerance == TOL
    vanished = c.compare(fake_record(), base)
    assert _result(vanished, "phases.forward.allocated_bytes").verdict == c.MISSING
    assert c.MetricResult("peak_allocated_bytes", 1, 1, 0.0, 0.0, c.OK).phase is None


def test_memory_freed_before_a_phase_is_an_improvement_not_a_failure() -> None:
    """The phase's start falls further than its peak: above-start grows, nothing used more memory."""
    before = {"backward": {"allocated_bytes": 1_000_000, "above_start_bytes": 500_000, "reserved_bytes": None}}
    freed = {"backward": {"allocated_bytes": 880_000, "above_start_bytes": 780_000, "reserved_bytes": None}}
    comparison = c.compare(fake_record(phases=freed, peak_allocated_bytes=880_000),
                           fake_record(phases=before, peak_allocated_bytes=1_000_000))
    assert comparison.failures == [] and comparison.verdict == c.STALE
    assert _result(comparison, "phases.backward.allocated_bytes").verdict == c.STALE
    derived = _result(comparison, "phases.backward.above_start_bytes")
    assert (derived.verdict, derived.detail) == (c.INFO, c.DERIVED_GREW) and derived.change_pct == pytest.approx(56.0)
    start = _result(comparison, "phases.backward.start_bytes")  # 500,000 -> 100,000 B: reported as improved
    assert (start.baseline, start.now, start.verdict) == (500_000, 100_000, c.STALE)
    assert {"phases.backward.allocated_bytes", "phases.backward.start_bytes"} <= {
        row["metric"] for row in c.Summary(comparison.rows()).worst_first()}
    # The same growth beside a peak that grew: the peak fails, the derived figure is named as its explanation.
    grown = {"backward": {"allocated_bytes": 1_300_000, "above_start_bytes": 800_000, "reserved_bytes": None}}
    failing = c.compare(fake_record(phases=grown), fake_record(phases=before), case_id="case")
    assert [r.metric for r in failing.failures] == ["phases.backward.allocated_bytes"]
    assert ("case: phases.backward.above_start_bytes got worse than its baseline, explaining the failures above: "
            "baseline 500,000 B") in failing.message()
    # A derived figure that fell is an improvement like a peak that fell.
    less = {"backward": {"allocated_bytes": 1_000_000, "above_start_bytes": 400_000, "reserved_bytes": None}}
    assert _result(c.compare(fake_record(phases=less), fake_record(phases=before)),
                   "phases.backward.above_start_bytes").verdict == c.STALE
    # A start that rose under the same peak: more was live earlier, the peak did not grow.
    later = {"backward": {"allocated_bytes": 1_000_000, "above_start_bytes": 100_000, "reserved_bytes": None}}
    risen = c.compare(fake_record(phases=later), fake_record(phases=before))
    assert risen.failures == [] and _result(risen, "phases.backward.start_bytes").verdict == c.INFO


def test_offloaded_host_state_is_compared_per_category_like_device_memory() -> None:
    base = fake_record(host_state_bytes={"parameters": 1000, "optimizer_state": 2000})
    grown = fake_record(host_state_bytes={"parameters": 1000, "optimizer_state": 2100})
    comparison = c.compare(grown, base)
    assert _result(comparison, "host_state.parameters_bytes").verdict == c.OK
    state = _result(comparison, "host_state.optimizer_state_bytes")
    assert state.verdict == c.REGRESSION and state.tolerance == TOL, state
    # Offload that stopped moving the state leaves the metric missing: it fails too.
    assert _result(c.compare(fake_record(), base), "host_state.parameters_bytes").verdict == c.MISSING


def test_tier_defaults() -> None:
    assert c.default_tolerances("cpu")["peak_allocated_bytes"] == 0.005
    assert c.default_tolerances("sim")["load_peak_bytes"] == 0.005
    assert c.default_tolerances("cuda")["peak_allocated_bytes"] == 0.03
    assert c.default_tolerances("mps") == c.default_tolerances("cuda")  # an unknown device: the noisy tier
    for device in ("cpu", "sim", "cuda"):
        defaults = c.default_tolerances(device)
        assert defaults["accuracy"] == 0.02 and defaults["step_time_s"] is None
        assert set(c.MEMORY_METRICS) <= set(defaults)
    assert c.default_tolerances("cpu")[c.LOSSES] == 0.001 and c.default_tolerances("cuda")[c.LOSSES] == 0.01
    changed = c.default_tolerances("cpu")
    changed["accuracy"] = 1.0
    assert c.default_tolerances("cpu")["accuracy"] == 0.02  # a copy each time
    cuda = fake_record(device="cuda", peak_allocated_bytes=1_000_000)
    assert _result(c.compare(fake_record(device="cuda", peak_allocated_bytes=1_020_000), cuda),
                   "peak_allocated_bytes").verdict == c.OK


@pytest.mark.parametrize(("before", "now", "verdict", "detail"), [
    ([1.0, 2.0, 4.0], [1.0, 2.0, 4.0], c.OK, "step 0"),
    ([1.0, 2.0, 4.0], [1.0, 2.001, 4.0], c.OK, "step 1"),  # 0.05 %, inside 0.1 %
    ([1.0, 2.0, 4.0], [1.0, 2.0, 4.01], c.REGRESSION, "step 2"),  # 0.25 %
    ([1.0, 2.0, 4.0], [1.0, 1.99, 4.0], c.REGRESSION, "step 1"),  # down is a change too
    ([1.0, 2.0, 4.0], [1.0009, 2.003, 4.0], c.REGRESSION, "step 1"),  # the step that moved most
    ([1.0, 2.0], [1.0, None], c.REGRESSION, "step 1: diverged"),
    ([1.0, None], [1.0, 2.0], c.REGRESSION, "step 1: no longer diverges"),
    ([None, 2.0], [None, 2.0], c.OK, "step 1"),
    ([0.0, 1.0], [0.0, 1.0], c.OK, "step 0"),
    ([0.0], [0.5], c.REGRESSION, "step 0"),
])
def test_losses_step_by_step(before: list, now: list, verdict: str, detail: str) -> None:
    result = c.compare_losses(before, now, 0.001)
    assert result is not None and result.verdict == verdict and result.detail == detail, result
    assert result.metric == c.LOSSES and result.tolerance == 0.001


def test_losses_with_a_tolerance_per_step() -> None:
    """After a numerics change a trajectory drifts more with every step (memclaims.baselines.noise): each step
    gets its own tolerance, the last repeating; the step named is the one furthest beyond its own."""
    per_step = [0.0001, 0.001, 0.005]
    drift = c.compare_losses([2.0, 2.0, 2.0, 2.0], [2.0, 2.001, 2.009, 2.0098], per_step)
    assert drift is not None and drift.verdict == c.OK and drift.detail == "step 3" and drift.tolerance == 0.005
    early = c.compare_losses([2.0, 2.0, 2.0, 2.0], [2.0, 2.003, 2.009, 2.0098], per_step)
    assert early is not None and early.verdict == c.REGRESSION and early.detail == "step 1"
    assert early.tolerance == 0.001
    compared = c.compare(fake_record(memory_losses=[2.0, 2.003]), fake_record(memory_losses=[2.0, 2.0]),
                         loss_tolerances=[0.001, 0.002])
    assert _result(compared, c.LOSSES).verdict == c.OK  # 0.15 % at step 1, inside its 0.2 %


def test_losses_absent_or_all_diverged() -> None:
    assert c.compare_losses([], [], 0.001) is None
    assert c.compare_losses([None], [None], 0.001) is None
    missing = c.compare_losses([1.0], [], 0.001)
    assert missing is not None and missing.verdict == c.MISSING and missing.fails(strict=False)
    exact = c.compare_losses([1.0], [1.0001], None)
    assert exact is not None and exact.verdict == c.REGRESSION
    result = c.compare_losses([2.0], [2.002], 0.001)
    assert result is not None and result.verdict == c.OK and result.change_pct == pytest.approx(0.1)
    assert result.baseline == 2.0 and result.now == 2.002
    compared = c.compare(fake_record(memory_losses=[1.0, 2.5]), fake_record(memory_losses=[1.0, 2.0]))
    assert _result(compared, c.LOSSES).verdict == c.REGRESSION and compared.verdict == c.REGRESSION
    cuda = c.compare(fake_record(device="cuda", memory_losses=[1.0, 2.01]),
                     fake_record(device="cuda", memory_losses=[1.0, 2.0]))
    assert _result(cuda, c.LOSSES).verdict == c.OK  # 0.5 % inside the CUDA tier's 1 %


def test_environment_diff_names_what_changed() -> None:
    before = fake_record(versions={"torch": "2.13.0", "lightning": "2.6.0", "bitsandbytes": None})
    now = fake_record(versions={"torch": "2.14.1", "lightning": "2.6.0", "bitsandbytes": "0.49.0"})
    assert c.environment_diff(before, now) == ("bitsandbytes absent -> 0.49.0, torch 2.13.0 -> 2.14.1, "
                                               "lightning unchanged")
    assert c.environment_diff(before, before) == ("bitsandbytes unchanged, lightning unchanged, "
                                                  "torch unchanged")
    assert c.environment_diff(fake_record(versions={}), fake_record(versions={})) == "nothing recorded changed"
    assert c.environment_diff(fake_record(versions={"torch": "2.1"}), fake_record(versions={})) == "torch 2.1 -> absent"
    moved = c.environment_diff(fake_record(versions={}, device_name="a"), fake_record(versions={}, device_name="b"))
    assert moved == "device a -> b"
    classes = c.environment_diff(
        fake_record(versions={}, environment={"capability": "avx2", "torch_build": "cu130"}),
        fake_record(versions={}, environment={"capability": "avx512", "half_features": ["bf16"],
                                              "torch_build": "cu130"}))
    assert classes == "baseline from avx2 (cu130), this machine avx512 with bf16 (cu130)"


def test_message_says_each_failure_with_numbers_and_the_environment() -> None:
    comparison = c.compare(fake_record(peak_allocated_bytes=2 * FAKE_PEAK, accuracy=0.4, versions={"torch": "2"},
                                       accuracy_schedule=PLATEAU),
                           fake_record(versions={"torch": "1"}), case_id="cpu:vit-smoke/x")
    lines = comparison.message().splitlines()
    assert lines[0] == ("cpu:vit-smoke/x: peak_allocated_bytes got worse than its baseline: baseline 10,485,760 B "
                        "(10.00 MiB), now 20,971,520 B (20.00 MiB), change +100.00 % (tolerance +0.50 %)")
    assert lines[1] == ("cpu:vit-smoke/x: accuracy got worse than its baseline: baseline 50.00 %, now 40.00 %, "
                        "change -10.00 points (tolerance -2.00 points)")
    assert lines[-1] == "environment since the baseline: torch 1 -> 2"
    assert len(lines) == 3
    stale = c.compare(fake_record(peak_allocated_bytes=FAKE_PEAK // 2), fake_record(), strict=True).message()
    assert "is better than its baseline (stale baseline; refresh with --update-baselines)" in stale
    losses = c.compare(fake_record(memory_losses=[1.0, 3.0]), fake_record(memory_losses=[1.0, 2.0])).message()
    assert "memory_losses (step 1) moved beyond its tolerance: baseline 2.0000, now 3.0000, change +50.00 %" in losses
    assert "(tolerance ±0.10 %)" in losses
    missing = c.compare(fake_record(peak_reserved_bytes=None), fake_record(peak_reserved_bytes=5)).message()
    assert "peak_reserved_bytes was not measured, but the baseline has it" in missing
    assert "baseline 5 B (0.0000 MiB), now n/a, change n/a" in missing
    assert c.compare(fake_record(), fake_record()).message() == "environment since the baseline: " + \
        c.environment_diff(fake_record(), fake_record())


def test_formats() -> None:
    assert c.fmt_value("step_time_s", 0.1234) == "123.4 ms"
    assert c.fmt_value("accuracy", 0.5) == "50.00 %"
    assert c.fmt_value("x_bytes", 3 * c.MIB) == "3,145,728 B (3.00 MiB)"
    assert c.fmt_value("x_bytes", 1024) == "1,024 B (0.0010 MiB)"
    assert c.fmt_value("other", 7) == "7" and c.fmt_value("x_bytes", None) == "n/a"
    assert c.fmt_short("x_bytes", 3 * c.MIB) == "3.00 MiB" and c.fmt_short("accuracy", 0.25) == "25.00 %"
    assert c.fmt_short("x_bytes", None) == ""
    result = c.MetricResult("step_time_s", 0.1, 0.2, 100.0, 50.0, c.REGRESSION)
    assert c.fmt_tolerance(result) == "+50.00 %" and c.fmt_change(result) == "+100.00 %"
    assert c.fmt_tolerance(c.MetricResult("accuracy", 0.5, 0.4, None, None, c.REGRESSION)) == "none set"
    assert c.fmt_change(c.MetricResult("x_bytes", None, 4, None, 0.1, c.NEW)) == "n/a"
    assert c.fmt_change(c.MetricResult("x_bytes", 0, 4, None, 0.1, c.REGRESSION)) == "n/a"


def test_rows_and_the_summary_table_worst_first() -> None:
    summary = c.Summary()
    summary.add(c.compare(fake_record(peak_allocated_bytes=FAKE_PEAK * 2), fake_record(), case_id="a",
                          environment="env-a"))
    summary.add(c.compare(fake_record(peak_allocated_bytes=FAKE_PEAK * 11 // 10), fake_record(), case_id="b"))
    summary.add(c.compare(fake_record(peak_allocated_bytes=FAKE_PEAK // 2), fake_record(), case_id="c"))
    summary.add_note("d", c.NO_BASELINE, "env-d")
    worst = summary.worst_first()
    assert [(r["case"], r["verdict"]) for r in worst] == [("a", c.REGRESSION), ("b", c.REGRESSION),
                                                          ("d", c.NO_BASELINE), ("c", c.STALE)]
    assert worst[0]["environment"] == "env-a" and worst[0]["change"] == "+100.00 %"
    assert worst[0]["environment_change"] == c.environment_diff(fake_record(), fake_record())
    everything = summary.worst_first(everything=True)
    assert len(everything) == len(summary.rows) > len(worst)
    assert {r["verdict"] for r in everything[len(worst):]} <= {c.OK, c.INFO}
    table = summary.table()
    assert table[0].split() == ["case", "environment", "metric", "baseline", "now", "change", "verdict"]
    assert table[1].split() == ["a", "env-a", "peak_allocated_bytes", "10.00", "MiB", "20.00", "MiB", "+100.00",
                                "%", "regression"]
    assert len(table) == 1 + len(worst)
    assert len({line.index("metric") for line in table[:1]} | {table[1].index("peak_allocated_bytes")}) == 1
    assert c.Summary().table() == [] and c.Summary().worst_first() == []


def test_result_fields_of_missing_new_and_diverged() -> None:
    record, baseline = fake_record(peak_reserved_bytes=None), fake_record(peak_reserved_bytes=5000)
    missing = _result(c.compare(record, baseline), "peak_reserved_bytes")
    assert (missing.baseline, missing.now, missing.tolerance) == (5000, None, TOL)
    new = _result(c.compare(baseline, record), "peak_reserved_bytes")
    assert (new.baseline, new.now, new.tolerance) == (None, 5000, TOL)
    comparison = c.compare(record, baseline)
    assert comparison.recipe == record.recipe and comparison.environment == ""
    no_losses = c.compare_losses([1.0], [], 0.001)
    assert no_losses is not None and (no_losses.metric, no_losses.tolerance, no_losses.detail) == (
        c.LOSSES, 0.001, "no losses recorded")
    diverged = c.compare_losses([1.0, 2.0], [1.0, None], 0.001)
    assert diverged is not None and (diverged.baseline, diverged.now) == (2.0, None)
    recovered = c.compare_losses([1.0, None], [1.0, 2.0], 0.001)
    assert recovered is not None and (recovered.baseline, recovered.now) == (None, 2.0)


def test_losses_report_the_step_that_moved_most_and_their_tolerance_boundary() -> None:
    first = c.compare_losses([1.0, 2.0], [1.005, 2.004], 0.001)  # 0.5 % at step 0, 0.2 % at step 1
    assert first is not None and first.detail == "step 0" and first.change_pct == pytest.approx(0.5)
    at_limit = c.compare_losses([1.0], [1.5], 0.5)  # exactly 50 %: inside
    assert at_limit is not None and at_limit.verdict == c.OK
    beyond = c.compare_losses([1.0], [1.5025], 0.5)  # 50.25 %
    assert beyond is not None and beyond.verdict == c.REGRESSION


def test_the_table_with_notes_unknown_verdicts_and_changes_without_a_percentage() -> None:
    summary = c.Summary()
    summary.add(c.compare(fake_record(optimizer_state_bytes=8), fake_record(optimizer_state_bytes=0), case_id="z"))
    summary.add(c.compare(fake_record(peak_allocated_bytes=FAKE_PEAK * 1006 // 1000), fake_record(), case_id="p"))
    summary.add_note("n", c.NO_BASELINE)
    summary.add_note("u", "custom")
    worst = summary.worst_first()
    # Among regressions the largest change first; one without a percentage (grown from zero) after it.
    assert [(r["case"], r["metric"]) for r in worst[:2]] == [("p", "peak_allocated_bytes"), ("z", "optimizer_state_bytes")]
    assert worst[-1]["case"] == "u"  # a verdict the table does not know: last
    note = next(r for r in summary.rows if r["case"] == "n")
    assert note == {"case": "n", "environment": "", "metric": "-", "baseline": None, "now": None,
                    "change_pct": None, "change": "", "tolerance": None, "verdict": c.NO_BASELINE}
    table = summary.table()
    assert [line.split() for line in table if line.startswith("n ")] == [["n", "-", "no", "baseline"]]
    assert all(line == line.rstrip() for line in table)
    assert len(summary.table(everything=True)) == 1 + len(summary.rows) > len(table)


def test_more_formats() -> None:
    assert c.fmt_value("x_bytes", c.MIB) == "1,048,576 B (1.00 MiB)"
    assert c.fmt_change(c.MetricResult("accuracy", None, 0.5, None, 0.02, c.NEW)) == "n/a"
    assert c.fmt_change(c.MetricResult("accuracy", 0.5, None, None, 0.02, c.MISSING)) == "n/a"
