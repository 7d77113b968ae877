"""A GPU's allocation history replayed through the sim's allocator model, request by request.

The sim's reserved figure rests on two reconstructions: the stream of requests (fake-tensor
dispatch) and the caching allocator's rules (``memclaims.sim.allocator``). A GPU's allocator history
(``torch.cuda.memory._record_memory_history``) holds the real stream and, beside each request, the
segment the real allocator created for it, if any. Replaying that stream through the model tests
the rules alone: where model and GPU first disagree about creating a segment, a rule differs; where
they agree throughout but the sim's own prediction does not match the GPU, the stream does.
torch's ``_memory_viz`` draws such histories but replays nothing, so this is written here.

Traces are kept as gzipped JSON (``memclaims-alloc-trace/1``): the four actions that change memory,
without stack frames, small enough to travel back from a lent GPU.
"""

from __future__ import annotations

import gzip
import json
import sys
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memclaims.core.errors import UsageError
from memclaims.sim.allocator import AllocatorConfig, CachingAllocator, TraceEvent

FORMAT = "memclaims-alloc-trace/1"
# The history's actions that change device memory; "free_requested" is followed by "free_completed"
# once the block's streams are done with it, and only then can the block be reused.
ACTIONS = ("segment_alloc", "segment_free", "alloc", "free_completed")


def from_snapshot(snapshot: dict[str, object], device: int = 0) -> list[TraceEvent]:
    """The memory-changing events of ``torch.cuda.memory._snapshot()``'s history for ``device``."""
    traces = snapshot.get("device_traces")
    if not isinstance(traces, list) or device >= len(traces):
        raise UsageError(f"the snapshot has no allocator history for device {device}: record it with "
                         "torch.cuda.memory._record_memory_history() before the run")
    if any(e.get("action") in ("segment_map", "segment_unmap") for e in traces[device]):
        raise UsageError("the snapshot's history maps expandable segments (PYTORCH_CUDA_ALLOC_CONF="
                         "expandable_segments:True); a history's replay follows the default allocator's segments "
                         "(the sim's expandable-segments replay predicts the peaks of such a run)")
    return [TraceEvent(e["action"], int(e["addr"]), int(e["size"]), int(e.get("stream", 0)))
            for e in traces[device] if e.get("action") in ACTIONS]


def save(path: Path, events: Iterable[TraceEvent], meta: dict[str, object]) -> None:
    """Write the trace atomically: a reader never sees half a file."""
    document = {"format": FORMAT, "meta": meta, "events": [list(e) for e in events]}
    partial = path.with_name(path.name + ".part")
    with gzip.open(partial, "wt", encoding="utf-8") as out:
        json.dump(document, out, separators=(",", ":"))
    partial.replace(path)


def load(path: Path) -> tuple[list[TraceEvent], dict[str, Any]]:
    """The events and metadata of a trace written by ``save``."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as source:
            document = json.load(source)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such allocator trace") from None
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{path}: not a gzipped JSON allocator trace ({error}); write one with "
                         "scripts/gpu-check on a GPU") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise UsageError(f"{path}: format {found!r}, expected {FORMAT!r}")
    try:
        events = [TraceEvent(str(a), int(addr), int(size), int(stream)) for a, addr, size, stream in document["events"]]
    except (KeyError, TypeError, ValueError) as error:
        raise UsageError(f"{path}: malformed events ({error!r}); each is [action, addr, size, stream]") from None
    unknown = sorted({e.action for e in events} - set(ACTIONS))
    if unknown:
        raise UsageError(f"{path}: unknown actions {unknown}; expected some of {list(ACTIONS)}")
    return events, dict(document.get("meta") or {})


@dataclass(frozen=True)
class Divergence:
    """The first request on which the model and the GPU disagree about creating a segment."""

    index: int  # position of the request in the trace
    request_bytes: int
    gpu_segment_bytes: int | None  # None: the GPU served it from a cached block
    model_segment_bytes: int | None
    live_bytes: int  # bytes requested and not yet freed, just before it


@dataclass(frozen=True)
class Agreement:
    requests: int
    gpu_segments: int
    model_segments: int
    gpu_reserved_peak_bytes: int  # above what was reserved when the history started
    model_reserved_peak_bytes: int
    live_peak_bytes: int
    disagreements: int  # requests on which one side created a segment the other did not (or sized it apart)
    first: Divergence | None
    unmatched_frees: int  # frees of blocks allocated before the history started
    segment_frees: int  # segments the GPU returned (empty_cache, an OOM retry): the model keeps all

    @property
    def exact(self) -> bool:
        return self.disagreements == 0 and self.gpu_reserved_peak_bytes == self.model_reserved_peak_bytes


def replay(events: Sequence[TraceEvent], config: AllocatorConfig | None = None) -> Agreement:
    """Feed the trace's requests and frees to a fresh allocator model; compare segment for segment."""
    model = CachingAllocator(config or AllocatorConfig())
    handles: dict[int, int] = {}
    gpu_segment: int | None = None  # the segment the GPU created for the next request
    gpu_segments = gpu_reserved = gpu_peak = live = live_peak = 0
    disagreements = unmatched = segment_frees = requests = 0
    first: Divergence | None = None
    for index, event in enumerate(events):
        if event.action == "segment_alloc":
            gpu_segment = event.size
            gpu_segments += 1
            gpu_reserved += event.size
            gpu_peak = max(gpu_peak, gpu_reserved)
        elif event.action == "segment_free":
            gpu_reserved -= event.size
            segment_frees += 1
        elif event.action == "alloc":
            requests += 1
            reserved_before = model.stats.reserved
            handles[event.addr] = model.malloc(event.size, event.stream)
            model_segment = (model.stats.reserved - reserved_before) or None
            if model_segment != gpu_segment:
                disagreements += 1
                if first is None:
                    first = Divergence(index, event.size, gpu_segment, model_segment, live)
            gpu_segment = None
            live += event.size
            live_peak = max(live_peak, live)
        elif event.action == "free_completed":
            handle = handles.pop(event.addr, None)
            if handle is None:
                unmatched += 1
            else:
                live -= event.size
                model.free(handle)
    return Agreement(requests=requests, gpu_segments=gpu_segments, model_segments=model.stats.segments,
                     gpu_reserved_peak_bytes=gpu_peak, model_reserved_peak_bytes=model.stats.reserved_high_water,
                     live_peak_bytes=live_peak, disagreements=disagreements, first=first,
                     unmatched_frees=unmatched, segment_frees=segment_frees)


def request_difference(gpu: Sequence[TraceEvent], sim: Sequence[TraceEvent], top: int = 10) -> list[dict[str, int]]:
    """The request sizes whose counts differ between two streams, most bytes of difference first:
    where the sim's reconstruction of the requests departs from the GPU's."""
    counts = [Counter(e.size for e in stream if e.action == "alloc") for stream in (gpu, sim)]
    rows = [{"request_bytes": size, "gpu": counts[0][size], "sim": counts[1][size]}
            for size in counts[0].keys() | counts[1].keys() if counts[0][size] != counts[1][size]]
    rows.sort(key=lambda row: (-abs(row["gpu"] - row["sim"]) * row["request_bytes"], row["request_bytes"]))
    return rows[:top]


def report(agreement: Agreement, label: str = "trace") -> str:
    """A few lines for a person: decimal GB for the peaks, bytes for the first divergence."""
    a = agreement
    lines = [f"{label}: {a.requests:,} requests replayed through the allocator model",
             f"  segments: GPU {a.gpu_segments:,}, model {a.model_segments:,}",
             f"  reserved peak above the start: GPU {a.gpu_reserved_peak_bytes / 1e9:.3f} GB, "
             f"model {a.model_reserved_peak_bytes / 1e9:.3f} GB; live peak {a.live_peak_bytes / 1e9:.3f} GB",
             f"  requests where model and GPU disagree on a new segment: {a.disagreements:,}"]
    if a.first is not None:
        f = a.first
        lines.append(f"  first at event {f.index:,}: a {f.request_bytes:,} B request with {f.live_bytes:,} B live; "
                     f"GPU segment {_segment(f.gpu_segment_bytes)}, model segment {_segment(f.model_segment_bytes)}")
    if a.unmatched_frees:
        lines.append(f"  {a.unmatched_frees:,} frees of blocks allocated before the history started (ignored)")
    if a.segment_frees:
        lines.append(f"  the GPU returned {a.segment_frees:,} segments (empty_cache or an OOM retry); "
                     "the model never returns any, so peaks after that differ")
    lines.append("  verdict: " + ("the model reproduces the GPU's allocator exactly" if a.exact else
                                  "the model's rules differ from this GPU's allocator; see the first divergence"))
    return "\n".join(lines)


def _segment(size: int | None) -> str:
    return "none (a cached block)" if size is None else f"{size:,} B"


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m memclaims.gpu.alloc_trace",
                                     description="Replay a GPU's allocator trace through the sim's allocator model.")
    parser.add_argument("trace", type=Path, help="a trace written by scripts/gpu-check (*.trace.json.gz)")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    args = parser.parse_args(argv)
    try:
        events, meta = load(args.trace)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    agreement = replay(events)
    if args.json:
        print(json.dumps({"meta": meta, **asdict(agreement)}, indent=2))
    else:
        print(report(agreement, label=str(meta.get("recipe", args.trace))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
