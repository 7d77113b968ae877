"""The pytest side of memclaims: options, case generation, requirements and the record cache.

The only module of the library that imports pytest; conftest.py loads it. Cases are generated
from the technique registry: invalid combinations never become cases. What a test needs from the
machine is declared with the ``requires`` marker (a case's needs come from its recipe); at
collection every unmet need becomes one skip with one joined reason (memclaims.requirements).
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from memclaims import requirements
from memclaims import techniques as registry
from memclaims.machine import Machine
from memclaims.pytest_options import SELECTIONS, pytest_addoption  # noqa: F401 - the hook, registered here
from memclaims.recipe import resolve

if TYPE_CHECKING:
    from memclaims.compare import Summary
    from memclaims.errors import OutOfMemory

TIERS = ("cpu", "gpu")
# The suite's markers, registered by the plugin so that any project using it gets them with help.
MARKERS = {
    "cpu": "real training at smoke scale on the CPU, exact tensor accounting",
    "sim": "article scale on fake tensors, predicted CUDA allocator peak",
    "gpu": "real CUDA at article scale (or --memclaims-gpu-scale smoke), allocator statistics",
    "dist": "several processes through torch.distributed (gloo on CPU, NCCL on GPU)",
    "slow": "takes more than a few seconds even at smoke scale",
    "requires": "requires(Needs | cuda_devices=N, bitsandbytes='cpu'|'cuda', packages=..., options=..., paths=..., "
                "unsupported=...): skipped at collection, with every unmet need in one reason "
                "(memclaims.requirements)",
}


def option(config: pytest.Config, name: str) -> str:
    """A memclaims option: the command line wins over pytest.ini."""
    value = config.getoption(f"memclaims_{name.replace('-', '_')}")
    if value is None:
        value = config.getini(f"memclaims_{name.replace('-', '_')}")
    return str(value)


def count_option(config: pytest.Config, name: str) -> int | None:
    """A positive whole-number memclaims option, None when unset; bad values stop the run."""
    text = option(config, name).strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise pytest.UsageError(f"--memclaims-{name} / memclaims_{name.replace('-', '_')} must be a positive "
                                f"integer, got {text!r}")
    return int(text)


def selection(config: pytest.Config) -> list[tuple[str, ...]]:
    name = option(config, "matrix")
    if name == "singles":
        return registry.singles(registry.single_process())
    if name == "full":
        return registry.full_matrix()
    if name == "default":
        return registry.default_selection()
    raise pytest.UsageError(f"memclaims_matrix = {name!r} in pytest.ini; valid values: {', '.join(SELECTIONS)}")


def tier_scale(config: pytest.Config, tier: str, workload: str = "vit") -> str:
    """cpu trains at smoke scale; sim predicts the article's scale; gpu runs what it is asked, and
    its smoke is the workload's ``gpusmoke`` scale where it has one (memclaims.workloads)."""
    from memclaims.workloads import gpu_tier_scale

    return {"cpu": "smoke", "sim": "article"}.get(tier) or gpu_tier_scale(workload, option(config, "gpu-scale"))


def pytest_report_header(config: pytest.Config) -> list[str]:
    counts = {name: len(registry.default_selection() if name == "default" else
                         registry.full_matrix() if name == "full" else registry.singles(registry.single_process()))
              for name in SELECTIONS}
    chosen = option(config, "matrix")
    return [f"memclaims: matrix {chosen!r}: {counts[chosen]} cases per workload and tier "
            f"(singles {counts['singles']}, default {counts['default']}, full {counts['full']}); "
            f"gpu tier at {option(config, 'gpu-scale')!r} scale", gpu_budget_line(config)]


def gpu_budget_line(config: pytest.Config) -> str:
    """The gpu tier's estimated cost for this selection (memclaims.budget's per-case model)."""
    from memclaims import budget
    from memclaims.errors import UsageError
    from memclaims.options import RunOptions

    cifar = bool(option(config, "data-dir") or os.environ.get("MEMCLAIMS_DATA_DIR"))
    cases = []
    for techniques in selection(config):
        recipe = resolve("vit", tier_scale(config, "gpu", "vit"), techniques)
        cases.append((recipe, RunOptions(device="cuda", memory_steps=count_option(config, "steps"),
                                          accuracy_epochs=count_option(config, "accuracy-epochs"),
                                          accuracy_full_epochs=flag(config, "accuracy-full-epochs"))))
    for techniques in (("fsdp",), ("fsdp", "activation-checkpointing"),
                       ("fsdp", "activation-checkpointing", "cpu-offload"),
                       ("fsdp", "activation-checkpointing", "cpu-offload", "delayed-init")):
        try:
            recipe = resolve("vit", tier_scale(config, "gpu", "vit"), techniques)
        except UsageError:
            continue
        cases.append((recipe, RunOptions(device="cuda", evaluate=False, memory_steps=count_option(config, "steps"))))
    minutes = budget.total_minutes(cases, cifar=cifar)
    return (f"memclaims: gpu tier estimate {minutes:.1f} GPU-minutes on one H100-class GPU for {len(cases)} "
            f"vit cases ({'CIFAR-10' if cifar else 'offline digits'}; memclaims.budget's per-case model, "
            "not a measurement)")


def case_params(config: pytest.Config, workload: str = "vit") -> list[Any]:
    """One pytest param per (tier, combination), with the tier's marker and a readable id."""
    params = []
    for tier in TIERS:
        for techniques in selection(config):
            recipe = resolve(workload, tier_scale(config, tier, workload), techniques)
            marks = [getattr(pytest.mark, tier), pytest.mark.requires(requirements.for_case(recipe, tier))]
            params.append(pytest.param(tier, techniques, id=f"{tier}:{recipe.id}", marks=marks))
    return params


def selected_workload(config: pytest.Config) -> str:
    """The workload of the technique matrix (``--memclaims-workload``; vit by default)."""
    return option(config, "workload").strip() or "vit"


def register_workloads(config: pytest.Config) -> None:
    """Register the ini's ``memclaims_workloads`` factories and check the selected workload exists."""
    from memclaims import user_workloads
    from memclaims.errors import UsageError
    from memclaims.workloads import workload

    try:
        for spec in config.getini("memclaims_workloads"):
            made = user_workloads.register_spec(spec)
            config.add_cleanup(functools.partial(user_workloads.forget, made.name))
        workload(selected_workload(config))
    except UsageError as error:
        raise pytest.UsageError(f"memclaims: {error}") from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if {"tier", "techniques"} <= set(metafunc.fixturenames):
        metafunc.parametrize(("tier", "techniques"), case_params(metafunc.config, selected_workload(metafunc.config)))


# --- requirements -----------------------------------------------------------------------------

def item_needs(item: pytest.Item) -> requirements.Needs:
    """Everything the item's ``requires`` markers (its own, its class's, its module's) ask for."""
    from memclaims.errors import UsageError

    found = requirements.NOTHING
    for mark in item.iter_markers("requires"):
        for given in mark.args:
            if not isinstance(given, requirements.Needs):
                raise pytest.UsageError(f"{item.nodeid}: requires() takes a memclaims.requirements.Needs or "
                                        f"keywords, got {given!r}")
            found |= given
        try:
            found |= requirements.needs(**mark.kwargs)
        except (TypeError, UsageError) as error:
            raise pytest.UsageError(f"{item.nodeid}: requires({mark.kwargs}): {error}") from None
    return found


# After -m / -k deselection (trylast), so that a probe such as bitsandbytes' step runs only for a
# selected test that needs it; skipping at collection means no fixture is set up for it.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def opted_in(name: str) -> bool:
        try:
            return flag(config, name)
        except ValueError:  # pytest's "no option named ...": a typo in a requires(options=...)
            raise pytest.UsageError(f"requires(options={name!r}): memclaims has no option --memclaims-{name}") from None

    machine = Machine(opted_in=opted_in)
    for item in items:
        reason = requirements.reason(item_needs(item), machine)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


# --- pytest-xdist ------------------------------------------------------------------------------

GPU_SHARING = ("GPU cases share one device: run `pytest -m gpu` without -n, or with -n 0 / -n 1 "
               "(concurrent cases would pad each other's allocator peaks)")


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available()


def pytest_runtest_setup(item: pytest.Item) -> None:
    # Refuse rather than serialise with an xdist_group: groups only take effect under
    # --dist loadgroup, which a plugin cannot force, so a refusal is the one rule that holds for
    # every -n invocation. Without a GPU the case skips with its own reason instead.
    if item.get_closest_marker("gpu") is None or not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    try:
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    except ValueError:
        workers = 1
    if workers > 1 and gpu_available():
        pytest.fail(GPU_SHARING, pytrace=False)


# Under xdist each worker compares its own cases; the end-of-run tables are printed by the
# controller. So a worker moves what its tests added (comparison rows, out-of-memory notes) onto
# each test's teardown report, and the controller, which sees every report, gathers them.
_FROM_WORKER = "memclaims_end_of_run"
_SENT = pytest.StashKey[tuple[int, int]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    report = yield
    config = item.config
    if report.when == "teardown" and hasattr(config, "workerinput"):
        rows, oom = summary(config).rows, config.stash.get(OOM_KEY, [])
        sent_rows, sent_oom = config.stash.get(_SENT, (0, 0))
        if len(rows) > sent_rows or len(oom) > sent_oom:
            report.user_properties.append((_FROM_WORKER, {"rows": rows[sent_rows:], "out_of_memory": oom[sent_oom:]}))
            config.stash[_SENT] = (len(rows), len(oom))
    return report


class _WorkerResults:
    """On the xdist controller: the workers' rows and notes, into the controller's tables."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == _FROM_WORKER:
                sent = cast(dict[str, list[dict[str, Any]]], value)
                summary(self.config).rows.extend(sent["rows"])
                self.config.stash.setdefault(OOM_KEY, []).extend(sent["out_of_memory"])


# --- baselines ---------------------------------------------------------------------------------

SUMMARY_KEY = pytest.StashKey["Summary"]()


@dataclass(frozen=True)
class Settings:
    """The baseline options, parsed and checked once in pytest_configure (a typo fails the run
    before anything is measured), then read by the fixtures from the config's stash."""

    baselines_dir: Path
    artifacts: Path
    strict: bool
    accept_regressions: bool
    time_threshold: float | None
    summary_all: bool


SETTINGS_KEY = pytest.StashKey[Settings]()


def _build_settings(config: pytest.Config) -> Settings:
    return Settings(baselines_dir=baselines_dir(config), artifacts=artifacts_dir(config),
                    strict=flag(config, "strict"), accept_regressions=flag(config, "accept-regressions"),
                    time_threshold=time_threshold(config),
                    summary_all=option(config, "summary") == "all" or config.getoption("verbose") > 0)


def settings(config: pytest.Config) -> Settings:
    if SETTINGS_KEY not in config.stash:
        config.stash[SETTINGS_KEY] = _build_settings(config)
    return config.stash[SETTINGS_KEY]


def accept_command(config: pytest.Config, environment: str) -> str:
    """The command that accepts a first run's obtained Records, as a user would type it."""
    folder = settings(config).baselines_dir
    try:
        shown = folder.relative_to(Path.cwd())
    except ValueError:
        shown = folder
    extra = "" if shown == Path("baselines") else f" --baselines-dir {shown}"
    return f"memclaims baselines accept {environment}{extra}"


def flag(config: pytest.Config, name: str) -> bool:
    return option(config, name).strip().lower() in ("1", "true", "yes", "on")


def baselines_dir(config: pytest.Config) -> Path:
    chosen = option(config, "baselines-dir")
    # Relative paths (from pytest.ini or the command line) are taken from the rootdir.
    return Path(config.rootpath) / (chosen or "baselines")


def time_threshold(config: pytest.Config) -> float | None:
    text = option(config, "time-threshold").strip().rstrip("%")
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        raise pytest.UsageError(f"--memclaims-time-threshold expects a percentage, got {text!r}") from None


def summary(config: pytest.Config) -> Summary:
    from memclaims.compare import Summary

    if SUMMARY_KEY not in config.stash:
        config.stash[SUMMARY_KEY] = Summary()
    return config.stash[SUMMARY_KEY]


_HISTORY_BEFORE = pytest.StashKey[int]()
_SNAPSHOTS_BEFORE = pytest.StashKey[tuple[Any, int]]()
_SNAPSHOTS_HERE = pytest.StashKey[Any]()


def artifacts_dir(config: pytest.Config) -> Path:
    return Path(config.rootpath) / (option(config, "artifacts") or "memclaims-results")


def pytest_configure(config: pytest.Config) -> None:
    # Malformed values are usage errors before anything runs (a typo must not cost a night's run).
    config.stash[SETTINGS_KEY] = _build_settings(config)
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(_WorkerResults(config), "memclaims-worker-results")
    for name, help_text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {help_text}")
    for name in ("steps", "accuracy-epochs"):
        count_option(config, name)
    register_workloads(config)
    from memclaims import diagnosis

    text = option(config, "memory-history").strip() or "0"
    if not text.isdigit():
        raise pytest.UsageError(f"--memclaims-memory-history expects a number of events, got {text!r}")
    if flag(config, "download"):
        download_data(config)
    # Restored at unconfigure: a pytester session nested in this one must not change ours.
    config.stash[_HISTORY_BEFORE] = diagnosis.history_entries()
    diagnosis.set_history_entries(int(text))
    limit = option(config, "snapshot-max-mb").strip() or "50"
    try:
        limit_bytes = int(float(limit) * 10**6)
    except ValueError:
        raise pytest.UsageError(f"--memclaims-snapshot-max-mb expects a size in MB, got {limit!r}") from None
    if limit_bytes < 1:
        raise pytest.UsageError(f"--memclaims-snapshot-max-mb must be positive, got {limit!r}")
    import tempfile

    config.stash[_SNAPSHOTS_BEFORE] = (diagnosis.snapshot_dir(), diagnosis.snapshot_max_bytes())
    config.stash[_SNAPSHOTS_HERE] = tempfile.TemporaryDirectory(prefix="memclaims-snapshots-")
    diagnosis.set_snapshot_dir(Path(config.stash[_SNAPSHOTS_HERE].name))
    diagnosis.set_snapshot_max_bytes(limit_bytes)


def download_data(config: pytest.Config) -> None:
    """--memclaims-download: fetch the data sets the data dir lacks, before anything runs."""
    from memclaims import download

    chosen = option(config, "data-dir") or os.environ.get("MEMCLAIMS_DATA_DIR", "")
    if not chosen:
        raise pytest.UsageError("--memclaims-download needs a folder to download into: set --memclaims-data-dir "
                                "or $MEMCLAIMS_DATA_DIR")
    root = Path(chosen).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    try:
        lines = download.download(root)
    except (OSError, RuntimeError) as error:  # no network, checksum mismatch
        raise pytest.UsageError(f"--memclaims-download failed: {error}") from None
    for line in lines:
        print(f"memclaims: {line}")


def pytest_unconfigure(config: pytest.Config) -> None:
    from memclaims import diagnosis

    diagnosis.set_history_entries(config.stash.get(_HISTORY_BEFORE, 0))
    directory, limit = config.stash.get(_SNAPSHOTS_BEFORE, (None, diagnosis.DEFAULT_SNAPSHOT_MAX_BYTES))
    diagnosis.set_snapshot_dir(directory)
    diagnosis.set_snapshot_max_bytes(limit)
    here = config.stash.get(_SNAPSHOTS_HERE, None)
    if here is not None:
        here.cleanup()  # snapshots of passing cases: nobody needs them


OOM_KEY = pytest.StashKey[list[dict[str, Any]]]()


def note_out_of_memory(config: pytest.Config, case_id: str, error: OutOfMemory) -> None:
    """Remember a case that ran out of memory, for the end-of-run summary."""
    config.stash.setdefault(OOM_KEY, []).append(
        {"case": case_id, "phase": error.phase, "requested_bytes": error.requested_bytes})


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    table = config.stash.get(SUMMARY_KEY, None)
    rows = table.rows if table is not None else []
    oom = config.stash.get(OOM_KEY, [])
    if not rows and not oom:
        return
    lines = table.table(everything=settings(config).summary_all) if table is not None else []
    if lines:
        shown = "every comparison" if settings(config).summary_all else \
            "what is not ok, worst first (every comparison: -v or --memclaims-summary all)"
        terminalreporter.write_sep("=", f"memclaims baselines: {shown}")
        for line in lines:
            terminalreporter.write_line(line)
    elif rows:
        terminalreporter.write_line(f"memclaims baselines: {len(rows)} comparisons, all within tolerance")
    if oom:
        terminalreporter.write_sep("=", "memclaims: out of memory")
        for entry in oom:
            size = "unknown" if entry["requested_bytes"] is None else f"{entry['requested_bytes']:,} B"
            terminalreporter.write_line(f"{entry['case']}  phase {entry['phase']}  requested {size}")
    path = option(config, "summary-json")
    if path:
        data = {"rows": rows, "out_of_memory": oom}
        Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        terminalreporter.write_line(f"memclaims: comparison written to {path}")
