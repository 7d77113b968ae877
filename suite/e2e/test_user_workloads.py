"""A workload from the user's own package runs through pytest: the README's example, registered
from a temporary package with the ini option, selected with --memclaims-workload, with baselines."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from memclaims.core.errors import UsageError
from memclaims.pytest.testing import make_project
from memclaims.recipes.recipe import resolve
from memclaims.workloads import user as user_workloads
from memclaims.workloads.registry import workload

pytest_plugins = ["pytester"]


def readme_block(first_line: str) -> str:
    """The README's python block that starts with ``first_line`` (one fact in one place: the test
    runs what users copy)."""
    blocks = re.findall(rf"```python\n({re.escape(first_line)}\n.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) == 1, f"README.md lost its python block starting {first_line!r}"
    return blocks[0]


def readme_example() -> str:
    """The README's worked user workload."""
    return readme_block("# mywork/workload.py")


@pytest.fixture
def project(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A user's project: their package, the README's test module importing the library's case test,
    and the ini option naming the factory.

    Runs go through a subprocess: an in-process pytester session re-imports torch.distributed's
    operator library, which torch refuses to register twice."""
    make_project(pytester, ROOT, ini_extra="memclaims_workloads = mywork.workload:make\n")
    pytester.mkpydir("mywork")
    (pytester.path / "mywork" / "workload.py").write_text(readme_example())
    (pytester.path / "test_memclaims.py").write_text(readme_block("# tests/test_memclaims.py"))
    # The subprocess finds the package (its cwd) and this checkout's memclaims.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    return pytester


@pytest.mark.slow  # CI's scripts/wheel-check runs a user project's matrix from the wheel (first run, accept, green)
def test_registered_workload_runs_the_matrix_with_baselines(project: pytest.Pytester) -> None:
    common = ["-m", "cpu", "--memclaims-matrix", "singles", "--memclaims-workload", "clusters-mlp",
              "-k", "fabric or bf16-true or sgd", "-p", "no:cacheprovider",
              "--memclaims-baselines-dir", str(project.path / "baselines")]
    first = project.runpytest_subprocess(*common, "--update-baselines", "-v")
    first.stdout.fnmatch_lines(["*test_case?cpu:clusters-mlp-smoke/bf16-true? PASSED*",
                                "*test_case?cpu:clusters-mlp-smoke/sgd? PASSED*"])
    assert first.parseoutcomes().get("passed") == 3 and "failed" not in first.parseoutcomes()
    stored = "".join(p.read_text() for p in (project.path / "baselines").rglob("*.json"))
    assert '"clusters-mlp-smoke/bf16-true"' in stored
    # The second run compares against what the first stored.
    second = project.runpytest_subprocess(*common)
    assert second.parseoutcomes().get("passed") == 3 and "failed" not in second.parseoutcomes()


@pytest.mark.slow  # nightly only (pytest -n 2): keeps CI under 15 minutes on 2 cores
def test_an_unknown_selected_workload_stops_the_run(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("--memclaims-workload", "nope", "--collect-only", "-p", "no:cacheprovider")
    result.stderr.fnmatch_lines(["*unknown workload 'nope'; valid workloads: vit*clusters-mlp*"])
    assert result.ret == pytest.ExitCode.USAGE_ERROR


def test_a_factory_that_returns_no_workload_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "badfactory.py").write_text("def make():\n    return 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UsageError, match="returned int, not a memclaims Workload"):
        user_workloads.register_spec("badfactory:make")
    with pytest.raises(UsageError, match="expected package.module:factory"):
        user_workloads.register_spec("badfactory")


def test_registered_workloads_resolve_like_built_ins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "userwork.py").write_text(readme_example())
    monkeypatch.syspath_prepend(str(tmp_path))
    made = user_workloads.register_spec("userwork:make")
    try:
        recipe = resolve("clusters-mlp", "smoke", ["bf16-true", "sgd"])
        assert workload("clusters-mlp") is made and recipe.id == "clusters-mlp-smoke/bf16-true+sgd"
        assert recipe.batch_size == 32 and recipe.workload.block_class().__name__ == "Block"
    finally:
        user_workloads.forget("clusters-mlp")
    with pytest.raises(UsageError, match="unknown workload 'clusters-mlp'"):
        workload("clusters-mlp")


def test_the_cli_finds_workloads_named_in_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "envwork.py").write_text(readme_example())
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(user_workloads.ENV, "envwork:make")
    monkeypatch.setattr(user_workloads, "_env_specs_loaded", set())
    try:
        assert resolve("clusters-mlp", "smoke", []).id == "clusters-mlp-smoke/fabric"
        assert "clusters-mlp" in user_workloads.names()
    finally:
        user_workloads.forget("clusters-mlp")


@pytest.mark.sim
def test_the_readme_example_predicts_on_the_sim_and_through_fit(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's workload, defined through define() alone, at article scale (24 blocks of width
    4096: 403 M parameters): one device, FSDP rank 0 of 2, and fit's ranking of a small pool."""
    from memclaims.recipes.run_options import RunOptions
    from memclaims.report import fit
    from memclaims.run import run_recipe

    (tmp_path / "simwork.py").write_text(readme_example())
    monkeypatch.syspath_prepend(str(tmp_path))
    user_workloads.register_spec("simwork:make")
    try:
        options = RunOptions(device="sim", memory_steps=2)
        one = run_recipe(resolve("clusters-mlp", "article", ["bf16-true"]), options)[0]
        sharded = run_recipe(resolve("clusters-mlp", "article", ["fsdp"]), RunOptions(device="sim", memory_steps=2,
                                                                                    devices=2))[0]
        ranked = fit.fit("clusters-mlp", 5 * 10**9, only=("bf16-true", "sgd")).ranked()
    finally:
        user_workloads.forget("clusters-mlp")
    assert one.param_count == 24 * (2 * 4096 + 4096 * 4096 + 4096) + 16 * 4096 + 4096 + 4096 * 4 + 4
    assert one.param_bytes == 2 * one.param_count and one.data == "none (fake tensors)"  # bf16 weights, no data read
    assert (sharded.devices, sharded.param_count) == (2, one.param_count)
    assert sharded.param_bytes == pytest.approx(4 * one.param_count / 2, rel=0.01)  # an fp32 half per rank
    assert one.peak_reserved_total_bytes and sharded.peak_reserved_total_bytes
    statuses = {row.recipe: row.status for row in ranked}
    assert statuses["clusters-mlp-article/fabric"] == "too big"  # fp32 + Adam: 16 B per parameter > 5 GB
    assert ranked[0].status == "fits" and ranked[0].peak_reserved_bytes is not None
    assert ranked[0].peak_reserved_bytes <= 5 * 10**9

