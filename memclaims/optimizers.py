"""Optimizers by technique name, built as the article's scripts build them."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from memclaims.errors import UsageError


def build(name: str, model: nn.Module, learning_rate: float, total_steps: int) -> tuple[torch.optim.Optimizer, Any]:
    """(optimizer, scheduler or None) for the recipe's optimizer ``name``."""
    if name == "adam":
        return torch.optim.Adam(model.parameters(), lr=learning_rate), None
    if name == "sgd":
        # 06: plain SGD, no momentum, cosine decay over the whole training run.
        optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
        return optimizer, torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=max(1, total_steps))
    raise UsageError(f"unknown optimizer {name!r}")
