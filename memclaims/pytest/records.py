"""The ``record_cache`` fixture: every recipe runs once per tier; cases and claims share its Record.

Part of memclaims' pytest plugin (registered by ``memclaims.pytest.plugin`` once the environment
preflight has passed: importing it imports the training stack).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from memclaims.claims.catalogue import Claim, skip_reason
from memclaims.claims.lookup import Key, Lookup, load_only, recipe_of
from memclaims.core.errors import MemclaimsError, OutOfMemory
from memclaims.core.library_eras import profile_name
from memclaims.core.names import sim_tier_profile, tier_device
from memclaims.core.record import Record
from memclaims.measure.host import keep_heap_frozen
from memclaims.pytest.plugin import note_out_of_memory, resolve, settings, tier_scale
from memclaims.recipes import requirements
from memclaims.recipes.recipe import Recipe
from memclaims.recipes.run_options import RunOptions
from memclaims.run import model_parameters, needs, run_recipe

# The xdist group of the tests that read the cpu tier's converged Records (test_accuracy.py's cases,
# test_claims.py's accuracy claims): under ``--dist loadgroup`` (pytest.ini) one worker runs them all
# and its RecordCache measures each Record once instead of once per worker.
CPU_CONVERGED_GROUP = "cpu-converged"

# The (tier, recipe id) keys whose whole Record (the accuracy phase included) this session's selected tests read:
# the technique matrix's cases and the claims' lookups, known once collection is done (``pytest_collection_finish``).
FULL_ASKED = pytest.StashKey[frozenset[tuple[str, str]]]()


@dataclass
class RecordCache:
    config: pytest.Config
    records: dict[tuple[str, str], Record] = field(default_factory=dict)
    failures: dict[tuple[str, str], str] = field(default_factory=dict)
    # Under xdist, a folder the session's workers share (``shared_folder``): a Record one worker measured, the
    # others read instead of measuring it again; None without xdist.
    shared: Path | None = None
    # What the session's tests read whole (``FULL_ASKED``): a memory reader of one of these takes the whole Record
    # instead of training the recipe a second time without its accuracy phase.
    full_asked: frozenset[tuple[str, str]] = frozenset()

    def options(self, tier: str) -> RunOptions:
        chosen = settings(self.config)
        return RunOptions(device=tier_device(tier),
                          memory_steps=chosen.steps,
                          accuracy_epochs=chosen.accuracy_epochs, data_dir=chosen.data_dir,
                          accuracy_full_epochs=chosen.accuracy_full_epochs)

    def recipe(self, tier: str, workload: str, techniques: tuple[str, ...], scale: str | None = None) -> Recipe:
        """The recipe at ``scale``, or at the tier's scale (``tier_scale``)."""
        return resolve(workload, scale or tier_scale(self.config, tier, workload), techniques, self.config)

    def get(self, tier: str, recipe: Recipe, load_only: bool = False) -> Record:
        """The recipe's Record, run on first use. What the machine lacks was decided at collection
        (the case's ``requires`` marker, memclaims.recipes.requirements): here a missing need is an error.
        ``load_only``: the sim's load-only replay of the recipe (RunOptions.load_only), another Record."""
        key = (tier, f"{recipe.id} (load only)" if load_only else recipe.id)
        if key in self.failures:
            pytest.fail(f"{recipe.id} failed earlier in this session: {self.failures[key]}", pytrace=False)
        if key not in self.records:
            try:
                self.records[key] = self._once(key, lambda: self._measure(tier, recipe, load_only=load_only))
            except MemclaimsError as error:
                self.failures[key] = str(error)
                if isinstance(error, OutOfMemory):  # a result for the end-of-run summary, not a crash
                    note_out_of_memory(self.config, f"{tier}:{recipe.id}", error)
                    raise pytest.fail.Exception(str(error), pytrace=False) from None
                raise
        return self.records[key]


    def memory(self, tier: str, recipe: Recipe) -> Record:
        """The recipe's measured steps only (no accuracy phase): the session's full Record where one
        ran or where a selected test will read it (``full_asked``: measured once, whichever reader comes first),
        else a run without evaluation, kept for the session. For comparisons of memory phases
        (activation checkpointing against the same recipe without it) at a fraction of a case's time."""
        full = self.records.get((tier, recipe.id)) or self._measured_by_another_worker((tier, recipe.id))
        if full is not None or tier == "sim" or (tier, recipe.id) in self.full_asked:
            return full or self.get(tier, recipe)
        key = (tier, f"{recipe.id} (memory only)")
        if key not in self.records:
            self.records[key] = self._once(key, lambda: _run(recipe, replace(self.options(tier), evaluate=False)))
        return self.records[key]

    def _shared_path(self, key: tuple[str, str]) -> Path | None:
        return None if self.shared is None else self.shared / hashlib.sha256(repr(key).encode()).hexdigest()[:32]

    def _measured_by_another_worker(self, key: tuple[str, str]) -> Record | None:
        """The Record another worker of this session has already stored for ``key`` (``_once``), or None: a
        memory-only reader takes the full Record a worker measured instead of training the recipe again."""
        path = self._shared_path(key)
        if path is None or not path.exists():  # whole or absent (``_once`` renames it into place)
            return None
        record: Record = pickle.loads(path.read_bytes())
        self.records[key] = record
        return record

    def _once(self, key: tuple[str, str], measure: Callable[[], Record]) -> Record:
        """``measure()``, or, under xdist, the Record another worker of this session measured for ``key``: the
        first worker to ask measures it, holding the key's lock, and stores it; a worker asking meanwhile waits
        for it instead of measuring the same recipe on the other core (a session measures each Record once, as
        without xdist). A measurement that raises stores nothing: the next worker to ask measures it itself."""
        path = self._shared_path(key)
        if path is None:
            return measure()
        with open(path.with_suffix(".lock"), "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # released when the file closes
            if path.exists():
                record: Record = pickle.loads(path.read_bytes())
                return record
            record = measure()
            temp = path.with_suffix(f".{os.getpid()}.tmp")
            temp.write_bytes(pickle.dumps(record))
            temp.replace(path)  # whole or absent, never half-written
            return record

    def lookup(self, tier: str, claim: Claim) -> Lookup:
        """What ``claim``'s check reads on ``tier`` (memclaims.claims.lookup): each key's Record, measured
        once this session at the claim's workload and scale (the tier's unless the check names one)."""
        scale = (claim.check.scale_on(tier) if claim.check else None) or tier_scale(self.config, tier, claim.workload)

        def record(key: Key) -> Record:
            return self.get(tier, recipe_of(key, claim.workload, scale), load_only=load_only(key))

        return Lookup(record, model_parameters)

    def _measure(self, tier: str, recipe: Recipe, seed: int | None = None, load_only: bool = False) -> Record:
        if tier == "sim":
            chosen = settings(self.config)  # the profile, with the older releases --memclaims-era names
            profile = profile_name(sim_tier_profile(recipe.workload.name, chosen.sim_profile), chosen.era)
            return run_recipe(recipe, RunOptions(device="sim", profile=profile,
                                              memory_steps=chosen.steps,
                                              load_only=load_only))[0]
        options = self.options(tier)
        if recipe.scale.plateau:  # a fixed task and schedule: its baselines mean the same everywhere
            options = RunOptions(device=options.device)
        return _run(recipe, options if seed is None else replace(options, seed=seed))


def _run(recipe: Recipe, options: RunOptions) -> Record:
    """A real run's Record, the heap frozen first (``memclaims.measure.host.keep_heap_frozen``): the run's collections
    at its phase boundaries scan only what the run makes, not the session's whole heap (a session of this repository's
    3,000 tests holds about 700,000 objects: 0.27 CPU s a collection, four a run)."""
    keep_heap_frozen()
    return run_recipe(recipe, options)[0]

    def accuracy_at(self, tier: str, recipe: Recipe, seed: int) -> float:
        """The recipe's accuracy at another seed (memclaims.baselines.noise reruns a case with its stored seeds)."""
        accuracy = self._measure(tier, recipe, seed).accuracy
        if accuracy is None:
            raise MemclaimsError(f"{recipe.id} measured no accuracy at seed {seed}")
        return accuracy


@pytest.fixture(scope="session")
def record_cache(request: pytest.FixtureRequest) -> RecordCache:
    """Yields the session's RecordCache: ``recipe(tier, workload, techniques)`` resolves a recipe at
    the tier's scale, ``get(tier, recipe)`` runs it on first use and returns its Record.

    Session scope: a recipe trains once per tier, however many cases and claims read it (a claim
    compares Records of the same session); a recipe that failed fails its later readers with the
    first error instead of running again, and one the machine cannot run skips with the reason. Under xdist
    the session's workers share what they measured (``RecordCache._once``).
    """
    return RecordCache(request.config, shared=shared_folder(request),
                       full_asked=request.config.stash.get(FULL_ASKED, frozenset()))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Stashes ``FULL_ASKED``: the whole Records the selected tests (after -m, -k and the skips at collection) read
    through ``record_cache``: each technique-matrix case's recipe (``memclaims.pytest.cases.test_case``) and the
    Records each claim's check looks up (a case parametrized with ``tier`` and ``claim``). Under xdist every worker
    collects every item, so each knows what the session as a whole reads, whichever worker runs it."""
    from memclaims.pytest.cases import test_case
    from memclaims.pytest.plugin import selected_workload

    config = session.config
    asked: set[tuple[str, str]] = set()
    cache = RecordCache(config)
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        tier = params.get("tier")
        if not isinstance(tier, str) or tier == "sim" or "record_cache" not in getattr(item, "fixturenames", ()):
            continue  # the sim's Records have no accuracy phase (``memory`` reads them whole anyway)
        if item.get_closest_marker("skip") is not None:
            continue  # never runs: reads nothing
        claim = params.get("claim")
        try:
            if getattr(item, "obj", None) is test_case:
                asked.add((tier, cache.recipe(tier, selected_workload(config), params["techniques"]).id))
            elif isinstance(claim, Claim) and claim.check is not None and skip_reason(claim, tier) is None:
                scale = claim.check.scale_on(tier) or tier_scale(config, tier, claim.workload)
                asked.update((tier, recipe_of(key, claim.workload, scale).id)
                             for key in claim.check.recipes_on(tier) if not load_only(key))
        except MemclaimsError:
            continue  # the test itself reports a recipe it cannot resolve
    config.stash[FULL_ASKED] = frozenset(asked)


def shared_folder(request: pytest.FixtureRequest) -> Path | None:
    """The folder an xdist session's workers share Records in, or None outside xdist. Each worker's basetemp is
    ``popen-gwN`` in the controller's (pytest-xdist's own recipe for a session fixture run once); without xdist
    the parent of basetemp is shared by every session on the machine, so it is not used."""
    if not hasattr(request.config, "workerinput"):
        return None
    folder: Path = request.getfixturevalue("tmp_path_factory").getbasetemp().parent / "memclaims-records"
    folder.mkdir(exist_ok=True)
    return folder


def claim_needs(claim: Claim, tier: str) -> requirements.Needs:
    """What checking ``claim`` on ``tier`` needs (memclaims.recipes.requirements): the catalogue's reason
    where the tier does not check it (data: no machine changes it), else the tier's device and what
    every Record the check looks up needs (memclaims.run.needs: bitsandbytes for an 8-bit recipe, the
    sim's replay)."""
    why_not = skip_reason(claim, tier)
    if why_not:
        return requirements.Needs(unsupported=(why_not,))
    result = requirements.Needs(cuda_devices=1 if tier_device(tier) == "cuda" else 0)
    if claim.check is None:
        return result
    # Any valid scale: needs do not depend on size.
    scale = claim.check.scale_on(tier) or ("smoke" if tier == "cpu" else "article")
    for key in claim.check.recipes_on(tier):
        result |= needs(recipe_of(key, claim.workload, scale), tier)
    return result
