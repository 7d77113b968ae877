"""What a person needs to diagnose a memory regression without rerunning the case.

On a memory failure the baseline check saves, under the artifacts folder, one file per case:
``<case>.breakdown.json`` (the per-category breakdown now and in the baseline, and the failing
metrics) and, for CUDA runs whose probe recorded the allocator's history, ``<case>.snapshot.pickle``
(open it at https://pytorch.org/memory_viz), captured right after that recipe's measured steps. The
history is bounded by ``max_entries`` and the file by ``snapshot_max_bytes``.

Everything CUDA-specific goes through an injectable ``cuda`` object (``torch.cuda`` by default),
as in CudaProbe, so that the logic is tested with a fake on machines without a GPU.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from memclaims.core.record import CATEGORIES, Record

# How many allocator events CudaProbe.prepare asks torch to keep (0: history off). A process-wide
# setting because the runner builds its probe itself; the pytest plugin sets it per session.
_history_entries = 0


def set_history_entries(entries: int) -> None:
    global _history_entries
    _history_entries = max(0, int(entries))


def history_entries() -> int:
    return _history_entries


# Whether each history event keeps its stack trace (what memory_viz shows) or only the address,
# size and stream (what memclaims.gpu.alloc_trace replays, a small fraction of the bytes).
_history_stacks = True


def set_history_stacks(keep: bool) -> None:
    global _history_stacks
    _history_stacks = keep


def case_file_stem(case_id: str) -> str:
    """A file name from a case id: ``gpu:vit-article/bf16-true`` -> ``gpu-vit-article-bf16-true``."""
    return re.sub(r"[/:\[\]\\\s]+", "-", case_id).strip("-.") or "case"


# Snapshots are taken when a recipe runs, not when its baseline is checked: the record cache runs
# each recipe once and checks baselines later, after other recipes ran, so the allocator's history
# at check time belongs to another case. ``capture_snapshot`` keeps one file per recipe here until a
# failing check copies it beside the breakdown; the plugin points this at a per-session folder.
_snapshot_dir: Path | None = None
DEFAULT_SNAPSHOT_MAX_BYTES = 50 * 10**6  # decimal MB; the history's entries are bounded separately
_snapshot_max_bytes = DEFAULT_SNAPSHOT_MAX_BYTES


def set_snapshot_dir(directory: Path | None) -> None:
    global _snapshot_dir
    _snapshot_dir = directory


def snapshot_dir() -> Path | None:
    return _snapshot_dir


def set_snapshot_max_bytes(limit: int) -> None:
    global _snapshot_max_bytes
    _snapshot_max_bytes = max(1, int(limit))


def snapshot_max_bytes() -> int:
    return _snapshot_max_bytes


def recipe_snapshot(recipe_id: str) -> Path | None:
    """The snapshot captured when ``recipe_id`` ran in this session, if any."""
    if _snapshot_dir is None:
        return None
    path = _snapshot_dir / f"{case_file_stem(recipe_id)}.snapshot.pickle"
    return path if path.is_file() else None


def bounded_snapshot(snapshot: dict[str, Any], max_bytes: int) -> bytes:
    """``snapshot`` pickled in at most ``max_bytes``: the oldest trace entries go first (the peak is
    at the end of the measured steps), then the stack frames; what was dropped is recorded in it."""
    import pickle

    data = pickle.dumps(snapshot)
    traces = snapshot.get("device_traces") or []
    keep = max((len(t) for t in traces), default=0)
    while len(data) > max_bytes and keep > 0:
        keep //= 2
        snapshot = {**snapshot, "device_traces": [t[len(t) - keep:] if keep else [] for t in traces],
                    "memclaims_truncated": f"kept the last {keep} events per device to stay under {max_bytes} B"}
        data = pickle.dumps(snapshot)
    if len(data) > max_bytes:
        segments = [{**seg, "blocks": [{k: v for k, v in b.items() if k != "frames"} for b in seg.get("blocks", [])]}
                    for seg in snapshot.get("segments", [])]
        snapshot = {**snapshot, "segments": segments,
                    "memclaims_truncated": f"no events and no stack frames, to stay under {max_bytes} B"}
        data = pickle.dumps(snapshot)
    return data


def capture_snapshot(cuda: Any, recipe_id: str) -> Path | None:
    """Save the allocator's state and recent history for ``recipe_id``, bounded in bytes; None when
    history is off or no folder is set (outside a pytest session)."""
    if _history_entries <= 0 or _snapshot_dir is None:
        return None
    _snapshot_dir.mkdir(parents=True, exist_ok=True)
    path = _snapshot_dir / f"{case_file_stem(recipe_id)}.snapshot.pickle"
    partial = path.with_suffix(".part")
    partial.write_bytes(bounded_snapshot(cuda.memory._snapshot(), _snapshot_max_bytes))
    partial.replace(path)
    return path


def start_history(cuda: Any, max_entries: int) -> None:
    """Record the allocator's history from now on, dropping what earlier cases recorded."""
    cuda.memory._record_memory_history(enabled=None)
    if _history_stacks:
        cuda.memory._record_memory_history(max_entries=max_entries)
    else:
        cuda.memory._record_memory_history(max_entries=max_entries, context=None)


def breakdown_report(case_id: str, record: Record, baseline: Record,
                     failing_metrics: Iterable[str]) -> dict[str, object]:
    categories = [c for c in CATEGORIES] + sorted((set(record.breakdown) | set(baseline.breakdown)) - set(CATEGORIES))
    rows = {}
    for category in categories:
        now, before = record.breakdown.get(category), baseline.breakdown.get(category)
        change = None if now is None or before is None else now - before
        rows[category] = {"baseline_bytes": before, "now_bytes": now, "change_bytes": change}
    return {
        "case": case_id,
        "recipe": record.recipe,
        "device": record.device,
        "failing_metrics": sorted(failing_metrics),
        "peak_allocated_bytes": {"baseline": baseline.peak_allocated_bytes, "now": record.peak_allocated_bytes},
        "peak_reserved_bytes": {"baseline": baseline.peak_reserved_bytes, "now": record.peak_reserved_bytes},
        "breakdown": rows,
        "versions": {"baseline": baseline.versions, "now": record.versions},
    }


def save_memory_failure(directory: Path, case_id: str, record: Record, baseline: Record,
                        failing_metrics: Iterable[str], cuda: object = None) -> list[Path]:
    """Save the breakdown JSON (always) and the CUDA snapshot (CUDA runs with history on)."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = case_file_stem(case_id)
    saved = [directory / f"{stem}.breakdown.json"]
    report = breakdown_report(case_id, record, baseline, failing_metrics)
    saved[0].write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    captured = recipe_snapshot(record.recipe) if record.device == "cuda" else None
    if captured is not None:  # taken when this recipe ran; never the history of whatever ran last
        import shutil

        snapshot = directory / f"{stem}.snapshot.pickle"
        shutil.copyfile(captured, snapshot)
        saved.append(snapshot)
    return saved
