"""No import cycles among memclaims' modules, counting every import statement (function-local ones
too: a lazy import only postpones a cycle; not those under ``if TYPE_CHECKING:``, never run), and
``from package import name`` as an import of the package, whose ``__init__`` must then be complete."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def modules(package: Path) -> dict[str, Path]:
    """Dotted name -> file of every module of ``package`` (a folder under some sys.path root)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges: set[str] = set()
    tree = ast.parse(path.read_text())
    for guard in ast.walk(tree):
        if isinstance(guard, ast.If) and isinstance(guard.test, ast.Name) and guard.test.id == "TYPE_CHECKING":
            guard.body = []  # annotations only (as scripts/import-layers): never imported at run time
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            edges.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if base in known:
                edges.add(base)
            edges.update(f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known)
    edges.discard(name)
    return edges


def import_graph(package: Path) -> dict[str, set[str]]:
    known = modules(package)
    return {name: _imported(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component, as the modules along it (first repeated last)."""
    found: list[list[str]] = []
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        # Modules reachable from start, and those from which start is reachable: its component.
        component = _reachable(graph, start) & _reachable(_reversed(graph), start)
        done |= component
        if len(component) > 1:
            found.append(_path_back(graph, start, component))
    return found


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = {start}, [start]
    while todo:
        for target in graph[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def _reversed(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    back: dict[str, set[str]] = {name: set() for name in graph}
    for source, targets in graph.items():
        for target in targets:
            back[target].add(source)
    return back


def _path_back(graph: dict[str, set[str]], start: str, component: set[str]) -> list[str]:
    """The shortest import chain from ``start`` back to itself inside its component."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node] & component):
                if target == start:
                    chain = [node]
                    while chain[-1] != start:
                        chain.append(previous[chain[-1]])
                    return [*reversed(chain), start]
                if target not in previous:
                    previous[target] = node
                    following.append(target)
        frontier = following
    raise AssertionError(f"{start} is in no cycle")


def test_memclaims_has_no_import_cycles() -> None:
    found = cycles(import_graph(ROOT / "memclaims"))
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
