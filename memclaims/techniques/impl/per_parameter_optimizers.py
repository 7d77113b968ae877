"""The optimizer step fused into backward, as PyTorch's tutorial "How to save memory by fusing the
optimizer step into the backward pass" does it: one optimizer per parameter, stepped and zeroed in
the parameter's ``register_post_accumulate_grad_hook``, so that each gradient is freed as soon as
it is applied and the gradients never all live at once.

The recipe's optimizer (built by ``memclaims.measure.optimizers``, set up by Fabric, stepped and
zeroed by the loop as ever) stays what the rest of the run sees: each per-parameter optimizer is a
copy of its parameter's group, takes the group's hyperparameters before every step (a scheduler
steers the recipe's optimizer), and keeps its state in the recipe's optimizer's ``state`` entry for
the parameter, so state bytes, probes and the sim's tags read them there. The loop's own step then
finds no gradient and does nothing; were the hooks ever lost, it would quietly train the ordinary
way, which the active check (``memclaims.measure.active``) tells from the fields counted here.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from memclaims.techniques.base import LoopHelper, Observed, observations


class OptimizerInBackward(LoopHelper):
    """Per-parameter optimizers for every parameter of ``optimizer``, stepped in backward by ``step``
    (the loop's: the sim attributes the step's temporaries)."""

    def __init__(self, optimizer: torch.optim.Optimizer, step: Callable[[Any], None], technique: str) -> None:
        self.step = step
        self.technique = technique  # whose part of the Record holds what it counts
        self.steps = 0  # per-parameter steps taken inside backward
        self.grad_peak_bytes = 0  # the most gradient bytes alive at once at a hook
        self._live: dict[torch.Tensor, int] = {}  # parameter -> its gradient's bytes, while alive
        self._optimizers: dict[torch.Tensor, tuple[torch.optim.Optimizer, dict[str, object]]] = {}
        cls = type(optimizer)
        # The recipe's defaults its class's constructor takes (torch's AdamW keeps one it does not take).
        accepted = inspect.signature(cls.__init__).parameters
        defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
        for group in optimizer.param_groups:
            for param in group["params"]:
                single = cls([{**group, "params": [param]}], **defaults)
                # One state dict per parameter, shared: the recipe's optimizer holds what the copy builds.
                optimizer.state[param] = single.state[param]
                self._optimizers[param] = (single, group)
                param.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, param: torch.Tensor) -> None:
        single, group = self._optimizers[param]
        single.param_groups[0].update({k: v for k, v in group.items() if k != "params"})
        if param.grad is not None:
            self._live[param] = param.grad.nbytes
        self.grad_peak_bytes = max(self.grad_peak_bytes, sum(self._live.values()))
        self.step(single)
        single.zero_grad(set_to_none=True)
        self.steps += 1
        if param.grad is None:
            self._live.pop(param, None)

    def measured_fields(self) -> Observed:
        return observations(self.technique, backward_optimizer_steps=self.steps,
                            backward_grad_peak_bytes=self.grad_peak_bytes)
