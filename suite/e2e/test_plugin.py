"""The pytest side, end to end with pytester: ids, markers, skip reasons, options."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from fixtures.paths import ROOT
from memclaims.pytest.testing import PLUGIN_NAME, make_project

pytest_plugins = ["pytester"]


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    """A throwaway project wired exactly like this one, with a case test that does not train."""
    make_project(pytester, ROOT).makepyfile(test_cases="""
        def test_case(tier, techniques, record_cache):
            recipe = record_cache.recipe(tier, "vit", techniques)
            assert recipe.techniques == techniques
    """)
    return pytester


def test_ids_are_readable_and_carry_the_tier(suite: pytest.Pytester) -> None:
    result = suite.runpytest("--collect-only", "-q", "--memclaims-matrix", "singles")
    result.stdout.fnmatch_lines(["*test_case?cpu:vit-smoke/bf16-true?*", "*test_case?gpu:vit-article/sgd?*"])


def test_lora_options_give_the_lora_and_qlora_cases_their_own_ids(suite: pytest.Pytester) -> None:
    """--memclaims-lora-* (issue #53): the adapters' cases ask them, in their ids (their own baselines); the other
    cases keep theirs; a bad value stops the run with one line naming the option."""
    result = suite.runpytest("--collect-only", "-q", "--memclaims-matrix", "singles", "--memclaims-workload",
                             "distilbert", "--memclaims-lora-r", "4", "--memclaims-lora-targets", "q_lin,k_lin")
    result.stdout.fnmatch_lines(["*test_case?cpu:distilbert-smoke/bf16-true?*",  # in the matrix's order
                                 "*test_case?cpu:distilbert-smoke/lora?r=4,targets=q_lin+k_lin??*",
                                 "*test_case?gpu:distilbert-article/qlora?r=4,targets=q_lin+k_lin??*"])
    refused = suite.runpytest("--collect-only", "--memclaims-lora-dropout", "1")
    assert refused.ret == pytest.ExitCode.USAGE_ERROR
    refused.stderr.fnmatch_lines(["*--lora-dropout 1: expected a probability in [[]0, 1)*"])


def test_markers_select_tiers(suite: pytest.Pytester) -> None:
    result = suite.runpytest("-m", "cpu", "--memclaims-matrix", "singles", "-q")
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) > 0 and "failed" not in outcomes


def test_gpu_cases_skip_with_what_they_need(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    from memclaims.core import machine

    monkeypatch.setattr(machine, "cuda_device_count", lambda: 0)  # in-process run: any machine is GPU-less
    result = suite.runpytest("-m", "gpu", "--memclaims-matrix", "singles", "-rs")
    result.stdout.fnmatch_lines(["*needs a CUDA GPU: torch.cuda.is_available() is False*"])
    outcomes = result.parseoutcomes()
    # Warnings may come with an in-process run (a module pytest already imported cannot be rewritten).
    assert outcomes.get("skipped", 0) > 0 and set(outcomes) - {"warnings"} == {"skipped", "deselected"}, outcomes


def test_cpu_16_mixed_case_skips_at_collection_with_why(suite: pytest.Pytester) -> None:
    result = suite.runpytest("-m", "cpu", "--memclaims-matrix", "singles", "-rs", "-k", "16-mixed and not bf16")
    result.stdout.fnmatch_lines(["*Lightning runs 16-mixed as bf16-mixed on the CPU*"])
    assert result.parseoutcomes().get("skipped") == 1, result.parseoutcomes()


def test_header_prints_how_many_cases_each_selection_holds(pytester: pytest.Pytester) -> None:
    """The header prints before collection: a project without the case test collects nothing instead of the full
    matrix's 55,737 combinations per tier (20 CPU s of collection the header never read)."""
    from memclaims.techniques import technique_registry as registry

    result = make_project(pytester, ROOT).runpytest("--collect-only", "--memclaims-matrix", "full")
    size = {name: registry.selection_size(name) for name in ("singles", "default", "full")}
    result.stdout.fnmatch_lines([f"memclaims: matrix 'full': {size['full']} cases per workload and tier (singles "
                                 f"{size['singles']}, default {size['default']}, full {size['full']})*"])


SIM_PROFILE_PROBE = """
    import memclaims.pytest.records as records

    def test_sim_profiles(record_cache, monkeypatch):
        asked = []
        monkeypatch.setattr(records, "run_recipe", lambda recipe, options: asked.append(options.profile) or [None])
        for workload in ("vit", "hf:gpt2", "demo-transformer"):
            record_cache.get("sim", record_cache.recipe("sim", workload, ()))
        print("sim profiles asked:", asked)
"""


@pytest.mark.parametrize("chosen, header, asked", [
    ((), "memclaims: sim tier on profile 'current' for workload 'demo-transformer' (the installed torch's defaults, "
         "for a user workload), 'article' for the built-in workloads' rows and claims *",
     "['article', 'article', 'current']"),
    (("--memclaims-sim-profile", "h100"), "memclaims: sim tier on profile 'h100' (--memclaims-sim-profile)",
     "['h100', 'h100', 'h100']"),
    (("--memclaims-era", "bitsandbytes=0.41"), "memclaims: sim tier as with bitsandbytes=0.41 (--memclaims-era*",
     "['article+bitsandbytes=0.39.0-0.43.1', 'article+bitsandbytes=0.39.0-0.43.1', "
     "'current+bitsandbytes=0.39.0-0.43.1']"),
])
def test_the_sim_tier_predicts_a_user_workload_for_the_installed_torch(
        pytester: pytest.Pytester, chosen: tuple[str, ...], header: str, asked: str) -> None:
    """A user workload's sim-tier cases answer for today's torch, the built-in workloads' keep the article's
    profile (their committed baselines'), a chosen profile is every case's; the header says which."""
    make_project(pytester, ROOT, ini_extra="memclaims_workloads = fixtures.demo_transformer:make\n")
    pytester.makepyfile(test_profiles=SIM_PROFILE_PROBE)
    result = pytester.runpytest("-s", "--memclaims-workload", "demo-transformer", "-k", "test_sim_profiles", *chosen)
    result.stdout.fnmatch_lines([header])
    assert f"sim profiles asked: {asked}" in result.stdout.str() and result.parseoutcomes().get("passed") == 1


def test_matrix_option_changes_the_number_of_cases(suite: pytest.Pytester) -> None:
    counts = {}
    for matrix in ("singles", "default"):
        result = suite.runpytest("--collect-only", "-q", "--memclaims-matrix", matrix)
        counts[matrix] = sum(1 for line in result.outlines if "::test_case[" in line)
    assert 0 < counts["singles"] < counts["default"]


def test_bad_matrix_value_is_a_usage_error(suite: pytest.Pytester) -> None:
    result = suite.runpytest("--memclaims-matrix", "everything")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*invalid choice: 'everything'*"])


def test_matrix_can_be_set_in_pytest_ini(suite: pytest.Pytester) -> None:
    make_project(suite, ROOT, ini_extra="memclaims_matrix = singles\n")
    result = suite.runpytest("--collect-only")
    result.stdout.fnmatch_lines(["memclaims: matrix 'singles'*"])


@pytest.mark.parametrize("flag, value", [("--memclaims-steps", "three"), ("--memclaims-steps", "0"),
                                         ("--memclaims-accuracy-epochs", "-1")])
def test_malformed_counts_are_usage_errors(suite: pytest.Pytester, flag: str, value: str) -> None:
    result = suite.runpytest(flag, value)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {flag}: expected a positive integer, got '{value}'"])


# --- loaded by its entry point ------------------------------------------------------------------------

def entry_point() -> str:
    """pyproject.toml's pytest11 entry point named memclaims, as ``name = value``."""
    found = re.search(r'^\[project\.entry-points\.pytest11\]\n(\w+) = "([\w.:]+)"', (ROOT / "pyproject.toml").read_text(),
                      re.M)
    assert found, "pyproject.toml declares no pytest11 entry point"
    return f"{found.group(1)} = {found.group(2)}"


def test_the_entry_point_is_the_plugin_named_memclaims() -> None:
    assert entry_point() == f"{PLUGIN_NAME} = memclaims.pytest.plugin"


@pytest.mark.slow  # CI's scripts/wheel-check loads the plugin by its entry point from the installed wheel
def test_installed_the_entry_point_loads_the_plugin_once_with_its_fixtures(pytester: pytest.Pytester) -> None:
    """As after ``pip install``: a distribution declaring the entry point is on the path (the
    package itself is this checkout); the project's conftest (this repository's) adds nothing."""
    dist = pytester.path / "site" / "memclaims_installed-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: memclaims-installed\nVersion: 0\n")
    (dist / "entry_points.txt").write_text(f"[pytest11]\n{entry_point()}\n")
    make_project(pytester, ROOT).makepyfile(test_uses="def test_uses(record_cache, baseline_check):\n    pass\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(pytester.path / "site")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--trace-config",
                           "--memclaims-matrix", "singles"], cwd=pytester.path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # pytest names the distribution that brought it: the fake one, or memclaims itself where it is
    # installed too (CI's editable install; the first distribution declaring the name wins).
    assert re.search(r"registered third-party plugins:\n(.*\n)*?\s+memclaims(-installed)?-\d[\w.]*", done.stdout), \
        done.stdout[-3000:]
    registered = re.findall(r"PLUGIN registered: <module 'memclaims\.pytest\.plugin'", done.stdout)
    assert len(registered) == 1, done.stdout[-3000:]


def test_importing_the_plugin_imports_nothing_of_the_training_stack() -> None:
    """pytest imports the plugin before the preflight has looked at the stack; a broken torch or
    torchvision imported here would be a traceback instead of the preflight's line."""
    code = ("import sys, memclaims.pytest.plugin, memclaims.pytest.addoption; "
            "print(sorted(m for m in ('torch', 'torchvision', 'lightning', 'torchmetrics', 'transformers', "
            "'bitsandbytes', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_only_the_controller_computes_the_header(pytestconfig: pytest.Config) -> None:
    """The header's counts (the full matrix: seconds of CPU) are computed where they are printed: without xdist and
    on its controller, never in a worker."""
    from memclaims.pytest import plugin

    class Controller:  # the session's config, less xdist's worker mark if this test runs in a worker
        def __getattr__(self, name: str) -> object:
            if name == "workerinput":
                raise AttributeError(name)
            return getattr(pytestconfig, name)

    class Worker(Controller):
        workerinput: dict[str, object] = {"workerid": "gw0"}

    lines = plugin.pytest_report_header(Controller())  # type: ignore[arg-type]
    assert any(line.startswith("memclaims: matrix ") for line in lines), lines
    assert plugin.pytest_report_header(Worker()) == []  # type: ignore[arg-type]
