"""The architecture's two boundaries around the engines (issue #25): every caller runs a recipe through
``memclaims.run.run_recipe``, the sim included, and the claims are relations over Records that import no
engine (their callers measure what they look up)."""

from __future__ import annotations

import ast
from pathlib import Path

from suite.selftest.test_imports import import_graph

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "memclaims"
# The sim's own entry points; only the sim and the door (memclaims/run.py) call them.
SIM_ENTRY_POINTS = frozenset({"simulate", "simulate_load", "simulate_load_record"})
ENGINES = ("memclaims.run", "memclaims.sim", "memclaims.measure")


def sim_calls(source: str) -> list[str]:
    """Each call of a sim entry point (``simulate(...)``, ``sim.simulate_load(...)``) and each import of
    one (``from memclaims.sim import simulate``), as ``line: name``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in SIM_ENTRY_POINTS:
                found.append(f"{node.lineno}: {name}()")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("memclaims.sim"):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name in SIM_ENTRY_POINTS]
    return found


def test_the_check_finds_calls_and_imports_of_the_sim() -> None:
    source = ("from memclaims import sim\nfrom memclaims.sim import simulate_load, profile\n"
              "sim.simulate(r, limit_bytes=1)\nsimulate_load('init-module').peak\n_simulate(r)\nsim.check(r)\n")
    assert sim_calls(source) == ["2: import simulate_load", "3: simulate()", "4: simulate_load()"]


def test_only_the_sim_and_the_door_call_the_sim() -> None:
    callers = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("memclaims/sim/") or relative == "memclaims/run.py":
            continue
        found = sim_calls(path.read_text())
        if found:
            callers[relative] = found
    assert callers == {}, f"run recipes on the sim through memclaims.run.run_recipe(recipe, RunOptions(device='sim', ...)): {callers}"


def test_no_sim_helper_replays_around_the_door() -> None:
    """Inside the sim only replay.py, where the entry points live, calls them (``__init__`` re-exports
    them): a helper elsewhere in the sim that replays a recipe itself (as sim.zero once did for its
    one-GPU activations) would let a report run the sim around the door; such a helper takes the
    Record its caller measured."""
    callers = {}
    for path in sorted((PACKAGE / "sim").rglob("*.py")):
        if path.name in ("replay.py", "__init__.py"):  # where the entry points live, and their re-export
            continue
        found = sim_calls(path.read_text())
        if found:
            callers[path.relative_to(ROOT).as_posix()] = found
    assert callers == {}, f"a sim helper takes a Record measured through memclaims.run.run_recipe: {callers}"


def test_the_claims_import_no_engine() -> None:
    """Not directly, not through anything they import (a lazy import counts)."""
    graph = import_graph(PACKAGE)
    claims = [name for name in graph if name == "memclaims.claims" or name.startswith("memclaims.claims.")]
    assert claims
    for name in claims:
        reached, todo = set(), [name]
        while todo:
            for target in graph[todo.pop()]:
                if target not in reached:
                    reached.add(target)
                    todo.append(target)
        engines = sorted(t for t in reached if any(t == e or t.startswith(f"{e}.") for e in ENGINES))
        assert engines == [], f"{name} imports {engines}: a check reads Records its caller measured (memclaims.claims.lookup)"
