"""Per-phase peaks, steady state and technique activity: the library parts, without training runs."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext
from typing import Any

import pytest
import torch
from torch import nn

from fixtures.paths import PACKAGE
from memclaims.core.record import Record
from memclaims.measure import active, steady
from memclaims.measure.loop import STEP_PHASES, TrainingLoop, batch_examples
from memclaims.measure.probes import CpuProbe, CudaProbe, PhasePeak, phase_entries
from memclaims.measure.record_builder import build_record
from memclaims.measure.tensors import bytes_by, device_type, dtype_name
from memclaims.recipes.recipe import resolve


class FakeAllocator:
    """``torch.cuda``'s allocator statistics over scripted mallocs and frees (reserved = 2 x allocated
    high-water mark, so reserved peaks are told apart from allocated ones)."""

    def __init__(self) -> None:
        self.allocated = self.peak = self.reserved = self.reserved_peak = 0
        self.resets = 0

    def malloc(self, nbytes: int) -> None:
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)
        self.reserved = max(self.reserved, 2 * self.allocated)
        self.reserved_peak = max(self.reserved_peak, self.reserved)

    def free(self, nbytes: int) -> None:
        self.allocated -= nbytes

    def synchronize(self) -> None:
        pass

    def empty_cache(self) -> None:
        pass

    def reset_peak_memory_stats(self) -> None:
        self.resets += 1
        self.peak, self.reserved_peak = self.allocated, self.reserved

    def memory_allocated(self) -> int:
        return self.allocated

    def max_memory_allocated(self) -> int:
        return self.peak

    def max_memory_reserved(self) -> int:
        return self.reserved_peak


def _cuda_step(probe: CudaProbe, cuda: FakeAllocator, optimizer_temporary: int) -> None:
    with probe.step_phase("forward"):
        cuda.malloc(1000)  # activations, kept for backward
    with probe.step_phase("backward"):
        cuda.malloc(300)  # gradients
        cuda.free(1000)
    with probe.step_phase("optimizer_step"):
        cuda.malloc(optimizer_temporary)
        cuda.free(optimizer_temporary)
    with probe.step_phase("zero_grad"):
        cuda.free(300)


def test_cuda_probe_gives_each_step_phase_its_own_peak_and_train_the_largest() -> None:
    cuda = FakeAllocator()
    cuda.malloc(500)  # the model, live before training
    probe = CudaProbe(cuda)
    with probe.phase("train"):
        _cuda_step(probe, cuda, optimizer_temporary=200)
        cuda.malloc(5000)  # between phases (the next batch): only the enclosing phase sees it
        cuda.free(5000)
        for _ in range(2):
            _cuda_step(probe, cuda, optimizer_temporary=200)
    phases = phase_entries(probe.phases)
    # Reserved memory never shrinks: from step 2 on every phase sees the high-water mark of step 1 (11000 = 2 x 5500).
    assert phases["forward"] == {"allocated_bytes": 1500, "above_start_bytes": 1000, "reserved_bytes": 11000}
    assert phases["backward"] == {"allocated_bytes": 1800, "above_start_bytes": 300, "reserved_bytes": 11000}
    assert phases["optimizer_step"]["allocated_bytes"] == 1000 and phases["optimizer_step"]["above_start_bytes"] == 200
    assert phases["zero_grad"]["above_start_bytes"] == 0
    assert phases["train"]["allocated_bytes"] == 5500 and phases["train"]["above_start_bytes"] == 5000
    assert probe.step_peaks["forward"] == [1500, 1500, 1500]
    assert cuda.resets == 1 + 3 * len(STEP_PHASES)  # a reset at every phase start


def test_the_enclosing_phase_sees_a_peak_inside_an_inner_phase() -> None:
    cuda = FakeAllocator()
    probe = CudaProbe(cuda)
    with probe.phase("train"):
        _cuda_step(probe, cuda, optimizer_temporary=9000)  # the largest, inside optimizer.step()
        _cuda_step(probe, cuda, optimizer_temporary=10)
    assert probe.phases["train"].allocated_bytes == 300 + 9000
    assert probe.phases["train"].reserved_bytes == 2 * 9300
    assert probe.step_peaks["optimizer_step"] == [9300, 310]


def test_an_optimizer_temporary_changes_only_the_optimizer_step() -> None:
    """The blind spot this closes: a parameter-sized temporary inside optimizer.step() below the
    forward peak moves no whole-step number, only phases.optimizer_step."""
    def measure(temporary: int) -> dict[str, Any]:
        cuda = FakeAllocator()
        probe = CudaProbe(cuda)
        with probe.phase("train"):
            _cuda_step(probe, cuda, temporary)
        return phase_entries(probe.phases)

    clean, regressed = measure(200), measure(500)
    assert regressed["train"] == clean["train"] and regressed["forward"] == clean["forward"]
    assert regressed["optimizer_step"]["above_start_bytes"] == clean["optimizer_step"]["above_start_bytes"] + 300


def test_cpu_probe_step_phases_are_exact_and_nested_in_train() -> None:
    model = nn.Linear(10, 10)  # 440 B of parameters
    probe = CpuProbe()
    probe.track(model, None)
    with probe.phase("train"):
        with probe.step_phase("forward"):
            kept = torch.empty(1000)  # 4000 B
        with probe.step_phase("optimizer_step"):
            temporary = torch.empty(250)  # 1000 B, freed inside the phase
            del temporary
        del kept
    phases = phase_entries(probe.phases)
    assert phases["forward"] == {"allocated_bytes": 440 + 4000, "above_start_bytes": 4000, "reserved_bytes": None}
    assert phases["optimizer_step"] == {"allocated_bytes": 440 + 4000 + 1000, "above_start_bytes": 1000,
                                        "reserved_bytes": None}
    assert phases["train"]["allocated_bytes"] == 5440
    # Outside a measured phase nothing is tracked, so step phases are not opened.
    with probe.step_phase("forward"):
        pass
    assert probe.step_peaks["forward"] == [4440]


def test_the_loop_opens_every_step_phase_in_the_scripts_order() -> None:
    opened: list[str] = []

    class Recorder(TrainingLoop):
        def forward_loss(self, model: nn.Module, inputs: Any, targets: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(model(inputs), targets)

    def phase(name: str) -> Any:
        opened.append(name)
        return nullcontext()

    model = nn.Linear(4, 3)
    batches = iter([(torch.ones(2, 4), torch.tensor([0, 1]))] * 8)
    loop = Recorder(accumulation_steps=1)
    loop.train(model, torch.optim.SGD(model.parameters(), lr=0.1), None, batches, 2, phase=phase)
    assert opened == ["forward", "zero_grad", "backward", "optimizer_step"] * 2
    assert (loop.step_examples, loop.step_micro_batches, loop.compute_dtypes) == (2, 1, ["float32"])

    opened.clear()
    loop = Recorder(accumulation_steps=2)
    loop.train(model, torch.optim.SGD(model.parameters(), lr=0.1), None, iter([(torch.ones(2, 4), torch.tensor([0, 1]))] * 8),
               2, phase=phase)
    # 05: the step after the first micro-batch, then every second; zero_grad after the step.
    assert opened == ["forward", "backward", "optimizer_step", "zero_grad",
                      "forward", "backward", "forward", "backward", "optimizer_step", "zero_grad"]
    assert (loop.step_examples, loop.step_micro_batches) == (4, 2)


def _built(phases: dict[str, PhasePeak], **fields: Any) -> Record:
    return build_record(resolve("vit", "smoke", ("bf16-true",)), device="sim", device_name="d", probe="p",
                        precision="bf16-true", memory_steps=2, param_count=10, param_tensor_count=2, phases=phases,
                        step_peaks={"forward": [5, 6]}, peak_reserved_total_bytes=None, weights="random", data="none",
                        notes=[], observed={"param_bytes": 20, "grad_bytes": 20, "optimizer_state_bytes": 0}, **fields)


def test_the_record_builder_derives_the_peaks_and_phases_of_every_engine() -> None:
    """One builder for every engine: the load peak, the run's peaks and the ``phases`` entries follow from
    the recorder's phases; a reader's further peaks (the sim's live bytes) go to the recipe's own phases only."""
    live = {"live_bytes": 90}
    phases = {"load": PhasePeak(100, 200, above_start_bytes=100, extra=live),
              "train": PhasePeak(300, 400, {"parameters": 7}, above_start_bytes=200, extra=live),
              "forward": PhasePeak(250, 400, above_start_bytes=150, extra=live)}
    record = _built(phases)
    assert (record.load_peak_bytes, record.peak_allocated_bytes, record.peak_reserved_bytes) == (100, 300, 400)
    assert record.phases == {"load": {"allocated_bytes": 100, "above_start_bytes": 100, "reserved_bytes": 200, "live_bytes": 90},
                             "train": {"allocated_bytes": 300, "above_start_bytes": 200, "reserved_bytes": 400, "live_bytes": 90},
                             "forward": {"allocated_bytes": 250, "above_start_bytes": 150, "reserved_bytes": 400}}
    assert record.breakdown == {"parameters": 7} and record.step_peaks == {"forward": [5, 6]}
    assert (record.final_loss, record.nan_loss, record.nan_step, record.memory_losses) == (None, False, None, [])
    # A probe without reserved memory (the CPU's): no reserved peak; a load-only run: its load is the peak.
    cpu = _built({"load": PhasePeak(100), "train": PhasePeak(300)})
    assert cpu.peak_reserved_bytes is None and cpu.phases["train"] == {"allocated_bytes": 300, "above_start_bytes": 0,
                                                                       "reserved_bytes": None}
    load_only = _built({"load": PhasePeak(100, 200)})
    assert (load_only.peak_allocated_bytes, load_only.peak_reserved_bytes, load_only.breakdown) == (100, 200, {})
    assert phase_entries(phases)["load"] == {k: v for k, v in record.phases["load"].items() if k != "live_bytes"}


def test_bytes_by_dtype_and_device() -> None:
    tensors = [torch.zeros(10, dtype=torch.uint8), torch.zeros(4), torch.zeros(4, device="meta")]
    assert bytes_by(iter(tensors), dtype_name) == {"float32": 16 + 16, "uint8": 10}
    assert bytes_by(iter(tensors[:2]), device_type) == {"cpu": 26}
    assert set(bytes_by(iter(tensors), device_type)) == {"cpu", "meta"}


@pytest.mark.requires(packages="torchao")
def test_a_state_subclass_counts_as_the_tensors_behind_it() -> None:
    """torchao's low-bit states own no storage of their own (``untyped_storage()`` of one raises): its codes, scales
    and map are what the Record counts, by their own dtypes; plain states stay as they are."""
    from torchao.optim.subclass_8bit import OptimState8bit

    from memclaims.measure.tensors import optimizer_state_tensors, storage_bytes

    class Holder:
        state = {0: {"step": torch.tensor(1.0), "exp_avg": OptimState8bit.zeros((64, 64), True, 256),
                     "plain": torch.zeros(10)}}

    held = list(optimizer_state_tensors(Holder()))  # type: ignore[arg-type]
    assert [(t.dtype, t.numel()) for t in held] == [(torch.float32, 1), (torch.uint8, 4096), (torch.float32, 16),
                                                    (torch.float32, 256), (torch.float32, 10)]
    assert storage_bytes(iter(held)) == 4 + 4096 + 64 + 1024 + 40
    assert bytes_by(iter(held), dtype_name) == {"float32": 4 + 64 + 1024 + 40, "uint8": 4096}


# --- steady state ---------------------------------------------------------------------------------


def _record(techniques: tuple[str, ...] = ("fabric",), **changes: Any) -> Record:
    recipe = resolve("vit", "smoke", techniques)
    base = dict(**recipe.record_fields(), device="cpu", device_name="cpu-test", probe="cpu-exact",
                precision=recipe.precision, memory_steps=5, param_count=1000, param_tensor_count=4,
                param_bytes=4000, grad_bytes=4000, optimizer_state_bytes=8000, load_peak_bytes=4000,
                peak_allocated_bytes=20000, peak_reserved_bytes=None, accuracy=None, final_loss=1.0,
                nan_loss=False, nan_step=None, step_time_s=None, weights="random", data="test", versions={},
                step_examples=recipe.batch_size, step_micro_batches=recipe.accumulation_steps,
                compute_dtypes=["float32"])
    base.update(changes)
    return Record(**base)


def test_steady_peaks_pass_and_step_one_may_differ() -> None:
    record = _record(step_peaks={"forward": [100, 180, 180, 180, 180], "optimizer_step": [90, 60, 60, 60, 60]})
    assert steady.leak(record) is None


def test_a_growing_phase_is_a_leak_named_with_bytes_per_step() -> None:
    record = _record(step_peaks={"forward": [100, 180, 184, 188, 192], "backward": [5, 5, 5, 5, 5]})
    message = steady.leak(record)
    assert message is not None
    assert "vit-smoke/fabric" in message and "phases.forward.allocated_bytes" in message
    assert "+4 B per step" in message and "step 2 peak 180 B, step 5 peak 192 B" in message
    assert "backward" not in message


def test_accumulation_compares_the_same_micro_batch_of_each_step() -> None:
    # 05 with 2 micro-batches: step 1 = occurrence 0; each later step = 2 occurrences (a cycle).
    steady_cycles = _record(("grad-accum",), accumulation_steps=2,
                            step_peaks={"forward": [50, 70, 90, 70, 90, 70, 90]})
    assert steady.leak(steady_cycles) is None  # 70 -> 90 within a step is no leak
    leaking = dataclasses.replace(steady_cycles, step_peaks={"forward": [50, 70, 90, 70, 90, 71, 91]})
    assert "step 4" in (steady.leak(leaking) or "")


# --- techniques visibly active -----------------------------------------------------------------------


def test_a_recipe_doing_what_it_says_has_no_problems() -> None:
    assert active.problems(resolve("vit", "smoke", ["fabric"]), _record()) == []


@pytest.mark.parametrize("techniques, changes, expected", [
    (("bf16-true",), dict(param_bytes=4000, compute_dtypes=["bfloat16"]), "not half precision"),
    (("bf16-true",), dict(param_bytes=2000, compute_dtypes=["float32"]), "computed in ['float32']"),
    (("bf16-mixed",), dict(compute_dtypes=["float32"]), "bf16-mixed is not active"),
    (("sgd",), dict(optimizer_state_bytes=8000), "sgd is not active"),
    (("adam8bit",), dict(optimizer_state_by_dtype={"float32": 8000}), "no uint8 optimizer state"),
    (("small-batch",), dict(step_examples=32), "small-batch is not active"),
    (("grad-accum",), dict(step_micro_batches=1), "grad-accum is not active"),
    (("bf16-true", "init-module"), dict(param_bytes=2000, compute_dtypes=["bfloat16"], load_peak_bytes=6000,
                                        reference_load_peak_bytes=6000), "init-module is not active"),
], ids=["bf16-true-params", "bf16-true-compute", "bf16-mixed", "sgd", "adam8bit", "small-batch", "grad-accum",
        "init-module"])
def test_a_technique_that_does_nothing_is_named(techniques, changes, expected) -> None:
    recipe = resolve("vit", "smoke", techniques)
    fine = dict(precision=recipe.precision)
    if recipe.precision in ("bf16-true", "16-true"):
        fine.update(param_bytes=2000, compute_dtypes=["bfloat16"])
    if recipe.precision == "bf16-mixed":
        fine.update(compute_dtypes=["bfloat16"])
    if recipe.optimizer == "sgd":
        fine.update(optimizer_state_bytes=0)
    if recipe.optimizer == "adam8bit":
        fine.update(optimizer_state_by_dtype={"uint8": 2000, "float32": 100}, optimizer_state_bytes=2100)
    if "init-module" in recipe.techniques:
        fine.update(load_peak_bytes=2000, reference_load_peak_bytes=6000)
    assert active.problems(recipe, _record(techniques, **fine)) == []
    found = active.problems(recipe, _record(techniques, **{**fine, **changes}))
    assert any(expected in line and recipe.id in line for line in found), found


def test_cpu_offload_must_leave_no_parameter_on_the_gpu() -> None:
    """Faked for CUDA: what the runner reads after setup, by device type."""
    recipe = resolve("vit", "smoke", ["fsdp", "cpu-offload"])
    offloaded = _record(("fsdp", "cpu-offload"), device="cuda", param_bytes_by_device={"cpu": 4000})
    assert active.problems(recipe, offloaded) == []
    stayed = dataclasses.replace(offloaded, param_bytes_by_device={"cuda": 4000})
    assert any("cpu-offload is not active" in line for line in active.problems(recipe, stayed))


def test_activation_checkpointing_needs_its_comparison_and_a_smaller_forward() -> None:
    recipe = resolve("vit", "smoke", ["fsdp", "activation-checkpointing"])
    plain = _record(("fsdp",), phases={"forward": {"above_start_bytes": 9000}})
    checkpointed = _record(("fsdp", "activation-checkpointing"), phases={"forward": {"above_start_bytes": 3000}})
    assert active.problems(recipe, checkpointed, without={"activation-checkpointing": plain}) == []
    assert any("activation-checkpointing is not active" in line
               for line in active.problems(recipe, plain, without={"activation-checkpointing": plain}))
    assert any("no Record of the same recipe without it" in line for line in active.problems(recipe, checkpointed))


def test_an_out_of_memory_is_blamed_on_the_first_unfinished_phase() -> None:
    from memclaims.measure.record_builder import SIM_PHASES, TOP_PHASES, failed_phase

    assert failed_phase(set()) == "load"
    assert failed_phase({"load", "forward"}) == "train"
    assert failed_phase(set(TOP_PHASES)) == "accuracy"
    assert failed_phase({"load", "train"}, SIM_PHASES) == "train"  # the sim replays no accuracy phase


def test_every_engine_raising_out_of_memory_blames_the_phase_by_the_one_rule() -> None:
    """Each module that builds a memclaims OutOfMemory names its phase with failed_phase (the runner and
    the sim had a copy of the rule each)."""
    import ast

    package = PACKAGE
    raising = {}
    for path in sorted(package.rglob("*.py")):
        calls = [n.func for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]
        names = {f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "" for f in calls}
        # torch.OutOfMemoryError is torch's; memclaims' is core.errors.OutOfMemory
        if "OutOfMemory" in names:
            raising[path.relative_to(package).as_posix()] = "failed_phase" in names
    assert set(raising) >= {"measure/runner.py", "sim/replay.py"}
    assert all(raising.values()), f"name the phase with measure.record_builder.failed_phase: {raising}"


def test_activation_checkpointing_on_one_device_must_recompute_in_backward() -> None:
    """One device: the forward keeps less than without it, and the backward ran the blocks' linears again."""
    recipe = resolve("vit", "smoke", ["activation-checkpointing"])
    plain = _record(phases={"forward": {"above_start_bytes": 9000}}, recomputed_linear_calls=0)
    checkpointed = _record(("activation-checkpointing",), phases={"forward": {"above_start_bytes": 3000}},
                           recomputed_linear_calls=4)
    without = {"activation-checkpointing": plain}
    assert active.problems(recipe, checkpointed, without=without) == []
    lazy = dataclasses.replace(checkpointed, recomputed_linear_calls=0)  # kept less, recomputed nothing
    assert any("nothing was recomputed" in line for line in active.problems(recipe, lazy, without=without))
    unobserved = dataclasses.replace(checkpointed, recomputed_linear_calls=None)  # FSDP on the sim observes none
    assert active.problems(recipe, unobserved, without=without) == []


def test_a_batch_counts_the_examples_of_its_inputs_not_the_tokens_of_its_labels() -> None:
    """The active check of batch sizes reads this (``Record.step_examples``): labels flattened over the tokens
    (``target.view(-1)``, Lightning's demo Transformer's) lead with batch x sequence, the inputs with the batch."""
    ids = torch.zeros(4, 16, dtype=torch.long)
    flat = ids.reshape(-1)
    assert batch_examples(ids, flat) == 4
    assert batch_examples({"input_ids": ids, "attention_mask": ids}, flat) == 4
    assert batch_examples((ids, ids), flat) == 4  # the demo Transformer's (inputs, target)
    assert batch_examples([ids], flat) == 4
    assert batch_examples({"texts": ["a", "b", "c"]}, torch.zeros(3)) == 3  # no tensor in the inputs: the labels'

