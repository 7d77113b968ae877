"""The architecture ARCHITECTURE.md states, held on memclaims' import graph (fixtures/import_graph.py, which
scripts/import-layers prints): no import cycles, every import in the direction of the subpackages' table,
the longest import chain at most ``MAX_LAYERS`` modules; and the two boundaries around the engines (every
caller runs a recipe through ``memclaims.run.run_recipe``; the claims import no engine).

Every import statement counts, function-local ones too (a lazy import only postpones a cycle and is a
dependency all the same); not those under ``if TYPE_CHECKING:`` (never run) or a module's own ``if
__name__ == "__main__":``. ``from package import name`` is an import of the package, whose ``__init__``
must then be complete."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from fixtures.import_graph import (
    MAX_LAYERS,
    MAY_IMPORT,
    ORDER,
    TYPE_ONLY_MAY_IMPORT,
    cycles,
    deepest_chain,
    group,
    import_graph,
    layers,
    modules,
    reachable,
    type_only_imports,
    wrong_way,
)
from fixtures.paths import PACKAGE, ROOT
from fixtures.stated_architecture import (
    allowed_groups,
    class_attributes,
    class_members,
    init_may_import,
    module_names,
    stated_chain,
    table_may_import,
    top_level_names,
)


@pytest.fixture(scope="module")
def package_graph() -> dict[str, set[str]]:
    """memclaims' import graph, parsed once for the tests that read it (about a second each otherwise)."""
    return import_graph(PACKAGE)


def test_memclaims_has_no_import_cycles(package_graph: dict[str, set[str]]) -> None:
    found = cycles(package_graph)
    assert not found, "import cycles: " + "; ".join(" -> ".join(cycle) for cycle in found)


@pytest.mark.parametrize("name", sorted(modules(ROOT / "memclaims")))
def test_every_module_imports(name: str) -> None:
    assert importlib.import_module(name).__name__ == name


def _write(root: Path, files: dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "pkg"


def test_a_lazy_import_back_is_a_cycle(tmp_path: Path) -> None:
    package = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/runner.py": "def run():\n    from pkg.distributed import shard\n",
        "pkg/distributed.py": "from pkg import runner\n",
        "pkg/leaf.py": "import pkg.runner\n",
    })
    assert cycles(import_graph(package)) == [["pkg.distributed", "pkg.runner", "pkg.distributed"]]


def test_importing_a_sibling_through_the_package_init_is_a_cycle(tmp_path: Path) -> None:
    package = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/sim/__init__.py": "from pkg.sim.replay import simulate\n",
        "pkg/sim/replay.py": "def simulate():\n    from pkg.sim import sharded\n",
        "pkg/sim/sharded.py": "",
    })
    assert cycles(import_graph(package)) == [["pkg.sim", "pkg.sim.replay", "pkg.sim"]]
    (package / "sim" / "replay.py").write_text("def simulate():\n    import pkg.sim.sharded as sharded\n")
    assert cycles(import_graph(package)) == []


def test_the_names_user_workloads_may_not_take_are_the_built_in_workloads() -> None:
    from memclaims.core.names import BUILT_IN_WORKLOADS
    from memclaims.workloads.registry import WORKLOADS

    assert sorted(BUILT_IN_WORKLOADS) == sorted(WORKLOADS)


# --- the rules of ARCHITECTURE.md ----------------------------------------------------------------


def test_every_import_goes_the_way_the_subpackages_table_allows(package_graph: dict[str, set[str]]) -> None:
    wrong = wrong_way(package_graph)
    assert wrong == [], ("imports against ARCHITECTURE.md's table (a subpackage imports only those its row "
                         "names; move the code down or the import up): " + "; ".join(wrong))


def test_the_longest_import_chain_lazy_imports_counted_is_at_most_max_layers(package_graph: dict[str, set[str]]) -> None:
    graph = package_graph
    deepest = max(layers(graph).values())
    assert deepest <= MAX_LAYERS, (f"{deepest} layers deep, ARCHITECTURE.md allows {MAX_LAYERS}: "
                                   + " -> ".join(deepest_chain(graph)))


def test_the_table_only_allows_imports_of_lower_subpackages() -> None:
    """The direction: a row may name only groups listed before it (so no rule allows a cycle)."""
    assert set(MAY_IMPORT) == set(ORDER)
    for name, allowed in MAY_IMPORT.items():
        assert all(ORDER.index(below) < ORDER.index(name) for below in allowed), (name, sorted(allowed))


def test_architecture_md_states_the_rules_the_test_holds() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    stated = re.search(r"at most\s+(\d+)\s+layers", text)
    assert stated and int(stated.group(1)) == MAX_LAYERS, "ARCHITECTURE.md and fixtures/import_graph.py disagree on the depth"
    rows = [row.split("|")[1].strip().strip("`").removesuffix(".py").rstrip("/")
            for row in text.splitlines() if row.startswith("| `")]
    assert tuple(rows) == ORDER, "the table's rows, bottom to top, are fixtures/import_graph.py's ORDER"


def test_architecture_md_names_only_modules_and_paths_that_exist() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    known = modules(PACKAGE)
    dotted = set(re.findall(r"`(memclaims(?:\.\w+)+)", text))
    missing = sorted(name for name in dotted
                     if name not in known and name.rpartition(".")[0] not in known  # a module's attribute
                     and not name.endswith(".*"))
    assert dotted and missing == [], f"ARCHITECTURE.md names modules that do not exist: {missing}"
    gone = []
    for line in text.splitlines():
        # A file of a table row is its subpackage's (`techniques.py` in core/'s row); elsewhere a path is
        # the checkout's or the package's (`scripts/import-layers`, `measure/runner.py`).
        row = re.match(r"\| `(\w+)/` \|", line)
        for path in re.findall(r"`((?:[\w-]+/)+[\w.-]*|[\w-]+\.py)`", line):
            bases = [PACKAGE / row.group(1)] if row and "/" not in path else [ROOT, PACKAGE]
            if not any((base / path).exists() for base in bases):
                gone.append(path)
    assert gone == [], f"ARCHITECTURE.md names files that do not exist: {sorted(set(gone))}"


def test_a_wrong_way_import_inside_a_function_breaks_the_rule(tmp_path: Path) -> None:
    _write(tmp_path, {
        "memclaims/__init__.py": "",
        "memclaims/core/__init__.py": "",
        "memclaims/core/record.py": "def build():\n    from memclaims.report import html_report\n",
        "memclaims/report/__init__.py": "",
        "memclaims/report/html_report.py": "import memclaims.core.record\n",
    })
    graph = import_graph(tmp_path / "memclaims")
    assert wrong_way(graph) == ["memclaims.core.record -> memclaims.report", "memclaims.core.record -> memclaims.report.html_report"]
    assert cycles(graph) == [["memclaims.core.record", "memclaims.report.html_report", "memclaims.core.record"]]


def test_depth_counts_lazy_imports_and_skips_type_checking_and_main(tmp_path: Path) -> None:
    package = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.d\n"
                    "def f():\n    import pkg.b\n",
        "pkg/b.py": "from pkg import c\n",
        "pkg/c.py": "",
        "pkg/d.py": "if __name__ == '__main__':\n    import pkg.a\n",
    })
    graph = import_graph(package)
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.d"] == set()
    assert layers(graph)["pkg.a"] == 3  # pkg.a -> pkg.b -> pkg.c (and pkg, its __init__): the lazy import counts
    assert deepest_chain(graph)[:2] == ["pkg.a", "pkg.b"]
    assert group("pkg.sim.replay") == "sim" and group("pkg") == "core"


# --- what the prose says: ARCHITECTURE.md's table and sentences, each subpackage's __init__ --------------
# Pure parsing (fixtures/stated_architecture.py): a moved module, a new import rule or a renamed class fails here
# until the docs say so.


def test_the_tables_may_import_column_is_the_rule_the_test_holds() -> None:
    stated = table_may_import((ROOT / "ARCHITECTURE.md").read_text())
    assert set(stated) == set(ORDER)
    differ = {name: (sorted(stated[name]), sorted(MAY_IMPORT[name])) for name in ORDER if stated[name] != MAY_IMPORT[name]}
    assert differ == {}, f"ARCHITECTURE.md's 'may import' column (stated, held by fixtures/import_graph.py): {differ}"


def test_every_subpackages_init_says_what_the_table_allows_it() -> None:
    differ = {}
    for name in ORDER:
        init = PACKAGE / name / "__init__.py"
        if not init.exists():  # run.py, cli.py: modules, not subpackages
            continue
        stated = init_may_import(ast.get_docstring(ast.parse(init.read_text())) or "", name)
        if stated is None or stated - {name} != MAY_IMPORT[name]:
            differ[f"memclaims/{name}/__init__.py"] = (sorted(stated or ()), sorted(MAY_IMPORT[name]))
    assert differ == {}, f"'May import' lines (stated, ARCHITECTURE.md's table): {differ}"


@pytest.mark.parametrize(("statement", "speaker", "allowed"), [
    ("nothing of memclaims", "core", set()),
    ("`core` at import time; torch and `techniques/impl/` inside hooks; never an engine", "techniques", {"core"}),
    ("everything below `run` and `run`, `baselines`, `claims`", "report", {*ORDER[:ORDER.index("run")], "run",
                                                                          "baselines", "claims"}),
    ("every other subpackage.", "pytest", set(ORDER[:ORDER.index("pytest")])),
    ("``core`` only: a verdict on Records needs no engine", "baselines", {"core"}),
    ("``core``, ``workloads`` (and ``sim`` for its types). Callers go through ``memclaims.run``", "measure",
     {"core", "workloads"}),
])
def test_a_may_import_statement_reads_as_the_groups_it_names(statement: str, speaker: str, allowed: set[str]) -> None:
    assert allowed_groups(statement, speaker) == allowed


def test_a_may_import_statement_naming_no_group_is_an_error() -> None:
    with pytest.raises(ValueError, match="'measures' .* is no group"):
        allowed_groups("`core` and `measures`", "sim")
    assert init_may_import("The facts.\n\nImports nothing.", "core") is None


def test_type_only_imports_go_against_the_table_only_where_architecture_md_says() -> None:
    """``if TYPE_CHECKING:`` imports are outside the layering rule (ARCHITECTURE.md says why); against the table
    they may go only from techniques to recipes and workloads, never to an engine."""
    allowed = {name: MAY_IMPORT[name] | TYPE_ONLY_MAY_IMPORT.get(name, frozenset()) for name in MAY_IMPORT}
    wrong = wrong_way(type_only_imports(PACKAGE), allowed)
    assert wrong == [], f"type-only imports ARCHITECTURE.md does not allow (name what you use as a Protocol): {wrong}"
    assert not {"measure", "sim", "run"} & set().union(*TYPE_ONLY_MAY_IMPORT.values())


def test_a_type_only_import_of_an_engine_is_caught(tmp_path: Path) -> None:
    _write(tmp_path, {
        "memclaims/__init__.py": "",
        "memclaims/techniques/__init__.py": "",
        "memclaims/techniques/offload.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                           "    from memclaims.sim.tracker import DeviceMemory\n"
                                           "    from memclaims.recipes.recipe import Recipe\n",
        "memclaims/sim/__init__.py": "", "memclaims/sim/tracker.py": "",
        "memclaims/recipes/__init__.py": "", "memclaims/recipes/recipe.py": "",
    })
    found = type_only_imports(tmp_path / "memclaims")
    assert found["memclaims.techniques.offload"] == {"memclaims.sim.tracker", "memclaims.recipes.recipe"}
    allowed = {name: MAY_IMPORT[name] | TYPE_ONLY_MAY_IMPORT.get(name, frozenset()) for name in MAY_IMPORT}
    assert wrong_way(found, allowed) == ["memclaims.techniques.offload -> memclaims.sim.tracker"]


def test_architecture_md_states_todays_deepest_chain(package_graph: dict[str, set[str]]) -> None:
    """The chain it names is one of the graph's (each module imports the next) and as deep as the graph."""
    chain = stated_chain((ROOT / "ARCHITECTURE.md").read_text())
    graph = package_graph
    assert len(chain) > 2, "ARCHITECTURE.md names no deepest chain ('The deepest chain today: `a` -> `b` ...')"
    broken = [f"{a} -> {b}" for a, b in zip(chain, chain[1:]) if b not in graph.get(a, set())]
    assert broken == [], f"ARCHITECTURE.md's deepest chain has links the graph lacks: {broken}"
    assert len(chain) == max(layers(graph).values()), (
        f"ARCHITECTURE.md's deepest chain is {len(chain)} modules, the graph's {max(layers(graph).values())}: "
        + " -> ".join(deepest_chain(graph)))


def test_architecture_md_names_only_classes_attributes_and_names_that_exist() -> None:
    """``path.py``'s ``Name`` is defined in that module; ``Class.attribute`` is a member of a memclaims class of that
    name (or of its bases)."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    gone = [f"{path}'s {name}" for path, name in module_names(text)
            if name not in top_level_names(next(p for p in (PACKAGE / path, ROOT / path) if p.exists()))]
    members = class_members(PACKAGE)
    gone += [f"{cls}.{attribute}" for cls, attribute in class_attributes(text)
             if cls in members and attribute not in members[cls]]
    unknown = sorted({cls for cls, _ in class_attributes(text)} - set(members))
    assert module_names(text) and class_attributes(text)
    assert gone == [] and unknown == [], f"ARCHITECTURE.md names what memclaims does not define: {gone + unknown}"



def test_a_named_function_or_method_is_read_called_and_across_a_line_break() -> None:
    text = "made by `techniques/base.py`'s\n  `observations(name, ...)`, read through `Record.observed(technique, key)`"
    assert module_names(text) == [("techniques/base.py", "observations")]
    assert class_attributes(text) == [("Record", "observed")]

# --- the engines' two boundaries (issue #25) -------------------------------------------------------

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


def test_the_claims_import_no_engine(package_graph: dict[str, set[str]]) -> None:
    """Not directly, not through anything they import (a lazy import counts)."""
    graph = package_graph
    claims = [name for name in graph if name == "memclaims.claims" or name.startswith("memclaims.claims.")]
    assert claims
    for name in claims:
        engines = sorted(t for t in reachable(graph, name) if any(t == e or t.startswith(f"{e}.") for e in ENGINES))
        assert engines == [], f"{name} imports {engines}: a check reads Records its caller measured (memclaims.claims.lookup)"
