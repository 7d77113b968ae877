"""The pytest side of memclaims: options, case generation, requirements and the record cache.

Loaded by pytest through the entry point ``memclaims`` of group ``pytest11`` (``pip install
memclaims``), in any project. Importing it imports nothing of the training stack: the environment
preflight runs first (``pytest_load_initial_conftests``, else ``pytest_configure``), so a broken
install is one usage-error line; only then does the plugin register its fixtures
(``memclaims.pytest.records``, ``memclaims.pytest.baselines``) and the claim-verdict recorder
(``memclaims.pytest.claims``), which import torch.

Every option is read once, in pytest_configure, into the session's frozen ``Settings``
(``memclaims.core.settings``: the table both front ends register from); fixtures and hooks read
``settings(config)``, never the raw options.

Cases are generated from the technique registry: invalid combinations never become cases. What a
test needs from the machine is declared with the ``requires`` marker (a case's needs come from its
recipe); at collection every unmet need becomes one skip with one joined reason
(memclaims.recipes.requirements).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from memclaims.core import offline, tested_versions
from memclaims.core.machine import Machine
from memclaims.core.names import ARTICLE_PROFILE, DATA_DIR_ENV, Tier, sim_tier_profile
from memclaims.core.settings import BY_NAME as OPTION_BY_NAME
from memclaims.core.settings import OPTIONS, BadValue, Option, Settings, parse, settings_from
from memclaims.pytest.addoption import SELECTIONS, pytest_addoption  # noqa: F401 - the hook, registered here
from memclaims.recipes import requirements
from memclaims.techniques import technique_registry as registry

if TYPE_CHECKING:
    from memclaims.baselines.compare import Summary
    from memclaims.core.errors import OutOfMemory
    from memclaims.recipes.recipe import Recipe
    from memclaims.techniques.base import TechniqueParameters

# Before it is imported (by a user's test module): a failed assert in the matrix's test shows its values.
pytest.register_assert_rewrite("memclaims.pytest.cases")
# Registered once the preflight has passed: they import the training stack. Named, not imported
# here: each of them imports this module.
LATE_PLUGINS = ("memclaims.pytest.records", "memclaims.pytest.baselines", "memclaims.pytest.claims",
                "memclaims.pytest.summary_files", "memclaims.pytest.watch")

TIERS: tuple[Tier, ...] = ("cpu", "gpu")  # the technique matrix's real-run tiers
# The suite's markers, registered by the plugin so that any project using it gets them with help.
MARKERS = {
    "cpu": "real training at smoke scale on the CPU, exact tensor accounting",
    "sim": "article scale on fake tensors, predicted CUDA allocator peak",
    "gpu": "real CUDA at article scale (or --memclaims-gpu-scale smoke), allocator statistics",
    "dist": "several processes through torch.distributed (gloo on CPU, NCCL on GPU)",
    "slow": "takes more than a few seconds even at smoke scale",
    "requires": "requires(Needs | cuda_devices=N, bitsandbytes='cpu'|'cuda', packages=..., options=..., paths=..., "
                "torch_features=..., unsupported=...): skipped at collection, with every unmet need in one reason "
                "(memclaims.recipes.requirements)",
}


# --- settings ----------------------------------------------------------------------------------

SETTINGS_KEY = pytest.StashKey[Settings]()


def _given(config: pytest.Config, option: Option) -> tuple[object, str]:
    """What the session was given for ``option`` (the command line wins over the ini file), and
    how the user spelled it, for an error line."""
    if option.pytest:
        value = config.getoption(option.pytest_dest)
        if value is not None or not option.in_ini:
            return value, option.pytest_option
    return config.getini(option.ini_name), f"{option.ini_name} (ini)"


def build_settings(config: pytest.Config) -> Settings:
    """Every option of the table, checked: a bad value stops the run with one line before anything
    is measured (a typo must not cost a night's run). Relative paths are taken from the rootdir."""
    values = {}
    for option in OPTIONS:
        if option.pytest or option.in_ini:
            value, spelled = _given(config, option)
            try:
                values[option.attr] = parse(option, value)
            except BadValue as error:
                raise pytest.UsageError(f"{spelled}: {error}") from None
    return settings_from(values, Path(config.rootpath))


def settings(config: pytest.Config) -> Settings:
    """The session's Settings, built once (pytest_configure)."""
    if SETTINGS_KEY not in config.stash:
        config.stash[SETTINGS_KEY] = build_settings(config)
    return config.stash[SETTINGS_KEY]


def selection(config: pytest.Config) -> list[tuple[str, ...]]:
    return registry.selection(settings(config).matrix)


def resolve(workload: str, scale: str, techniques: tuple[str, ...], config: pytest.Config | None = None) -> Recipe:
    """The recipe; with ``config``, what its options ask of the techniques (``--memclaims-lora-r``: the lora and
    qlora cases' adapters)."""
    from memclaims.recipes.recipe import applicable
    from memclaims.recipes.recipe import resolve as resolve_recipe  # imports torch: not at plugin import

    asked = applicable(asked_parameters(config), techniques) if config is not None else ()
    return resolve_recipe(workload, scale, techniques, parameters=asked)


def asked_parameters(config: pytest.Config) -> tuple[TechniqueParameters, ...]:
    """What ``--memclaims-lora-r`` and the rest ask (``memclaims.techniques.lora.asked_by``); () where none is given."""
    from memclaims.techniques import lora

    return lora.asked_by(settings(config))


def tier_scale(config: pytest.Config, tier: str, workload: str = "vit") -> str:
    """cpu trains at smoke scale; sim predicts the article's scale; gpu runs what it is asked, and
    its smoke is the workload's ``gpusmoke`` scale where it has one (memclaims.workloads.vit)."""
    from memclaims.workloads.registry import gpu_tier_scale

    return {"cpu": "smoke", "sim": "article"}.get(tier) or gpu_tier_scale(workload, settings(config).gpu_scale)


def pytest_report_header(config: pytest.Config) -> list[str]:
    if hasattr(config, "workerinput"):
        # An xdist worker's header is never printed (the controller prints its own): the full matrix's count
        # alone is seconds of CPU per worker.
        return []
    counts = {name: registry.selection_size(name) for name in SELECTIONS}
    chosen = settings(config).matrix
    hub = [config.stash[_HUB].line] if _HUB in config.stash else []  # Hub offline, or downloads allowed
    return [f"memclaims: matrix {chosen!r}: {counts[chosen]} cases per workload and tier "
            f"(singles {counts['singles']}, default {counts['default']}, full {counts['full']}); "
            f"gpu tier at {settings(config).gpu_scale!r} scale", *hub, sim_profile_line(config), *sim_eras_line(config),
            gpu_budget_line(config),
            *tested_versions.header_lines(tested_versions.installed()), *config.stash.get(_STACK_NOTES, [])]


def sim_profile_line(config: pytest.Config) -> str:
    """Which simulated GPU and torch the sim tier predicts for (memclaims.core.names.sim_tier_profile)."""
    chosen, workload = settings(config).sim_profile, selected_workload(config)
    if chosen:
        return f"memclaims: sim tier on profile {chosen!r} (--memclaims-sim-profile)"
    profile = sim_tier_profile(workload)
    if profile == ARTICLE_PROFILE:
        return (f"memclaims: sim tier on profile {profile!r} (the article's A100 and torch of 2023, as the built-in "
                "workloads' baselines; --memclaims-sim-profile NAME picks another)")
    return (f"memclaims: sim tier on profile {profile!r} for workload {workload!r} (the installed torch's defaults, "
            f"for a user workload), {ARTICLE_PROFILE!r} for the built-in workloads' rows and claims "
            "(--memclaims-sim-profile NAME picks one for all)")


def sim_eras_line(config: pytest.Config) -> list[str]:
    """The older library releases the sim tier replays (--memclaims-era), when any are asked for."""
    asked = settings(config).era
    return [f"memclaims: sim tier as with {', '.join(asked)} (--memclaims-era; memclaims.core.library_eras)"] if asked else []


def gpu_budget_line(config: pytest.Config) -> str:
    """The gpu tier's estimated cost for this selection (memclaims.report.budget's per-case model,
    which knows the vit workload only: another selected workload gets no estimate, and says so)."""
    from memclaims.core.errors import UsageError
    from memclaims.recipes.run_options import RunOptions
    from memclaims.report import budget

    chosen = settings(config)
    if selected_workload(config) != "vit":
        return (f"memclaims: gpu tier estimate: none for workload {selected_workload(config)!r} "
                "(memclaims.report.budget's per-case model covers the vit workload only)")
    cifar = chosen.data_dir is not None
    cases = []
    from memclaims.recipes.recipe import for_workload

    for techniques in for_workload("vit", selection(config)):
        recipe = resolve("vit", tier_scale(config, "gpu", "vit"), techniques)
        cases.append((recipe, RunOptions(device="cuda", memory_steps=chosen.steps,
                                          accuracy_epochs=chosen.accuracy_epochs,
                                          accuracy_full_epochs=chosen.accuracy_full_epochs)))
    for techniques in (("fsdp",), ("fsdp", "activation-checkpointing"),
                       ("fsdp", "activation-checkpointing", "cpu-offload"),
                       ("fsdp", "activation-checkpointing", "cpu-offload", "delayed-init")):
        try:
            recipe = resolve("vit", tier_scale(config, "gpu", "vit"), techniques)
        except UsageError:
            continue
        cases.append((recipe, RunOptions(device="cuda", evaluate=False, memory_steps=chosen.steps)))
    minutes = budget.total_minutes(cases, cifar=cifar)
    return (f"memclaims: gpu tier estimate {minutes:.1f} GPU-minutes on one H100-class GPU for {len(cases)} "
            f"vit cases ({'CIFAR-10' if cifar else 'offline digits'}; memclaims.report.budget's per-case model, "
            "not a measurement)")


def case_params(config: pytest.Config, workload: str = "vit") -> list[Any]:
    """One pytest param per (tier, combination), with the tier's marker and a readable id. Which cases a
    project's CI leaves to a nightly run is the project's choice (this repository's: suite/conftest.py);
    the plugin marks none ``slow``."""
    from memclaims.recipes.recipe import for_workload
    from memclaims.run import case_needs

    params = []
    for tier in TIERS:
        for techniques in for_workload(workload, selection(config)):
            recipe = resolve(workload, tier_scale(config, tier, workload), techniques, config)
            marks = [getattr(pytest.mark, tier), pytest.mark.requires(case_needs(recipe, tier))]
            params.append(pytest.param(tier, techniques, id=f"{tier}:{recipe.id}", marks=marks))
    return params


def selected_workload(config: pytest.Config) -> str:
    """The workload of the technique matrix (``--memclaims-workload``; vit by default)."""
    return settings(config).workload


def register_workloads(config: pytest.Config) -> None:
    """Register the ini's ``memclaims_workloads`` factories and check the selected workload exists."""
    from memclaims.core.errors import UsageError
    from memclaims.workloads import user as user_workloads
    from memclaims.workloads.registry import workload

    try:
        for spec in settings(config).workloads:
            made = user_workloads.register_spec(spec)
            config.add_cleanup(functools.partial(user_workloads.forget, made.name))
        workload(selected_workload(config))
        asked_parameters(config)  # a bad --memclaims-lora-* value: one line before anything is collected
    except UsageError as error:
        raise pytest.UsageError(f"memclaims: {error}") from None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if {"tier", "techniques"} <= set(metafunc.fixturenames):
        metafunc.parametrize(("tier", "techniques"), case_params(metafunc.config, selected_workload(metafunc.config)))


# --- requirements -----------------------------------------------------------------------------

def item_needs(item: pytest.Item) -> requirements.Needs:
    """Everything the item's ``requires`` markers (its own, its class's, its module's) ask for."""
    from memclaims.core.errors import UsageError

    found = requirements.NOTHING
    for mark in item.iter_markers("requires"):
        for given in mark.args:
            if not isinstance(given, requirements.Needs):
                raise pytest.UsageError(f"{item.nodeid}: requires() takes a memclaims.recipes.requirements.Needs or "
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
        option = OPTION_BY_NAME.get(name)
        if option is None or not option.pytest:  # a typo in a requires(options=...)
            raise pytest.UsageError(f"requires(options={name!r}): memclaims has no option --memclaims-{name}")
        if option.kind != "flag":
            raise pytest.UsageError(f"requires(options={name!r}): {option.pytest_option} is not an on/off option")
        return bool(getattr(settings(config), option.attr))

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


def summary_all(config: pytest.Config) -> bool:
    """The end-of-run table lists every comparison (--memclaims-summary all, or -v)."""
    return settings(config).summary == "all" or config.get_verbosity() > 0


def accept_command(config: pytest.Config, environment: str) -> str:
    """The command that accepts a first run's obtained Records, as a user would type it."""
    folder = settings(config).baselines_dir
    try:
        shown = folder.relative_to(Path.cwd())
    except ValueError:
        shown = folder
    extra = "" if shown == Path("baselines") else f" --baselines-dir {shown}"
    return f"memclaims baselines accept {environment}{extra}"


def summary(config: pytest.Config) -> Summary:
    from memclaims.baselines.compare import Summary

    if SUMMARY_KEY not in config.stash:
        config.stash[SUMMARY_KEY] = Summary()
    return config.stash[SUMMARY_KEY]


_HISTORY_BEFORE = pytest.StashKey[int]()
_SNAPSHOTS_BEFORE = pytest.StashKey[tuple[Any, int]]()
_SNAPSHOTS_HERE = pytest.StashKey[Any]()


# --- the environment preflight -------------------------------------------------------------------

_STACK_NOTES = pytest.StashKey[list[str]]()  # set once the preflight ran: its header lines


_HUB = pytest.StashKey[offline.HubMode]()  # what the session decided about the Hugging Face Hub


def download_asked(config: pytest.Config) -> bool:
    """--memclaims-download (or memclaims_download in the ini file), read before the session's Settings
    exist: known_args_namespace holds the plugin's options when its entry point loaded it, config.option
    once a conftest.py has registered it."""
    option = OPTION_BY_NAME["download"]
    value = getattr(config.option, option.pytest_dest, None)
    if value is None:
        value = getattr(config.known_args_namespace, option.pytest_dest, None)
    spelled = option.pytest_option
    if value is None:
        value, spelled = config.getini(option.ini_name), f"{option.ini_name} (ini)"
    try:
        return bool(parse(option, value))
    except BadValue as error:
        raise pytest.UsageError(f"{spelled}: {error}") from None


def go_offline(config: pytest.Config) -> None:
    """The Hub offline for this session, its xdist workers and every process it starts, unless
    --memclaims-download asks for downloads (memclaims.core.offline); before the preflight imports the
    stack, since each library reads its switch at import. Once per session; undone at unconfigure."""
    if _HUB not in config.stash:
        config.stash[_HUB] = offline.apply(download_asked(config), OPTION_BY_NAME["download"].pytest_option)


def check_stack(config: pytest.Config) -> None:
    """The environment preflight (memclaims.pytest.release_preflight), once per session: a package every run or
    the selected workload needs that does not work stops the run with one line (a usage error,
    exit status 4) before any conftest or test module imports it; any other is a header line."""
    go_offline(config)
    if _STACK_NOTES in config.stash:
        return
    config.stash[_STACK_NOTES] = []
    asked = config.known_args_namespace  # parsed already in pytest_load_initial_conftests
    if getattr(asked, "help", False) or getattr(asked, "version", False):
        return  # --help and --version must work on a broken install too
    from memclaims.pytest import release_preflight

    found = release_preflight.problems()
    # Before the session's Settings exist (pytest_configure builds them, after the conftests this
    # guards), so the workload as given: known_args_namespace holds the plugin's options when its
    # entry point loaded it, config.option once a conftest.py has registered it.
    option = OPTION_BY_NAME["workload"]
    workload = (getattr(config.option, option.pytest_dest, None) or getattr(asked, option.pytest_dest, None)
                or str(config.getini(option.ini_name))).strip()
    if release_preflight.stopping(found, workload or "vit"):
        raise pytest.UsageError(release_preflight.message(found))
    config.stash[_STACK_NOTES] = [release_preflight.note(p) for p in found]


def check_options_early(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """The plugin's options as given on the command line, checked before the preflight's imports (seconds): a
    bad value, or a misspelled ``--memclaims-*`` option, is one line at once (issue #49). The ini file's values
    and the other plugins' options are checked where pytest checks them, after the conftests."""
    _, unknown = parser.parse_known_and_unknown_args(args)
    ours = [option.pytest_option for option in OPTIONS if option.pytest]
    for word in unknown:
        name = word.partition("=")[0]
        if name.startswith("--memclaims-"):
            from memclaims.core.suggest import did_you_mean

            raise pytest.UsageError(f"unrecognized option {name}" + did_you_mean(name, ours, "pytest --help lists "
                                                                               "the memclaims options"))
    for option in OPTIONS:
        value = getattr(early_config.known_args_namespace, option.pytest_dest, None) if option.pytest else None
        if value is not None and value is not False:
            try:
                parse(option, value)
            except BadValue as error:
                raise pytest.UsageError(f"{option.pytest_option}: {error}") from None


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    # Loaded by its entry point, the plugin is here before the project's conftest.py files are
    # imported (a conftest that imports torch would otherwise fail first, with a traceback).
    check_options_early(early_config, parser, args)
    check_stack(early_config)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    check_stack(config)  # registered by a conftest.py (a checkout not installed): the first chance
    # Malformed values are usage errors before anything runs (a typo must not cost a night's run).
    config.stash[SETTINGS_KEY] = chosen = build_settings(config)
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(_WorkerResults(config), "memclaims-worker-results")
    for name in LATE_PLUGINS:
        config.pluginmanager.import_plugin(name)
    for name, help_text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {help_text}")
    register_workloads(config)
    from memclaims.measure import diagnosis

    if chosen.download:
        download_data(config)
    # Restored at unconfigure: a pytester session nested in this one must not change ours.
    config.stash[_HISTORY_BEFORE] = diagnosis.history_entries()
    diagnosis.set_history_entries(chosen.memory_history)
    import tempfile

    config.stash[_SNAPSHOTS_BEFORE] = (diagnosis.snapshot_dir(), diagnosis.snapshot_max_bytes())
    config.stash[_SNAPSHOTS_HERE] = tempfile.TemporaryDirectory(prefix="memclaims-snapshots-")
    diagnosis.set_snapshot_dir(Path(config.stash[_SNAPSHOTS_HERE].name))
    diagnosis.set_snapshot_max_bytes(chosen.snapshot_max_bytes)


def download_data(config: pytest.Config) -> None:
    """--memclaims-download: fetch the data sets the data dir lacks, before anything runs."""
    from memclaims.workloads import download

    root = settings(config).data_dir
    if root is None:
        raise pytest.UsageError("--memclaims-download needs a folder to download into: set --memclaims-data-dir "
                                f"or ${DATA_DIR_ENV}")
    root.mkdir(parents=True, exist_ok=True)
    try:
        lines = download.download(root)
    except (OSError, RuntimeError) as error:  # no network, checksum mismatch
        raise pytest.UsageError(f"--memclaims-download failed: {error}") from None
    for line in lines:
        print(f"memclaims: {line}")


def pytest_unconfigure(config: pytest.Config) -> None:
    from memclaims.measure import diagnosis

    hub = config.stash.get(_HUB, None)
    if hub is not None:
        offline.restore(hub)  # a session nested in another (pytester, in-process) leaves the outer one's

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
    lines = table.table(everything=summary_all(config)) if table is not None else []
    if lines:
        shown = "every comparison" if summary_all(config) else \
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
    # The summary JSON, the HTML report and the CI step summary: memclaims.pytest.summary_files.
