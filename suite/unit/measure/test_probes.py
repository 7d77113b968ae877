"""Probe arithmetic: the CUDA probe against faked allocator statistics, the CPU probe exactly."""

from __future__ import annotations

import mmap

import pytest
import torch
from torch import nn

from memclaims.measure.probes import CpuProbe, CudaProbe, HostMemory, PhaseRecorder, Reading, model_state_bytes
from memclaims.measure.tensors import storage_bytes


class FakeCuda:
    """Allocator statistics as torch.cuda reports them, scripted per phase."""

    def __init__(self, peaks: list[tuple[int, int]]) -> None:
        self.peaks = list(peaks)
        self.calls: list[str] = []
        self.current = (0, 0)

    def synchronize(self) -> None:
        self.calls.append("synchronize")

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")

    def reset_peak_memory_stats(self) -> None:
        self.calls.append("reset")
        if self.peaks:
            self.current = self.peaks.pop(0)

    def max_memory_allocated(self) -> int:
        return self.current[0]

    def max_memory_reserved(self) -> int:
        return self.current[1]

    def memory_allocated(self) -> int:
        return 0


def test_cuda_probe_resets_between_phases_and_reads_both_peaks() -> None:
    cuda = FakeCuda([(100, 2048), (900, 4096)])
    probe = CudaProbe(cuda)
    with probe.phase("load"):
        pass
    with probe.phase("train"):
        pass
    assert probe.phases["load"].allocated_bytes == 100 and probe.phases["load"].reserved_bytes == 2048
    assert probe.phases["train"].allocated_bytes == 900 and probe.phases["train"].reserved_bytes == 4096
    assert cuda.calls.count("reset") == 2, "each phase must start from reset peak statistics"


def test_cuda_probe_prepare_starts_clean() -> None:
    cuda = FakeCuda([])
    CudaProbe(cuda).prepare()
    assert cuda.calls[-2:] == ["empty_cache", "reset"]


def test_cuda_probe_breakdown_subtracts_model_states() -> None:
    model = nn.Linear(10, 10)  # 110 float32 parameters = 440 B
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(1, 10)).sum().backward()
    probe = CudaProbe(FakeCuda([(2000, 4096)]))
    probe.track(model, optimizer)
    with probe.phase("train"):
        pass
    breakdown = probe.phases["train"].breakdown
    assert breakdown == {"parameters": 440, "gradients": 440, "optimizer_state": 0,
                         "activations_and_temporaries": 2000 - 880}


def test_storage_bytes_counts_shared_storage_once() -> None:
    base = torch.zeros(100)
    assert storage_bytes(iter([base, base[:10], base.view(10, 10)])) == 400


def test_model_state_bytes_of_adam_is_two_states_plus_step_counters() -> None:
    model = nn.Linear(10, 10)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 10)).sum().backward()
    optimizer.step()
    states = model_state_bytes(model, optimizer)
    assert states == {"param_bytes": 440, "grad_bytes": 440, "optimizer_state_bytes": 2 * 440 + 2 * 4}


def test_cpu_probe_counts_exact_bytes_of_a_phase() -> None:
    probe = CpuProbe()
    with probe.phase("alloc"):
        a = torch.empty(1000, dtype=torch.float32)
        b = torch.empty(500, dtype=torch.bfloat16)
        del a
        c = torch.empty(10, dtype=torch.float64)
    assert probe.phases["alloc"].allocated_bytes == 4000 + 1000  # a and b alive together
    del b, c


def test_cpu_probe_counts_what_set_up_keeps_alive_in_every_later_phase() -> None:
    """A tensor made at set-up (the load phase) and kept alive, neither the model's nor the optimizer's, is in every
    later phase from its start, as on a GPU; what set-up freed, or what is freed later, is not."""
    def phases(keep: bool, free_in_train: bool = False) -> dict[str, int]:
        probe, kept = CpuProbe(), []
        with probe.phase("load"):
            model = nn.Linear(64, 64)
            if keep:
                kept.append(torch.empty(1000, dtype=torch.float32))
            scratch = torch.empty(5000, dtype=torch.float32)  # freed at set-up: never counted again
            del scratch
        probe.track(model, None)
        with probe.phase("train"):
            if free_in_train:
                kept.clear()
            with probe.step_phase("forward"):
                model(torch.ones(1, 64))
        with probe.phase("evaluation"):  # a phase without a new track counts what it makes, as load does
            pass
        return {name: peak.allocated_bytes for name, peak in probe.phases.items()}

    clean, kept, freed = phases(False), phases(True), phases(True, free_in_train=True)
    assert {name: kept[name] - clean[name] for name in clean} == {"load": 4000, "train": 4000, "forward": 4000,
                                                                  "evaluation": 0}
    assert freed["forward"] == clean["forward"]  # freed before the step: no longer counted


def test_cpu_probe_is_deterministic() -> None:
    def measure() -> int:
        probe = CpuProbe()
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
        optimizer = torch.optim.Adam(model.parameters())
        probe.track(model, optimizer)
        with probe.phase("train"):
            for _ in range(2):
                probe.step_begin()
                loss = model(torch.ones(8, 32)).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        return probe.phases["train"].allocated_bytes

    assert measure() == measure()


# --- host memory (offload claims need both sides) ----------------------------------------------


def test_host_memory_resets_and_reads_the_high_water_mark(tmp_path) -> None:
    status, clear_refs = tmp_path / "status", tmp_path / "clear_refs"
    status.write_text("Name:\tpython\nVmHWM:\t  123456 kB\nVmRSS:\t  100000 kB\n")
    clear_refs.write_text("")
    host = HostMemory(str(status), str(clear_refs))
    host.start()
    assert clear_refs.read_text() == "5" and host.resettable
    assert host.peak_bytes() == 123_456 * 1024


def test_host_memory_falls_back_to_the_lifetime_peak(tmp_path) -> None:
    host = HostMemory(str(tmp_path / "status"), str(tmp_path / "no-such-dir" / "clear_refs"))
    host.start()
    assert not host.resettable
    peak = host.peak_bytes()
    assert peak is None or peak > 0


@pytest.mark.requires(paths=HostMemory.CLEAR_REFS)  # Linux's per-process peak reset
def test_host_memory_peak_is_per_span_on_linux() -> None:
    host = HostMemory()
    host.start()
    # Fresh anonymous pages (a bytearray may reuse a freed heap that is still resident in a worker that ran other
    # tests, leaving the resident set where it was: seen once in CI's run).
    block = mmap.mmap(-1, 256 * 2**20)
    block.write(b"\x01" * len(block))  # touch every page: resident, not just reserved
    with_block = host.peak_bytes()
    block.close()
    host.start()
    assert host.resettable and with_block is not None
    assert with_block - host.peak_bytes() >= 200 * 2**20


def test_step_phases_keep_each_occurrences_growth_above_its_start() -> None:
    """``step_growth``: per occurrence of a step phase, its peak above its start for the counter and for each
    further counter whose reader says where it stands (the sim's live tensor bytes); the Record's
    ``above_start_bytes`` stays the largest occurrence's. A first optimizer step that creates the state grows more
    than the later ones, which add only their temporaries (memclaims.techniques.optimizer_impl reads the last)."""
    now, peak, live, live_peak = [0], [0], [0], [0]

    def read() -> Reading:
        return Reading(now=now[0], peak=peak[0], extra={"live_bytes": live_peak[0]}, extra_now={"live_bytes": live[0]})

    def reset() -> None:
        peak[0], live_peak[0] = now[0], live[0]

    recorder = PhaseRecorder(read, reset)

    def step(state: int, temporaries: int) -> None:
        with recorder.measure("optimizer_step", per_step=True):
            peak[0] = now[0] + state + temporaries + 512  # the allocator rounds: 512 B more than the tensors
            live_peak[0] = live[0] + state + temporaries
            now[0] += state
            live[0] += state

    with recorder.measure("train"):
        now[0] = live[0] = 1000
        step(state=300, temporaries=50)
        step(state=0, temporaries=50)
        step(state=0, temporaries=0)
    assert recorder.step_growth["optimizer_step"] == [
        {"allocated_bytes": 862, "live_bytes": 350}, {"allocated_bytes": 562, "live_bytes": 50},
        {"allocated_bytes": 512, "live_bytes": 0}]
    assert recorder.phases["optimizer_step"].above_start_bytes == 862
    assert recorder.step_peaks["optimizer_step"] == [1862, 1862, 1812]
    assert "optimizer_step" not in PhaseRecorder(read, reset).step_growth


def test_the_cpu_probe_exposes_its_step_growth_exactly() -> None:
    probe = CpuProbe()
    with probe.phase("train"):
        for _ in range(2):
            with probe.step_phase("optimizer_step"):
                kept = torch.ones(256)  # 1 KiB alive at the end of the step
                temporary = torch.ones(128)  # 512 B, gone before the step ends
                del temporary
            del kept
    assert probe.step_growth["optimizer_step"] == [{"allocated_bytes": 1536}, {"allocated_bytes": 1536}]
