"""The published numbers and claims: ``published.json`` holds the two seed documents' logged tables,
``sources/<document>.json`` one file per source with its claims (packaged, ``memclaims/resources/``).

Everything that quotes a source (claims, reproduce, named recipes) reads it here; ``data()`` is both
in one object, each claim with the ``document`` its file names.
A claim's numbers are written in the file either as literals (what only the text says: "20x",
"1/4") or as references ``@section/row/field`` to the logged tables, so no number is stored twice.
A row of a list is named by its ``script`` (``@vit_chain/02_mixed-precision/peak_reserved_gb``)
or by its position (``@vit_h14_series/rows/0/peak_reserved_gb``).
"""

from __future__ import annotations

import json
from functools import cache
from typing import TYPE_CHECKING, Any

from memclaims.core import names
from memclaims.core.errors import DataError, UsageError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

PUBLISHED_SCHEMA = 1
TIERS: tuple[str, ...] = names.TIERS  # the tiers a claim names
KINDS = ("memory", "ratio", "accuracy", "time", "count")
# Where a number is printed (names.py's contract): the seed document's text, only the article's
# logs.md, read off a figure, or derived (arithmetic, or a measurement of ours). In this order: a
# claim whose numbers come from several places names them in it.
SOURCE_KINDS = ("text", "logs", "figure", "derived")


@cache
def data() -> dict[str, Any]:
    """The tables of ``published.json`` with every source's claims (``claims``, in the files' name
    order) and the sources themselves (``sources``: document -> title and where it is published);
    schemas checked, a bad file named."""
    from memclaims.core import packaged

    tables = load_published(packaged.resource(packaged.PUBLISHED))
    files = sorted((f for f in packaged.resource(packaged.SOURCES).iterdir() if f.name.endswith(".json")),
                   key=lambda f: f.name)
    return {**tables, **merge_sources([load_source(f) for f in files])}


def merge_sources(loaded: list[tuple[str, dict[str, Any]]]) -> dict[str, object]:
    """``claims`` (each with its ``document``) and ``sources`` from the loaded source files (``(file
    name, content)``); a claim id in two files is a DataError naming both."""
    claims: list[dict[str, object]] = []
    sources: dict[str, dict[str, str]] = {}
    seen: dict[str, str] = {}
    for name, source in loaded:
        document = source["document"]
        sources[document] = {"title": source["title"], "where": source["where"]}
        for entry in source["claims"]:
            if entry["id"] in seen:
                raise DataError(f"claim {entry['id']!r} is in both {seen[entry['id']]} and {name}: "
                                "keep it in the file of the source it quotes")
            seen[entry["id"]] = name
            claims.append({**entry, "document": document})
    return {"claims": claims, "sources": sources}


def documents() -> dict[str, dict[str, str]]:
    """Every source memclaims quotes: document name -> ``title`` and ``where``."""
    return dict(data()["sources"])


def lookup(reference: str, source: dict[str, object] | None = None) -> Any:
    """The value at ``@section/row/field`` (``row`` a script name or an index)."""
    if not reference.startswith("@"):
        raise UsageError(f"not a published reference: {reference!r} (expected @section/row/field)")
    node: object = source if source is not None else data()
    for part in reference[1:].split("/"):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list):
            matches = [row for row in node if isinstance(row, dict) and row.get("script") == part]
            if matches:
                node = matches[0]
            elif part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise UsageError(f"published reference {reference!r}: no row {part!r}")
        else:
            raise UsageError(f"published reference {reference!r}: no key {part!r}")
    return node


def resolve(value: object, source: dict[str, object] | None = None) -> Any:
    return lookup(value, source) if isinstance(value, str) and value.startswith("@") else value


def row(section: str, script: str) -> dict[str, Any]:
    """One logged run (``row('vit_chain', '03_bfloat16')``)."""
    logged: dict[str, Any] = lookup(f"@{section}/{script}")  # a row of a logged table is an object
    return logged


def chain_row(techniques: tuple[str, ...]) -> dict[str, Any]:
    """The logged ViT chain row (``vit_chain``) whose recipe is ``techniques``: its script and numbers."""
    rows: list[dict[str, Any]] = data()["vit_chain"]
    for entry in rows:
        if set(entry["techniques"]) == set(techniques) and entry.get("peak_reserved_gb") is not None:
            return entry
    raise UsageError(f"no logged vit_chain row runs {'+'.join(techniques)}; "
                     f"logged: {', '.join(r['script'] for r in rows if r.get('peak_reserved_gb') is not None)}")


def claims() -> list[dict[str, Any]]:
    return list(data()["claims"])


def claim(claim_id: str) -> dict[str, Any]:
    entries: list[dict[str, object]] = data()["claims"]
    for entry in entries:
        if entry["id"] == claim_id:
            return entry
    raise UsageError(f"unknown claim {claim_id!r}; valid: {', '.join(c['id'] for c in data()['claims'])}")


def numbers(claim_id: str) -> dict[str, Any]:
    """The claim's published numbers, references resolved."""
    return {key: resolve(value) for key, value in claim(claim_id)["published"].items()}


def printed(claim_id: str) -> dict[str, str]:
    """Where each of the claim's numbers is printed (``SOURCE_KINDS``): a reference's from the file's
    ``printed`` table, a literal's from the claim's own ``printed``; a claim without numbers names
    where its phrase is printed (key ``phrase``). A number with no kind is missing from the result
    (``memclaims.claims.catalogue.coverage_problems`` names it)."""
    entry = claim(claim_id)
    table: dict[str, str] = data().get("printed", {})
    own: dict[str, str] = entry.get("printed", {})
    kinds = {key: table[value] if isinstance(value, str) and value.startswith("@") and value in table else own.get(key)
             for key, value in entry["published"].items()}
    if "phrase" in own:
        kinds["phrase"] = own["phrase"]
    return {key: kind for key, kind in kinds.items() if kind is not None}


def load_published(path: Traversable) -> dict[str, object]:
    """The article's published numbers (the packaged ``published.json``), schema checked."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise DataError(f"published numbers {path}: cannot be read ({error})") from None
    if not isinstance(data, dict) or data.get("schema") != PUBLISHED_SCHEMA:
        raise DataError(f"published numbers {path}: expected an object with schema {PUBLISHED_SCHEMA}")
    return data


def load_source(path: Traversable) -> tuple[str, dict[str, object]]:
    """One source's file (``sources/<document>.json``): its name and content, schema checked."""
    try:
        source = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise DataError(f"claims source {path}: cannot be read ({error})") from None
    required = ("document", "title", "where", "claims")
    if not isinstance(source, dict) or source.get("schema") != PUBLISHED_SCHEMA or \
            any(key not in source for key in required):
        raise DataError(f"claims source {path}: expected an object with schema {PUBLISHED_SCHEMA} and "
                        f"{', '.join(required)}")
    if f"{source['document']}.json" != path.name:
        raise DataError(f"claims source {path}: its document is {source['document']!r}; "
                        f"name the file {source['document']}.json")
    return path.name, source
