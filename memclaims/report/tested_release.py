"""Recording a release as tested: ``memclaims upgrade --record`` writes the packaged tested range.

The range is read in one place (memclaims.core.tested_versions) and written here only, after a
candidate stack ran the upgrade check against the committed baselines: each of its releases widens
its package's range, and the run is appended with what it moved. The file is written whole to a
temporary file beside it and then renamed over it, so it is never left half-written.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memclaims.core import packaged, tested_versions
from memclaims.core.errors import UsageError


def tested_file() -> Path:
    """The packaged tested_versions.json of a checkout; an installed wheel's is not ours to change."""
    path = Path(str(packaged.resource(packaged.TESTED_VERSIONS)))
    if not (path.parents[2] / "pyproject.toml").is_file() or not os.access(path, os.W_OK):
        raise UsageError(f"--record writes {path}, which is not in a writable checkout of memclaims; run it from "
                         "a clone (pip install -e .)")
    return path


def widened(data: dict[str, Any], stack: Mapping[str, str | None], result: str) -> dict[str, Any]:
    """``data`` (the file's JSON) with each release of ``stack`` inside its package's range and the run
    appended; a package not installed in the stack is left as it was."""
    packages = data["packages"]
    for package in tested_versions.PACKAGES:
        version = stack.get(package)
        release = tested_versions.release(version) if version else None
        if release is None:
            continue
        entry = packages.setdefault(package, {"lowest": version, "highest": version})
        if release < (tested_versions.release(entry["lowest"]) or release):
            entry["lowest"] = version
        if release > (tested_versions.release(entry["highest"]) or release):
            entry["highest"] = version
    run = {"stack": {p: stack.get(p) for p in tested_versions.PACKAGES}, "result": result}
    data["runs"] = [r for r in data.get("runs", []) if r.get("stack") != run["stack"]] + [run]
    return data


def record(stack: Mapping[str, str | None], result: str, path: Path | None = None) -> Path:
    """Write the widened range to ``path`` (default: the checkout's packaged file)."""
    path = path or tested_file()
    data = widened(json.loads(path.read_text(encoding="utf-8")), stack, result)
    # One line per run and per package, as the file is written by hand: a diff shows the run.
    packages = ",\n".join(f'    "{name}": {json.dumps(entry)}' for name, entry in data["packages"].items())
    runs = ",\n".join(f'    {{"stack": {json.dumps(r["stack"])},\n     "result": {json.dumps(r["result"])}}}'
                      for r in data["runs"])
    text = (f'{{\n  "schema": {data["schema"]},\n  "tested": {json.dumps(data["tested"])},\n'
            f'  "packages": {{\n{packages}\n  }},\n  "runs": [\n{runs}\n  ]\n}}\n')
    json.loads(text)  # what is written must read back
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(handle, "w", encoding="utf-8") as file:
        file.write(text)
    os.replace(temporary, path)
    if path == Path(str(packaged.resource(packaged.TESTED_VERSIONS))):
        tested_versions.table.cache_clear()  # this process reads the new range from now on
    return path
