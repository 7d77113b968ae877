"""memclaims.recipes.requirements: what a case needs, evaluated once at collection into one joined skip.

Unit tests of each need against a stub machine, the needs derived from recipes and claims, the
bitsandbytes check (a real step, so a build without a backend skips instead of failing), the
plugin end to end with pytester, and a guard that no test body or fixture skips by itself.
"""

from __future__ import annotations

import ast
import re
import sys
import types
from collections.abc import Iterator

import pytest
import torch

from fixtures.paths import ROOT
from memclaims import run
from memclaims.claims.catalogue import CLAIMS, CLAIMS_BY_NAME
from memclaims.core import machine
from memclaims.core.errors import UsageError
from memclaims.pytest.testing import make_project
from memclaims.recipes import requirements
from memclaims.recipes.recipe import resolve
from memclaims.recipes.requirements import Machine, Needs

pytest_plugins = ["pytester"]


class Stub(Machine):
    """A machine described in the test; a probe nobody should need raises."""

    def __init__(self, cuda: int = 0, bitsandbytes: dict[str, str | None] | None = None,
                 packages: dict[str, str | None] | None = None, opted_in: frozenset[str] = frozenset(),
                 paths: frozenset[str] = frozenset()) -> None:
        super().__init__(opted_in=lambda name: name in opted_in, cuda_devices=cuda)
        self.bnb, self.pkgs, self.paths = bitsandbytes or {}, packages or {}, paths

    def bitsandbytes(self, device: str) -> str | None:
        return self.bnb[device]  # KeyError: probed although no need asked

    def package(self, name: str) -> str | None:
        return self.pkgs[name]

    def has_path(self, path: str) -> bool:
        return path in self.paths


# --- each need, the joined reason, a met case ------------------------------------------------------

def test_nothing_needed_is_met_without_probing() -> None:
    assert requirements.reason(Needs(), Stub()) is None
    assert requirements.reason(requirements.NOTHING) is None  # this machine: nothing probed, nothing unmet


@pytest.mark.parametrize(("required", "machine", "expected"), [
    (Needs(cuda_devices=1), Stub(cuda=0), "needs a CUDA GPU: torch.cuda.is_available() is False on this machine"),
    (Needs(cuda_devices=2), Stub(cuda=1), "needs 2 CUDA devices; torch sees 1 (run on a machine with 2 GPUs)"),
    (Needs(cuda_devices=2), Stub(cuda=0), "needs 2 CUDA devices: torch.cuda.is_available() is False"),
    (requirements.needs(bitsandbytes="cpu"), Stub(bitsandbytes={"cpu": "no working CPU backend"}),
     "needs bitsandbytes' 8-bit optimizers on the CPU: no working CPU backend (install a build with a CPU "
     "backend: pip install 'bitsandbytes>=0.45')"),
    (requirements.needs(packages="deepspeed"), Stub(packages={"deepspeed": "ModuleNotFoundError: no deepspeed"}),
     "needs deepspeed: ModuleNotFoundError: no deepspeed (pip install 'memclaims[deepspeed]')"),
    (requirements.needs(options="vit-h14"), Stub(),
     "runs only when asked: add --memclaims-vit-h14 (633M parameters at 518 px"),
    (requirements.needs(paths="/proc/self/clear_refs"), Stub(),
     "needs /proc/self/clear_refs, which this machine does not have"),
    (requirements.needs(unsupported="the sim cannot replay it"), Stub(), "the sim cannot replay it"),
])
def test_each_unmet_need_says_what_to_do(required: Needs, machine: Stub, expected: str) -> None:
    reason = requirements.reason(required, machine)
    assert reason is not None and reason.startswith(expected), reason


@pytest.mark.parametrize(("required", "machine"), [
    (Needs(cuda_devices=2), Stub(cuda=2)),
    (requirements.needs(bitsandbytes="cpu"), Stub(bitsandbytes={"cpu": None})),
    (requirements.needs(bitsandbytes="cuda", cuda_devices=1), Stub(cuda=1, bitsandbytes={"cuda": None})),
    (requirements.needs(packages="xdist"), Stub(packages={"xdist": None})),
    (requirements.needs(options="vit-h14"), Stub(opted_in=frozenset({"vit-h14"}))),
    (requirements.needs(paths="/x"), Stub(paths=frozenset({"/x"}))),
])
def test_each_met_need_is_met(required: Needs, machine: Stub) -> None:
    assert requirements.unmet(required, machine) == []


def test_every_unmet_need_in_one_line_unsupported_first() -> None:
    required = (requirements.needs(cuda_devices=2, options="vit-h14", packages="deepspeed")
                | requirements.needs(bitsandbytes="cpu", unsupported="no DeepSpeed technique"))
    machine = Stub(cuda=1, bitsandbytes={"cpu": "does not import"}, packages={"deepspeed": "missing"})
    reasons = requirements.unmet(required, machine)
    assert [r.split(" ")[0] for r in reasons] == ["no", "needs", "needs", "needs", "runs"], reasons
    joined = requirements.reason(required, machine)
    assert joined == "; ".join(reasons) and "\n" not in joined


def test_bitsandbytes_on_cuda_without_cuda_is_the_cuda_reason_alone() -> None:
    # Stub has no "cuda" bitsandbytes answer: probing it would raise KeyError.
    assert requirements.unmet(requirements.needs(bitsandbytes="cuda"), Stub(cuda=0)) == [
        requirements.unmet(Needs(cuda_devices=1), Stub(cuda=0))[0]]


def test_needs_combine() -> None:
    combined = (requirements.needs(cuda_devices=1, unsupported=("a", "b"))
                | requirements.needs(cuda_devices=2, bitsandbytes="cuda", unsupported=("b", "c")))
    assert combined == Needs(cuda_devices=2, bitsandbytes=frozenset({"cuda"}), unsupported=("a", "b", "c"))
    assert requirements.needs(packages="xdist").packages == {"xdist"}  # one name, not its letters


@pytest.mark.parametrize("kwargs", [{"bitsandbytes": "tpu"}, {"cuda_devices": -1}])
def test_malformed_needs_are_usage_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(UsageError):
        requirements.needs(**kwargs)  # type: ignore[arg-type]


def test_the_install_hint_is_pyprojects_range() -> None:
    spec = re.search(r'"(bitsandbytes[^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)  # type: ignore[union-attr]
    assert requirements.INSTALL["bitsandbytes"] == f"pip install '{spec}'"


# --- needs derived from recipes, cases and claims ------------------------------------------------

def test_recipe_needs() -> None:
    def of(techniques: tuple[str, ...], tier: str) -> Needs:
        scale = "smoke" if tier == "cpu" else "article"
        return run.needs(resolve("vit", scale, techniques), tier)

    vit = Needs(packages=frozenset({"torchvision"}))  # the ViT workloads build torchvision's model, on every tier
    assert of(("bf16-true",), "cpu") == vit
    assert of(("bf16-true",), "gpu") == vit | Needs(cuda_devices=1)
    assert of(("adam8bit",), "cpu") == vit | Needs(bitsandbytes=frozenset({"cpu"}))
    assert of(("adam8bit",), "gpu") == vit | Needs(cuda_devices=1, bitsandbytes=frozenset({"cuda"}))
    assert of(("adam8bit",), "sim") == vit  # the sim reads bitsandbytes' layout, no step
    text = run.needs(resolve("distilbert", "smoke", ("bf16-true",)), "cpu")
    assert text == Needs(packages=frozenset({"transformers"}))
    assert run.needs(resolve("hf:gpt2", "smoke", ()), "sim").packages == {"transformers"}
    offload = requirements.for_techniques(("fsdp", "cpu-offload"), "cpu")
    assert offload == Needs(cuda_devices=1)  # offload exists only from a GPU
    unreplayable = of(("fsdp", "adam8bit"), "sim")
    assert len(unreplayable.unsupported) == 1 and "sim device cannot run" in unreplayable.unsupported[0]
    assert requirements.for_techniques(("warp-drive",), "cpu").unsupported == (
        "technique 'warp-drive' is not registered yet",)


def test_case_needs_add_16_mixed_on_the_cpu_tier_only() -> None:
    assert run.case_needs(resolve("vit", "smoke", ["16-mixed"]), "cpu").unsupported == (
        requirements.FP16_MIXED_ON_CPU,)
    vit = Needs(packages=frozenset({"torchvision"}))
    assert run.case_needs(resolve("vit", "article", ["16-mixed"]), "gpu") == vit | Needs(cuda_devices=1)
    # A claim may still use a 16-mixed cpu Record: the rule is the case's, not the recipe's.
    assert run.needs(resolve("vit", "smoke", ["16-mixed"]), "cpu") == vit


def test_claim_needs() -> None:
    from memclaims.pytest.records import claim_needs

    checked = next(c for c in CLAIMS if c.checks.get("gpu") == "claims" and c.check is not None)
    assert claim_needs(checked, "gpu").cuda_devices == 1 and not claim_needs(checked, "gpu").unsupported
    elsewhere = next(c for c in CLAIMS if "cpu" in c.not_on)
    assert claim_needs(elsewhere, "cpu") == Needs(unsupported=(elsewhere.not_on["cpu"],))
    # A variant a check looks up (the 07 load-only replay) needs what its recipe needs.
    assert claim_needs(CLAIMS_BY_NAME["init-module-param-count"], "sim") == Needs(packages=frozenset({"torchvision"}))


# --- the one bitsandbytes check ----------------------------------------------------------------------

@pytest.fixture
def fresh_check() -> Iterator[None]:
    machine.bitsandbytes_problem.cache_clear()
    yield
    machine.bitsandbytes_problem.cache_clear()


def fake_bitsandbytes(monkeypatch: pytest.MonkeyPatch, works: bool) -> list[int]:
    """An importable bitsandbytes whose Adam8bit steps (or fails at its first step, as a build
    without a CPU backend does); returns the list of steps taken."""
    steps: list[int] = []

    class Adam8bit(torch.optim.Optimizer):
        def __init__(self, params: object, lr: float = 1e-3, **kwargs: object) -> None:
            super().__init__(params, {"lr": lr})  # type: ignore[arg-type]

        def step(self, closure: object = None) -> None:  # type: ignore[override]
            steps.append(1)
            if not works:
                raise NotImplementedError("no CPU implementation of optimizer_update_8bit_blockwise")

    fake = types.ModuleType("bitsandbytes")
    fake.__version__ = "0.0-fake"  # type: ignore[attr-defined]
    fake.optim = types.SimpleNamespace(Adam8bit=Adam8bit, AdamW8bit=Adam8bit)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "bitsandbytes", fake)
    return steps


def test_bitsandbytes_check_is_a_real_step_cached_per_process(monkeypatch: pytest.MonkeyPatch,
                                                              fresh_check: None) -> None:
    steps = fake_bitsandbytes(monkeypatch, works=True)
    assert machine.bitsandbytes_problem("cpu") is None
    assert machine.bitsandbytes_problem("cpu") is None
    assert steps == [1]  # one step for the whole process


def test_bitsandbytes_without_a_backend_is_unmet(monkeypatch: pytest.MonkeyPatch, fresh_check: None) -> None:
    fake_bitsandbytes(monkeypatch, works=False)
    problem = machine.bitsandbytes_problem("cpu")
    assert problem is not None and "0.0-fake has no working CPU backend" in problem, problem
    monkeypatch.setattr(machine, "cuda_device_count", lambda: 0)
    assert machine.bitsandbytes_problem("cuda") == "there is no CUDA device to step on"


NO_BACKEND_PROJECT = """
import pytest
from memclaims.measure import optimizers
from torch import nn


@pytest.mark.requires(bitsandbytes="cpu")
def test_eight_bit_step():
    optimizers.build("adam8bit", nn.Linear(64, 64), 1e-3, 1)  # raises without a backend
"""


def test_installed_without_a_backend_skips_not_fails(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                     fresh_check: None) -> None:
    """The issue's case: bitsandbytes imports, its CPU backend is missing. A test and a technique
    case that need it skip with the reason; before, find_spec said yes and the case failed."""
    fake_bitsandbytes(monkeypatch, works=False)
    make_project(pytester, ROOT).makepyfile(test_no_backend=NO_BACKEND_PROJECT, test_cases="""
        def test_case(tier, techniques, record_cache):
            record_cache.get(tier, record_cache.recipe(tier, "vit", techniques))  # would train, and fail
    """)
    result = pytester.runpytest("-rs", "--memclaims-matrix", "singles", "-k", "eight_bit_step or cpu:vit-smoke/adam8bit")
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped") == 2 and not {"passed", "failed", "error"} & set(outcomes), outcomes
    result.stdout.fnmatch_lines(["SKIPPED*needs bitsandbytes' 8-bit optimizers on the CPU: bitsandbytes 0.0-fake "
                                 "has no working CPU backend*"] * 2)


# --- the plugin: one skip at collection, with the joined reason --------------------------------------

PROJECT = """
import pytest
from memclaims.recipes.requirements import Needs


@pytest.fixture
def boom():
    raise RuntimeError("set up although its test should have been skipped at collection")


@pytest.mark.requires(cuda_devices=2, options="vit-h14")
def test_big(boom_or_not):
    pass


@pytest.mark.requires(Needs(unsupported=("not on this tier",)))
@pytest.mark.requires(paths="/no/such/file")
def test_never(boom):
    pass


def test_plain():
    pass


@pytest.fixture
def boom_or_not(request):
    from memclaims.pytest.plugin import settings

    if not settings(request.config).vit_h14:
        raise RuntimeError("set up although its test should have been skipped at collection")
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    make_project(pytester, ROOT).makepyfile(test_needs=PROJECT)
    return pytester


def test_unmet_needs_skip_at_collection_with_one_joined_reason(project: pytest.Pytester,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "cuda_device_count", lambda: 0)
    result = project.runpytest("-rs")
    result.assert_outcomes(passed=1, skipped=2)  # no fixture set up for a skipped test: no error
    result.stdout.fnmatch_lines([
        "SKIPPED [[]1[]] test_needs.py:*: needs 2 CUDA devices: torch.cuda.is_available() is False on this machine "
        "(*); runs only when asked: add --memclaims-vit-h14 (633M parameters*)",
        "SKIPPED [[]1[]] test_needs.py:*: not on this tier; needs /no/such/file, which this machine does not have",
    ])


def test_met_needs_run(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "cuda_device_count", lambda: 2)
    result = project.runpytest("-rs", "--memclaims-vit-h14", "-k", "big or plain")
    result.assert_outcomes(passed=2, deselected=1)


def test_a_deselected_test_probes_nothing(project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_probe() -> int:
        raise AssertionError("probed CUDA for a deselected test")

    monkeypatch.setattr(machine, "cuda_device_count", no_probe)
    project.runpytest("-k", "plain").assert_outcomes(passed=1, deselected=2)


@pytest.mark.parametrize(("marker", "message"), [
    ('requires("cuda")', "requires() takes a memclaims.recipes.requirements.Needs or keywords"),
    ("requires(gpus=2)", "unexpected keyword argument 'gpus'"),
    ('requires(options="vit-h41")', "memclaims has no option --memclaims-vit-h41"),
])
def test_a_malformed_requires_is_a_usage_error(pytester: pytest.Pytester, marker: str, message: str) -> None:
    make_project(pytester, ROOT).makepyfile(
        test_bad=f"import pytest\n\n@pytest.mark.{marker}\ndef test_x():\n    pass\n")
    result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{message}*"])


# --- the one mechanism stays the only one ----------------------------------------------------------

FORBIDDEN = {"pytest.skip", "pytest.importorskip", "pytest.mark.skip", "pytest.mark.skipif"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def test_nothing_skips_but_the_requirements() -> None:
    """A skip in a test body, a fixture or a skipif decorator is a second mechanism; the plugin's
    collection hook is the one place that adds a skip (strings, e.g. pytester projects, are not code)."""
    found = []
    files = [*(ROOT / "suite").rglob("*.py"), *(ROOT / "fixtures").rglob("*.py"), *(ROOT / "memclaims").rglob("*.py"),
             ROOT / "conftest.py"]
    for path in files:
        if path == ROOT / "memclaims" / "pytest" / "plugin.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and _dotted(node) in FORBIDDEN:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {_dotted(node)}")
            if isinstance(node, ast.ImportFrom) and node.module == "pytest" and \
                    {a.name for a in node.names} & {"skip", "importorskip"}:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from pytest import skip")
    assert found == [], "skip through @pytest.mark.requires (memclaims.recipes.requirements) instead:\n" + "\n".join(found)
    plugin = ast.parse((ROOT / "memclaims" / "pytest" / "plugin.py").read_text(encoding="utf-8"))
    uses = [n.lineno for n in ast.walk(plugin) if isinstance(n, ast.Attribute) and _dotted(n) in FORBIDDEN]
    assert len(uses) == 1, f"memclaims/pytest/plugin.py skips in {len(uses)} places (lines {uses}); only the requirements hook may"
