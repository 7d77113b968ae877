"""docs/your-training.md's examples (examples/your-training/), run as written in a user project (pytester, the
installed plugin): the plain loop in CI; the Trainer, Lightning and Accelerate ones, and the course's 8-bit Adam
acceptance (issue #50), and the sim form judged against its baseline, in the nightly: they import transformers, Lightning and accelerate and train a DistilBERT
(about 20 s of CPU on 2 cores, over CI's share for one feature)."""

from __future__ import annotations

import json
import runpy
import shutil

import pytest

from fixtures.paths import ROOT

pytest_plugins = ["pytester"]

EXAMPLES = ROOT / "examples" / "your-training"
COURSE_CASE = "distilbert-cased-smoke/hf-trainer+adam8bit"


def _project(pytester: pytest.Pytester, *names: str) -> pytest.Pytester:
    pytester.makeini("[pytest]\n")
    for name in names:
        shutil.copy(EXAMPLES / name, pytester.path / name)
    return pytester


def test_the_watch_a_loop_script_prints_each_phase(capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(EXAMPLES / "watch_a_loop.py"), run_name="__main__")
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0].strip() for line in out] == [
        "forward", "backward", "optimizer_step", "zero_grad", "optimizer state"], out
    assert out[-1] == "optimizer state: 1.04 MiB"  # AdamW's two fp32 moments of 136,714 parameters, and its steps


def test_the_watch_a_build_script_prints_the_builds_load_peak(capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(EXAMPLES / "watch_a_build.py"), run_name="__main__")
    # The fp32 build (136,714 parameters: 546,856 B) and the bf16 copy of its largest weight (262,144 B) at once.
    assert capsys.readouterr().out.splitlines() == ["load peak: 0.77 MiB", "parameters: 0.26 MiB"]


def test_the_plain_loop_example_stores_then_passes_against_its_baseline(pytester: pytest.Pytester) -> None:
    project = _project(pytester, "test_plain_loop.py")
    project.runpytest_inprocess("-p", "no:cacheprovider", "--update-baselines").assert_outcomes(passed=1, skipped=1)
    second = project.runpytest_inprocess("-p", "no:cacheprovider", "-rs")
    # Here (no GPU) the CUDA form skips with its reason, never passes.
    second.assert_outcomes(passed=1, skipped=1)
    second.stdout.fnmatch_lines(["SKIPPED*test_plain_loop.py*CUDA*"])


def _course_case_optimizer_bytes() -> set[int]:
    """The course case's optimizer_state_bytes in every baseline file memclaims stores it in."""
    found = set()
    for path in (ROOT / "baselines" / "measured").glob("cpu-*.json"):
        entry = json.loads(path.read_text())["records"].get(COURSE_CASE)
        if entry is not None:
            found.add(entry["record"]["optimizer_state_bytes"])
    return found


@pytest.mark.slow
@pytest.mark.requires(bitsandbytes="cpu")
def test_the_stack_examples_and_the_courses_8bit_adam_acceptance(pytester: pytest.Pytester) -> None:
    project = _project(pytester, "test_trainer.py", "test_lightning.py", "test_accelerate.py", "test_on_sim.py")
    project.runpytest_inprocess("-p", "no:cacheprovider", "--update-baselines").assert_outcomes(passed=4)
    project.runpytest_inprocess("-p", "no:cacheprovider", "test_on_sim.py").assert_outcomes(passed=1)  # judged
    stored = next(p for p in (project.path / "baselines" / "measured").glob("*.json") if "obtained" not in p.name)
    trainer = json.loads(stored.read_text())["records"]["test_trainer.py::test_course_trainer_memory"]["record"]
    # The user's script's Adam8bit holds what memclaims' own course case holds, to the byte.
    assert _course_case_optimizer_bytes() == {trainer["optimizer_state_bytes"]}
    # The user swaps Adam8bit for AdamW: the test fails naming the optimizer step's phase, the metric, both numbers.
    script = project.path / "test_trainer.py"
    script.write_text(script.read_text().replace("bnb.optim.Adam8bit(", "torch.optim.AdamW("))
    swapped = project.runpytest_inprocess("-p", "no:cacheprovider", "test_trainer.py")
    swapped.assert_outcomes(failed=1)
    swapped.stdout.fnmatch_lines(["*test_course_trainer_memory: phases.optimizer_step.allocated_bytes got worse than "
                                  "its baseline: baseline 1,49* B (1.42 MiB), now 2,84* B (2.72 MiB)*"])


def test_the_sim_example_names_a_value_read_in_one_line(pytester: pytest.Pytester) -> None:
    """docs/your-training.md's sim form with a loop that steers on a value (which fake tensors do not have): one line
    naming the op and the test file's line, no traceback. (The example as written is stored and judged in the nightly
    with the stack examples: one more run of the plugin here would cost CI about 4 s.)"""
    project = _project(pytester, "test_on_sim.py")
    script = project.path / "test_on_sim.py"
    lines = script.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if "loss.backward()" in line)
    lines[at:at] = ["        if loss.item() > 10.0:", "            break"]
    script.write_text("\n".join(lines) + "\n")
    broken = project.runpytest_inprocess("-p", "no:cacheprovider")
    broken.assert_outcomes(failed=1)
    broken.stdout.fnmatch_lines([f"*test_on_sim.py:{at + 1} reads a tensor's value (aten._local_scalar_dense*"])
    assert "Traceback" not in broken.stdout.str() and "During handling" not in broken.stdout.str()
