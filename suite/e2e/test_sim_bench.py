"""``scripts/sim-bench``: the sim's cost on issue #53's three targets. Its numbers are read by a person, so what is held
here is that it measures what the docs and the issue name (the docs' fit example, the records snapshot's 25 sim
rows) and that a bad target is one line; running the targets themselves takes minutes (docs/development.md)."""

from __future__ import annotations

import subprocess
import sys
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from types import ModuleType

from fixtures.paths import ROOT

SCRIPTS = ROOT / "scripts"


def _script(name: str) -> ModuleType:
    """A script of scripts/ (no ``.py``) as a module, its ``main`` not run."""
    loader = SourceFileLoader(name.replace("-", "_"), str(SCRIPTS / name))
    spec = spec_from_loader(loader.name, loader)
    assert spec is not None
    module = module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_targets_are_the_docs_fit_example_and_the_snapshots_25_sim_rows() -> None:
    bench = _script("sim-bench")
    fit = " ".join(["memclaims", *bench.TARGETS["fit"][3:]])
    assert fit in (ROOT / "docs" / "sim.md").read_text(encoding="utf-8").splitlines(), fit
    assert bench.TARGETS["reproduce"][3:] == ["reproduce", "--device", "sim"]
    assert bench.TARGETS["rows"][1:] == [str(SCRIPTS / "records-snapshot"), "take", "sim"]
    assert len(_script("records-snapshot").SIM) == 25


def test_an_unknown_target_is_one_line_and_exit_2() -> None:
    done = subprocess.run([sys.executable, str(SCRIPTS / "sim-bench"), "fit", "nope"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done
    assert "unknown target 'nope'; valid targets: fit, reproduce, rows" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
