"""Under pytest-xdist with several workers, GPU cases refuse to share one device."""

from __future__ import annotations

import json

import pytest

from fixtures.paths import ROOT
from memclaims.pytest.testing import CHECKOUT_CONFTEST, make_project

pytest_plugins = ["pytester"]

# The generated suite pretends to have a GPU (in every worker: the conftest runs there too), so
# the guard is exercised on this CPU-only machine; the gpu case itself does not touch CUDA.
CONFTEST = CHECKOUT_CONFTEST + """
def pytest_configure(config):
    import memclaims.pytest.plugin as plugin
    plugin.gpu_available = lambda: True
"""
TESTS = """
import pytest

@pytest.mark.gpu
def test_on_gpu():
    pass

@pytest.mark.cpu
def test_on_cpu():
    pass
"""


@pytest.fixture
def tiny(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """Its tests require pytest-xdist (``requires(packages="xdist")``)."""
    make_project(pytester, ROOT, conftest=CONFTEST).makepyfile(test_tiny=TESTS)
    # A subprocess run: xdist workers must import the project, so it goes on PYTHONPATH.
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    return pytester


def _run(tiny: pytest.Pytester, *args: str) -> pytest.RunResult:
    result = tiny.runpytest_subprocess("-p", "no:cacheprovider", "-p", "xdist", *args, timeout=120)
    # xdist installed but no workers is not "cannot check": the guard went unexercised, so fail.
    assert "gw0" in result.stdout.str() or "created:" in result.stdout.str(), (
        f"xdist could not start workers here:\n{result.stdout.str()[-500:]}")
    return result


@pytest.mark.slow  # two nested xdist sessions
@pytest.mark.requires(packages="xdist")
def test_gpu_case_fails_at_setup_with_two_workers(tiny: pytest.Pytester) -> None:
    result = _run(tiny, "-n", "2", "-rE")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*ERROR at setup of test_on_gpu*", "GPU cases share one device: run "
                                 "`pytest -m gpu` without -n, or with -n 0 / -n 1*"])


# Each test adds what a baseline check and a case out of memory add, in whichever worker runs it.
REPORTING = """
import pytest
from memclaims.core.errors import OutOfMemory
from memclaims.pytest.plugin import note_out_of_memory, summary

@pytest.mark.parametrize("n", range(4))
def test_case(request, n):
    summary(request.config).add_note(f"case-{n}", "no baseline", "env-x")
    if n == 3:
        note_out_of_memory(request.config, "case-3", OutOfMemory("r", "cpu", "forward", 1234, "too big"))
"""


@pytest.mark.slow  # two nested xdist sessions
@pytest.mark.requires(packages="xdist")
def test_the_controller_prints_every_workers_comparisons(tiny: pytest.Pytester) -> None:
    tiny.makepyfile(test_reporting=REPORTING)
    result = _run(tiny, "-n", "2", "test_reporting.py", "--memclaims-summary-json", "summary.json")
    result.assert_outcomes(passed=4)
    out = result.stdout.str()
    assert all(f"case-{n}" in out for n in range(4)), out[-2000:]
    assert "case-3  phase forward  requested 1,234 B" in out
    data = json.loads((tiny.path / "summary.json").read_text())
    assert sorted(row["case"] for row in data["rows"]) == [f"case-{n}" for n in range(4)]
    assert [entry["case"] for entry in data["out_of_memory"]] == ["case-3"]
    assert data["outcomes"] == {"passed": 4}  # the controller counts its workers' tests once each


class _Item:
    """Just what the hook reads of a pytest.Item."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def get_closest_marker(self, name: str) -> object:
        return object() if name == self.marker else None


@pytest.mark.parametrize(("marker", "worker", "count", "gpu", "refused"), [
    ("gpu", "gw0", "2", True, True),
    ("gpu", "gw1", "8", True, True),
    ("gpu", "gw0", "1", True, False),   # -n 1: one worker owns the device
    ("gpu", None, None, True, False),   # no xdist
    ("gpu", "gw0", "2", False, False),  # no GPU: the case skips with its own reason instead
    ("cpu", "gw0", "2", True, False),   # CPU cases run in parallel freely
])
def test_guard_decision(monkeypatch: pytest.MonkeyPatch, marker: str, worker: str | None, count: str | None,
                        gpu: bool, refused: bool) -> None:
    from memclaims.pytest import plugin as pytest_plugin

    for name, value in (("PYTEST_XDIST_WORKER", worker), ("PYTEST_XDIST_WORKER_COUNT", count)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.setattr(pytest_plugin, "gpu_available", lambda: gpu)
    if refused:
        with pytest.raises(pytest.fail.Exception, match="GPU cases share one device"):
            pytest_plugin.pytest_runtest_setup(_Item(marker))  # type: ignore[arg-type]
    else:
        pytest_plugin.pytest_runtest_setup(_Item(marker))  # type: ignore[arg-type]


# --- the Records an xdist session's workers share (memclaims.pytest.records.RecordCache._once) ------------


def test_workers_asking_for_one_record_at_once_measure_it_once(tmp_path) -> None:
    """Two workers (threads here: each opens the lock itself, as a process does) ask for the same key; the second
    waits for the first's measurement and reads it, equal to the byte; another key is measured on its own."""
    import threading
    import time

    from memclaims.pytest.records import RecordCache
    from memclaims.pytest.testing import fake_record

    measured: list[str] = []

    def measure(name: str) -> object:
        measured.append(name)
        time.sleep(0.3)  # long enough for the other worker to ask meanwhile
        return fake_record(f"vit-smoke/{name}", peak_allocated_bytes=12345)

    workers = [RecordCache(None, shared=tmp_path) for _ in range(2)]  # type: ignore[arg-type]
    got: list[object] = []
    threads = [threading.Thread(target=lambda cache=cache: got.append(cache._once(("cpu", "r"), lambda: measure("r"))))
               for cache in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert measured == ["r"] and got[0] == got[1] and got[0].peak_allocated_bytes == 12345  # type: ignore[attr-defined]
    workers[1]._once(("sim", "r"), lambda: measure("r-sim"))
    assert measured == ["r", "r-sim"]


def test_a_measurement_that_raises_stores_nothing_and_no_xdist_shares_nothing(tmp_path) -> None:
    from memclaims.core.errors import MemclaimsError
    from memclaims.pytest.records import RecordCache, shared_folder
    from memclaims.pytest.testing import fake_record

    cache = RecordCache(None, shared=tmp_path)  # type: ignore[arg-type]

    def broken() -> object:
        raise MemclaimsError("out of luck")

    with pytest.raises(MemclaimsError):
        cache._once(("cpu", "r"), broken)  # type: ignore[arg-type]
    assert cache._once(("cpu", "r"), lambda: fake_record("vit-smoke/again")).recipe == "vit-smoke/again"

    class Request:  # what shared_folder reads of a fixture request, without xdist
        config = object()

    assert shared_folder(Request()) is None  # type: ignore[arg-type]


def test_a_memory_only_reader_takes_the_full_record_another_worker_stored(tmp_path, monkeypatch) -> None:
    """``memory`` reads the full Record another worker measured (issue #51: the same recipe trained again on the
    other core was CI's waste) instead of training the recipe without evaluation."""
    from types import SimpleNamespace

    import memclaims.pytest.records as records
    from memclaims.pytest.records import RecordCache
    from memclaims.pytest.testing import fake_record

    recipe = SimpleNamespace(id="vit-smoke/fabric")
    RecordCache(None, shared=tmp_path)._once(("cpu", recipe.id), lambda: fake_record(recipe.id))  # type: ignore[arg-type]
    monkeypatch.setattr(records, "run_recipe", lambda *args: pytest.fail("measured again"))
    other = RecordCache(None, shared=tmp_path)  # type: ignore[arg-type]
    assert other.memory("cpu", recipe).recipe == recipe.id  # type: ignore[arg-type]


def test_a_memory_only_reader_takes_the_whole_record_the_session_reads_anyway(monkeypatch) -> None:
    """``memory`` of a recipe a selected test reads whole (``full_asked``: a matrix case, a claim's lookup) measures
    the whole Record once, whichever reader comes first (issue #51: the same recipe trained twice, without and then
    with its accuracy phase); a recipe nobody reads whole still trains without evaluation."""
    from types import SimpleNamespace

    import memclaims.pytest.records as records
    from memclaims.pytest.records import RecordCache
    from memclaims.pytest.testing import fake_record

    runs: list[tuple[str, bool]] = []

    def run_recipe(recipe: SimpleNamespace, options: object) -> tuple[object]:
        runs.append((recipe.id, options.evaluate))  # type: ignore[attr-defined]
        return (fake_record(recipe.id),)

    monkeypatch.setattr(records, "run_recipe", run_recipe)
    monkeypatch.setattr(records, "settings", lambda config: SimpleNamespace(
        steps=2, accuracy_epochs=1, data_dir=None, accuracy_full_epochs=None))
    whole, apart = (SimpleNamespace(id=name, scale=SimpleNamespace(plateau=False))
                    for name in ("vit-smoke/fabric", "vit-smoke/sgd"))
    cache = RecordCache(None, full_asked=frozenset({("cpu", whole.id)}))  # type: ignore[arg-type]
    assert cache.memory("cpu", whole) is cache.get("cpu", whole)  # type: ignore[arg-type]
    cache.memory("cpu", apart)  # type: ignore[arg-type]
    assert runs == [(whole.id, True), (apart.id, False)]


def test_the_session_knows_the_records_its_selected_tests_read_whole(pytester: pytest.Pytester) -> None:
    """``pytest_collection_finish`` stashes the matrix's selected cpu cases (not the sim's, not a deselected one) and
    the Records a claim's check looks up."""
    from memclaims.pytest.records import FULL_ASKED

    make_project(pytester, ROOT).makepyfile(
        test_memclaims="from memclaims.pytest.cases import test_case  # noqa\n",
        test_claims="""
import pytest
from memclaims.claims.catalogue import CLAIMS

@pytest.mark.parametrize(("tier", "claim"), [("cpu", c) for c in CLAIMS if c.name == "small-batch-memory"])
def test_claim(tier, claim, record_cache):
    pass
""")
    items, recorder = pytester.inline_genitems("--memclaims-matrix", "singles", "-k", "not cpu:vit-smoke/sgd]")
    asked = items[0].config.stash[FULL_ASKED]
    assert ("cpu", "vit-smoke/bf16-true") in asked and ("cpu", "vit-smoke/fabric") in asked
    assert ("cpu", "vit-smoke/sgd") not in asked  # deselected by -k
    assert not any(tier == "sim" for tier, _ in asked)
    assert ("cpu", "vit-smoke/bf16-true+small-batch") in asked  # the claim's, no single case's
