"""Regression injection: library regressions of kinds that really happened upstream, injected with
monkeypatch into smoke-scale runs; each must be caught, and named, by the suite's own checks.

Every injected run is judged the way a real upgrade would be: ``memclaims.baselines.compare.compare`` against
a clean Record of the same recipe measured in this module (not a stored baseline, so these tests
hold on any machine), plus ``memclaims.measure.active.problems`` (is every technique at work) and
``memclaims.measure.steady.leak`` (does a step phase grow from step to step). The controls, a patch that
changes nothing, a changed version string and an improvement (memory freed before the backward),
must stay green.

| injection | upstream | caught by |
|---|---|---|
| Adam holds a parameter-sized intermediate per parameter during ``step`` | pytorch#97712, fixed by #104898..#105193 (July 2023) | phases.optimizer_step.* |
| 8-bit Adam keeps 32-bit state | bitsandbytes (facebookresearch) #22 "no difference in memory usage"; #1261 | optimizer_state_bytes, phases.optimizer_step.*, active |
| ``Fabric.init_module`` stops building in the target dtype | Lightning #17462 / #17608 (what init_module promises) | load_peak_bytes, phases.load.*, active |
| every step's loss kept alive | Lightning #4556 (loss kept for epoch aggregation), #9336 | steady.leak on phases.forward / backward |
| Adam's update 100x too small | pytorch#105837 (model stopped learning after 1.13 -> 2.0) | accuracy (converged) |
| ``save_on_cpu``'s hooks never pushed: saved tensors stay where autograd made them | a saved-tensor hook outranked or disabled (torch.utils.checkpoint's own hooks take precedence inside a checkpointed region) | active (offloaded_activation_bytes, phase forward) |
| the post-accumulate-grad hooks lost: the loop's own step trains the ordinary way | a wrapper that replaces the parameters after the hooks were registered (FSDP1's flat parameters) | backward_optimizer_steps, grad_bytes, phases.optimizer_step.*, active |
| FSDP's sharding strategy lost on its way to the wrapper: SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD run as FULL_SHARD (or SHARD_GRAD_OP, FULL_SHARD as NO_SHARD); on the sim, suite/cases/techniques/test_fsdp_sharding_strategies.py | a keyword a wrapper stops forwarding (Lightning's FSDPStrategy passes ``sharding_strategy`` through its kwargs) | active (forward_unsharded_params, phase forward; param_bytes, optimizer_state_bytes, phase optimizer_step), every model-state metric |
| FSDP2's setting lost: ``reshard_after_forward`` ignored (False runs as True, True as False), or the FSDP2 replay run as FSDP1's flat parameters; on the sim, suite/cases/techniques/test_fsdp2.py | a keyword a parallelize_fn stops forwarding to ``fully_shard``; a strategy that picks FSDP1 | active (forward_unsharded_params, phase forward; fsdp_api, phase load) |
| Lightning's FSDP layer changed in every CPU rank: FSDPPrecision's MixedPrecision kept in fp32, FSDPStrategy's auto-wrap or checkpointing policy dropped, ``cpu_offload`` ignored, a new FSDP keyword; in suite/cases/techniques/test_fsdp_lightning_configuration.py (one process group of ranks, and the sim) | Lightning 2.1-2.5's "*-mixed" (until PR #21361), issue #19721; a keyword FSDPStrategy stops forwarding | phases.forward.*, peak_allocated_bytes, active (forward_unsharded_params, phase forward; recomputed_linear_calls), the configuration case (cpu_offload.offload_params, phase setup), refusal by name |
| peft's ``get_peft_model`` returns the model unchanged: no adapters, every base weight trained | a LoRA target-module rule that matches nothing where the model is left as it was | optimizer_state_bytes, grad_bytes, active (trainable_parameters, phase load; optimizer_state_bytes, phase optimizer_step) |
| 3,000 small objects kept per optimizer step | FSDP2/DTensor and foreach paths leaking Python objects per step (pytorch#178276, #181761, #188174) | host_steady.leak on python_blocks, phase optimizer_step |
| a 4 MiB C buffer kept per optimizer step | host RAM growing by tens of GB over long runs (the same issues) | host_steady.leak on malloc_bytes, phase optimizer_step |
| a copy of the model kept alive from set-up (a wrapper's ``setup`` that holds an extra copy) | the shape of an Accelerate ``prepare`` that keeps the module it replaced; pytorch#120123-style wrappers that clone the weights | load_peak_bytes, every training phase's allocated_bytes (the cpu tier counts set-up's survivors from set-up on, as a GPU's allocated bytes hold them) |
| the Trainer's default optimizer path changes: the default ``optim`` builds AdamW keeping a third state (``amsgrad``) | a transformers release that changes TrainingArguments' default ``optim`` or what its handler builds (``adamw_torch`` became ``adamw_torch_fused`` with torch 2.8) | optimizer_state_bytes, phases.optimizer_step.* (against the Trainer's own default path's clean Record; the sim replays the same answer) |
| Accelerate steps the optimizer on every micro-batch under ``accumulate`` | a wrapper whose step stops asking ``sync_gradients`` (accelerate's ``AcceleratedOptimizer.step``) | active (optimizer steps counted by torch's step hook against micro-batches / accumulation steps, phase train) |
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import pytest
import torch

from fixtures.injections import inject_lora_not_applied, inject_post_accumulate_hooks_lost
from memclaims.baselines.compare import Comparison, compare
from memclaims.core.names import CONVERGED
from memclaims.core.record import Record
from memclaims.measure import active, host, host_steady, steady
from memclaims.measure.runner import run
from memclaims.pytest.records import RecordCache
from memclaims.recipes import requirements
from memclaims.recipes.recipe import Recipe, resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.run import run_recipe

# One worker under -n (--dist loadgroup): the module-scoped clean Records are measured once.
pytestmark = [pytest.mark.cpu, pytest.mark.xdist_group("regressions-clean")]

# One clean run per recipe; the converged reference measures accuracy (for the numerics injection:
# accuracy is compared only where training reaches its plateau).
RECIPES: dict[str, tuple[tuple[str, ...], str]] = {
    "reference": (("fabric",), "smoke"),
    "adam8bit": (("adam8bit",), "smoke"),
    "init-module": (("bf16-true", "init-module"), "smoke"),
    "activation-offload": (("activation-offload",), "smoke"),
    "optimizer-in-backward": (("optimizer-in-backward",), "smoke"),
    "lora": (("lora",), "smoke"),
    "converged": (("fabric",), CONVERGED),
    "hf-trainer": (("hf-trainer",), "smoke"),
    "accelerate-accumulate": (("accelerate", "grad-accum"), "smoke"),
}
WITH_ACCURACY = {"converged"}
# The recipes of another workload than the ViT (lora runs on the text models only, the Trainer on a transformers one).
WORKLOADS = {"lora": "distilbert", "hf-trainer": "distilbert-cased"}
# The stacks' clean Records are the session's measured steps of the stacks' own CI cases
# (suite/cases/techniques/test_hf_trainer.py, test_accelerate.py: ``record_cache.memory``), measured once for both.
STACKS = {"hf-trainer", "accelerate-accumulate"}


def _recipe(name: str) -> Recipe:
    techniques, scale = RECIPES[name]
    return resolve(WORKLOADS.get(name, "vit"), scale, techniques)


def _measure(name: str) -> Record:
    if name in STACKS:  # a stack's own engine (its driver), through the door
        return run_recipe(_recipe(name), RunOptions(device="cpu", evaluate=False))[0]
    return run(_recipe(name), RunOptions(device="cpu", evaluate=name in WITH_ACCURACY))


# Decided at collection, by the one check the requires marker below also uses: without a working
# bitsandbytes the 8-bit recipe is neither measured nor injected.
NO_BITSANDBYTES = requirements.reason(requirements.needs(bitsandbytes="cpu"))


# Measured on first use by a selected injection, not up front: the nightly's ones (lora) cost CI nothing.
LAZY = {"lora", *STACKS}


class _Clean(dict[str, Record]):
    def __init__(self, records: dict[str, Record], record_cache: RecordCache) -> None:
        super().__init__(records)
        self.record_cache = record_cache

    def __missing__(self, name: str) -> Record:
        self[name] = self.record_cache.memory("cpu", _recipe(name)) if name in STACKS else _measure(name)
        return self[name]


@pytest.fixture(scope="module")
def clean(record_cache: RecordCache) -> dict[str, Record]:
    """One clean Record per recipe, shared by every injection of the module. The converged reference is the
    session's Record of that recipe (``record_cache``: the same run, ``RunOptions(device="cpu")`` at a plateau
    scale, that test_accuracy.py's case and the accuracy claims read), measured once for all of them."""
    return _Clean({name: record_cache.get("cpu", _recipe(name)) if name in WITH_ACCURACY else _measure(name)
                   for name in RECIPES if name not in LAZY and not (name == "adam8bit" and NO_BITSANDBYTES)},
                  record_cache)


class Verdict:
    """Everything the suite would say about an injected run."""

    def __init__(self, name: str, injected: Record, clean_record: Record) -> None:
        self.record = injected
        self.comparison: Comparison = compare(injected, clean_record, case_id=f"cpu:{injected.recipe}")
        self.inactive = active.problems(_recipe(name), injected)
        self.leak = steady.leak(injected)
        self.host_leak = host_steady.leak(injected, reference=clean_record)

    @property
    def failing_metrics(self) -> set[str]:
        return {r.metric for r in self.comparison.failures}

    @property
    def message(self) -> str:
        parts = [self.comparison.message()] if self.comparison.failures else []
        parts += self.inactive
        parts += [leak for leak in (self.leak, self.host_leak) if leak]
        return "\n".join(parts)

    @property
    def green(self) -> bool:
        return not self.comparison.failures and not self.inactive and self.leak is None and self.host_leak is None


def _judge(name: str, clean: dict[str, Record]) -> Verdict:
    return Verdict(name, _measure(name), clean[name])


# --- injections ---------------------------------------------------------------------------------


def _wrap_adam_step(monkeypatch: pytest.MonkeyPatch, around: Callable[[torch.optim.Optimizer, Callable[[], Any]], Any]) -> None:
    original = torch.optim.Adam.step

    @functools.wraps(original)
    def step(self: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
        return around(self, lambda: original(self, *args, **kwargs))

    monkeypatch.setattr(torch.optim.Adam, "step", step)


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]


def inject_foreach_intermediates(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch < 2.1's foreach Adam: ``exp_avg_sq.sqrt()`` and the bias-corrected step as fresh
    parameter-sized lists, alive together during the update (pytorch#97712)."""
    def around(optimizer: torch.optim.Optimizer, step: Callable[[], Any]) -> Any:
        intermediates = torch._foreach_mul([p.grad for p in _params(optimizer)], 1.0)
        result = step()
        del intermediates
        return result

    _wrap_adam_step(monkeypatch, around)


def inject_noop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: a wrapper that changes nothing."""
    _wrap_adam_step(monkeypatch, lambda optimizer, step: step())


def inject_buffer_kept_until_backward(monkeypatch: pytest.MonkeyPatch, size: int = 256 * 1024) -> None:
    """The older release of an improvement: the loss keeps a buffer (an upcast copy of the logits, say)
    until the backward begins, where the newer one frees it before. At smoke scale 256 KiB lifts the
    backward's start above its peak, as freeing it lowered every peak of the affected cases by 10-15 %."""
    original = torch.nn.functional.cross_entropy

    def keeping(logits: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        loss = original(logits, *args, **kwargs)
        if loss.requires_grad:
            held = [torch.empty(size // 4, dtype=torch.float32).fill_(1.0)]
            loss.register_hook(lambda grad: (held.clear(), grad)[1])  # the backward's first node frees it
        return loss

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", keeping)


def inject_small_updates(monkeypatch: pytest.MonkeyPatch) -> None:
    """An update 100x too small: training all but stops, as in pytorch#105837."""
    def around(optimizer: torch.optim.Optimizer, step: Callable[[], Any]) -> Any:
        rates = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] / 100
        try:
            return step()
        finally:
            for group, rate in zip(optimizer.param_groups, rates):
                group["lr"] = rate

    _wrap_adam_step(monkeypatch, around)


def inject_eight_bit_as_32_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """bitsandbytes' 8-bit optimizer running with 32-bit state: no memory saved (bitsandbytes#22)."""
    from bitsandbytes.optim.optimizer import Optimizer2State

    original = Optimizer2State.get_config

    def get_config(self: Any, gindex: int, pindex: int, group: dict[str, Any]) -> dict[str, Any]:
        config = original(self, gindex, pindex, group)
        config["optim_bits"] = 32
        return config

    monkeypatch.setattr(Optimizer2State, "get_config", get_config)


def inject_init_module_noop(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Fabric.init_module`` that no longer builds on the device in the target dtype: the model is
    built in fp32 and converted in ``setup``, as without it."""
    from lightning.fabric import Fabric

    monkeypatch.setattr(Fabric, "init_module", lambda self, *args, **kwargs: nullcontext())


def inject_loss_kept(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Every step's loss tensor kept alive after backward (Lightning#4556: losses kept on the device
    for the epoch-end aggregation)."""
    from lightning.fabric import Fabric

    kept: list[torch.Tensor] = []
    original = Fabric.backward

    def backward(self: Any, tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        kept.append(tensor)
        return original(self, tensor, *args, **kwargs)

    monkeypatch.setattr(Fabric, "backward", backward)
    return kept


def inject_objects_kept(monkeypatch: pytest.MonkeyPatch, count: int = 3000) -> list[list[tuple[int, int]]]:
    """``count`` small Python objects kept on every optimizer step (under the RSS noise: about
    200 KiB)."""
    kept: list[list[tuple[int, int]]] = []

    def around(optimizer: torch.optim.Optimizer, step: Callable[[], Any]) -> Any:
        kept.append([(len(kept), index) for index in range(count)])
        return step()

    _wrap_adam_step(monkeypatch, around)
    return kept


def inject_offload_not_pushed(monkeypatch: pytest.MonkeyPatch) -> None:
    """``save_on_cpu`` whose hooks are never pushed: the forward pass saves as without it."""
    save_on_cpu = torch.autograd.graph.save_on_cpu
    monkeypatch.setattr(save_on_cpu, "__enter__", lambda self: None)
    monkeypatch.setattr(save_on_cpu, "__exit__", lambda self, *exc: None)


def inject_buffers_kept(monkeypatch: pytest.MonkeyPatch, size: int = 4 * 2**20) -> list[bytes]:
    """A C buffer of ``size`` bytes (4 MiB) kept on every optimizer step: a leak in native code
    (a cache that never evicts, a pinned staging buffer per step). Freshly written, so its pages
    are resident."""
    kept: list[bytes] = []

    def around(optimizer: torch.optim.Optimizer, step: Callable[[], Any]) -> Any:
        kept.append(bytes([len(kept) % 256]) * size)
        return step()

    _wrap_adam_step(monkeypatch, around)
    return kept


def inject_trainer_default_with_more_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """A transformers release whose default ``optim`` builds another optimizer: the handler of TrainingArguments'
    default now builds AdamW with ``amsgrad`` (a third parameter-sized state, the running maximum). Patched where the
    Trainer looks its handlers up (``transformers.trainer_optimizer._OPTIMIZER_HANDLERS``), so the real run and the
    sim's replay (``memclaims.techniques.hf_trainer.trainer_built``) both see it, as both would see a release."""
    import dataclasses

    from transformers import TrainingArguments, trainer_optimizer
    from transformers.training_args import OptimizerNames

    default = OptimizerNames(next(f.default for f in dataclasses.fields(TrainingArguments) if f.name == "optim"))
    original = trainer_optimizer._OPTIMIZER_HANDLERS[default]

    def handler(ctx: Any) -> tuple[Any, dict[str, Any]]:
        cls, kwargs = original(ctx)
        return cls, {**kwargs, "amsgrad": True}

    monkeypatch.setitem(trainer_optimizer._OPTIMIZER_HANDLERS, default, handler)


def inject_accelerate_steps_every_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """accelerate's prepared optimizer stepping on every micro-batch under ``accumulate``: the wrapper's step no
    longer asks ``sync_gradients`` (the loop, and what the stack reports as synced, unchanged)."""
    from accelerate.optimizer import AcceleratedOptimizer

    def step(self: AcceleratedOptimizer, closure: Any = None) -> None:
        self.optimizer.step(closure)

    monkeypatch.setattr(AcceleratedOptimizer, "step", step)


def inject_model_copy_kept_from_setup(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """``Fabric.setup`` keeping a copy of the model's weights alive (not parameters, not the optimizer's): what a
    wrapper that holds the module it replaced keeps on the device through every phase."""
    from lightning.fabric import Fabric

    kept: list[torch.Tensor] = []
    original = Fabric.setup

    def setup(self: Any, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        kept.extend(p.detach().clone() for p in module.parameters())
        return original(self, module, *args, **kwargs)

    monkeypatch.setattr(Fabric, "setup", setup)
    return kept


def inject_version_string(monkeypatch: pytest.MonkeyPatch) -> None:
    """Control: only the recorded torch version changes (a rebuild, a local tag)."""
    from memclaims.core import tested_versions
    from memclaims.core.record import library_versions

    def versions() -> dict[str, str | None]:
        found = library_versions()
        found["torch"] = f"{found['torch']}+rebuilt"
        return found

    # Where every engine's Record reads the versions (memclaims.core.tested_versions.version_fields).
    monkeypatch.setattr(tested_versions, "library_versions", versions)


# --- the catch table ----------------------------------------------------------------------------


def _assert_named(verdict: Verdict, recipe: str, metric: str, phase: str | None) -> None:
    message = verdict.message
    assert recipe in message, message
    assert metric in message, message
    if phase is not None:
        assert phase in message, message


def test_foreach_adam_intermediates_are_caught_in_the_optimizer_step(clean, monkeypatch) -> None:
    inject_foreach_intermediates(monkeypatch)
    verdict = _judge("reference", clean)
    # The temporaries live only inside optimizer.step(): the whole-step peak (set by the forward
    # pass at smoke scale) does not move, the optimizer step's own peak does.
    assert "phases.optimizer_step.allocated_bytes" in verdict.failing_metrics
    assert "peak_allocated_bytes" not in verdict.failing_metrics
    # The step's peak above its start is derived: named as the explanation, never a failure of its own.
    assert "phases.optimizer_step.above_start_bytes got worse than its baseline, explaining" in verdict.message
    _assert_named(verdict, "vit-smoke/fabric", "phases.optimizer_step.above_start_bytes", "optimizer_step")


@pytest.mark.requires(bitsandbytes="cpu")
def test_eight_bit_state_left_in_32_bit_is_caught(clean, monkeypatch) -> None:
    inject_eight_bit_as_32_bit(monkeypatch)
    verdict = _judge("adam8bit", clean)
    assert "optimizer_state_bytes" in verdict.failing_metrics
    assert "phases.optimizer_step.allocated_bytes" in verdict.failing_metrics
    assert any("adam8bit is not active" in line and "uint8" in line for line in verdict.inactive), verdict.inactive
    _assert_named(verdict, "vit-smoke/adam8bit", "optimizer_state_bytes", "optimizer_step")


def test_init_module_that_builds_in_fp32_is_caught(clean, monkeypatch) -> None:
    inject_init_module_noop(monkeypatch)
    verdict = _judge("init-module", clean)
    assert {"load_peak_bytes", "phases.load.allocated_bytes"} <= verdict.failing_metrics
    assert any("init-module is not active" in line for line in verdict.inactive), verdict.inactive
    _assert_named(verdict, "vit-smoke/bf16-true+init-module", "phases.load.allocated_bytes", "load")


def test_offload_whose_hooks_are_never_pushed_is_caught(clean, monkeypatch) -> None:
    inject_offload_not_pushed(monkeypatch)
    verdict = _judge("activation-offload", clean)
    # On the host nothing moved either way: only what went through the pack hook tells.
    assert not verdict.comparison.failures, verdict.comparison.message()
    assert any("activation-offload is not active" in line for line in verdict.inactive), verdict.inactive
    _assert_named(verdict, "vit-smoke/activation-offload", "offloaded_activation_bytes", "forward")


def test_step_in_backward_whose_hooks_are_lost_is_caught(clean, monkeypatch) -> None:
    inject_post_accumulate_hooks_lost(monkeypatch)
    verdict = _judge("optimizer-in-backward", clean)
    # The ordinary step after backward: the gradients live through it and its temporaries return.
    assert {"peak_allocated_bytes", "phases.optimizer_step.allocated_bytes"} <= verdict.failing_metrics
    assert any("optimizer-in-backward is not active" in line for line in verdict.inactive), verdict.inactive
    _assert_named(verdict, "vit-smoke/optimizer-in-backward", "backward_optimizer_steps", "backward")
    _assert_named(verdict, "vit-smoke/optimizer-in-backward", "phases.optimizer_step.allocated_bytes",
                  "optimizer_step")


@pytest.mark.slow  # 7 s on CI's 2 cores (a clean and an injected DistilBERT run); suite/cases/techniques/test_lora.py's sim injection runs in CI
def test_peft_that_puts_no_adapters_on_is_caught(clean, monkeypatch) -> None:
    assert clean["lora"].observed("lora", "trainable_parameters")  # the clean run (LAZY: measured here), before the injection
    inject_lora_not_applied(monkeypatch)
    verdict = _judge("lora", clean)
    # Every parameter trains: Adam keeps state for the base weights and their gradients return.
    assert {"optimizer_state_bytes", "grad_bytes"} <= verdict.failing_metrics, verdict.message
    assert any("lora is not active" in line for line in verdict.inactive), verdict.inactive
    _assert_named(verdict, "distilbert-smoke/lora", "trainable_parameters", "load")
    _assert_named(verdict, "distilbert-smoke/lora", "optimizer_state_bytes", "phases.optimizer_step.allocated_bytes")


def test_a_model_copy_kept_from_setup_fails_every_training_phase(clean, monkeypatch) -> None:
    """Not only load: the copy is alive in every phase of training, and a GPU's allocated bytes would hold it there."""
    kept = inject_model_copy_kept_from_setup(monkeypatch)
    verdict = _judge("reference", clean)
    assert kept, "the injection never ran"
    training = {f"phases.{phase}.allocated_bytes" for phase in ("forward", "backward", "optimizer_step", "zero_grad")}
    assert {"load_peak_bytes", "peak_allocated_bytes", *training} <= verdict.failing_metrics, verdict.message
    copy = sum(t.untyped_storage().nbytes() for t in kept)
    for phase in ("forward", "optimizer_step", "zero_grad"):  # the copy's bytes, to the byte, in each
        grew = verdict.record.phases[phase]["allocated_bytes"] - clean["reference"].phases[phase]["allocated_bytes"]
        assert grew == copy, (phase, grew, copy)
    _assert_named(verdict, "vit-smoke/fabric", "phases.optimizer_step.allocated_bytes", "optimizer_step")


def test_the_trainers_default_optimizer_keeping_more_state_is_caught(clean, monkeypatch) -> None:
    """CI's Trainer case on its own default path (no optim given): a release that changes what the default builds
    fails it, where the case that passes the course's Adam8bit in cannot see it."""
    assert clean["hf-trainer"].optimizer_state_bytes  # the clean run (LAZY: measured here), before the injection
    inject_trainer_default_with_more_state(monkeypatch)
    verdict = _judge("hf-trainer", clean)
    assert {"optimizer_state_bytes", "phases.optimizer_step.allocated_bytes"} <= verdict.failing_metrics, verdict.message
    _assert_named(verdict, "distilbert-cased-smoke/hf-trainer", "optimizer_state_bytes", "optimizer_step")
    assert verdict.record.optimizer_state_bytes >= 1.4 * clean["hf-trainer"].optimizer_state_bytes  # 3 states, not 2
    # The sim replays the Trainer's own answer, not a choice of memclaims': the same third state, to the byte (the
    # clean replay's two states equal the cpu tier's too, suite/cases/techniques/test_hf_trainer.py).
    from memclaims import sim

    assert sim.simulate(_recipe("hf-trainer")).optimizer_state_bytes == verdict.record.optimizer_state_bytes


def test_accelerate_stepping_every_micro_batch_under_accumulation_is_caught(clean, monkeypatch) -> None:
    """The optimizer's real steps (torch's step hook), against the micro-batches over the accumulation steps: the
    stack's own view (sync_gradients, the loop's phases) still says one step per window."""
    assert not active.problems(_recipe("accelerate-accumulate"), clean["accelerate-accumulate"])  # before the injection
    inject_accelerate_steps_every_batch(monkeypatch)
    verdict = _judge("accelerate-accumulate", clean)
    steps = _recipe("accelerate-accumulate").accumulation_steps * verdict.record.memory_steps
    assert any(f"the optimizer stepped {steps} times over {steps} micro-batches in phase train" in line
               for line in verdict.inactive), verdict.message
    _assert_named(verdict, "vit-smoke/accelerate+grad-accum", "accelerate is not active", "phase train")


def test_loss_kept_every_step_is_caught_as_a_leak(clean, monkeypatch) -> None:
    kept = inject_loss_kept(monkeypatch)
    verdict = _judge("reference", clean)
    assert kept, "the injection never ran"
    assert verdict.leak is not None, "a per-step leak passed unnoticed"
    _assert_named(verdict, "vit-smoke/fabric", "phases.forward.allocated_bytes", "forward")
    assert "B per step" in verdict.leak


def test_small_objects_kept_every_step_are_caught_as_a_host_leak(clean, monkeypatch) -> None:
    kept = inject_objects_kept(monkeypatch)
    verdict = _judge("reference", clean)
    assert kept, "the injection never ran"
    assert verdict.leak is None
    assert verdict.host_leak is not None, "3,000 objects per step passed unnoticed"
    _assert_named(verdict, "vit-smoke/fabric", "python_blocks", "optimizer_step")
    growth = host_steady.growth_per_step(verdict.record, "python_blocks")
    # 3,000 tuples and their list per step, and the ints above 256 in them (not cached): over 3,000 blocks.
    assert growth is not None and growth >= 3000, growth


@pytest.mark.requires(unsupported=host.NO_MALLOC_COUNTER)
def test_a_buffer_kept_every_step_is_caught_as_a_host_leak(clean, monkeypatch) -> None:
    kept = inject_buffers_kept(monkeypatch)
    verdict = _judge("reference", clean)
    assert kept, "the injection never ran"
    assert verdict.leak is None  # nothing on the device (the CPU probe's tensor accounting)
    assert verdict.host_leak is not None, "4 MiB kept per step passed unnoticed"
    _assert_named(verdict, "vit-smoke/fabric", "malloc_bytes", "optimizer_step")
    growth = host_steady.growth_per_step(verdict.record, "malloc_bytes")
    assert growth is not None and 4 * 2**20 <= growth < 4.5 * 2**20, growth


def test_updates_too_small_cost_accuracy(clean, monkeypatch) -> None:
    inject_small_updates(monkeypatch)
    verdict = _judge("converged", clean)
    assert "accuracy" in verdict.failing_metrics, verdict.comparison.message()
    _assert_named(verdict, "vit-converged/fabric", "accuracy", None)


def test_control_noop_patch_stays_green(clean, monkeypatch) -> None:
    inject_noop(monkeypatch)
    verdict = _judge("reference", clean)
    assert verdict.green, verdict.message
    assert all(r.verdict in ("ok", "info") for r in verdict.comparison.results
               if r.metric != "accuracy"), verdict.comparison.rows()


def test_control_version_string_only_stays_green(clean, monkeypatch) -> None:
    inject_version_string(monkeypatch)
    verdict = _judge("reference", clean)
    assert verdict.green, verdict.message
    assert "+rebuilt" in verdict.comparison.environment_change


def test_control_memory_freed_before_the_backward_is_an_improvement(clean, monkeypatch) -> None:
    """The newer release frees before the backward what the older kept until it began: every peak falls or
    holds, the backward's peak above its (lower) start rises; judged on what is used, nothing fails."""
    inject_buffer_kept_until_backward(monkeypatch)
    older = _measure("reference")
    monkeypatch.undo()
    verdict = Verdict("reference", clean["reference"], older)
    assert verdict.green, verdict.message
    results = {r.metric: r for r in verdict.comparison.results}
    improved = {metric for metric, r in results.items() if r.verdict == "stale"}
    assert {"peak_allocated_bytes", "phases.forward.allocated_bytes", "phases.backward.allocated_bytes",
            "phases.backward.start_bytes"} <= improved, verdict.comparison.rows()
    assert results["phases.backward.above_start_bytes"].explains, results["phases.backward.above_start_bytes"]
    assert verdict.comparison.verdict == "stale" and not verdict.comparison.failures
