"""The article scripts' training loop, shared by every engine: one device, sharded ranks, the sim.

The loop decides the peak, so it exists once: ``zero_grad`` after the forward pass (scripts 01-04,
06), or a scaled loss with a step on every accumulation-th batch and ``zero_grad`` after it (05).
Subclasses say how a loss is computed, back-propagated and read, and how the optimizer steps
(the sim wraps the step to attribute its temporaries and cannot read a fake loss). A training stack
that runs its own loop (memclaims.measure.stacks) has its order (``techniques.base.LoopOrder``: the HF
Trainer and the course's Accelerate loop zero after every step, Lightning's Trainer at the start of each
accumulation window, the Trainer clips and prefetches a step's micro-batches), which the sim replays here.

The loop also names the phases of a step (``STEP_PHASES``) and opens each through the ``phase``
callback that ``train`` takes, so that the probes measure the same boundaries on every engine.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from memclaims.measure.tensors import storage_bytes
from memclaims.techniques.base import (
    CLIP_GRAD_NORM,
    ZERO_AFTER_STEP,
    ZERO_AS_SCRIPTS,
    ZERO_AT_WINDOW_START,
    LoopHelper,
    LoopOrder,
    merge_observed,
)

if TYPE_CHECKING:
    from torch.optim.lr_scheduler import LRScheduler

# The phases of a training step, in the order of scripts 01-04 and 06 (05 zeroes after the step).
# The loss (and its scaling under accumulation) belongs to ``forward``; reading its value, the
# scheduler step and fetching the next batch belong to no step phase, only to the enclosing one.
STEP_PHASES = ("forward", "backward", "optimizer_step", "zero_grad")

PhaseCallback = Callable[[str], AbstractContextManager[object]]


def no_phase(name: str) -> AbstractContextManager[object]:
    return nullcontext()


def json_number(value: float) -> float | None:
    """NaN and inf are not JSON: a diverged loss is null, and ``nan_loss``/``nan_step`` say when."""
    return value if math.isfinite(value) else None


class TrainingLoop:
    def __init__(self, accumulation_steps: int, order: LoopOrder | None = None) -> None:
        self.accumulation_steps = accumulation_steps
        self.order = order or LoopOrder()  # the article scripts' unless a stack's loop is replayed
        self.losses: list[float] = []
        self.step_times: list[float] = []
        self.nan_step: int | None = None  # index into ``losses`` of the first NaN/inf
        self.grad_bytes: int | None = None  # read while the gradients exist, before the first step
        # Whether to hash the gradients there too (DDP ranks: memclaims.measure.active compares ranks).
        self.digests_gradients = False
        self.grad_digest: str | None = None
        # What the last optimizer step really consumed, counted from the batches (not the recipe),
        # so that a batch-size or accumulation technique that does nothing shows.
        self.step_examples: int | None = None
        self.step_micro_batches: int | None = None
        # Output dtypes of the model's linear layers in the first forward pass: the precision the
        # matmuls really ran in (autocast's half dtype, or the parameters' own).
        self.compute_dtypes: list[str] = []
        # nn.Linear calls inside the first backward pass: activation checkpointing recomputes there.
        self.recomputed_linear_calls: int | None = None
        # What the recipe's techniques put on this run's loop (memclaims.techniques.base.LoopHelper):
        # activation-offload's saved-tensor hooks, the per-parameter optimizers of optimizer-in-backward,
        # fused-linear-ce's loss; the engine's or the sim's.
        self.helpers: list[LoopHelper] = []

    # --- what a subclass provides -------------------------------------------------------------

    def forward_loss(self, model: nn.Module, inputs: object, targets: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def loss_value(self, loss: torch.Tensor) -> float:
        return float(loss.detach().float().item())

    def watch_loss(self, loss: torch.Tensor) -> None:
        self._watch(self.loss_value(loss))

    def gradients(self, model: nn.Module) -> Iterator[torch.Tensor]:
        return (p.grad for p in model.parameters() if p.grad is not None)

    def storage_bytes(self, tensors: Iterator[torch.Tensor]) -> int:
        return storage_bytes(tensors)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        optimizer.step()

    def after_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Right after the optimizer step's phase has closed."""

    def clip(self, model: nn.Module) -> None:
        """The gradient norm and clipping of a stack that clips (``LoopOrder.clips_gradients``)."""
        torch.nn.utils.clip_grad_norm_(model.parameters(), self.order.max_grad_norm)

    def synchronize(self) -> None:
        """Wait for queued device work, so that step times are real."""

    def technique_loss(self, model: nn.Module, output: object, targets: torch.Tensor) -> torch.Tensor | None:
        """A helper's loss from the model's output (fused-linear-ce's), or None: cross-entropy over it."""
        for helper in self.helpers:
            loss: torch.Tensor | None = helper.loss(model, output, targets)
            if loss is not None:
                return loss
        return None

    def _around_forward(self) -> ExitStack:
        """The helpers' contexts around a forward pass (activation-offload's saved-tensor hooks)."""
        stack = ExitStack()
        for helper in self.helpers:
            context = helper.forward_context()
            if context is not None:
                stack.enter_context(context)
        return stack

    # --- the loop -----------------------------------------------------------------------------

    def train(self, model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: LRScheduler | None, batches: Iterator[Any],
              optimizer_steps: int, on_step: Callable[[], None] | None = None,
              phase: PhaseCallback = no_phase) -> None:
        """``optimizer_steps`` optimizer steps (or until ``batches`` runs out when negative);
        ``phase(name)`` wraps each of the ``STEP_PHASES`` (a probe's ``step_phase``)."""
        accumulation, order = self.accumulation_steps, self.order
        scripts = order.zero_grad == ZERO_AS_SCRIPTS
        done = 0
        examples = micro_batches = 0
        started = time.perf_counter()
        if order.prefetches and accumulation > 1:
            batches = prefetched(batches, accumulation)
        for batch_index, (inputs, targets) in enumerate(batches):
            if on_step is not None:
                on_step()
            model.train()
            watch = watch_linear_outputs(model) if not self.compute_dtypes else None
            with phase("forward"), self._around_forward():
                loss = self.forward_loss(model, inputs, targets)
                if accumulation > 1:
                    loss = loss / accumulation  # 05: scaled loss, step on every accumulation-th batch
            if watch is not None:
                self.compute_dtypes = watch()
                for helper in self.helpers:  # fused-linear-ce: the head's matmul, inside the loss
                    self.compute_dtypes = helper.compute_dtypes(self.compute_dtypes)
            examples += batch_examples(inputs, targets)
            micro_batches += 1
            if (accumulation == 1 and scripts
                    or order.zero_grad == ZERO_AT_WINDOW_START and batch_index % accumulation == 0):
                with phase("zero_grad"):
                    optimizer.zero_grad()  # 01..04, 06: after the forward pass (Lightning: the window's first)
            count = count_linear_calls(model) if self.recomputed_linear_calls is None else None
            with phase("backward"):
                self.backward(loss)
            if count is not None:
                self.recomputed_linear_calls = count()
            if scripts:  # 05 steps after its first micro-batch, then after every accumulation-th
                stepping = accumulation == 1 or batch_index % accumulation == 0
            else:  # the stacks step after each whole window
                stepping = (batch_index + 1) % accumulation == 0
            self.watch_loss(loss)
            if not stepping:
                continue
            if self.grad_bytes is None:
                self.grad_bytes = self.storage_bytes(self.gradients(model))
                if self.digests_gradients:
                    self.grad_digest = gradient_digest(self.gradients(model))
            self.step_examples, self.step_micro_batches = examples, micro_batches
            examples = micro_batches = 0
            if order.clips_gradients:
                with phase(CLIP_GRAD_NORM):
                    self.clip(model)
            with phase("optimizer_step"):
                self.step(optimizer)
            self.after_step(optimizer)
            if accumulation > 1 and scripts or order.zero_grad == ZERO_AFTER_STEP:
                with phase("zero_grad"):
                    optimizer.zero_grad()
            if scheduler is not None:
                scheduler.step()
            self.synchronize()
            now = time.perf_counter()
            self.step_times.append(now - started)
            started = now
            done += 1
            if done == optimizer_steps:
                return

    def measured_fields(self) -> dict[str, object]:
        """The Record's fields of what the loop observed (batch, accumulation, compute dtype)."""
        fields: dict[str, object] = dict(step_examples=self.step_examples, step_micro_batches=self.step_micro_batches,
                                      compute_dtypes=list(self.compute_dtypes), grad_digest=self.grad_digest,
                                      recomputed_linear_calls=self.recomputed_linear_calls)
        for helper in self.helpers:  # each technique's part of the Record (by_technique)
            merge_observed(fields, helper.measured_fields())
        return fields

    def loss_fields(self, memory_losses: list[float]) -> dict[str, Any]:
        """The Record's loss fields: the last loss, where it diverged, and the measured steps' losses."""
        return dict(final_loss=json_number(self.losses[-1]) if self.losses else None,
                    nan_loss=self.nan_step is not None, nan_step=self.nan_step,
                    memory_losses=[json_number(loss) for loss in memory_losses])

    def _watch(self, value: float) -> None:
        self.losses.append(value)
        if self.nan_step is None and not math.isfinite(value):
            self.nan_step = len(self.losses) - 1


def prefetched(batches: Iterator[object], window: int) -> Iterator[object]:
    """``batches`` a window at a time: all micro-batches of a step fetched before its first forward, and held until
    the next window is fetched (the HF Trainer's ``get_batch_samples`` list)."""
    source = iter(batches)
    while True:
        fetched = [batch for _, batch in zip(range(window), source)]
        if not fetched:
            return
        yield from fetched


def gradient_digest(gradients: Iterator[torch.Tensor]) -> str:
    """SHA-256 of the gradients' bytes, in parameter order: equal only where every bit is."""
    import hashlib

    digest = hashlib.sha256()
    for grad in gradients:
        digest.update(grad.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def batch_examples(inputs: object, targets: torch.Tensor) -> int:
    """Examples in a micro-batch: the leading dimension of the inputs' first tensor (a tensor, or the first
    in a mapping, tuple or list of them), never the targets' where the inputs have one: a causal LM's targets
    are its tokens, one per position, and flattened labels (``target.view(-1)``) lead with batch x sequence.
    The targets' only where the inputs hold no tensor."""
    first = next((leaf for leaf in tree_leaves(inputs) if isinstance(leaf, torch.Tensor)), None)
    return int(first.shape[0]) if first is not None else int(targets.shape[0])


def watch_linear_outputs(model: nn.Module) -> Callable[[], list[str]]:
    """Hooks every ``nn.Linear``; the returned function removes them and names the output dtypes seen."""
    seen: dict[str, None] = {}

    def hook(module: nn.Module, args: object, output: object) -> None:
        if isinstance(output, torch.Tensor):
            seen[dtype_name(output.dtype)] = None

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.Linear)]

    def done() -> list[str]:
        for handle in handles:
            handle.remove()
        return sorted(seen)

    return done


def count_linear_calls(model: nn.Module) -> Callable[[], int]:
    """Hooks every ``nn.Linear``; the returned function removes them and says how often they ran."""
    calls = [0]

    def hook(module: nn.Module, args: object) -> None:
        calls[0] += 1

    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, nn.Linear)]

    def done() -> int:
        for handle in handles:
            handle.remove()
        return calls[0]

    return done
