"""Every name a test or fixture takes from memclaims exists: a rename in memclaims that breaks a nightly
test (deselected in CI, so nothing runs its body) fails CI here instead.

Collection already imports every test module, so a module-level ``from memclaims... import`` that broke
fails CI; what it does not see is a name used inside a test body: ``distributed._rank_main`` after the
function became ``rank_main`` (issue #52), an import inside a function, or ``monkeypatch.setattr(module,
"name", ...)`` on a name the module lost. This reads the suite's sources (no test runs) and resolves
each such reference on the installed memclaims. Hand-written: pytest collects, it does not resolve
attribute references of function bodies, and mypy checks memclaims/ only.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "suite").rglob("*.py"), *(ROOT / "fixtures").rglob("*.py")])
PACKAGE = "memclaims"


def _module(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _has(module: ModuleType, attribute: str) -> bool:
    return hasattr(module, attribute) or _module(f"{module.__name__}.{attribute}") is not None


def _module_names(tree: ast.AST) -> dict[str, str]:
    """The local names this file binds to memclaims modules (anywhere in it), by module path; a name the
    file also binds to anything else is left out (its attribute uses are not the module's)."""
    modules: dict[str, str] = {}
    other: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PACKAGE) and alias.asname:
                    modules[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE) and node.level == 0:
            for alias in node.names:
                path = f"{node.module}.{alias.name}"
                if _module(path) is not None:
                    modules[alias.asname or alias.name] = path
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.For, ast.With, ast.FunctionDef, ast.arg)):
            targets = (node.targets if isinstance(node, ast.Assign) else
                       [node.target] if isinstance(node, (ast.AnnAssign, ast.For)) else [])
            for target in targets:
                other.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            if isinstance(node, ast.arg):
                other.add(node.arg)
    return {name: path for name, path in modules.items() if name not in other}


def references(path: Path) -> Iterator[tuple[int, str, str]]:
    """(line, module path, attribute) of each name this file takes from a memclaims module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    modules = _module_names(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE) and node.level == 0:
            for alias in node.names:
                if alias.name != "*":
                    yield node.lineno, node.module or "", alias.name
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            yield node.lineno, modules[node.value.id], node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "setattr"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "monkeypatch" and node.args):
            target = node.args[0]
            if (isinstance(target, ast.Name) and target.id in modules and len(node.args) > 1
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
                yield node.lineno, modules[target.id], node.args[1].value
            elif (isinstance(target, ast.Constant) and isinstance(target.value, str)
                  and target.value.startswith(f"{PACKAGE}.")):
                owner, _, attribute = target.value.rpartition(".")
                yield node.lineno, owner, attribute


def unresolved(path: Path, root: Path = ROOT) -> list[str]:
    missing = []
    for line, owner, attribute in references(path):
        module = _module(owner)
        where = f"{path.relative_to(root)}:{line}"
        if module is None:
            missing.append(f"{where}: no module {owner}")
        elif not _has(module, attribute):
            missing.append(f"{where}: {owner} has no {attribute}")
    return missing


def test_every_name_the_suite_takes_from_memclaims_exists() -> None:
    missing = [problem for path in SOURCES for problem in unresolved(path)]
    assert missing == [], "\n".join(missing)


@pytest.mark.parametrize("use", [
    "from memclaims.measure import distributed\n\ndef test():\n    distributed._gone(1)\n",
    "def test():\n    from memclaims.measure.distributed import _gone\n",
    "from memclaims.measure import distributed\n\ndef test(monkeypatch):\n"
    "    monkeypatch.setattr(distributed, '_gone', None)\n",
    "def test(monkeypatch):\n    monkeypatch.setattr('memclaims.measure.distributed._gone', None)\n",
    "import memclaims.measure.distributed as d\n\ndef test():\n    d._gone()\n",
], ids=["attribute", "import-in-body", "setattr", "setattr-dotted", "import-as"])
def test_a_name_a_test_body_uses_that_memclaims_lost_is_named(use: str, tmp_path: Path) -> None:
    test = tmp_path / "test_nightly.py"
    test.write_text(use)
    assert unresolved(test, tmp_path) == [
        f"test_nightly.py:{use.count(chr(10), 0, use.index('_gone')) + 1}: memclaims.measure.distributed has no _gone"]
    test.write_text(use.replace("_gone", "rank_main"))
    assert unresolved(test, tmp_path) == []
