"""Workloads: a model and its data at a named scale.

``article`` scale is exactly the article's; ``smoke`` is the same model family shrunk so that a
case trains on two CPU cores in seconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from memclaims import data
from memclaims.errors import UsageError

SEED = 123  # L.seed_everything(123) in every script of the article


@dataclass(frozen=True)
class Scale:
    name: str
    summary: str
    batch_size: int
    learning_rate: float  # Adam's
    sgd_learning_rate: float
    memory_steps: int  # optimizer steps measured by the probes; the peak needs at least 2
    accuracy_epochs: int


@dataclass(frozen=True)
class Workload:
    name: str
    summary: str
    source: str
    num_classes: int
    scales: dict[str, Scale]
    # (scale) -> (model, "pretrained" | "random")
    build_model: Callable[[Scale], tuple[nn.Module, str]]
    load_data: Callable[[Scale, str | os.PathLike[str] | None], data.DataBundle]
    # The transformer block FSDP and activation checkpointing wrap.
    block_class: Callable[[], type[nn.Module]]

    def scale(self, name: str) -> Scale:
        try:
            return self.scales[name]
        except KeyError:
            raise UsageError(
                f"unknown scale {name!r} for workload {self.name!r}; valid scales: {', '.join(self.scales)}"
            ) from None

    def logits(self, model: nn.Module, inputs: Any) -> torch.Tensor:
        return model(**inputs).logits if isinstance(inputs, dict) else model(inputs)


# --- ViT -------------------------------------------------------------------------------------

VIT_SMOKE = dict(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64)
VIT_ARTICLE_IMAGE_SIZE = 224


def _vit_weights_cached() -> bool:
    from torchvision.models import ViT_L_16_Weights

    filename = os.path.basename(ViT_L_16_Weights.IMAGENET1K_V1.url)
    return (Path(torch.hub.get_dir()) / "checkpoints" / filename).is_file()


def build_vit(scale: Scale) -> tuple[nn.Module, str]:
    from torchvision.models import VisionTransformer, ViT_L_16_Weights, vit_l_16

    if scale.name == "smoke":
        return VisionTransformer(num_classes=10, **VIT_SMOKE), "random"
    pretrained = _vit_weights_cached()
    # Loading from the hub cache never downloads: the file is already there.
    model = vit_l_16(weights=ViT_L_16_Weights.IMAGENET1K_V1 if pretrained else None)
    model.heads.head = nn.Linear(in_features=1024, out_features=10)
    return model, "pretrained" if pretrained else "random"


def _vit_data(scale: Scale, data_dir: str | os.PathLike[str] | None) -> data.DataBundle:
    size = VIT_SMOKE["image_size"] if scale.name == "smoke" else VIT_ARTICLE_IMAGE_SIZE
    return data.images(size, data_dir)


def _vit_block() -> type[nn.Module]:
    from torchvision.models.vision_transformer import EncoderBlock

    return EncoderBlock


VIT = Workload(
    name="vit",
    summary="torchvision ViT-L/16, 10-class head, CIFAR-10 (offline: scikit-learn digits)",
    source="01_pytorch-vit .. 06_sgd-with-scheduler",
    num_classes=10,
    scales={
        "smoke": Scale("smoke", "ViT 2 layers x 32 wide, 16 px patches of 4, batch 32", batch_size=32,
                       learning_rate=1e-3, sgd_learning_rate=0.05, memory_steps=3, accuracy_epochs=1),
        "article": Scale("article", "ViT-L/16, 224 px, batch 64, Adam lr 5e-5", batch_size=64,
                         learning_rate=5e-5, sgd_learning_rate=0.01, memory_steps=3, accuracy_epochs=1),
    },
    build_model=build_vit,
    load_data=_vit_data,
    block_class=_vit_block,
)

WORKLOADS: dict[str, Workload] = {VIT.name: VIT}

from memclaims.text import text_workloads  # noqa: E402 (text.py builds on Scale/Workload above)

WORKLOADS.update(text_workloads())


def workload(name: str) -> Workload:
    try:
        return WORKLOADS[name]
    except KeyError:
        raise UsageError(f"unknown workload {name!r}; valid workloads: {', '.join(WORKLOADS)}") from None
