"""What a person needs to diagnose a memory regression without rerunning the case.

On a memory failure the baseline check saves, under the artifacts folder, one file per case:
``<case>.breakdown.json`` (the per-category breakdown now and in the baseline, and the failing
metrics) and, for CUDA runs whose probe recorded the allocator's history, ``<case>.snapshot.pickle``
(open it at https://pytorch.org/memory_viz). The history is bounded by ``max_entries`` so that a
snapshot stays a few tens of MB at article scale.

Everything CUDA-specific goes through an injectable ``cuda`` object (``torch.cuda`` by default),
as in CudaProbe, so that the logic is tested with a fake on machines without a GPU.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterable

from memclaims.record import Record

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations_and_temporaries")
DEFAULT_HISTORY_ENTRIES = 100_000

# How many allocator events CudaProbe.prepare asks torch to keep (0: history off). A process-wide
# setting because the runner builds its probe itself; the pytest plugin sets it per session.
_history_entries = 0


def set_history_entries(entries: int) -> None:
    global _history_entries
    _history_entries = max(0, int(entries))


def history_entries() -> int:
    return _history_entries


def case_file_stem(case_id: str) -> str:
    """A file name from a case id: ``gpu:vit-article/bf16-true`` -> ``gpu-vit-article-bf16-true``."""
    return re.sub(r"[/:\[\]\\\s]+", "-", case_id).strip("-.") or "case"


def start_history(cuda: Any, max_entries: int) -> None:
    """Record the allocator's history from now on, dropping what earlier cases recorded."""
    cuda.memory._record_memory_history(enabled=None)
    cuda.memory._record_memory_history(max_entries=max_entries)


def breakdown_report(case_id: str, record: Record, baseline: Record,
                     failing_metrics: Iterable[str]) -> dict[str, Any]:
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
                        failing_metrics: Iterable[str], cuda: Any = None) -> list[Path]:
    """Save the breakdown JSON (always) and the CUDA snapshot (CUDA runs with history on)."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = case_file_stem(case_id)
    saved = [directory / f"{stem}.breakdown.json"]
    report = breakdown_report(case_id, record, baseline, failing_metrics)
    saved[0].write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    if record.device == "cuda" and history_entries() > 0:
        if cuda is None:
            import torch

            cuda = torch.cuda
        snapshot = directory / f"{stem}.snapshot.pickle"
        cuda.memory._dump_snapshot(str(snapshot))
        saved.append(snapshot)
    return saved
