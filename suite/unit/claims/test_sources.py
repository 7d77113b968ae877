"""Where each published number is printed (published.json's ``printed``), audited against the seeds.

The seed documents (the article's translation, the course's slides) are not part of the repository;
``seed_numbers.json`` beside this file holds every number their text prints, as
``numbers_in`` extracts them, so that CI checks each "text" kind against the seeds' own numbers.
Where the seeds are present (``MEMCLAIMS_SEEDS`` names their folder),
``test_seed_numbers_file_is_what_the_seeds_print`` re-extracts them: the file is never edited by hand.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from memclaims.claims.catalogue import CLAIMS, CLAIMS_BY_NAME, coverage_problems
from memclaims.core import published

HERE = Path(__file__).resolve().parent
NUMBERS_FILE = HERE / "seed_numbers.json"
SEED_FILES = {"article": "000_425a50867436967d.txt", "course": "002_6c88420d5ef986ac.txt"}
NUMBER = re.compile(r"(?<![\d.])(\d[\d,]*(?:\.\d+)?)(?:\s*/\s*(\d+))?")


def numbers_in(text: str) -> list[float]:
    """Every number the text prints (thousands separators dropped), and each fraction a/b's value."""
    found: set[float] = set()
    for whole, denominator in NUMBER.findall(text):
        value = float(whole.replace(",", "")) if whole.replace(",", "").replace(".", "").isdigit() else None
        if value is None:
            continue
        found.add(value)
        if denominator and float(denominator):
            found.add(round(value / float(denominator), 4))
            found.add(float(denominator))
    return sorted(found)


def seeds_dir() -> Path | None:
    return Path(os.environ["MEMCLAIMS_SEEDS"]) if "MEMCLAIMS_SEEDS" in os.environ else None


def printed_numbers(document: str) -> list[float]:
    data: dict[str, list[float]] = json.loads(NUMBERS_FILE.read_text())
    return data[document]


def in_text(value: float, numbers: list[float]) -> bool:
    """``value`` as the text prints it: itself, as a percentage (0.75 <- '75 %'), or a fraction's value."""
    return any(abs(n - value) <= 1e-4 * max(1.0, abs(value)) or abs(n - 100 * value) <= 1e-6 for n in numbers)


def _seeds_here() -> bool:
    folder = seeds_dir()
    return folder is not None and all((folder / name).is_file() for name in SEED_FILES.values())


@pytest.mark.requires(**({} if _seeds_here() else {"unsupported": (
    "the seed documents are not on this machine: set MEMCLAIMS_SEEDS to the folder holding "
    f"{', '.join(SEED_FILES.values())}",)}))
def test_seed_numbers_file_is_what_the_seeds_print() -> None:
    folder = seeds_dir()
    assert folder is not None
    extracted = {doc: numbers_in((folder / name).read_text(encoding="utf-8")) for doc, name in SEED_FILES.items()}
    assert extracted == json.loads(NUMBERS_FILE.read_text()), (
        f"{NUMBERS_FILE.name} is not what the seeds print: regenerate it with numbers_in()")


def test_the_extraction_reads_separators_decimals_and_fractions() -> None:
    assert numbers_in("65,783,042 params; 26.84 GB; reduced to 2/3; Batch 0000/0703") == sorted(
        {65783042.0, 26.84, 2.0, 3.0, 0.6667, 0.0, 703.0})  # 0000/0703: 0, 703 and their quotient 0


# Numbers of logs.md or a figure that the text prints for something else (checked by hand, each once).
COINCIDENCES = {
    "@multi_gpu/11_delay-allocation/peak_reserved_gb": "6.03 GB is printed for 09 (offload), not for 11",
    "@vit_h14_series/rows/2/peak_reserved_gb": "the text's 9 counts techniques ('9 つの方法'), not GB",
}


def _document(reference: str) -> str:
    return "course" if reference.startswith("@adam8bit/") else "article"


def _numbers_and_kinds() -> list[tuple[str, str, float, str]]:
    """(document, name, value, kind) of every numeric published number: the table's references, then
    each claim's literals."""
    found = [(_document(ref), ref, float(published.lookup(ref)), kind) for ref, kind in published.data()["printed"].items()
             if isinstance(published.lookup(ref), (int, float))]
    for claim in CLAIMS:
        own = published.claim(claim.name).get("printed", {})
        found += [(claim.document, f"{claim.name}/{key}", float(value), own[key])
                  for key, value in published.claim(claim.name)["published"].items()
                  if isinstance(value, (int, float)) and key in own]
    return found


NUMBERS = _numbers_and_kinds()


@pytest.mark.parametrize(("document", "name", "value", "kind"), NUMBERS, ids=[n[1] for n in NUMBERS])
def test_a_text_number_is_printed_in_the_seed_text_and_no_other_is(document: str, name: str, value: float,
                                                                    kind: str) -> None:
    """'text' means the seed's text prints the number; a number it prints is not filed as logs or figure.
    (Before #26 the catalogue said "text" or "both" for 19 claims whose numbers only logs.md holds,
    e.g. grad-accum-memory's 3.91 GB.)"""
    numbers = printed_numbers(document)
    if kind == "text":
        assert in_text(value, numbers), f"{name} = {value} is filed as printed in the {document}'s text, which does not print it"
    elif kind in ("logs", "figure") and name not in COINCIDENCES:
        assert not in_text(value, numbers), f"{name} = {value} is filed as {kind}, but the {document}'s text prints it"


def test_every_number_has_a_source_kind_and_a_missing_one_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    assert coverage_problems() == []
    table = dict(published.data()["printed"])
    del table["@vit_chain/05_gradient-accum/peak_reserved_gb"]
    monkeypatch.setitem(published.data(), "printed", table)
    import dataclasses

    import memclaims.claims.catalogue as catalogue

    rebuilt = tuple(dataclasses.replace(c, printed=published.printed(c.name)) for c in CLAIMS)
    monkeypatch.setattr(catalogue, "CLAIMS", rebuilt)
    problems = catalogue.coverage_problems()
    assert "grad-accum-memory: no source kind (printed) for accum_gb" in problems
    assert "sgd-memory: no source kind (printed) for adam_gb" in problems


def test_every_printed_reference_is_a_published_number() -> None:
    for reference, kind in published.data()["printed"].items():
        assert kind in published.SOURCE_KINDS, reference
        assert published.lookup(reference) is not None, reference


SCRIPT = re.compile(r"\b(0[1-9](?:-2)?(?:_0[1-3])?|1[01])\b")


def _scripts_read(claim_id: str) -> set[str]:
    refs = [v for v in published.claim(claim_id)["published"].values() if isinstance(v, str) and v.startswith("@")]
    return {ref.split("/")[1] for ref in refs}


READS_ROWS = [c.name for c in CLAIMS if SCRIPT.search(c.source) and _scripts_read(c.name) - {"(derived)"}]


@pytest.mark.parametrize("claim", READS_ROWS)
def test_the_scripts_a_claim_names_are_the_rows_it_reads(claim: str) -> None:
    """A claim's 'where' names the scripts whose rows it compares (init-module-load named 07_03 and read
    07_02 before #26)."""
    named = set(SCRIPT.findall(CLAIMS_BY_NAME[claim].source))
    read = _scripts_read(claim)
    for script in named:
        assert any(row == script or row.startswith(f"{script}_") for row in read), (
            f"{claim}: names {script} but reads {sorted(read)}")


def test_the_init_module_load_row_is_07_03() -> None:
    """The 0.65 GB load was printed by 07_03_init-module.py (with init_module); in the repository 07_02 is
    Fabric 16-true without it."""
    row = published.row("model_loading", "07_03")
    assert row["techniques"] == ["16-true", "init-module"] and row["load_peak_reserved_gb"] == 0.65
    assert published.claim("init-module-load")["published"]["init_module_gb"] == "@model_loading/07_03/load_peak_reserved_gb"
    assert [r["script"] for r in published.data()["model_loading"]] == ["07_01", "07_03", "(derived)"]


def test_sgd_two_thirds_states_both_readings() -> None:
    from fixtures.claim_worlds import lookup_of, world

    detail = CLAIMS_BY_NAME["sgd-two-thirds"].check.run("cpu", lookup_of(world("cpu"))).detail  # type: ignore[union-attr]
    assert "reading 'cut by 2/3' (asserted): cut 0.6667" in detail, detail
    assert "reading 'reduced to 2/3' (the seed's literal wording, not asserted): SGD keeps 0.3333, that reading does not hold" in detail
    assert "2/3 に削減" in published.claim("sgd-two-thirds")["note"]



def _docstring_of(where: str) -> str | None:
    """The installed torch's docstring of the object a pytorch-docs claim's ``where`` names
    ("PyTorch docs: torch.autograd.graph.save_on_cpu ..."), whitespace collapsed."""
    import importlib

    match = re.match(r"PyTorch docs: (torch(?:\.\w+)+)", where)
    if match is None:
        return None
    module_name, _, attribute = match.group(1).rpartition(".")
    doc = getattr(importlib.import_module(module_name), attribute).__doc__ or ""
    return " ".join(doc.split())


# Quotes of PyTorch's notes pages (docs/source/notes/*.rst) ship in no wheel: they cannot be read here.
DOCSTRING_CLAIMS = [c for c in CLAIMS if c.document == "pytorch-docs" and not c.source.startswith("PyTorch docs: CUDA semantics")]


def test_only_notes_pages_are_exempt_from_the_docstring_check() -> None:
    exempt = {c.name for c in CLAIMS if c.document == "pytorch-docs"} - {c.name for c in DOCSTRING_CLAIMS}
    assert exempt == {"expandable-segments-fewer-slivers"}
    assert "docs/source/notes/cuda.rst" in published.claim("expandable-segments-fewer-slivers")["where"]


@pytest.mark.parametrize("claim", DOCSTRING_CLAIMS, ids=lambda c: c.name)
def test_pytorch_docs_phrases_are_the_installed_docstrings_words(claim) -> None:
    """A quote from PyTorch's docs is the installed torch's docstring, word for word."""
    doc = _docstring_of(published.claim(claim.name)["where"])
    assert doc is not None, f"{claim.name}: 'where' names no torch object"
    assert " ".join(claim.statement.split()) in doc, f"{claim.name}: {claim.statement!r} is not in the docstring"


def test_fully_shard_quote_is_read_from_fully_shards_own_docstring() -> None:
    """The FSDP2 claim's ``where`` resolves to ``torch.distributed.fsdp.fully_shard`` (FSDP2's entry point, not
    FSDP1's FullyShardedDataParallel), whose reshard_after_forward paragraph the phrase quotes."""
    from torch.distributed.fsdp import fully_shard

    doc = _docstring_of(published.claim("fsdp2-no-reshard-keeps-unsharded")["where"])
    assert doc == " ".join((fully_shard.__doc__ or "").split()) and "reshard_after_forward" in doc
