"""The one table of options (memclaims.core.settings) and the Settings both front ends build from it:
every option registered where the table says, with its default and help; relative paths from the
rootdir in pytest and from the working directory on the command line; a bad value is one line in
each; the old spellings work and say so."""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from memclaims import cli
from memclaims.core import names
from memclaims.core import settings as table
from memclaims.core.settings import OPTIONS, Settings
from memclaims.pytest.testing import make_project
from memclaims.techniques import technique_registry as techniques

pytest_plugins = ["pytester"]


def _flat(text: str) -> str:
    """Help as a front end prints it, without the line breaks and indents of its wrapping."""
    return "".join(text.split())


def _minimal_argv(command: str) -> list[str]:
    """``command`` with what it requires and nothing else."""
    argv = command.split()
    for option, use in table.for_command(command):
        if use.positional and option.kind != "list":
            argv.append("x")
        elif use.required:
            argv += [option.cli_option, "1GB"]
    return argv


def _commands() -> list[str]:
    return [name for name, _, _ in cli.COMMANDS]


# --- the table itself ------------------------------------------------------------------------------

def test_settings_has_one_field_per_option_with_its_default() -> None:
    assert [f.name for f in fields(Settings)] == [option.attr for option in OPTIONS]
    for f, option in zip(fields(Settings), OPTIONS):
        default = f.default if f.default is not MISSING else None
        assert default == option.default, option.name


def test_the_table_names_what_the_registries_hold() -> None:
    from memclaims.recipes.run_options import DEVICES
    from memclaims.sim import PROFILES

    assert table.MATRICES == tuple(techniques.SELECTIONS)
    assert names.SIM_PROFILES == tuple(PROFILES)
    assert names.GPU_SMOKE in table.SCALES and set(DEVICES) | {"sim"} == set(table.DEVICES)
    assert len({option.name for option in OPTIONS}) == len(OPTIONS)
    assert {command for option in OPTIONS for command in option.cli} == set(_commands())


def test_every_default_reads_back_from_its_text() -> None:
    for option in OPTIONS:
        if option.in_ini:
            assert table.parse(option, table.text_default(option)) == option.default, option.name


# --- registered by both front ends, where the table says -----------------------------------------------

@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    return make_project(pytester, ROOT)


def test_pytest_registers_every_option_it_takes_with_its_default_and_help(project: pytest.Pytester) -> None:
    text = "\n".join(project.runpytest("--help").outlines)
    shown = _flat(text)
    config = project.parseconfig()
    for option in OPTIONS:
        if option.pytest:
            assert _flat(f"{option.pytest_option}={table.metavar_for(option)}" if option.kind != "flag"
                         else option.pytest_option) in shown, option.name
            assert _flat(table.help_for(option, "pytest")) in shown, option.name
            assert config.getoption(option.pytest_dest) in (None, False), option.name  # unset: the ini decides
        if option.in_ini:
            assert _flat(table.help_for(option, "ini")) in shown, option.name
            assert table.parse(option, config.getini(option.ini_name)) == option.default, option.name
        if not (option.pytest or option.in_ini):
            assert not re.search(rf"(--memclaims-{option.name}|memclaims_{option.attr})(?![\w-])", text), option.name


@pytest.mark.parametrize("command", _commands())
def test_the_cli_registers_every_option_of_each_command_with_its_default_and_help(
        command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(table.DATA_DIR_ENV, raising=False)
    with pytest.raises(SystemExit):
        cli.parse([*command.split(), "--help"])
    text = capsys.readouterr().out
    usage, shown = text.split("\n\n")[0], _flat(text)
    _, settings = cli.parse(_minimal_argv(command))
    for option in OPTIONS:
        use = option.cli.get(command)
        if use is None:
            assert not re.search(rf"(?<![\w-])--{option.name}(?![\w-])", usage), option.name
            continue
        assert _flat(table.help_for(option, "cli", command)) in shown, option.name
        if not use.positional:
            assert option.cli_option in shown, option.name
        if not (use.positional or use.required):
            assert getattr(settings, option.attr) == table.default_for(option, command), option.name


def test_an_option_of_both_front_ends_has_one_default_and_one_help(project: pytest.Pytester) -> None:
    config = project.parseconfigure()
    from memclaims.pytest.plugin import settings

    in_pytest = settings(config)
    shared = [option for option in OPTIONS if option.pytest and option.cli]
    assert {option.name for option in shared} >= {"matrix", "steps", "sim-profile", "data-dir", "baselines-dir"}
    for option in shared:
        for command, use in option.cli.items():
            _, on_cli = cli.parse(_minimal_argv(command))
            if use.positional:
                continue
            assert use.default is table.USE.default and use.help is None, (option.name, command)
            here, there = getattr(in_pytest, option.attr), getattr(on_cli, option.attr)
            if option.kind == "path" and here is not None:  # the same default, from its own base
                here = here.relative_to(config.rootpath)
            if option.name != "data-dir":  # $MEMCLAIMS_DATA_DIR may be set: it is both fronts' default
                assert here == there, (option.name, command)


# --- relative paths --------------------------------------------------------------------------------

def test_a_relative_path_in_pytest_is_taken_from_the_rootdir(project: pytest.Pytester) -> None:
    make_project(project, ROOT, ini_extra="memclaims_artifacts = results\n")
    (project.path / "sub").mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(project.path / "sub")  # the rootdir stays the ini file's folder
        config = project.parseconfigure("--memclaims-baselines-dir", "rel", "--memclaims-summary-json=s.json")
    from memclaims.pytest.plugin import settings

    chosen = settings(config)
    assert config.rootpath == project.path
    assert chosen.baselines_dir == project.path / "rel"
    assert chosen.summary_json == project.path / "s.json"
    assert chosen.artifacts == project.path / "results"  # the ini file's too


def test_a_relative_path_on_the_command_line_is_taken_from_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _, chosen = cli.parse(["baselines", "accept", "env", "--baselines-dir", "rel"])
    assert chosen.baselines_dir == Path("rel") and chosen.baselines_dir.resolve() == tmp_path / "rel"
    _, chosen = cli.parse(["reproduce"])
    assert chosen.baselines_dir == Path("baselines") and chosen.out == Path("reproduce")


def test_each_path_option_says_where_a_relative_path_is_taken_from() -> None:
    for option in OPTIONS:
        if option.kind in table.PATH_KINDS:
            if option.pytest:
                assert "relative path is taken from the rootdir" in table.help_for(option, "pytest")
            for command in option.cli:
                assert "relative path is taken from the working directory" in table.help_for(option, "cli", command)


# --- bad values: one line naming the option, the value and what is valid ----------------------------

@pytest.mark.parametrize("argv, line", [
    (["--memclaims-steps=-1"], "--memclaims-steps: expected a positive integer, got '-1'"),
    (["--memclaims-sim-profile", "nope"], "--memclaims-sim-profile: invalid choice: 'nope' (choose from article, "),
    (["--memclaims-time-threshold", "fast"], "--memclaims-time-threshold: expected a percentage (a number >= 0, "
                                             "e.g. 20 or 20%), got 'fast'"),
    (["--memclaims-matrix", "everything"], "--memclaims-matrix: invalid choice: 'everything' (choose from singles, "
                                           "default, full)"),
])
def test_a_bad_value_in_pytest_is_one_usage_error_line(project: pytest.Pytester, argv: list[str], line: str) -> None:
    result = project.runpytest("--collect-only", *argv)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [text for text in result.errlines if text.strip()]
    assert len(errors) == 1 and errors[0].startswith(f"ERROR: {line}"), errors


def test_a_bad_value_in_the_ini_file_names_the_ini_option(project: pytest.Pytester) -> None:
    make_project(project, ROOT, ini_extra="memclaims_strict = maybe\n")
    result = project.runpytest("--collect-only")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert [text for text in result.errlines if text.strip()] == [
        "ERROR: memclaims_strict (ini): expected true or false, got 'maybe'"]


@pytest.mark.parametrize("argv, line", [
    (["run", "vit", "--steps", "-1"], "argument --steps: expected a positive integer, got '-1'"),
    (["run", "vit", "--device", "sim", "--sim-profile", "nope"],
     "argument --sim-profile: invalid choice: 'nope' (choose from article, "),
    (["benchmark", "--matrix", "everything"],
     "argument --matrix: invalid choice: 'everything' (choose from singles, default, full)"),
    (["run", "vit", "--timeout", "-3"], "argument --timeout: expected seconds (0 for no limit), got '-3'"),
])
def test_a_bad_value_on_the_command_line_is_one_line_and_exit_2(argv: list[str], line: str,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and line in err, err


# --- the old spellings --------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, field, value, old, new", [
    (["fidelity", "--profile", "h100"], "sim_profile", "h100", "--profile", "--sim-profile"),
    (["fit", "vit", "--memory", "1GB", "--profile", "a100"], "sim_profile", "a100", "--profile", "--sim-profile"),
    (["benchmark", "--selection", "singles"], "matrix", "singles", "--selection", "--matrix"),
    (["claims", "--results", "old"], "artifacts", Path("old"), "--results", "--artifacts"),
])
def test_an_old_spelling_works_with_a_one_line_warning(argv: list[str], field: str, value: object, old: str,
                                                      new: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, chosen = cli.parse(argv)
    assert getattr(chosen, field) == value
    assert capsys.readouterr().err == f"memclaims: warning: {old} is deprecated, use {new}\n"
    _, chosen = cli.parse([new if word == old else word for word in argv])
    assert getattr(chosen, field) == value and capsys.readouterr().err == ""


def test_an_old_spelling_still_checks_its_value(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["fidelity", "--profile", "nope"]) == cli.EXIT_USAGE
    assert "argument --profile: invalid choice: 'nope'" in capsys.readouterr().err


def test_claims_reads_the_artifacts_folder_by_its_old_name_too(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["claims", "--results", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.err.startswith("memclaims: warning: --results is deprecated, use --artifacts\n")
    assert f"verdicts from {tmp_path / 'claims-last-run.json'}" in captured.out


# --- the header's gpu budget line -----------------------------------------------------------------------

def test_the_gpu_budget_line_speaks_of_the_selected_workload(project: pytest.Pytester) -> None:
    vit = project.runpytest("--collect-only", "--memclaims-matrix", "singles")
    vit.stdout.fnmatch_lines(["memclaims: gpu tier estimate * GPU-minutes * for * vit cases *"])
    other = project.runpytest("--collect-only", "--memclaims-matrix", "singles", "--memclaims-workload", "distilbert")
    other.stdout.fnmatch_lines(["memclaims: gpu tier estimate: none for workload 'distilbert' "
                                "(memclaims.report.budget's per-case model covers the vit workload only)"])


# --- option facts, each defined once (#25 item 5) ---------------------------------------------------

LIBRARY = ROOT / "memclaims"


def _sources_saying(pattern: str) -> list[str]:
    found = re.compile(pattern)
    return sorted(str(path.relative_to(ROOT)) for path in LIBRARY.rglob("*.py") if found.search(path.read_text()))


def test_only_core_names_reads_the_data_dir_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Spelled as a name, or read from the environment: in core.names only (messages say DATA_DIR_ENV).
    assert _sources_saying(r"MEMCLAIMS_DATA_DIR[\"' ]|environ[^\n]*DATA_DIR") == ["memclaims/core/names.py"]
    monkeypatch.setenv(names.DATA_DIR_ENV, str(tmp_path))
    assert names.data_dir(None) == tmp_path and names.data_dir("given") == Path("given")
    _, on_cli = cli.parse(["run", "vit"])
    assert on_cli.data_dir == tmp_path  # both front ends build Settings through settings_from
    assert table.settings_from({}, Path("/root")).data_dir == tmp_path  # the variable's: not taken from the base
    monkeypatch.delenv(names.DATA_DIR_ENV)
    assert names.data_dir(None) is None and table.settings_from({}, Path("/root")).data_dir is None


def test_the_tier_to_device_mapping_is_spelled_once() -> None:
    assert {tier: names.tier_device(tier) for tier in names.TIERS} == {
        "cpu": "cpu", "sim": "sim", "gpu": "cuda", "dist": "cpu"}
    assert [names.device_tier(device) for device in names.DEVICES] == ["cpu", "gpu", "sim"]
    copies = r"""["']cuda["']\s+if\s+tier\s*==\s*["']gpu["']|["']gpu["']\s*:\s*["']cuda["']|["']cuda["']\s*:\s*["']gpu["']"""
    assert _sources_saying(copies) == ["memclaims/core/names.py"]


def test_the_default_step_count_is_defined_once() -> None:
    from memclaims.recipes.recipe import resolve
    from memclaims.recipes.run_options import RunOptions, memory_steps, resolve_memory_steps

    recipe = resolve("vit", "article", ())
    assert memory_steps(recipe, None, "sim") == names.SIM_MEMORY_STEPS != recipe.scale.memory_steps
    assert resolve_memory_steps(recipe, RunOptions(device="cuda")) == recipe.scale.memory_steps
    assert resolve_memory_steps(recipe, RunOptions(device="sim", memory_steps=5)) == 5
    with pytest.raises(Exception, match="--steps must be at least 1"):
        memory_steps(recipe, 0, "sim")
    assert f"{names.SIM_MEMORY_STEPS} on the sim" in table.BY_NAME["steps"].help
    # The engines ask memory_steps; none keeps a default of its own.
    assert _sources_saying(r"must be at least 1 \(got \{steps\}\)") == ["memclaims/recipes/run_options.py"]
