"""Optimizers by technique name, built as the article's scripts and the course's lesson build them."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from memclaims.core import machine
from memclaims.core.errors import UsageError
from memclaims.techniques import torchao_adamw

# The course sets a weight decay on the decayed group; TrainingArguments' default (0.0) would make
# the two groups identical, so the value is AdamW's usual 0.01 (torch's and transformers' examples).
WEIGHT_DECAY = 0.01
EIGHT_BIT = {"adam8bit": "Adam8bit", "adamw8bit": "AdamW8bit", "paged_adamw8bit": "PagedAdamW8bit"}
# Paged: bitsandbytes puts a state of this many elements or more of a CUDA parameter in CUDA unified
# memory (cudaMallocManaged, outside torch's caching allocator; the driver pages it to the host when
# the GPU runs out); smaller ones, and every state on the CPU, stay ordinary tensors
# (Optimizer8bit.get_state_buffer: ``p.numel() < 1e5``; on the CPU it warns and falls back).
PAGED = frozenset({"paged_adamw8bit"})
# The optimizers torch implements three ways, and its foreach=/fused= for each way (memclaims.techniques.optimizer_impl).
from memclaims.techniques.optimizer_impl import TORCH_IMPLEMENTED, torch_flags  # noqa: E402

# The paged-adamw8bit technique's constant (memclaims.techniques.paged_adamw8bit), where the 8-bit models read it.
from memclaims.techniques.paged_adamw8bit import PAGED_MIN_NUMEL as PAGED_MIN_NUMEL  # noqa: E402

# torchao's low-bit AdamW (memclaims.techniques.torchao_adamw builds them), by the recipe's optimizer name.
TORCHAO: tuple[str, ...] = torchao_adamw.OPTIMIZERS

NAMES = ("adam", "sgd", "adamw", "adam8bit", "adamw8bit", "paged_adamw8bit", "adafactor", *TORCHAO)


def training_arguments_defaults() -> dict[str, float]:
    """betas and eps as ``TrainingArguments`` defines them, read from its fields (no instance needed)."""
    from transformers import TrainingArguments

    # Numeric defaults only: a field without a default holds dataclasses.MISSING, no number.
    defaults = {f.name: f.default for f in dataclasses.fields(TrainingArguments) if isinstance(f.default, (int, float))}
    return {k: float(defaults[k]) for k in ("adam_beta1", "adam_beta2", "adam_epsilon")}


def parameter_groups(model: nn.Module, weight_decay: float = WEIGHT_DECAY) -> list[dict[str, Any]]:
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
          implementation: str | None = None) -> tuple[torch.optim.Optimizer, LRScheduler | None]:
    """(optimizer, scheduler or None) for the recipe's optimizer ``name``; ``min_8bit_size``: the
    8-bit optimizers' threshold (None: bitsandbytes' default; torchao's quantize from it too, else from their
    own); ``anneal``: a cosine decay over
    ``total_steps`` for every optimizer (the scale's ``anneal``), not only SGD's; ``implementation``: how
    torch steps Adam, AdamW or SGD (``for-loop``, ``foreach``, ``fused``: torch's own ``foreach=`` and
    ``fused=``), None: torch's default for the parameters' device."""
    flags = torch_flags(implementation)
    if flags and name not in TORCH_IMPLEMENTED:
        raise UsageError(f"optimizer {name!r} has no {implementation} implementation to choose; torch's "
                         f"foreach= and fused= are those of {', '.join(TORCH_IMPLEMENTED)}")
    optimizer, scheduler = _build(name, model, learning_rate, total_steps, min_8bit_size, flags)
    if anneal and scheduler is None:
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total_steps))
    return optimizer, scheduler


def _build(name: str, model: nn.Module, learning_rate: float, total_steps: int,
           min_8bit_size: int | None, flags: dict[str, bool]) -> tuple[torch.optim.Optimizer, LRScheduler | None]:
    # None, None: torch picks by device, as before the choice existed (the for-loop on the CPU, foreach on CUDA).
    foreach, fused = flags.get("foreach"), flags.get("fused")
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=learning_rate, foreach=foreach, fused=fused), None
    if name == "sgd":
        # 06: plain SGD, no momentum, cosine decay over the whole training run.
        optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate, foreach=foreach, fused=fused)
        return optimizer, torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total_steps))
    if name == "adamw" or name in EIGHT_BIT or name in TORCHAO:
        hf = training_arguments_defaults()
        betas, eps = (hf["adam_beta1"], hf["adam_beta2"]), hf["adam_epsilon"]
        groups = parameter_groups(model)
        if name == "adamw":
            return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=eps, foreach=foreach,
                                     fused=fused), None
        # The device the parameters live on is where bitsandbytes steps (CPU with offloaded FSDP).
        device = next((p.device.type for p in model.parameters()), "cpu")
        if name in TORCHAO:  # the course's AdamW arguments, torchao's low-bit states
            return torchao_adamw.build(name, groups, learning_rate, betas, eps, min_8bit_size, device), None
        reason = machine.bitsandbytes_problem(device if device in machine.DEVICES else "cpu")
        if reason:
            raise UsageError(f"technique {name!r} needs bitsandbytes' 8-bit optimizers: {reason}")
        import bitsandbytes as bnb

        threshold = {} if min_8bit_size is None else {"min_8bit_size": min_8bit_size}
        eight_bit: torch.optim.Optimizer = getattr(bnb.optim, EIGHT_BIT[name])(
            groups, lr=learning_rate, betas=betas, eps=eps, **threshold)
        return eight_bit, None
    if name == "adafactor":
        from transformers.optimization import Adafactor

        # A fixed learning rate like the other optimizers (not Adafactor's relative step schedule).
        return Adafactor(model.parameters(), lr=learning_rate, scale_parameter=False, relative_step=False,
                         warmup_init=False), None
    raise UsageError(f"unknown optimizer {name!r}; valid optimizers: {', '.join(NAMES)}")
