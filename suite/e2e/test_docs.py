"""The README and the docs site: every command they show parses (a ``memclaims`` command through the
CLI's own parser, its ``--help`` runs; a pytest option is one the plugin defines; a script or module
exists), the README stays short, and ``mkdocs build --strict`` passes where mkdocs is installed."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fixtures.paths import ROOT
from memclaims.cli import main, parse
from memclaims.core.settings import OPTIONS

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 150  # read in two minutes (issue #28)
PYTEST_OPTIONS = {o.pytest_option for o in OPTIONS if o.pytest} | {"--update-baselines"}
# pytest's own and its plugins' options the docs use.
PYTEST_OWN = {"-n", "-m", "-k", "-v", "-x", "-q", "--junitxml", "--benchmark-autosave", "--benchmark-compare",
              "-p", "--durations"}


def shell_lines() -> list[tuple[str, str]]:
    """(page, command) for every line of every bash block, continuations joined, comments dropped."""
    found = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            for line in block.replace("\\\n", " ").splitlines():
                command = re.sub(r"\s+#\s.*$", "", line).strip()
                if command and not command.startswith("#"):
                    found.append((page.name, command))
    return found


def memclaims_argv(command: str) -> list[str] | None:
    """The arguments after ``memclaims`` (or ``-m memclaims.cli``), with ``[optional]`` parts dropped."""
    words = shlex.split(re.sub(r"\[[^\]]*\]", "", command))
    if words[0] == "memclaims":
        return words[1:]
    if "memclaims.cli" in words:
        return words[words.index("memclaims.cli") + 1:]
    return None


COMMANDS = shell_lines()
MEMCLAIMS = [(page, c) for page, c in COMMANDS if memclaims_argv(c) is not None]


def test_readme_is_short_and_the_docs_show_commands() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_MAX_LINES
    assert len(MEMCLAIMS) >= 25 and any(c.startswith("pytest") for _, c in COMMANDS)


@pytest.mark.parametrize("page, command", MEMCLAIMS, ids=[f"{p}:{c[:60]}" for p, c in MEMCLAIMS])
def test_memclaims_command_parses(page: str, command: str) -> None:
    argv = memclaims_argv(command)
    assert argv is not None
    parse(argv)  # every option and value as the command line checks it (no handler runs)


@pytest.mark.parametrize("subcommand", sorted({" ".join(w for w in memclaims_argv(c)[:2]  # type: ignore[index]
                                                        if re.fullmatch(r"[a-z]+", w) and w not in ("vit",))
                                               for _, c in MEMCLAIMS}))
def test_memclaims_subcommand_help_runs(subcommand: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*subcommand.split(), "--help"])
    assert exited.value.code == 0 and "usage: memclaims" in capsys.readouterr().out


def test_pytest_scripts_and_modules_shown_exist() -> None:
    checked = 0
    for page, command in COMMANDS:
        words = shlex.split(command)
        if words[0] == "pytest":
            for word in words[1:]:
                option = word.split("=")[0]
                if option.startswith("-"):
                    assert option in PYTEST_OPTIONS | PYTEST_OWN, f"{page}: {command}: unknown option {option}"
                    checked += 1
        elif words[0].startswith("scripts/"):
            assert (ROOT / words[0]).is_file(), f"{page}: {command}: no {words[0]}"
            checked += 1
        elif words[0] == "python" and words[1] == "-m" and words[2].startswith("memclaims"):
            assert importlib.util.find_spec(words[2]) is not None, f"{page}: {command}"
            checked += 1
        elif words[0] == "python" and words[1].startswith("scripts/"):
            assert (ROOT / words[1]).is_file(), f"{page}: {command}"
            checked += 1
    assert checked >= 15


@pytest.mark.requires(packages={"mkdocs", "material"})
def test_mkdocs_build_strict(tmp_path: Path) -> None:
    # --strict turns every warning (a broken link, a missing page or snippet) into a failure.
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"),
                             "-d", str(tmp_path / "site")], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    page = (tmp_path / "site" / "own-model" / "index.html").read_text()
    assert "mywork/workload.py" in page  # the README's example, included (one place for it)


def test_ci_installs_the_readmes_set_up_and_runs_its_test_command() -> None:
    """The README's one install line is the lock's (the extras it is compiled with: the header then says
    "installed as locked"), what .ci/run installs and what the example workflow installs; .ci/run runs the
    README's first test command (no second recipe)."""
    from memclaims.report.lock import COMPILE_OPTIONS

    readme, ci = (ROOT / "README.md").read_text(), (ROOT / ".ci" / "run").read_text()
    install = re.search(r"pip install -e \"\.\[([a-z,]+)\]\" -c (\S+)", readme)
    assert install, "the README's install line"
    extras, lock = install.group(1), install.group(2)
    compiled = [COMPILE_OPTIONS[i + 1] for i, option in enumerate(COMPILE_OPTIONS) if option == "--extra"]
    assert extras.split(",") == compiled and (ROOT / lock).is_file()
    assert f'-c {lock} -e ".[{extras}]"' in ci
    assert install.group(0) in (ROOT / "examples" / "nightly-gpu.yml").read_text()
    assert "pip install memclaims" not in readme  # no index serves it: the README installs from a clone
    tests = readme[readme.index("## Tests"):]
    command = re.search(r"^(pytest [^#\n]*?)\s+#", tests, re.M)
    assert command and any(line.strip().startswith(command.group(1)) for line in ci.splitlines()), command
