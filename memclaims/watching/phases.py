"""The phases of a training step, told from hooks on the user's own code: nothing is marked by the user.

- ``forward`` opens when one of the model's modules is called from outside the model (a global module hook, so a
  LightningModule whose ``training_step`` calls ``self.model`` or any submodule is seen as well as ``model(x)``); it
  stays open through the loss, as memclaims' own loop counts the loss in the forward, until the next phase opens.
  Under ``torch.no_grad()`` or ``model.eval()`` the same hook opens ``evaluation`` instead. A module's forward called
  inside ``backward`` (activation checkpointing recomputes its blocks there) opens nothing.
- ``backward`` is ``torch.autograd.backward`` (which ``Tensor.backward``, ``accelerator.backward`` and Lightning's
  precision plugins all call), wrapped for the watch, from its call to its return.
- ``optimizer_step`` from torch.optim's global step pre-hook to its post-hook, for every optimizer (bitsandbytes'
  included: they are torch.optim optimizers). Where ``step`` was given a closure (Lightning's automatic optimization
  runs forward and backward inside it), the phase opens when the closure's backward returns.
- ``zero_grad``: the model's and the optimizers' ``zero_grad``, wrapped on the instance (an accelerate
  ``AcceleratedOptimizer`` and the optimizer it wraps are one phase).

Phases open and close at these points through the stacks' ``PhaseDriver`` (one phase open at a time), as the stacks'
own drivers open theirs from the Trainer's and Lightning's callbacks. torch has no hook for "a backward begins" nor
for "zero_grad" (a module's or an optimizer's), hence the two wraps, undone when the watch ends.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from memclaims.measure.loop import PhaseCallback
from memclaims.measure.stacks.stack_driver import PhaseDriver
from memclaims.measure.tensors import storage_bytes

FORWARD, BACKWARD, OPTIMIZER_STEP, ZERO_GRAD, EVALUATION = (
    "forward", "backward", "optimizer_step", "zero_grad", "evaluation")
# The phases every watched training run must show (issue #50: an empty Record never passes).
REQUIRED = (FORWARD, BACKWARD, OPTIMIZER_STEP)


def _examples(value: object) -> int | None:
    """The rows of a batch: the first dimension of the first tensor in a forward's arguments."""
    if isinstance(value, torch.Tensor):
        return int(value.shape[0]) if value.dim() else None
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple)) else ()
    for item in items:
        found = _examples(item)
        if found is not None:
            return found
    return None


class StepPhases:
    """The hooks that open the step phases of a watched run, and what they saw: phases by count, optimizer steps,
    micro-batches per step, the batch size, the gradient bytes before the first step, the optimizers stepped."""

    def __init__(self, model: nn.Module, optimizers: list[torch.optim.Optimizer], phase: PhaseCallback,
                 on_micro_batch: Callable[[], None], reads_losses: bool = True,
                 count_bytes: Callable[[Any], int] = storage_bytes) -> None:
        self.model = model
        self.reads_losses = reads_losses  # not on the sim: a fake loss has no value
        self.count_bytes = count_bytes  # storages by identity on the sim (a fake one has no data pointer)
        self.driver = PhaseDriver(phase)
        self.on_micro_batch = on_micro_batch
        self.seen: Counter[str] = Counter()
        self.optimizers: list[torch.optim.Optimizer] = []
        self.optimizer_steps = 0
        self.micro_batches: list[int] = []  # per optimizer step
        self.batch_size: int | None = None
        self.grad_bytes: int | None = None
        self.losses: list[float] = []  # each backward's loss, where it was one number
        self.step_times: list[float] = []  # seconds from one optimizer step's end to the next one's
        self._last_step = time.perf_counter()
        self._modules = {id(m) for m in model.modules()}
        self._micro = 0
        self._depth = 0  # the watched modules' forwards under way (a call from outside the model is at depth 0)
        self._closure_step = False
        self._handles: list[RemovableHandle] = []
        self._undo: list[Callable[[], None]] = []
        for optimizer in optimizers:
            self._adopt(optimizer)

    # --- installing and removing ------------------------------------------------------------------

    def install(self) -> None:
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self._handles += [register_module_forward_pre_hook(self._forward_pre),
                          register_module_forward_hook(self._forward_post, always_call=True),
                          register_optimizer_step_pre_hook(self._step_pre),
                          register_optimizer_step_post_hook(self._step_post)]
        # The batch's rows where the model is called with keyword arguments only (a transformers model's **inputs):
        # torch's global forward pre-hooks see the positional ones only.
        self._handles.append(self.model.register_forward_pre_hook(self._rows, with_kwargs=True))
        self._wrap(self.model, "zero_grad")
        original = torch.autograd.backward

        def backward(*args: Any, **kwargs: Any) -> Any:
            if self.driver.current == BACKWARD:  # a backward inside a backward (a hook's): one phase
                return original(*args, **kwargs)
            self._loss(args[0] if args else kwargs.get("tensors"))
            self._open(BACKWARD)
            try:
                return original(*args, **kwargs)
            finally:
                self.driver.close()
                if self._closure_step:  # the closure of optimizer.step(closure) ran; the update follows
                    self._closure_step = False
                    self._before_update()
                    self._open(OPTIMIZER_STEP)

        torch.autograd.backward = backward

        def restore() -> None:
            torch.autograd.backward = original

        self._undo.append(restore)

    def remove(self) -> None:
        """Every hook and wrap undone, the open phase closed."""
        self.driver.close()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()

    def _wrap(self, owner: Any, method: str) -> None:
        """``owner.method`` opens ``zero_grad`` (on the instance; the class stays the library's)."""
        original = getattr(owner, method)

        def zero_grad(*args: Any, **kwargs: Any) -> Any:
            if self.driver.current == ZERO_GRAD:  # an AcceleratedOptimizer's zero_grad calls its optimizer's
                return original(*args, **kwargs)
            self._open(ZERO_GRAD)
            try:
                return original(*args, **kwargs)
            finally:
                self.driver.close()

        setattr(owner, method, zero_grad)

        def restore() -> None:
            if vars(owner).get(method) is zero_grad:
                delattr(owner, method)

        self._undo.append(restore)

    def _adopt(self, optimizer: torch.optim.Optimizer) -> None:
        if any(known is optimizer for known in self.optimizers):
            return
        self.optimizers.append(optimizer)
        self._wrap(optimizer, "zero_grad")

    # --- the points -------------------------------------------------------------------------------

    def _open(self, name: str) -> None:
        self.seen[name] += 1
        self.driver.open(name)

    def _forward_pre(self, module: nn.Module, args: tuple[object, ...]) -> None:
        if id(module) not in self._modules:
            return
        self._depth += 1
        if self._depth > 1 or self.driver.current == BACKWARD:  # a submodule's forward, or a recomputation
            return
        # A call of the model from outside it: the probe's per-forward boundary (MemTracker keeps one forward's
        # module statistics and refuses a module called twice without a reset), each evaluation batch included.
        self.on_micro_batch()
        kind = EVALUATION if not torch.is_grad_enabled() or not module.training else FORWARD
        if self.driver.current == kind:  # the loss's second call of the model, the next evaluation batch: one phase
            return
        if kind == FORWARD:
            self._micro += 1
            if self.batch_size is None:
                self.batch_size = _examples(args)
        self._open(kind)

    def _forward_post(self, module: nn.Module, args: tuple[object, ...], output: object) -> None:
        if id(module) in self._modules:
            self._depth = max(0, self._depth - 1)

    def _rows(self, module: nn.Module, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        if self.batch_size is None and self.driver.current == FORWARD:
            self.batch_size = _examples(kwargs)

    def _step_pre(self, optimizer: torch.optim.Optimizer, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        self._adopt(optimizer)
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args: (optimizer, *step's arguments)
        if closure is not None:
            self._closure_step = True  # forward and backward run inside step: the phase opens after them
            return
        self._before_update()
        self._open(OPTIMIZER_STEP)

    def _step_post(self, optimizer: torch.optim.Optimizer, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        self._closure_step = False
        if self.driver.current == OPTIMIZER_STEP:
            self.driver.close()
        self.optimizer_steps += 1
        now = time.perf_counter()
        self.step_times.append(now - self._last_step)
        self._last_step = now
        self.micro_batches.append(self._micro)
        self._micro = 0

    def _loss(self, value: object) -> None:
        if self.reads_losses and isinstance(value, torch.Tensor) and value.numel() == 1:
            self.losses.append(float(value.detach().float()))

    def _before_update(self) -> None:
        if self.grad_bytes is None:
            self.grad_bytes = self.count_bytes(p.grad for p in self.model.parameters() if p.grad is not None)

    def missing(self) -> list[str]:
        """The required phases never seen, in order."""
        return [name for name in REQUIRED if not self.seen[name]]

