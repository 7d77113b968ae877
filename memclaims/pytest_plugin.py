"""The pytest side of memclaims: options, case generation, capabilities and the record cache.

The only module of the library that imports pytest; conftest.py loads it. Cases are generated
from the technique registry: invalid combinations never become cases, and a case whose tier the
machine cannot run is skipped with a reason that says what it needs.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from memclaims import techniques as registry
from memclaims.recipe import resolve

if TYPE_CHECKING:
    from memclaims.compare import Summary
    from memclaims.errors import OutOfMemory

TIERS = ("cpu", "gpu")
SELECTIONS = ("singles", "default", "full")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memclaims", "memclaims: memory-claim regression cases")

    def add(name: str, help: str, default: Any = None, **kwargs: Any) -> None:
        group.addoption(f"--memclaims-{name}", dest=f"memclaims_{name.replace('-', '_')}",
                        default=None, help=f"{help} (ini: memclaims_{name.replace('-', '_')})", **kwargs)
        parser.addini(f"memclaims_{name.replace('-', '_')}", help, default=default)

    add("matrix", "which combinations become cases: singles, default (singles + the article's "
        "chain + a pairwise cover) or full", default="default", choices=SELECTIONS)
    add("gpu-scale", "scale of the gpu tier: article or smoke", default="article", choices=("article", "smoke"))
    add("steps", "optimizer steps measured per case (default: the scale's)", default="")
    add("accuracy-epochs", "epochs of the accuracy phase per case (default: the scale's; 1 at article "
        "scale, as the article)", default="")
    add("vit-h14", "also run the ViT-H/14 series (518 px, 16-mixed, batch 4 per GPU) in the gpu tier",
        default="false", action="store_const", const="true")
    add("sim-profile", "the simulated GPU of the sim tier (memclaims list shows the profiles)", default="article")
    add("workload", "the workload the technique matrix runs on: vit, another built-in, hf:<model_type>, or one "
        "registered by an entry point (group memclaims.workloads) or memclaims_workloads", default="vit")
    parser.addini("memclaims_workloads", "workload factories to register, one package.module:factory per line "
                  "(each returns a memclaims Workload; see memclaims.user_workloads.define)", type="linelist",
                  default=[])
    add("data-dir", "folder holding CIFAR-10 / IMDb (default: $MEMCLAIMS_DATA_DIR, else offline data)", default="")
    # Baselines (memclaims.baselines / memclaims.compare).
    group.addoption("--update-baselines", action="store_true", default=False,
                    help="store the Records of the cases that ran as their baselines, instead of comparing")
    add("strict", "fail when a metric is better than its baseline beyond tolerance (stale baseline)",
        default="false", action="store_const", const="true")
    add("time-threshold", "fail when the step time grows by more than PCT percent over its baseline "
        "(default: step time is only reported)", default="", metavar="PCT")
    add("summary-json", "write the end-of-run baseline comparison table as JSON to PATH", default="",
        metavar="PATH")
    add("baselines-dir", "the baseline folder (default: baselines/ in the rootdir)", default="", metavar="DIR")
    # Diagnosis of memory failures (memclaims.diagnosis).
    add("artifacts", "where a case that fails on memory saves its breakdown JSON and CUDA snapshot "
        "(default: memclaims-results/ in the rootdir)", default="", metavar="DIR")
    add("memory-history", "CUDA allocator events recorded per case for the snapshot saved on a memory "
        "failure; 0 turns recording off", default="100000", metavar="N")


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


def tier_scale(config: pytest.Config, tier: str) -> str:
    """cpu trains at smoke scale; sim predicts the article's scale; gpu runs what it is asked."""
    return {"cpu": "smoke", "sim": "article"}.get(tier) or option(config, "gpu-scale")


def pytest_report_header(config: pytest.Config) -> list[str]:
    counts = {name: len(registry.default_selection() if name == "default" else
                         registry.full_matrix() if name == "full" else registry.singles(registry.single_process()))
              for name in SELECTIONS}
    chosen = option(config, "matrix")
    return [f"memclaims: matrix {chosen!r}: {counts[chosen]} cases per workload and tier "
            f"(singles {counts['singles']}, default {counts['default']}, full {counts['full']}); "
            f"gpu tier at {option(config, 'gpu-scale')!r} scale"]


def case_params(config: pytest.Config, workload: str = "vit") -> list[Any]:
    """One pytest param per (tier, combination), with the tier's marker and a readable id."""
    params = []
    for tier in TIERS:
        for techniques in selection(config):
            recipe = resolve(workload, tier_scale(config, tier), techniques)
            params.append(pytest.param(tier, techniques, id=f"{tier}:{recipe.id}",
                                       marks=getattr(pytest.mark, tier)))
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
            config.add_cleanup(lambda name=made.name: user_workloads.forget(name))
        workload(selected_workload(config))
    except UsageError as error:
        raise pytest.UsageError(f"memclaims: {error}") from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if {"tier", "techniques"} <= set(metafunc.fixturenames):
        metafunc.parametrize(("tier", "techniques"), case_params(metafunc.config, selected_workload(metafunc.config)))


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


# --- baselines ---------------------------------------------------------------------------------

SUMMARY_KEY = pytest.StashKey["Summary"]()


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


def summary(config: pytest.Config) -> "Summary":
    from memclaims.compare import Summary

    if SUMMARY_KEY not in config.stash:
        config.stash[SUMMARY_KEY] = Summary()
    return config.stash[SUMMARY_KEY]


_HISTORY_BEFORE = pytest.StashKey[int]()


def artifacts_dir(config: pytest.Config) -> Path:
    return Path(config.rootpath) / (option(config, "artifacts") or "memclaims-results")


def pytest_configure(config: pytest.Config) -> None:
    # Malformed values are usage errors before anything runs (a typo must not cost a night's run).
    time_threshold(config)
    for name in ("steps", "accuracy-epochs"):
        count_option(config, name)
    register_workloads(config)
    from memclaims import diagnosis

    text = option(config, "memory-history").strip() or "0"
    if not text.isdigit():
        raise pytest.UsageError(f"--memclaims-memory-history expects a number of events, got {text!r}")
    # Restored at unconfigure: a pytester session nested in this one must not change ours.
    config.stash[_HISTORY_BEFORE] = diagnosis.history_entries()
    diagnosis.set_history_entries(int(text))


def pytest_unconfigure(config: pytest.Config) -> None:
    from memclaims import diagnosis

    diagnosis.set_history_entries(config.stash.get(_HISTORY_BEFORE, 0))


OOM_KEY = pytest.StashKey[list[dict[str, Any]]]()


def note_out_of_memory(config: pytest.Config, case_id: str, error: "OutOfMemory") -> None:
    """Remember a case that ran out of memory, for the end-of-run summary."""
    config.stash.setdefault(OOM_KEY, []).append(
        {"case": case_id, "phase": error.phase, "requested_bytes": error.requested_bytes})


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    table = config.stash.get(SUMMARY_KEY, None)
    rows = table.rows if table is not None else []
    oom = config.stash.get(OOM_KEY, [])
    if not rows and not oom:
        return
    if rows:
        terminalreporter.write_sep("=", "memclaims baselines")
        for line in table.table():
            terminalreporter.write_line(line)
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
