"""optimizer-in-backward: each parameter's optimizer step and zero_grad inside backward, as its gradient is
ready (``Tensor.register_post_accumulate_grad_hook``; PyTorch's tutorial "How to save memory by fusing the
optimizer step into the backward pass"): gradients freed as soon as they are applied.

The loop's ``fuse`` (``memclaims.techniques.impl.per_parameter_optimizers``) builds one optimizer per parameter before Fabric's
setup (its wrapper is no optimizer to copy) and on the sim after the gradient-tagging hooks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memclaims.techniques.base import Hooks, Say, Technique
from memclaims.techniques.shared_conflicts import FSDP1_SHARDINGS, FSDP2_TECHNIQUES

if TYPE_CHECKING:
    import torch
    from torch import nn

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.techniques.engine_protocols import RealRun, SimLoop

NAME = "optimizer-in-backward"  # the technique's registry name, and its part of the Record (``by_technique``)


class OptimizerInBackward(Hooks):
    def before_setup(self, engine: RealRun, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        # On the optimizer itself; setup on one device moves and converts the parameters in place, so the
        # hooks stay on them.
        from memclaims.techniques.impl.per_parameter_optimizers import OptimizerInBackward as PerParameter

        engine.helpers.append(PerParameter(optimizer, engine.step, NAME))  # stepping as the loop's step does

    def expected_grad_bytes(self, record: Record, bytes_per_param: int, expected: int) -> int:
        return 0  # each gradient applied and freed in the backward

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        # Per-parameter steps taken inside backward over the measured steps, and the most gradient bytes alive at
        # once when one of them began.
        steps, peak = record.observed(NAME, "backward_optimizer_steps"), record.observed(NAME, "backward_grad_peak_bytes")
        expected = record.param_tensor_count * record.memory_steps  # one step per parameter per backward
        if steps != expected:
            say(f"backward_optimizer_steps is {steps}, expected {expected} ({record.param_tensor_count} parameters "
                f"x {record.memory_steps} steps) in phase backward")
        if record.grad_bytes:
            say(f"grad_bytes is {record.grad_bytes:,} B after phase backward: gradients outlived the backward "
                "instead of being freed as they were applied")
        if peak is None or peak >= record.param_bytes:
            say(f"backward_grad_peak_bytes is {peak} B in phase backward, not below the {record.param_bytes:,} B "
                "of all gradients: they all lived at once")

    def sim_before_train(self, loop: SimLoop, optimizer: torch.optim.Optimizer) -> None:
        from memclaims.techniques.impl.per_parameter_optimizers import OptimizerInBackward as PerParameter

        loop.helpers.append(PerParameter(optimizer, loop.step, NAME))  # after the tagging hooks: tagged before freed


# Why the optimizer step cannot move into backward alongside these (PyTorch's tutorial names grad-accum and
# the strategies).
_CONFLICTS: tuple[tuple[str, str], ...] = (
    ("grad-accum", "the step runs on each backward's gradient as it is accumulated; accumulation needs the "
                   "gradients of all micro-batches summed before one step"),
    ("16-mixed", "GradScaler unscales the gradients and skips a step on inf/NaN after backward (scaler.step); "
                 "a step inside backward would apply the scaled gradients unchecked"),
    *((eight_bit, "memclaims builds one optimizer per parameter from the recipe's param groups, and "
                  "bitsandbytes keeps its 8-bit settings (min_8bit_size, optim_bits) outside them")
      for eight_bit in ("adam8bit", "adamw8bit", "paged-adamw8bit")),
    *((fsdp, "FSDP flattens the parameters into shards: hooks on the original parameters never fire, and a "
             "shard's gradient exists only after the reduce-scatter") for fsdp in ("fsdp", *FSDP1_SHARDINGS)),
    # memclaims' own: FSDP2 runs the sharded parameters' post-accumulate-grad hooks after each reduce-scatter
    # (torch's foreach_reduce), but memclaims' ranks engines step the optimizer after the backward only.
    *((fsdp2, "memclaims' multi-rank engines step the optimizer after the backward; FSDP2 would call the hook "
              "on each sharded parameter after its group's reduce-scatter, which memclaims does not replay")
      for fsdp2 in FSDP2_TECHNIQUES),
    ("ddp", "DDP all-reduces gradients in buckets from its own hooks; a step in the post-accumulate hook "
            "would apply the rank's local gradient before the all-reduce"),
    ("deepspeed-zero2", "DeepSpeed owns the optimizer step (partitioned fp32 master weights and states)"),
)

# One optimizer per parameter, stepped and zeroed in Tensor.register_post_accumulate_grad_hook.
ENTRY = Technique(NAME, "each parameter's optimizer step and zero_grad inside backward, as its "
                  "gradient is ready: gradients freed as soon as they are applied",
                  "torch tutorial: optimizer step in backward", in_cover=False, conflicts=_CONFLICTS,
                  hooks=OptimizerInBackward())
