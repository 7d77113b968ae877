"""FSDP2 as memclaims applies it (the fsdp techniques, ``memclaims.techniques.fsdp``): ``fully_shard`` on each of
the workload's blocks, then on the root. The CPU ranks' sharded engine calls it through the strategy's
``parallelize`` over gloo (every FSDP technique there), Lightning's ``ModelParallelStrategy`` through
``Fsdp2Parallelize``, its ``parallelize_fn``, on CUDA ranks (fsdp2, fsdp2-no-reshard).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

from torch import nn

from memclaims.core.errors import UsageError


def fully_shard_blocks(model: nn.Module, block: type[nn.Module], *, checkpointing: bool, auto_wrap: bool,
                       workload: str, block_options: Mapping[str, Any], root_options: Mapping[str, Any]) -> nn.Module:
    """Activation checkpointing around each ``block`` (non-reentrant, as Lightning's policy),
    ``fully_shard(**block_options)`` on each block's outermost module (the checkpoint wrapper when there is
    one), then ``fully_shard(model, **root_options)`` on the root: embeddings, final norm and head (all of it
    without auto-wrap)."""
    from torch.distributed.fsdp import fully_shard

    if checkpointing:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            apply_activation_checkpointing,
            checkpoint_wrapper,
        )

        apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                       check_fn=lambda m: isinstance(m, block))
    if auto_wrap:
        if not any(isinstance(m, block) for m in model.modules()):
            raise UsageError(f"{workload} has no {block.__name__} to shard")
        for module in model.modules():
            inner = getattr(module, "_checkpoint_wrapped_module", module)
            if isinstance(inner, block) and (module is inner) != checkpointing:
                fully_shard(module, **block_options)
    fully_shard(model, **root_options)
    return model


@dataclass(frozen=True)
class Fsdp2Parallelize:
    """``ModelParallelStrategy``'s ``parallelize_fn`` for an FSDP2 recipe: ``fully_shard`` on each of the
    workload's blocks with the recipe's ``reshard_after_forward``, then on the root (``reshard_after_forward``
    left to FSDP2: False for the root), over the device mesh's ``data_parallel`` dimension."""

    block: type[nn.Module]
    reshard_after_forward: bool
    checkpointing: bool
    auto_wrap: bool
    workload: str

    def __call__(self, model: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        mesh = device_mesh["data_parallel"]
        return fully_shard_blocks(model, self.block, checkpointing=self.checkpointing, auto_wrap=self.auto_wrap,
                                  workload=self.workload,
                                  block_options={"mesh": mesh, "reshard_after_forward": self.reshard_after_forward},
                                  root_options={"mesh": mesh})
