"""The docs are tests: every shell command of README.md, docs/*.md and examples/nightly-gpu.yml runs here,
from a fresh folder (pytester's), through the installed package (the ``memclaims`` entry point's
``main``, pytest with the plugin its ``pytest11`` entry point loads), and must exit 0.

A command runs as written unless ``HOW`` says otherwise, and every command of the docs must be here:
- ``ci``: a long command (a CPU training run, an article-scale sim sweep) runs in CI in the small form
  given (the same command with ``--steps 1 --no-eval``, a smaller selection), and as written in the
  nightly (``slow``; ``pytest -n 2`` runs it);
- ``slow``: runs as written in the nightly only (minutes on 2 cores, no small form that says more);
- ``needs``: what the command needs (a CUDA GPU), through the ``requires`` marker: skipped with the reason;
- ``skip``: never run by the suite, and why (CI's own install and test command, a network download, a
  tool CI does not install).
One pytest session answers the README's nightly command and every command that reads its files (report,
history), and one folder holds the README's own-model example for the commands that use it."""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from fixtures.paths import ROOT
from memclaims.baselines.store import Baseline, BaselineStore
from memclaims.pytest.testing import fake_record
from suite.e2e.test_docs import COMMANDS as PAGE_COMMANDS

pytest_plugins = ["pytester"]

EXAMPLE = ROOT / "examples" / "nightly-gpu.yml"


def workflow_commands() -> list[tuple[str, str]]:
    """The shell lines of the example workflow's ``run: |`` steps, continuations joined."""
    text = EXAMPLE.read_text(encoding="utf-8").replace("\\\n", " ")
    found = []
    for block in re.findall(r"run: \|\n((?:\s{10}.*\n)+)", text):
        for line in block.splitlines():
            command = re.sub(r"\s+#\s.*$", "", line).strip()
            if command and not command.startswith((".", "python -m venv")):  # the venv's set-up lines
                found.append((EXAMPLE.name, " ".join(command.split())))
    return found


COMMANDS = [(page, " ".join(c.split())) for page, c in PAGE_COMMANDS] + workflow_commands()
NIGHTLY = "pytest -m gpu --memclaims-summary-json nightly/summary.json --memclaims-html nightly/report.html"
# examples/nightly-gpu.yml's pytest step: the README's nightly command and two more files; a checkout of a project
# that uses the plugin runs it (an empty folder has no test to select: exit 5), answered by test_the_workflow_step.
WORKFLOW_NIGHTLY = f"{NIGHTLY} --memclaims-artifacts nightly/memclaims-results --junitxml nightly/junit.xml"
OWN_MODEL = "export MEMCLAIMS_WORKLOADS=mywork.workload:make"
SMALL = " --steps 1 --no-eval"  # one optimizer step, no evaluation: the CPU runs' small form


@dataclass(frozen=True)
class How:
    ci: str | None = None
    slow: bool = False
    needs: dict[str, Any] = field(default_factory=dict)
    skip: str = ""


CUDA = How(needs={"cuda_devices": 1}, slow=True)
UPGRADE = How(skip="downloads the candidate releases (network); memclaims upgrade's tests build candidates offline")
HOW: dict[str, How] = {
    'python -m venv .venv && . .venv/bin/activate && pip install -e ".[test,docs]" -c locks/ci.txt':
        How(skip="CI's install (.ci/run runs it; this suite runs inside it; test_docs checks they agree)"),
    'pip install -e ".[test,docs]" -c locks/ci.txt': How(skip="CI's install, as in the README (test_docs checks it)"),
    'pytest -n 2 -m "not slow" --durations=10': How(skip="CI's own test command (.ci/run runs it)"),
    'pytest -n 2 -m "not slow"': How(skip="CI's own test command (.ci/run runs it)"),
    "pytest -n 2": How(skip="the nightly's whole run (this test is part of it)"),
    "pytest -m stress": How(skip="the nightly's own step, run by itself after `pytest -n 2` (ten dist-tier sessions, 15 min "
                                 "or more on 2 cores); a fresh folder has no suite for it to select (exit 5)"),
    "memclaims reproduce": How(slow=True),
    "memclaims reproduce --all": How(slow=True),
    "memclaims reproduce --device sim": How(slow=True),
    "memclaims reproduce --device sim --all": How(slow=True),
    "memclaims reproduce --device sim --source pytorch-docs": How(slow=True),
    "memclaims reproduce --device cuda": CUDA,
    "memclaims benchmark": How(slow=True),
    "memclaims baselines calibrate vit-smoke/bf16-true --runs 5": How(slow=True),  # --runs 2: still 16 s
    "memclaims baselines spread --changes up/records.jsonl":
        How(skip="reads an upgrade's records (memclaims upgrade writes up/records.jsonl; network)"),
    "memclaims fit distilbert --memory 16GB -t hf-trainer -t bf16-mixed": How(slow=True),
    "memclaims fit vit -t bf16-true -t small-batch -t grad-accum -t fused --memory 3.5GB": How(slow=True),  # 2 techniques: 40 s
    "memclaims fit clusters-mlp --memory 6GB": How(ci="memclaims fit clusters-mlp --memory 6GB -t bf16-true"),
    # 11 combinations of a 7B, each from 2- and 4-layer replays: 23 CPU s. Without -t and --extrapolate (the page's
    # form until 2026-12-08) the whole matrix of 32-layer replays ran 40+ minutes in the nightly and never finished.
    "memclaims fit hf:llama --config hidden_size=4096,num_hidden_layers=32,intermediate_size=11008 --memory 80GB "
    "--device sim --extrapolate -t bf16-true -t adamw -t adafactor -t activation-checkpointing --sim-profile article "
    "--plot fit.png": How(slow=True),
    "memclaims fit hf:llama --memory 16GB -t bf16-true -t qlora -t activation-checkpointing": How(slow=True),
    "memclaims upgrade torch==2.15.0": UPGRADE,
    "memclaims upgrade --newest --lock locks/ci.txt --record": UPGRADE,
    "memclaims upgrade torch==2.15.0 --lock locks/ci.txt --record": UPGRADE,
    "memclaims upgrade torch==2.15.0 --lock locks/ci.txt --accept": UPGRADE,
    "nox -s newest": How(skip="installs each release combination (network)"),
    "strace -f -e trace=connect -o trace.txt memclaims run distilbert -t adam8bit --device cpu --steps 2 --no-eval":
        How(skip="strace is not in CI's image; suite/e2e/test_offline.py guards the same at the socket layer"),
    "grep -E 'AF_INET6?' trace.txt | grep -v -E '127\\.0\\.0\\.1|::1'": How(skip="reads the strace above"),
    'pip install -e ".[dev]"': How(skip="installs mutmut (a development tool, not in the lock)"),
    "mutmut run --max-children 1": How(skip="mutation testing: hours; a development tool"),
    "mutmut results": How(skip="mutation testing's results (after mutmut run)"),
    "mutmut run --max-children 1 NAME...": How(skip="mutation testing of named mutants (after mutmut run)"),
    "python scripts/mutation-import-time.py --only memclaims.claims.sources.article.x__no_nan":
        How(skip="reads mutmut's mutants (after mutmut run)"),
    "torchrun --nnodes 2 --nproc-per-node 4 --rdzv-endpoint HOST:29500 -m memclaims.cli run vit -t fsdp -t "
    "activation-checkpointing --device cuda --scale article --json":
        How(needs={"cuda_devices": 8}, slow=True),
    "pytest -m gpu --memclaims-gpu-scale smoke": CUDA,
    "pytest -m gpu": CUDA,
    'pytest -m "dist and gpu" --memclaims-vit-h14': CUDA,
    "scripts/gpu-check out/": CUDA,
    "scripts/sim-bench": How(skip="a benchmark: minutes of CPU, its numbers read against another tree's, never "
                             "judged (suite/e2e/test_sim_bench.py holds its targets and its refusal)"),
    "scripts/sim-bench fit rows": How(skip="a benchmark, as above"),
    # 7 pairs of DistilBERT steps: minutes on a loaded 2-core box; one pair of the small MLP's two steps in CI.
    "scripts/watch-overhead": How(ci="scripts/watch-overhead --model mlp --pairs 1 --steps 2", slow=True),
    "python -m memclaims.gpu.alloc_trace out/vit-h14.trace.json.gz": CUDA,
    "memclaims run vit -t bf16-true -t sgd --device cpu --scale smoke":
        How(ci="memclaims run vit -t bf16-true -t sgd --device cpu --scale smoke" + SMALL, slow=True),
    "memclaims run distilbert -t adam8bit --device cpu --evaluate-each-epoch --json": How(slow=True),
    # CPU ranks (spawned processes): 50 s even at one step; the dist tier runs both in CI.
    "memclaims run vit -t fsdp -t activation-checkpointing --devices 2 --device cpu --json": How(slow=True),
    "memclaims run vit -t ddp --devices 2 --device cpu --json": How(slow=True),
    "memclaims run distilbert-cased -t adam8bit --device cpu --scale article --steps 1 --no-eval --json":  # 96 s
        How(ci="memclaims run distilbert-cased -t adam8bit --device cpu --steps 1 --no-eval --json", slow=True),
    "memclaims run distilbert -t hf-trainer -t adam8bit --device cpu":
        How(ci="memclaims run distilbert -t hf-trainer -t adam8bit --device cpu" + SMALL, slow=True),
    "memclaims run distilbert-cased -t accelerate -t bf16-mixed -t adam8bit --device cpu":
        How(ci="memclaims run distilbert-cased -t accelerate -t bf16-mixed -t adam8bit --device cpu" + SMALL, slow=True),
    "memclaims run distilbert-cased -t lightning-trainer -t bf16-true --device cpu":
        How(ci="memclaims run distilbert-cased -t lightning-trainer -t bf16-true --device cpu" + SMALL, slow=True),
    "memclaims run distilbert -t adamw -t foreach --device cpu":
        How(ci="memclaims run distilbert -t adamw -t foreach --device cpu" + SMALL, slow=True),
    "memclaims run hf:gpt2 -t bf16-true -t adam8bit --device cpu":
        How(ci="memclaims run hf:gpt2 -t bf16-true -t adam8bit --device cpu" + SMALL, slow=True),
    "memclaims run vit --image-size 32 --batch-size 8 -t grad-accum --accumulation-steps 2":
        How(ci="memclaims run vit --image-size 32 --batch-size 8 -t grad-accum --accumulation-steps 2" + SMALL,
            slow=True),
    "memclaims run hf:llama --config hidden_size=4096,num_hidden_layers=32,intermediate_size=11008 -t bf16-true "
    "--device sim --scale article --no-eval": How(slow=True),
    "memclaims run hf:llama --device sim --scale article -t bf16-true -t qlora -t activation-checkpointing --no-eval":
        How(slow=True),
    "memclaims run vit-h14 -t 16-mixed --device sim --scale article --no-eval --json": How(slow=True),
    # A 7B on the sim: 16 s of CPU; the same era on the smoke Llama in CI.
    "memclaims run hf:llama --device sim --scale article -t bf16-true -t qlora --era bitsandbytes=0.41 --no-eval":
        How(ci="memclaims run hf:llama --device sim -t bf16-true -t qlora --era bitsandbytes=0.41 --no-eval", slow=True),
    # Two article-scale QLoRA replays, 12 CPU s from a fresh process; in CI --era's reach into reproduce --source (and
    # its answer's profile line) is held by test_cli's profile test and test_reproduce_one_source_on_the_sim.
    "memclaims reproduce --device sim --source qlora-paper --era bitsandbytes=0.41": How(slow=True),
    # A 7B replay (15 CPU s); the small form asks the same parameters of the smoke LLaMA.
    "memclaims run hf:llama --device sim --scale article -t bf16-true -t lora --lora-r 8 --lora-alpha 16 "
    "--lora-targets q_proj,v_proj": How(ci="memclaims run hf:llama --device sim --scale smoke -t bf16-true -t lora "
                                          "--lora-r 8 --lora-alpha 16 --lora-targets q_proj,v_proj", slow=True),
}
# Answered by test_the_nightly_flow (one pytest session, then what reads its files) and
# test_the_own_model_example (the README's example workload in the folder).
NIGHTLY_FLOW = {NIGHTLY, "memclaims report nightly/summary.json", "memclaims report nightly/summary.json --out "
                "nightly/report.html", "memclaims history nightly-runs/", "memclaims history nightly-runs/ --plot "
                "history.png", "memclaims history nightly-runs/ --plot h.png", "memclaims history nightly-runs/ --json"}
OWN_MODEL_FLOW = {OWN_MODEL, "memclaims run clusters-mlp --device sim --scale article -t bf16-true",
                  "memclaims run clusters-mlp --device sim --scale article -t fsdp --devices 2",
                  "memclaims fit clusters-mlp --memory 6GB"}
# docs/own-model.md's split MLP (mywork/split_mlp.py): its plan and its LoRA defaults, answered by
# test_the_split_mlp_example.
SPLIT_MLP = "export MEMCLAIMS_WORKLOADS=mywork.split_mlp:make"
SPLIT_MLP_FLOW = {SPLIT_MLP, "memclaims run split-mlp --device sim --scale article -t tensor-parallel --devices 8",
                  "memclaims run split-mlp --device sim --scale article -t bf16-true -t lora --lora-r 4 --lora-targets up"}

# docs/tiers.md's step times, a contributor's commands (they name the suite's own file): answered by
# test_the_step_time_flow in a copy of the repository's test tree, the save first, then the comparison with it.
STEP_TIME_FLOW = ["pytest suite/cases/test_step_time.py --benchmark-autosave",
                  "pytest suite/cases/test_step_time.py --benchmark-compare"]
TEST_TREE = ("suite", "fixtures", "baselines", "locks", "conftest.py", "pytest.ini")


def run(command: str, folder: Path, pytester: pytest.Pytester | None = None) -> tuple[int, str]:
    """``command`` in ``folder`` through the installed entry points; its exit status and output."""
    words = shlex.split(re.sub(r"\[([^\]]*)\]", r"\1", command))  # `list [--json]`: the option given
    # A command that starts ranks on a real device runs in its own process, as from the reader's shell: in this one,
    # pytester's in-process runs take the modules they imported out of sys.modules again, and a rank's entry point,
    # found through the package's attribute, is then not the module object that pickling looks up (PicklingError).
    spawns = "--devices" in words and "sim" not in words
    if words[0] == "memclaims" and spawns:
        return _in_shell(words, folder, 600)
    if words[0] == "memclaims":
        entry = next(e for e in metadata.entry_points(group="console_scripts") if e.name == "memclaims")
        out = io.StringIO()
        with contextlib.chdir(folder), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                status = entry.load()(words[1:])
            except SystemExit as exited:
                status = exited.code
        return int(status or 0), out.getvalue()
    if words[0] == "pytest":
        assert pytester is not None and pytester.path == folder
        result = pytester.runpytest("-p", "no:cacheprovider", *words[1:])
        return int(result.ret), "\n".join(result.outlines + result.errlines)
    return _in_shell([str(ROOT / words[0]), *words[1:]] if words[0].startswith("scripts/") else words, folder, 600)


def _in_shell(argv: list[str], folder: Path, timeout_s: int) -> tuple[int, str]:
    """``argv`` in its own process from ``folder``, as the reader's shell starts it; its exit status and output."""
    done = subprocess.run(argv, cwd=folder, capture_output=True, text=True, timeout=timeout_s, env=shell_environment())
    return done.returncode, done.stdout + done.stderr


def shell_environment() -> dict[str, str]:
    """This process's environment as the reader's shell has it: without the variables pytest and pytest-xdist set
    for their own processes (a pytest started from an xdist worker inherits PYTEST_XDIST_WORKER, and
    pytest-benchmark then disables itself: ``--benchmark-autosave`` saved nothing under ``pytest -n 2``)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def params() -> list[Any]:
    out = []
    for page, command in COMMANDS:
        if command in NIGHTLY_FLOW | OWN_MODEL_FLOW | SPLIT_MLP_FLOW | set(STEP_TIME_FLOW) | {WORKFLOW_NIGHTLY}:
            continue
        how, name = HOW.get(command, How()), f"{page}:{command[:70]}"
        if how.skip:
            out.append(pytest.param(command, id=name, marks=pytest.mark.requires(unsupported=how.skip)))
            continue
        marks = [pytest.mark.requires(**how.needs)] if how.needs else []
        if how.ci:
            out.append(pytest.param(how.ci, id=f"{name} (small form)", marks=marks))
        out.append(pytest.param(command, id=name, marks=[*marks, *([pytest.mark.slow] if how.slow else [])]))
    return out


def test_every_command_of_the_docs_is_here() -> None:
    """A command added to the docs is run (as written, unless HOW says how); HOW holds no stale entry."""
    shown = {c for _, c in COMMANDS}
    assert NIGHTLY in shown and WORKFLOW_NIGHTLY in shown and OWN_MODEL in shown and len(shown) >= 70
    assert not set(HOW) - shown, f"HOW names commands the docs no longer show: {sorted(set(HOW) - shown)}"
    assert (NIGHTLY_FLOW | OWN_MODEL_FLOW) - {OWN_MODEL} <= shown | {"memclaims history nightly-runs/ --plot h.png"}
    assert SPLIT_MLP_FLOW <= shown and set(STEP_TIME_FLOW) <= shown
    assert metadata.distribution("memclaims").entry_points  # the installed package (pip install -e), not sys.path


@pytest.mark.parametrize("command", params())
def test_doc_command_runs_from_a_fresh_folder(command: str, pytester: pytest.Pytester) -> None:
    if command.startswith("memclaims baselines accept "):  # what a first run on that machine left to accept
        environment = command.split()[-1]
        BaselineStore(pytester.path / "baselines").update(f"{environment}.obtained",
                                                          {"vit-smoke/fake-a": Baseline(fake_record())})
    status, output = run(command, pytester.path, pytester)
    assert status == 0, f"{command}\n{output[-3000:]}"


@pytest.mark.slow
def test_the_step_time_flow(tmp_path: Path) -> None:
    """The two step-time commands as docs/tiers.md shows them, from the root of a copy of the repository's test
    tree (they name its file): the first saves a run, the second compares with it."""
    for name in TEST_TREE:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, tmp_path / name)
    for command in STEP_TIME_FLOW:
        status, output = _pytest_in(tmp_path, command)
        assert status == 0, f"{command}\n{output[-3000:]}"
    assert len(list(tmp_path.glob(".benchmarks/*/0001_*.json"))) == 1  # saved once, then compared with


def _pytest_in(folder: Path, command: str, *options: str) -> tuple[int, str]:
    """A ``pytest`` command of the docs in its own process, from ``folder``, as the reader's shell starts it."""
    return _in_shell([sys.executable, "-m", *shlex.split(command), "-p", "no:cacheprovider", *options], folder, 900)


def test_a_pytest_started_from_an_xdist_worker_saves_its_benchmark(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """CI's form of test_the_step_time_flow's clash under ``pytest -n 2`` (1.5 s of CPU): the pytest it starts
    from an xdist worker saves its benchmark run (it inherited PYTEST_XDIST_WORKER, and pytest-benchmark
    disabled itself); one trivial benchmark, without memclaims' plugin."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")  # as every test of an xdist worker has it
    (tmp_path / "test_tick.py").write_text("def test_tick(benchmark):\n    benchmark(int)\n")
    status, output = _pytest_in(tmp_path, "pytest test_tick.py --benchmark-autosave", "-p", "no:memclaims")
    assert status == 0 and len(list(tmp_path.glob(".benchmarks/*/0001_*.json"))) == 1, output[-3000:]


def _plugin_project(pytester: pytest.Pytester) -> Path:
    """A project that uses the plugin as the README shows: its test module collects the technique matrix (every
    gpu case skips here with its reason)."""
    pytester.makepyfile(**{"tests/test_memclaims": "from memclaims.pytest.cases import test_case  # noqa: F401\n"})
    return pytester.path


@pytest.mark.xdist_group("docs-nightly")
def test_the_nightly_flow(pytester: pytest.Pytester) -> None:
    """The README's nightly command writes both files into a folder that did not exist (the README's own
    test module collects the technique matrix: every gpu case skips with its reason here), then report and
    history read them as the docs show."""
    here = _plugin_project(pytester)
    assert not (here / "nightly").exists()
    status, output = run(NIGHTLY, here, pytester)
    assert status == 0 and (here / "nightly" / "summary.json").is_file() and (here / "nightly" / "report.html").is_file(), output[-3000:]
    for night in ("2026-12-01", "2026-12-02"):
        shutil.copytree(here / "nightly", here / "nightly-runs" / night)
    for command in sorted(NIGHTLY_FLOW - {NIGHTLY}):
        status, output = run(command, here)
        assert status == 0, f"{command}\n{output[-3000:]}"
    assert (here / "history.png").is_file() and (here / "h.png").is_file()


@pytest.mark.slow  # a second session of the README's nightly (CI runs test_the_nightly_flow's): ~10 s of CPU
@pytest.mark.xdist_group("docs-nightly")
def test_the_workflow_step(pytester: pytest.Pytester) -> None:
    """examples/nightly-gpu.yml's pytest step, in the checkout of a project that uses the plugin (what the
    workflow runs in): every file it names, the folders created."""
    here = _plugin_project(pytester)
    status, output = run(WORKFLOW_NIGHTLY, here, pytester)
    assert status == 0, f"{WORKFLOW_NIGHTLY}\n{output[-3000:]}"
    assert all((here / "nightly" / name).is_file() for name in ("summary.json", "report.html", "junit.xml")), output


def _example_flow(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, page: str, module: str,
                  export: str, flow: set[str]) -> None:
    """``page``'s python block ``mywork/MODULE.py``, as the reader saves it, and the commands after its ``export``."""
    text = (ROOT / page).read_text(encoding="utf-8")
    source = re.search(rf"```python\n# mywork/{module}.py\n(.*?)```", text, re.S)
    assert source is not None
    (pytester.path / "mywork").mkdir()
    (pytester.path / "mywork" / "__init__.py").write_text("")
    (pytester.path / "mywork" / f"{module}.py").write_text(source.group(1))
    monkeypatch.syspath_prepend(str(pytester.path))
    name, value = export.removeprefix("export ").split("=")
    monkeypatch.setenv(name, value)
    try:
        for command in sorted(flow - {export}):
            command = HOW.get(command, How()).ci or command  # fit's small form: one technique
            status, output = run(command, pytester.path)
            assert status == 0, f"{command}\n{output[-3000:]}"
    finally:
        sys.modules.pop(f"mywork.{module}", None)
        sys.modules.pop("mywork", None)


def test_the_own_model_example(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's example workload, as the reader saves it (mywork/workload.py), run as docs/own-model.md
    shows after its ``export``."""
    _example_flow(pytester, monkeypatch, "README.md", "workload", OWN_MODEL, OWN_MODEL_FLOW)


def test_the_split_mlp_example(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/own-model.md's split MLP (its tensor-parallel plan and LoRA defaults through define) on the sim."""
    _example_flow(pytester, monkeypatch, "docs/own-model.md", "split_mlp", SPLIT_MLP, SPLIT_MLP_FLOW)
