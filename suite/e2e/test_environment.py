"""The environment: the preflight's one line for a broken install, a missing torchvision skipping
only the ViT workloads, and the committed CPU baselines holding under every ATen CPU class this
machine can run as (CI may land on any of them)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from memclaims.core import machine
from memclaims.core.environment import cpu_capability
from memclaims.pytest import release_preflight as preflight
from memclaims.pytest.testing import make_project

pytest_plugins = ["pytester"]

# A torchvision whose C++ operators do not register beside the installed torch fails at import
# with this (the real message of torchvision's meta registrations).
_BROKEN_TORCHVISION = 'raise RuntimeError("operator torchvision::nms does not exist")\n'


@pytest.fixture
def fresh_stack() -> Iterator[None]:
    """The stack's answers recomputed in this test, and forgotten after it."""
    machine.stack_problem.cache_clear()
    yield
    machine.stack_problem.cache_clear()


def test_a_working_stack_passes_the_preflight() -> None:
    assert preflight.problems() == []


@pytest.mark.reads_versions
def test_the_preflight_runs_each_packages_operation_not_a_version_table(fresh_stack: None, installed_releases: object,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A torchvision that imports but whose operator fails is named, with its version and error;
    its version number alone decides nothing (any number passes when the operator works)."""
    import torchvision

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Could not run 'torchvision::nms' with arguments from the 'CPU' backend")

    monkeypatch.setattr(torchvision.ops, "nms", broken)
    found = preflight.problems()
    version = metadata.version("torchvision")
    assert [p.line() for p in found] == [
        f"torchvision {version} imports, but torchvision.ops.nms on 2 boxes fails: RuntimeError: Could not run "
        "'torchvision::nms' with arguments from the 'CPU' backend"]
    assert preflight.stopping(found, "vit") and not preflight.stopping(found, "hf:gpt2")
    assert preflight.stopping(found, "vit-h14") and not preflight.stopping(found, "distilbert")
    monkeypatch.undo()
    machine.stack_problem.cache_clear()
    monkeypatch.setattr(machine, "_version", lambda p: "0.99.0" if p == "torchvision" else metadata.version(p))
    assert preflight.problems() == []  # a number no table knows: the stack works, so it runs


def test_a_missing_backend_of_bitsandbytes_never_stops_a_session(fresh_stack: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "bitsandbytes_problem", lambda device="cpu": "bitsandbytes 9 has no CPU backend")
    found = preflight.problems()
    assert [p.package for p in found] == ["bitsandbytes"]
    assert not any(preflight.stopping(found, w) for w in ("vit", "vit-h14", "distilbert", "hf:llama", "user-model"))
    assert preflight.note(found[0]).endswith("the cases of the techniques that need it (adam8bit, adamw8bit, paged-adamw8bit, qlora, "
                                             "qlora-no-double-quant) "
                                             "skip with that reason")


def _pytest_with(path: list[Path], *args: str, cwd: Path = ROOT, python: str = sys.executable) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in path)}
    done = subprocess.run([python, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    return f"exit {done.returncode}\n{done.stdout}{done.stderr}"


def test_a_broken_install_stops_pytest_with_one_line(tmp_path: Path) -> None:
    shim = tmp_path / "shim" / "torchvision"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(_BROKEN_TORCHVISION)
    # A plugin option on the command line must not turn the finding into "unrecognized arguments".
    output = _pytest_with([tmp_path / "shim", ROOT], "--collect-only", "-q", "--memclaims-matrix", "singles",
                          str(ROOT / "suite" / "cases" / "test_claims.py"))
    assert output.startswith("exit 4\n"), output  # pytest's usage error: nothing ran
    version = metadata.version("torchvision")
    assert f"torchvision {version} does not import beside torch" in output
    assert "operator torchvision::nms does not exist" in output
    # Lightning and torchmetrics import an installed torchvision: the line says why they fail too.
    assert "lightning " in output and "imports torchvision and fails with it" in output
    assert "Traceback" not in output and len(output.strip().splitlines()) <= 4, output


@pytest.mark.parametrize("option, message", [
    (["--memclaims-matirx", "singles"], "ERROR: unrecognized option --memclaims-matirx; did you mean "
                                        "'--memclaims-matrix'"),
    (["--memclaims-matrix", "bogus"], "ERROR: --memclaims-matrix: invalid choice: 'bogus' (choose from singles, "
                                      "default, full)"),
])
def test_a_bad_option_is_answered_before_the_releases_preflight(tmp_path: Path, option: list[str],
                                                               message: str) -> None:
    """Checked before the preflight's imports (seconds; issue #49): on a broken install the option's line is the
    answer, not the preflight's."""
    shim = tmp_path / "shim" / "torchvision"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(_BROKEN_TORCHVISION)
    output = _pytest_with([tmp_path / "shim", ROOT], "--collect-only", "-q", *option,
                          str(ROOT / "suite" / "cases" / "test_claims.py"))
    assert output.startswith("exit 4\n") and message in output, output
    assert "torchvision" not in output and len(output.strip().splitlines()) <= 2, output


def test_force_regen_is_taken_for_update_baselines(pytester: pytest.Pytester) -> None:
    """pytest-regressions' spelling of "store what ran as the expected values"."""
    assert pytester.parseconfig("--force-regen").getoption("update_baselines") is True
    assert pytester.parseconfig().getoption("update_baselines") is False


def stack_without(tmp_path: Path, missing: str) -> str:
    """A virtual environment holding this one's packages but ``missing`` (links, not copies);
    returns its python."""
    farm = tmp_path / "site"
    farm.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        # .pth files and the editable memclaims: the checkout comes through PYTHONPATH instead.
        if not entry.name.startswith((missing, "__editable__", "memclaims")) and entry.suffix != ".pth":
            (farm / entry.name).symlink_to(entry)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "stack.pth").write_text(f"{farm}\n")
    return str(venv / "bin" / "python")


USES_VIT = """
import pytest
from memclaims import run
from memclaims.recipes.recipe import resolve

@pytest.mark.requires(run.needs(resolve("vit", "smoke", ()), "cpu"))
def test_a_vit_recipe():
    pass
"""


@pytest.mark.slow
def test_a_missing_torchvision_skips_only_the_vit_workloads(pytester: pytest.Pytester, tmp_path: Path) -> None:
    python = stack_without(tmp_path, "torchvision")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    listed = subprocess.run([python, "-m", "memclaims.cli", "list"], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert listed.returncode == 0 and "vit-h14" in listed.stdout, listed.stderr[-2000:]
    hf = subprocess.run([python, "-m", "memclaims.cli", "run", "hf:gpt2", "--device", "sim", "--scale", "smoke",
                         "--no-eval", "--json"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert hf.returncode == 0 and '"recipe": "hf:gpt2-smoke/fabric"' in hf.stdout, hf.stderr[-2000:]

    make_project(pytester, ROOT).makepyfile(test_uses_vit=USES_VIT,
                                            test_memclaims="from memclaims.pytest.cases import test_case  # noqa\n")
    ran = _pytest_with([ROOT], "-v", "-rs", "--memclaims-workload", "distilbert", "--memclaims-matrix", "singles",
                       "-k", "vit_recipe or cpu:distilbert-smoke/fabric", "--update-baselines",
                       cwd=pytester.path, python=python)
    assert ran.startswith("exit 0\n"), ran[-3000:]
    assert "memclaims: torchvision is not installed; the cases of the ViT workloads (vit, vit-h14) skip" in ran
    assert "test_memclaims.py::test_case[cpu:distilbert-smoke/fabric] PASSED" in ran, ran[-3000:]
    assert "SKIPPED [1] test_uses_vit.py:5: needs torchvision: torchvision is not installed (pip install" in ran
    assert "1 passed, 1 skipped" in ran  # with the default workload (vit) the same session stops: see stopping()


def runnable_classes() -> list[str]:
    """ATen's default class where this machine runs another: the CPU furthest from the baselines'
    (avx2) that CI may land on. The classes between add a minute each on 2 cores and judge nothing
    the committed Records of baselines/releases/ (suite/unit/baselines/test_noise_release_records.py) do not."""
    return [] if cpu_capability() == "default" else ["default"]


# The cases most sensitive to the CPU class: bf16 arithmetic differs where bf16 instructions do,
# and the fp32 reference. Each is a real smoke-scale training run against the committed baseline.
_SENSITIVE = ("cpu:vit-smoke/fabric] or cpu:vit-smoke/bf16-true] or cpu:vit-smoke/bf16-mixed] or "
              "cpu:vit-smoke/bf16-true+small-batch+grad-accum]")


@pytest.mark.cpu
@pytest.mark.slow
@pytest.mark.parametrize("cpu_class", runnable_classes() or [pytest.param(
    "none", marks=pytest.mark.requires(unsupported="this machine runs only ATen's default class"))])
def test_committed_baselines_hold_under_another_cpu_class(cpu_class: str) -> None:
    env = {**os.environ, "ATEN_CPU_CAPABILITY": cpu_class}
    done = subprocess.run([sys.executable, "-m", "pytest", "suite/cases/test_technique_matrix.py", "-m", "cpu", "-q",
                           "-p", "no:cacheprovider", "-k", _SENSITIVE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"the committed baselines fail as ATEN_CPU_CAPABILITY={cpu_class}:\n{output[-4000:]}"
    assert "4 passed" in output
