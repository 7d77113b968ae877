"""memclaims.gpu.alloc_trace: a GPU's allocator history replayed through the sim's allocator model.

No GPU here, so the histories are the model's own (``simulate(..., allocator_events=...)``) written
out in the shape of ``torch.cuda.memory._snapshot()``, and small hand-built ones."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from memclaims.core.errors import UsageError
from memclaims.core.record import Record
from memclaims.gpu import alloc_trace
from memclaims.gpu import check as gpucheck
from memclaims.measure import diagnosis
from memclaims.recipes.recipe import resolve
from memclaims.sim import simulate
from memclaims.sim.allocator import AllocatorConfig, MiB, TraceEvent

# One worker under -n (--dist loadgroup): the module's replay with its allocator history (a few s of CPU) runs once.
pytestmark = [pytest.mark.sim, pytest.mark.xdist_group("unit-alloc-trace")]
RECIPE = resolve("vit", "article", ("16-mixed",))  # ViT-L/16 at batch 64: segments of many sizes


@pytest.fixture(scope="module")
def model_history() -> tuple[Record, list[TraceEvent]]:
    events: list[TraceEvent] = []
    record = simulate(RECIPE, profile="h100", allocator_events=events)
    return record, events


def as_snapshot(events: list[TraceEvent]) -> dict[str, Any]:
    """The events as torch's snapshot holds them: dicts, each free requested before it completes,
    and entries the replay must skip."""
    trace: list[dict[str, Any]] = [{"action": "snapshot", "addr": 0, "size": 0, "stream": 0}]
    for action, addr, size, stream in events:
        if action == "free_completed":
            trace.append({"action": "free_requested", "addr": addr, "size": size, "stream": stream, "frames": []})
        trace.append({"action": action, "addr": addr, "size": size, "stream": stream, "frames": []})
    return {"segments": [], "device_traces": [trace]}


def test_the_model_reproduces_its_own_history_exactly(model_history) -> None:
    record, events = model_history
    replayed = alloc_trace.replay(alloc_trace.from_snapshot(as_snapshot(events)))
    assert replayed.exact and replayed.first is None and replayed.unmatched_frees == 0
    assert replayed.requests == sum(1 for e in events if e[0] == "alloc") > 100
    assert replayed.model_reserved_peak_bytes == replayed.gpu_reserved_peak_bytes == record.peak_reserved_total_bytes
    assert replayed.gpu_segments == replayed.model_segments == sum(1 for e in events if e[0] == "segment_alloc")


def test_a_different_rule_is_caught_at_its_first_request(model_history) -> None:
    _, trace = model_history
    # Segments for large requests rounded to 4 MiB instead of 2 MiB: the first large request whose
    # 2 MiB rounding differs is the first disagreement, and the model's segment is the larger.
    replayed = alloc_trace.replay(trace, AllocatorConfig(round_large=4 * MiB))
    assert not replayed.exact and replayed.first is not None
    first = replayed.first
    assert first.request_bytes >= 10 * MiB
    assert first.gpu_segment_bytes is not None and first.model_segment_bytes is not None
    assert first.model_segment_bytes > first.gpu_segment_bytes
    assert trace[first.index].action == "alloc" and trace[first.index].size == first.request_bytes
    # Requests of 10-20 MiB given a shared 20 MiB segment, as smaller ones are.
    shared = alloc_trace.replay(trace, AllocatorConfig(min_large_alloc=20 * MiB))
    assert shared.first is not None and 10 * MiB <= shared.first.request_bytes < 20 * MiB


def test_a_hand_built_history_counts_reuse_unknown_frees_and_returned_segments() -> None:
    trace = [
        TraceEvent("free_completed", 999, 512, 0),  # allocated before the history started
        TraceEvent("segment_alloc", 0, 20 * MiB, 0), TraceEvent("alloc", 0, 4 * MiB, 0),
        TraceEvent("free_completed", 0, 4 * MiB, 0),
        TraceEvent("segment_alloc", 20 * MiB, 20 * MiB, 0), TraceEvent("alloc", 20 * MiB, 4 * MiB, 0),  # the model reuses instead
        TraceEvent("segment_free", 20 * MiB, 20 * MiB, 0),
    ]
    replayed = alloc_trace.replay(trace)
    assert replayed.unmatched_frees == 1 and replayed.segment_frees == 1 and replayed.requests == 2
    assert replayed.disagreements == 1 and replayed.first == alloc_trace.Divergence(5, 4 * MiB, 20 * MiB, None, 0)
    assert replayed.gpu_reserved_peak_bytes == 40 * MiB and replayed.model_reserved_peak_bytes == 20 * MiB
    text = alloc_trace.report(replayed, "hand-built")
    assert "first at event 5" in text and "none (a cached block)" in text and "returned 1 segments" in text
    assert "rules differ" in text


def test_traces_round_trip_and_bad_files_name_themselves(tmp_path: Path, model_history) -> None:
    _, trace = model_history
    path = tmp_path / "t.trace.json.gz"
    alloc_trace.save(path, trace, {"recipe": RECIPE.id})
    assert alloc_trace.load(path) == (trace, {"recipe": RECIPE.id})
    assert not list(tmp_path.glob("*.part"))

    (tmp_path / "plain.json").write_text("{}")
    wrong = tmp_path / "wrong.json.gz"
    with gzip.open(wrong, "wt") as out:
        json.dump({"format": "other/9", "events": []}, out)
    odd = tmp_path / "odd.json.gz"
    with gzip.open(odd, "wt") as out:
        json.dump({"format": alloc_trace.FORMAT, "events": [["alloc", 0, 1, 0], ["teleport", 0, 1, 0]]}, out)
    short = tmp_path / "short.json.gz"
    with gzip.open(short, "wt") as out:
        json.dump({"format": alloc_trace.FORMAT, "events": [["alloc", 0]]}, out)
    for bad, says in ((tmp_path / "missing.gz", "no such"), (tmp_path / "plain.json", "not a gzipped"),
                      (wrong, "'other/9'"), (odd, "teleport"), (short, "malformed")):
        with pytest.raises(UsageError, match=says) as error:
            alloc_trace.load(bad)
        assert str(bad) in str(error.value)


def test_a_snapshot_without_history_or_of_expandable_segments_is_refused() -> None:
    with pytest.raises(UsageError, match="_record_memory_history"):
        alloc_trace.from_snapshot({"segments": []})
    with pytest.raises(UsageError, match="device 1"):
        alloc_trace.from_snapshot({"device_traces": [[]]}, device=1)
    with pytest.raises(UsageError, match="expandable_segments"):
        alloc_trace.from_snapshot({"device_traces": [[{"action": "segment_map", "addr": 0, "size": 1}]]})


def test_request_difference_lists_the_largest_byte_gaps_first() -> None:
    gpu = [TraceEvent("alloc", 0, 100, 0)] * 3 + [TraceEvent("alloc", 0, 10_000, 0)] + [TraceEvent("alloc", 0, 7, 0)] * 2
    sim = [TraceEvent("alloc", 0, 100, 0)] * 1 + [TraceEvent("alloc", 0, 7, 0)] * 2 + [TraceEvent("alloc", 0, 50, 0)]
    assert alloc_trace.request_difference(gpu, sim) == [
        {"request_bytes": 10_000, "gpu": 1, "sim": 0},
        {"request_bytes": 100, "gpu": 3, "sim": 1},
        {"request_bytes": 50, "gpu": 0, "sim": 1},
    ]


def test_the_command_prints_the_comparison(tmp_path: Path, capsys, model_history) -> None:
    _, events = model_history
    path = tmp_path / "t.trace.json.gz"
    alloc_trace.save(path, events, {"recipe": "gpu-run"})
    assert alloc_trace.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gpu-run: ") and "reproduces the GPU's allocator exactly" in out
    assert alloc_trace.main([str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["disagreements"] == 0
    assert alloc_trace.main([str(tmp_path / "none.gz")]) == 2
    assert "no such allocator trace" in capsys.readouterr().err


def test_sharded_recipes_refuse_an_allocator_history() -> None:
    with pytest.raises(UsageError, match="one-device"):
        simulate(resolve("vit", "smoke", ("fsdp",)), profile="h100", allocator_events=[])


def test_gpu_check_step_saves_the_trace_and_reports_the_replay(tmp_path: Path, monkeypatch, model_history) -> None:
    """The allocator-trace step with ``measure`` faked on CUDA: it writes a history-only snapshot as the
    CUDA probe would, and the step turns it into a trace, a replay and the sim's prediction (the real
    door: the sim's history comes back beside its Record)."""
    import memclaims.run

    record, events = model_history
    recipe_seen: list[str] = []
    real_measure = memclaims.run.run_recipe

    def fake_measure(recipe: Any, options: Any) -> list[Record]:
        if options.device == "sim":
            assert options.allocator_events and options.memory_steps == gpucheck.TRACE_STEPS
            return real_measure(recipe, options)
        recipe_seen.append(recipe.id)
        assert options.device == "cuda" and options.memory_steps == gpucheck.TRACE_STEPS
        assert diagnosis.history_entries() == gpucheck.TRACE_ENTRIES
        folder = diagnosis.snapshot_dir()
        assert folder is not None
        path = folder / f"{diagnosis.case_file_stem(recipe.id)}.snapshot.pickle"
        path.write_bytes(pickle.dumps(as_snapshot(events)))
        return [record]

    monkeypatch.setattr("memclaims.run.run_recipe", fake_measure)
    monkeypatch.setattr(gpucheck, "TRACE_WORKLOAD", "vit")
    monkeypatch.setattr(gpucheck, "SIM_PROFILE", "h100")
    monkeypatch.setattr(diagnosis, "_history_stacks", True)
    monkeypatch.setattr(diagnosis, "_history_entries", 0)
    monkeypatch.setattr(diagnosis, "_snapshot_dir", None)
    monkeypatch.setattr(diagnosis, "_snapshot_max_bytes", diagnosis.DEFAULT_SNAPSHOT_MAX_BYTES)
    trace = tmp_path / gpucheck.TRACE_FILE
    found = gpucheck.allocator_trace(trace)
    assert recipe_seen == [RECIPE.id] == [found["recipe"]]
    assert recipe_seen and diagnosis._history_stacks is False  # history without stack traces
    assert alloc_trace.load(trace)[1]["recipe"] == found["recipe"]
    assert found["replay"]["disagreements"] == 0 and found["events"] == len(events)
    assert found["sim"]["profile"] == "h100" and found["sim"]["peak_reserved_total_bytes"] > 0
    text = gpucheck.report({"allocator-trace": {"status": "ok", "seconds": 30.0, "json": found}})
    assert "GPU's requests through the allocator model" in text and "requests on which they disagree: 0" in text


def test_history_without_stacks_asks_torch_for_no_tracebacks(monkeypatch) -> None:
    calls: list[dict[str, Any]] = []

    class Memory:
        def _record_memory_history(self, **kwargs: Any) -> None:
            calls.append(kwargs)

    class Cuda:
        memory = Memory()

    monkeypatch.setattr(diagnosis, "_history_stacks", False)
    diagnosis.start_history(Cuda(), 10)
    assert calls == [{"enabled": None}, {"max_entries": 10, "context": None}]
