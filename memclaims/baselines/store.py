"""The baseline store: measured Records per (environment id, recipe id), as reviewable JSON.

A rank of a multi-device run is stored under ``recipe@devices/rankN`` (``Record.baseline_key``).

One file per environment, ``<root>/measured/<environment>.json``::

    {"schema": 2, "environment": "cpu-x86_64",
     "records": {"vit-smoke/bf16-true": {"record": {...Record...}, "tolerances": {...}}}}

Schema 2 (issue #51): what a technique observed lives in its part of the Record, ``by_technique``; schema 1 kept
some of it in flat fields (``memclaims.core.record.RETIRED_FIELDS``). A schema 1 file is read through the Record's
migration (``memclaims.core.record.migrate``: each flat field moved into its technique's part), so every stored
baseline stays comparable; the first update of the file writes it whole as schema 2, its other records moved the
same way and otherwise as stored. memclaims before schema 2 refuses a schema 2 file ("newer than this memclaims reads").

Library versions live inside each record (``Record.versions``), not in the key: an upgrade must
compare against the numbers measured before it, and the message says which versions changed.
Writes are atomic (temp file + ``os.replace``) and serialised between processes by an exclusive
``flock`` on a sidecar ``.lock`` file; a writer re-reads the file under the lock and merges only
its own recipe keys, so concurrent writers of different recipes never lose each other's work.
A file that cannot be trusted (corrupt, truncated, newer schema, wrong types) raises
BaselineError and is never rewritten: silently replacing it would hide the damage.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memclaims.core.environment import environment_id, family
from memclaims.core.errors import MemclaimsError
from memclaims.core.record import Record, migrate

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

    from memclaims.baselines.noise import Noise

SCHEMA = 2
TOLERANCE_SCHEMA = 1  # the tolerance file's own (memclaims.report.spread writes it)
OBTAINED = ".obtained"  # <environment>.obtained.json: a first run's Records, waiting for `baselines accept`

# Record fields a baseline must hold, with the JSON types they may take (bool is rejected for ints).
_INT = "int"
_INT_OR_NONE = "int|None"
_NUMBER_OR_NONE = "number|None"
_STR = "str"
REQUIRED_FIELDS: dict[str, str] = {
    "recipe": _STR,
    "device": _STR,
    "device_name": _STR,
    "param_bytes": _INT,
    "grad_bytes": _INT,
    "optimizer_state_bytes": _INT,
    "load_peak_bytes": _INT,
    "peak_allocated_bytes": _INT,
    "peak_reserved_bytes": _INT_OR_NONE,
    "accuracy": _NUMBER_OR_NONE,
    "step_time_s": _NUMBER_OR_NONE,
}


class BaselineError(MemclaimsError):
    """A baseline file that cannot be trusted; the message names the file and what is wrong."""


@dataclass
class Baseline:
    """One stored recipe: the Record as measured and its per-metric tolerance overrides."""

    record: Record
    tolerances: dict[str, float | None] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"record": _finite(self.record.to_dict()), "tolerances": dict(self.tolerances)}


def _finite(value: object) -> object:
    """NaN and inf are not JSON: store them as null (``nan_loss``/``nan_step`` keep the fact)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def _type_ok(value: object, kind: str) -> bool:
    is_int = isinstance(value, int) and not isinstance(value, bool)
    is_number = (is_int or isinstance(value, float)) and not (isinstance(value, float) and math.isnan(value))
    return {
        _INT: is_int,
        _INT_OR_NONE: value is None or is_int,
        _NUMBER_OR_NONE: value is None or is_number,
        _STR: isinstance(value, str),
    }[kind]


def _describe(value: object) -> str:
    return f"{type(value).__name__} {json.dumps(value)[:60]}"


def parse(text: str, path: Path, environment: str | None = None) -> dict[str, Baseline]:
    """Validate a baseline file's text; raise BaselineError naming ``path`` and the problem."""

    def bad(problem: str) -> BaselineError:
        return BaselineError(f"baseline file {path}: {problem}; fix or delete it, then rerun with "
                             f"--update-baselines (the file was left unchanged)")

    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise bad(f"not valid JSON ({error.msg} at line {error.lineno} column {error.colno}; "
                  f"truncated or corrupt?)") from None
    except RecursionError:  # json's decoder recurses once per nesting level
        raise bad("nested too deeply to be a baseline file (corrupt?)") from None
    if not isinstance(data, dict):
        raise bad(f"top level must be an object, found {_describe(data)}")
    schema = data.get("schema")
    if not isinstance(schema, int) or isinstance(schema, bool):
        raise bad(f"'schema' must be an integer, found {_describe(schema)}")
    if schema > SCHEMA:
        raise bad(f"schema {schema} is newer than this memclaims reads (schema {SCHEMA}); upgrade memclaims")
    if schema < 1:
        raise bad(f"unknown schema {schema}")
    env = data.get("environment")
    if not isinstance(env, str):
        raise bad(f"'environment' must be a string, found {_describe(env)}")
    if environment is not None and env != environment:
        raise bad(f"'environment' is {env!r} but the file name says {environment!r}")
    records = data.get("records")
    if not isinstance(records, dict):
        raise bad(f"'records' must be an object, found {_describe(records)}")
    out: dict[str, Baseline] = {}
    for recipe_id, entry in records.items():
        where = f"records[{recipe_id!r}]"
        if not isinstance(entry, dict):
            raise bad(f"{where} must be an object, found {_describe(entry)}")
        raw, tolerances = entry.get("record"), entry.get("tolerances", {})
        if not isinstance(raw, dict):
            raise bad(f"{where}.record must be an object, found {_describe(raw)}")
        for name, kind in REQUIRED_FIELDS.items():
            if name not in raw:
                raise bad(f"{where}.record lacks {name!r}")
            if not _type_ok(raw[name], kind):
                raise bad(f"{where}.record.{name} must be {kind}, found {_describe(raw[name])}")
        try:
            record = Record.from_dict(raw)
        except TypeError as error:  # a Record field without a default is missing
            raise bad(f"{where}.record is not a Record: {error}") from None
        if record.baseline_key != recipe_id:
            raise bad(f"{where}.record belongs under {record.baseline_key!r}, not the key it is stored under")
        versions = raw.get("versions", {})
        if not isinstance(versions, dict) or not all(v is None or isinstance(v, str) for v in versions.values()):
            raise bad(f"{where}.record.versions must map package names to version strings")
        if not isinstance(tolerances, dict) or not all(
                v is None or _type_ok(v, _NUMBER_OR_NONE) for v in tolerances.values()):
            raise bad(f"{where}.tolerances must map metric names to numbers (or null), found "
                      f"{_describe(tolerances)}")
        out[recipe_id] = Baseline(record=record, tolerances=dict(tolerances))
    return out


def dumps(environment: str, baselines: Mapping[str, Baseline | dict[str, object]]) -> str:
    """Sorted, indented JSON so that a reviewer can diff two versions of a baseline file; an entry given as
    a dict is written as it is (a record kept as the file stored it)."""
    data = {"schema": SCHEMA, "environment": environment,
            "records": {rid: entry if isinstance(entry, dict) else entry.to_json()
                        for rid, entry in sorted(baselines.items())}}
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"


class BaselineStore:
    """Measured baselines under ``root/measured``; ``root`` is the user's baseline folder
    (``--memclaims-baselines-dir``, default ``baselines/``). The measured accuracy tolerances are
    memclaims' own (the packaged ``tolerances.json``); ``tolerances`` names another copy (tests)."""

    def __init__(self, root: str | os.PathLike[str], tolerances: Traversable | None = None) -> None:
        self.root = Path(root)
        self.measured = self.root / "measured"
        self._cache: dict[str, dict[str, Baseline]] = {}
        self._tolerance_file = tolerances
        self._tolerances: dict[str, object] | None = None

    def path(self, environment: str) -> Path:
        return self.measured / f"{environment}.json"

    def load(self, environment: str, *, fresh: bool = False) -> dict[str, Baseline]:
        """Every baseline of an environment; empty when the file does not exist yet."""
        if fresh or environment not in self._cache:
            path = self.path(environment)
            try:
                text = path.read_text(encoding="utf-8")
            except (FileNotFoundError, NotADirectoryError):  # no file, or no folder (a path under a file)
                self._cache[environment] = {}
            except UnicodeDecodeError:
                raise BaselineError(f"baseline file {path}: not UTF-8 text (corrupt?); "
                                    f"the file was left unchanged") from None
            except OSError as error:  # unreadable: permissions, an I/O error
                raise BaselineError(f"baseline file {path}: cannot be read ({error.strerror or error}); "
                                    f"make it readable, or give --memclaims-baselines-dir another folder") from None
            else:
                self._cache[environment] = parse(text, path, environment)
        return self._cache[environment]

    def get(self, environment: str, recipe_id: str) -> Baseline | None:
        return self.load(environment).get(recipe_id)

    @contextmanager
    def _locked(self, environment: str) -> Iterator[None]:
        self.measured.mkdir(parents=True, exist_ok=True)
        # The lock file is never deleted: unlinking it while another process waits on it would
        # let two writers hold "the" lock on two different inodes.
        lock_path = self.path(environment).with_suffix(".json.lock")
        with open(lock_path, "a+") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    @staticmethod
    def temp_files(path: Path) -> list[Path]:
        """Temp files of ``path``'s writers (``.<name>.<random>.tmp``), in the same folder."""
        return sorted(path.parent.glob(f".{path.name}.*.tmp"))

    def _remove_stale_temps(self, path: Path) -> None:
        # Writers create temp files only while holding the lock, and remove them on any Python
        # exception (Ctrl-C included); one found by the lock holder is therefore left by a
        # writer that was killed (SIGKILL, power loss) and is safe to delete.
        for temp in self.temp_files(path):
            try:
                temp.unlink()
            except FileNotFoundError:
                pass

    def update(self, environment: str, updates: Mapping[str, Baseline]) -> None:
        """Store ``updates`` (recipe id -> Baseline), keeping every other recipe in the file."""
        path = self.path(environment)
        try:
            self._write(environment, path, updates)
        except OSError as error:  # a read-only or full folder, a path under a file: one line, not a traceback
            raise BaselineError(f"baseline file {path}: cannot be written ({error.strerror or error}: "
                                f"{error.filename or path}); make {self.measured} writable, or give "
                                f"--memclaims-baselines-dir a writable copy of {self.root}") from None

    def _write(self, environment: str, path: Path, updates: Mapping[str, Baseline]) -> None:
        with self._locked(environment):
            self._remove_stale_temps(path)
            current = dict(self.load(environment, fresh=True))  # raises, untouched, when corrupt
            current.update(updates)
            # The records not measured now stay as the file stored them (not re-serialized through today's
            # Record, which would add every field it has since gained, as null): an update changes what it
            # measured and nothing else.
            # A schema 1 file's records are moved to schema 2's form as they are (``migrate``), nothing else.
            stored: dict[str, Baseline | dict[str, object]] = {
                key: {**entry, "record": migrate(entry["record"])}
                for key, entry in (json.loads(path.read_text())["records"] if path.is_file() else {}).items()}
            stored.update(updates)
            text = dumps(environment, stored)
            # The name is chosen before the file exists, so a Ctrl-C at any point after it is
            # created finds it to remove (tempfile.mkstemp leaves a window where it does not).
            temp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
            try:
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    handle.write(text)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(temp, path)
            except BaseException:
                if os.path.exists(temp):
                    os.unlink(temp)
                raise
            self._cache[environment] = current

    def environments(self) -> list[str]:
        """Every environment with a baseline file (obtained files excluded)."""
        return sorted(p.stem for p in self.measured.glob("*.json") if not p.stem.endswith(OBTAINED))

    def find(self, record: Record, profile: str | None = None) -> tuple[Baseline, str] | None:
        """The record's baseline and the environment it was measured in.

        This machine's own class first; else the closest sibling class of the same family (another
        CPU capability class, another CUDA of the same GPU model), whose difference the
        comparison then states. None when neither has the recipe.
        """
        environment = environment_id(record, profile)
        own = self.get(environment, record.baseline_key)
        if own is not None:
            return own, environment
        tokens = set(environment.split("-"))
        siblings = [e for e in self.environments() if e != environment and family(e) == family(environment)]
        for sibling in sorted(siblings, key=lambda e: (-len(tokens & set(e.split("-"))), e)):
            found = self.get(sibling, record.baseline_key)
            if found is not None:
                return found, sibling
        return None

    def store_record(self, record: Record, tolerances: Mapping[str, float | None] | None = None,
                     profile: str | None = None, *, obtained: bool = False) -> Path:
        """Store one measured Record with its tolerance overrides (default: the stored ones);
        ``obtained`` writes to the environment's obtained file instead (see :meth:`accept`)."""
        environment = environment_id(record, profile)
        if tolerances is None:
            previous = self.load(environment, fresh=True).get(record.baseline_key)
            tolerances = previous.tolerances if previous else {}
        target = environment + OBTAINED if obtained else environment
        self.update(target, {record.baseline_key: Baseline(record=record, tolerances=overrides(record, tolerances))})
        return self.path(target)

    def accept(self, environment: str) -> tuple[Path, list[str]]:
        """Move the obtained Records of ``environment`` into its baseline file; returns the keys.

        The first run on a new machine measures everything and stores it as obtained; accepting
        it is a review step, not a rerun (the pytest-regressions pattern).
        """
        obtained_path = self.path(environment + OBTAINED)
        obtained = self.load(environment + OBTAINED, fresh=True)
        if not obtained:
            raise BaselineError(f"nothing to accept: {obtained_path} does not exist or holds no records; "
                                f"run the tier first (it writes the file when a case has no baseline)")
        self.update(environment, obtained)
        obtained_path.unlink()
        self._cache.pop(environment + OBTAINED, None)
        return self.path(environment), sorted(obtained)

    def tolerance_file(self) -> Traversable:
        """The measured noise this store judges with: the file it was given, else the user's own
        ``<root>/tolerances.json`` (``memclaims baselines spread --out``), else the packaged one."""
        from memclaims.core import packaged

        own = self.root / packaged.TOLERANCES
        found: Traversable = self._tolerance_file or (own if own.exists() else packaged.resource(packaged.TOLERANCES))
        return found

    def noise(self) -> Noise:
        """The measured noise of a numerics change (memclaims.baselines.noise), from :meth:`tolerance_file`."""
        from memclaims.baselines.noise import Noise

        data = self.tolerances()
        try:
            return Noise.from_json(data)
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise BaselineError(f"tolerance file {self.tolerance_file()}: not the measured noise memclaims writes "
                                f"({type(error).__name__}: {error}); measure it again with "
                                f"`memclaims baselines spread`") from None

    def tolerances(self) -> dict[str, object]:
        if self._tolerances is None:
            self._tolerances = read_tolerances(self.tolerance_file())
        return self._tolerances


def read_tolerances(path: Traversable) -> dict[str, Any]:
    """The one reader of a tolerance file (memclaims.report.spread writes it); empty when there is none."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BaselineError(f"tolerance file {path}: cannot be read ({error}); fix it or "
                            f"measure it again with `memclaims baselines spread`") from None
    if not isinstance(data, dict) or data.get("schema", TOLERANCE_SCHEMA) != TOLERANCE_SCHEMA:
        raise BaselineError(f"tolerance file {path}: expected an object with schema {TOLERANCE_SCHEMA}")
    return data


def overrides(record: Record, tolerances: Mapping[str, float | None]) -> dict[str, float | None]:
    """The tolerances that differ from the tier's defaults: only those are stored, so that changing
    a default in memclaims.baselines.compare reaches every existing baseline."""
    from memclaims.baselines.compare import default_tolerances

    defaults = default_tolerances(record.device)
    return {k: v for k, v in tolerances.items() if k not in defaults or defaults[k] != v}
