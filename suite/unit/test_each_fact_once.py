"""Facts defined once (issue #25, item 5), with a check where a copy could creep back: the memory
categories are core.record's constants, and the article's chain is techniques.technique_registry.CHAIN."""

from __future__ import annotations

import ast

from fixtures.paths import PACKAGE
from memclaims.core.record import CATEGORIES
from memclaims.techniques import technique_registry as registry


def _modules_outside_core() -> list[tuple[str, ast.Module]]:
    return [(path.relative_to(PACKAGE).as_posix(), ast.parse(path.read_text()))
            for path in sorted(PACKAGE.rglob("*.py"))
            if path.relative_to(PACKAGE).parts[0] != "core" and path.relative_to(PACKAGE).as_posix() != "techniques/technique_registry.py"]


def category_literals(tree: ast.Module) -> list[str]:
    """Each string constant equal to a memory category name (a dict key, a subscript, an argument:
    anywhere but a docstring, where prose may name one), as ``line: name``."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    return [f"{node.lineno}: {node.value}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in CATEGORIES and id(node) not in docstrings]


def test_the_check_finds_a_spelled_category() -> None:
    tree = ast.parse('"""parameters"""\nmemory.tag(p, "parameters")\nbreakdown["gradients"]\nPARAMETERS\n"params"\n')
    assert category_literals(tree) == ["2: parameters", "3: gradients"]


def test_no_module_outside_core_spells_a_memory_category() -> None:
    found = {name: hits for name, tree in _modules_outside_core() if (hits := category_literals(tree))}
    assert found == {}, f"name a memory category with memclaims.core.record's constants: {found}"


def test_only_core_composes_the_article_chain() -> None:
    """``((REFERENCE,), *ARTICLE_CHAIN)`` was written out in five modules; they import CHAIN."""
    found = {name: [f"{n.lineno}: {ast.unparse(n)}" for n in ast.walk(tree)
                    if isinstance(n, ast.Starred) and "ARTICLE_CHAIN" in ast.unparse(n)]
             for name, tree in _modules_outside_core()}
    assert {name: hits for name, hits in found.items() if hits} == {}, "import techniques.technique_registry.CHAIN"
    assert registry.CHAIN == ((registry.REFERENCE,), *registry.ARTICLE_CHAIN)


def test_reproduce_lists_row_01_and_the_chain() -> None:
    from memclaims.report.reproduce import CHAIN_ROWS

    assert tuple(techniques for _, _, techniques, _ in CHAIN_ROWS) == (("pytorch",), *registry.CHAIN)
    assert [row for row, *_ in CHAIN_ROWS] == ["01", "01-2", "02", "03", "04", "05", "06"]
