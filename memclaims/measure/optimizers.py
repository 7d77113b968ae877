"""Optimizers by technique name, built as the article's scripts and the course's lesson build them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from memclaims.core import machine
from memclaims.core.errors import UsageError

# The choices' plain data (memclaims.core.optimizer_choices): torch's foreach=/fused= per implementation, the
# optimizers torch implements three ways, bitsandbytes' paging threshold (the sim's 8-bit model reads it here).
from memclaims.core.optimizer_choices import PAGED_MIN_NUMEL as PAGED_MIN_NUMEL
from memclaims.core.optimizer_choices import TORCH_IMPLEMENTED, torch_flags

if TYPE_CHECKING:
    from memclaims.techniques.base import BuildsOptimizer

# The course sets a weight decay on the decayed group; TrainingArguments' default (0.0) would make
# the two groups identical, so the value is AdamW's usual 0.01 (torch's and transformers' examples).
WEIGHT_DECAY = 0.01
EIGHT_BIT = {"adam8bit": "Adam8bit", "adamw8bit": "AdamW8bit", "paged_adamw8bit": "PagedAdamW8bit"}
# Paged: bitsandbytes puts a state of PAGED_MIN_NUMEL elements or more of a CUDA parameter in CUDA unified
# memory (cudaMallocManaged, outside torch's caching allocator; the driver pages it to the host when
# the GPU runs out); smaller ones, and every state on the CPU, stay ordinary tensors
# (Optimizer8bit.get_state_buffer: ``p.numel() < 1e5``; on the CPU it warns and falls back).
PAGED = frozenset({"paged_adamw8bit"})

Built = tuple[torch.optim.Optimizer, LRScheduler | None]


def training_arguments_defaults() -> dict[str, float]:
    """betas and eps as ``TrainingArguments`` defines them, read from its fields (no instance needed)."""
    from transformers import TrainingArguments

    # Numeric defaults only: a field without a default holds dataclasses.MISSING, no number.
    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments) if isinstance(f.default, (int, float))}
    return {k: float(defaults[k]) for k in ("adam_beta1", "adam_beta2", "adam_epsilon")}


def parameter_groups(model: nn.Module, weight_decay: float = WEIGHT_DECAY) -> list[dict[str, object]]:
    """The course's two groups: decay on everything except LayerNorm weights and all biases."""
    from transformers.trainer_pt_utils import get_parameter_names

    decay = {n for n in get_parameter_names(model, [nn.LayerNorm]) if "bias" not in n}
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for n, p in named if n in decay], "weight_decay": weight_decay},
        {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
    ]


def prepare(name: str, device: str = "cpu") -> None:
    """Work an optimizer does once per process, done before any measured phase.

    bitsandbytes' check (memclaims.core.machine) steps a tiny optimizer on the device; inside a
    phase, only the first 8-bit case of a session would count its tensors, and a case's bytes
    would depend on test order.
    """
    if name in EIGHT_BIT:
        machine.bitsandbytes_problem(device)


def build(name: str, model: nn.Module, learning_rate: float, total_steps: int,
          min_8bit_size: int | None = None, anneal: bool = False,
          implementation: str | None = None, owner: BuildsOptimizer | None = None) -> Built:
    """(optimizer, scheduler or None) for the recipe's optimizer ``name``; ``min_8bit_size``: the
    8-bit optimizers' threshold (None: bitsandbytes' default; torchao's quantize from it too, else from their
    own); ``anneal``: a cosine decay over
    ``total_steps`` for every optimizer (the scale's ``anneal``), not only SGD's; ``implementation``: how
    torch steps Adam, AdamW or SGD (``for-loop``, ``foreach``, ``fused``: torch's own ``foreach=`` and
    ``fused=``), None: torch's default for the parameters' device; ``owner``: the technique that builds ``name``
    itself (``Recipe.optimizer_owner``: torchao's), for a name none of ``BUILDERS`` is."""
    flags = torch_flags(implementation)
    if flags and name not in TORCH_IMPLEMENTED:
        raise UsageError(f"optimizer {name!r} has no {implementation} implementation to choose; torch's "
                         f"foreach= and fused= are those of {', '.join(TORCH_IMPLEMENTED)}")
    builder = BUILDERS.get(name)
    if builder is not None:
        optimizer, scheduler = builder(_Request(name, model, learning_rate, total_steps, min_8bit_size, flags))
    elif owner is not None:  # the course's AdamW arguments and groups, the owner's optimizer (torchao's low-bit states)
        betas, eps = _course_adamw()
        optimizer, scheduler = owner.build_optimizer(parameter_groups(model), learning_rate, betas, eps, min_8bit_size,
                                                     _device(model)), None
    else:
        raise UsageError(f"unknown optimizer {name!r}; valid optimizers: {', '.join(BUILDERS)} and those a "
                         "technique builds itself (torchao's ao_adamw8bit, ao_adamw4bit, ao_adamw_fp8)")
    if anneal and scheduler is None:
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total_steps))
    return optimizer, scheduler


@dataclass(frozen=True)
class _Request:
    name: str
    model: nn.Module
    learning_rate: float
    total_steps: int
    min_8bit_size: int | None
    flags: dict[str, bool]

    @property
    def foreach(self) -> bool | None:
        """torch's ``foreach=``; None (with ``fused`` None): torch picks by device (the for-loop on the CPU, foreach
        on CUDA), as before the choice existed."""
        return self.flags.get("foreach")

    @property
    def fused(self) -> bool | None:
        return self.flags.get("fused")


def _course_adamw() -> tuple[tuple[float, float], float]:
    """The course's AdamW betas and eps: TrainingArguments' defaults."""
    hf = training_arguments_defaults()
    return (hf["adam_beta1"], hf["adam_beta2"]), hf["adam_epsilon"]


def _device(model: nn.Module) -> str:
    """The device the parameters live on: where bitsandbytes and torchao step (CPU with offloaded FSDP)."""
    return next((p.device.type for p in model.parameters()), "cpu")


def _adam(asked: _Request) -> Built:
    return torch.optim.Adam(asked.model.parameters(), lr=asked.learning_rate, foreach=asked.foreach,
                            fused=asked.fused), None


def _sgd(asked: _Request) -> Built:
    # 06: plain SGD, no momentum, cosine decay over the whole training run.
    optimizer = torch.optim.SGD(asked.model.parameters(), lr=asked.learning_rate, foreach=asked.foreach,
                                fused=asked.fused)
    return optimizer, torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, asked.total_steps))


def _adamw(asked: _Request) -> Built:
    betas, eps = _course_adamw()
    return torch.optim.AdamW(parameter_groups(asked.model), lr=asked.learning_rate, betas=betas, eps=eps,
                             foreach=asked.foreach, fused=asked.fused), None


def _eight_bit(asked: _Request) -> Built:
    betas, eps = _course_adamw()
    groups = parameter_groups(asked.model)
    device = _device(asked.model)
    reason = machine.bitsandbytes_problem(device if device in machine.DEVICES else "cpu")
    if reason:
        raise UsageError(f"technique {asked.name!r} needs bitsandbytes' 8-bit optimizers: {reason}")
    import bitsandbytes as bnb

    threshold = {} if asked.min_8bit_size is None else {"min_8bit_size": asked.min_8bit_size}
    eight_bit: torch.optim.Optimizer = getattr(bnb.optim, EIGHT_BIT[asked.name])(
        groups, lr=asked.learning_rate, betas=betas, eps=eps, **threshold)
    return eight_bit, None


def _adafactor(asked: _Request) -> Built:
    from transformers.optimization import Adafactor

    # A fixed learning rate like the other optimizers (not Adafactor's relative step schedule).
    return Adafactor(asked.model.parameters(), lr=asked.learning_rate, scale_parameter=False, relative_step=False,
                     warmup_init=False), None


# The recipe optimizers (core field values) the engines build themselves, by name; a technique that builds its own
# (``BuildsOptimizer``) is asked through the recipe (``Recipe.optimizer_owner``).
BUILDERS: dict[str, Callable[[_Request], Built]] = {
    "adam": _adam, "sgd": _sgd, "adamw": _adamw, **dict.fromkeys(EIGHT_BIT, _eight_bit), "adafactor": _adafactor,
}
