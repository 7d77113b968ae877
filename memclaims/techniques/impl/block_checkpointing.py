"""Activation checkpointing on one device (the ``activation-checkpointing`` technique without ``fsdp``).

Under a strategy that checkpoints the blocks by its own policy (FSDP: ``Strategy.block_policies``) the ranks get
theirs from the strategy's plan (``memclaims.techniques.fsdp``, ``memclaims.sim.sharded``); one device (and DDP's
ranks) gets it here, the way each model's users switch it on: a transformers model through its own ``activation_checkpointing_enable()`` (before
transformers 5: ``gradient_checkpointing_enable()``), anything else by wrapping each block of the
workload's block class in non-reentrant ``torch.utils.checkpoint`` (``checkpoint_wrapper``, as
FSDP's ``apply_activation_checkpointing`` does). The real engines and the sim call the same function; selective
checkpointing (``memclaims.techniques.selective_checkpointing``) passes its ``context_fn`` through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torch import nn

from memclaims.core.errors import UsageError

if TYPE_CHECKING:
    from memclaims.workloads.types import Workload

# What torch.utils.checkpoint is given: the non-reentrant implementation (the reentrant one is
# deprecated and needs inputs that require grad).
CHECKPOINT_KWARGS = {"use_reentrant": False}


def enable(model: nn.Module, workload: Workload, context_fn: Callable[[], Any] | None = None) -> str:
    """Checkpoint every block of ``model``; returns how, for the Record's notes. The workload's block
    class is asked for only where the model has no switch of its own (an ``hf:`` model may name none).
    ``context_fn``: ``torch.utils.checkpoint.checkpoint``'s (selective checkpointing's); None: torch's default."""
    kwargs: dict[str, Any] = dict(CHECKPOINT_KWARGS)
    if context_fn is not None:
        kwargs["context_fn"] = context_fn
    if getattr(model, "supports_gradient_checkpointing", False):
        # transformers >= 5 names it activation_checkpointing_enable (the old name warns).
        switch = getattr(model, "activation_checkpointing_enable", None)
        if switch is not None:
            switch(activation_checkpointing_kwargs=kwargs)
            return "activation checkpointing: the model's own activation_checkpointing_enable(use_reentrant=False)"
        legacy: Any = model.gradient_checkpointing_enable  # nn.Module's __getattr__ types it as a Tensor
        legacy(gradient_checkpointing_kwargs=kwargs)
        return "activation checkpointing: the model's own gradient_checkpointing_enable(use_reentrant=False)"
    block = workload.block_class()
    if not any(isinstance(m, block) for m in model.modules()):
        raise UsageError(f"activation-checkpointing: workload {workload.name!r} has no {block.__name__} block "
                         "to checkpoint; give the workload's block_class")
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    def wrap(module: nn.Module) -> nn.Module:
        if context_fn is None:
            return checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT)
        return checkpoint_wrapper(module, checkpoint_impl=CheckpointImpl.NO_REENTRANT, context_fn=context_fn)

    apply_activation_checkpointing(model, checkpoint_wrapper_fn=wrap, check_fn=lambda m: isinstance(m, block))
    return f"activation checkpointing: each {block.__name__} in torch.utils.checkpoint (use_reentrant=False)"
