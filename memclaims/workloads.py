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
    # Micro-batches per optimizer step under grad-accum: 4 in script 05 and DistilBERT "after",
    # 12 (micro-batch 1) in BigBird "after".
    accumulation_steps: int = 4
    # Size knobs (memclaims.recipe.Sizes); None: the workload's own size at this scale.
    image_size: int | None = None
    seq_len: int | None = None


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
    # False: FSDP shards the model as one unit, as BigBird "after" (FSDPStrategy without a policy).
    fsdp_auto_wrap: bool = True
    # Which size knob the model takes: "image" (--image-size) or "seq" (--seq-len); None: neither.
    size_knob: str | None = None
    # Raises UsageError for a size the model cannot take (image not a multiple of the patch, a
    # sequence longer than the position embeddings); None: any size.
    check_scale: Callable[[Scale], None] | None = None
    # For the sim: the randomly initialised architecture (scale, num_classes or None for the stock
    # head) and a micro-batch of synthetic inputs at full size (scale, batch) -> (inputs, targets).
    architecture: Callable[[Scale, int | None], nn.Module] | None = None
    fake_inputs: Callable[[Scale, int], tuple[Any, torch.Tensor]] | None = None
    # (model, inputs) -> logits of shape (N, classes), when not ``model(**inputs).logits`` /
    # ``model(inputs)`` (a causal LM flattens its next-token logits).
    logits_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None

    def scale(self, name: str) -> Scale:
        try:
            return self.scales[name]
        except KeyError:
            raise UsageError(
                f"unknown scale {name!r} for workload {self.name!r}; valid scales: {', '.join(self.scales)}"
            ) from None

    def logits(self, model: nn.Module, inputs: Any) -> torch.Tensor:
        if self.logits_fn is not None:
            return self.logits_fn(model, inputs)
        return model(**inputs).logits if isinstance(inputs, dict) else model(inputs)


# --- ViT -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VitFamily:
    """A torchvision Vision Transformer at both scales: the article's model, and a 2-layer,
    32-wide model of the same patch grid for smoke runs."""

    builder: str  # torchvision.models function: vit_l_16, vit_h_14
    weights: str  # the member of its weights enum the article's scripts load
    article_image_size: int
    hidden_dim: int  # width of the article model, for the 10-class head
    smoke: dict[str, int]

    def image_size(self, scale: Scale | str) -> int:
        """The scale's image size: its ``--image-size`` knob, else the family's size at that scale."""
        if isinstance(scale, Scale) and scale.image_size is not None:
            return scale.image_size
        scale_name = scale.name if isinstance(scale, Scale) else scale
        return self.smoke["image_size"] if scale_name == "smoke" else self.article_image_size

    def patch_size(self, scale_name: str) -> int:
        return self.smoke["patch_size"] if scale_name == "smoke" else int(self.builder.rsplit("_", 1)[1])

    def check_scale(self, scale: Scale) -> None:
        size, patch = self.image_size(scale), self.patch_size(scale.name)
        if size % patch:
            valid = ", ".join(str(patch * k) for k in range(max(1, size // patch - 1), size // patch + 3))
            raise UsageError(f"image size {size} is not a multiple of the patch size {patch} of {self.builder} "
                             f"at scale {scale.name!r}; valid image sizes are multiples of {patch}, e.g. {valid}")

    def architecture(self, scale: Scale | str, num_classes: int | None = 10) -> nn.Module:
        """Randomly initialised; ``num_classes=None`` keeps the stock 1000-class head (07 scripts)."""
        import torchvision.models as models

        scale_name = scale.name if isinstance(scale, Scale) else scale
        if scale_name == "smoke":
            return models.VisionTransformer(num_classes=num_classes or 10,
                                            **dict(self.smoke, image_size=self.image_size(scale)))
        model = getattr(models, self.builder)(weights=None, image_size=self.image_size(scale))
        if num_classes is not None:
            model.heads.head = nn.Linear(in_features=self.hidden_dim, out_features=num_classes)
        return model

    def _weights(self) -> Any:
        import torchvision.models as models

        enum_name, member = self.weights.split(".")
        return getattr(getattr(models, enum_name), member)

    def weights_cached(self) -> bool:
        filename = os.path.basename(self._weights().url)
        return (Path(torch.hub.get_dir()) / "checkpoints" / filename).is_file()

    def build(self, scale: Scale) -> tuple[nn.Module, str]:
        if scale.name == "smoke" or not self.weights_cached() or scale.image_size is not None:
            # Another image size changes the position embedding: the hub weights do not fit it.
            return self.architecture(scale), "random"
        import torchvision.models as models

        # Loading from the hub cache never downloads: the file is already there.
        model = getattr(models, self.builder)(weights=self._weights())
        model.heads.head = nn.Linear(in_features=self.hidden_dim, out_features=10)
        return model, "pretrained"

    def data(self, scale: Scale, data_dir: str | os.PathLike[str] | None) -> data.DataBundle:
        return data.images(self.image_size(scale), data_dir)


def _vit_block() -> type[nn.Module]:
    from torchvision.models.vision_transformer import EncoderBlock

    return EncoderBlock


VIT_L16 = VitFamily("vit_l_16", "ViT_L_16_Weights.IMAGENET1K_V1", 224, 1024,
                    smoke=dict(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64))
# The repo's later series: ViT-H/14 fine-tuned end to end at 518 px (torchvision's SWAG weights).
VIT_H14 = VitFamily("vit_h_14", "ViT_H_14_Weights.IMAGENET1K_SWAG_E2E_V1", 518, 1280,
                    smoke=dict(image_size=56, patch_size=14, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64))
VIT_FAMILIES = {"vit": VIT_L16, "vit-h14": VIT_H14}

VIT = Workload(
    name="vit",
    summary="torchvision ViT-L/16, 10-class head, CIFAR-10 (offline: scikit-learn digits)",
    source="01_pytorch-vit .. 11_delay-allocation",
    num_classes=10,
    scales={
        "smoke": Scale("smoke", "ViT 2 layers x 32 wide, 16 px patches of 4, batch 32", batch_size=32,
                       learning_rate=1e-3, sgd_learning_rate=0.05, memory_steps=3, accuracy_epochs=1),
        "article": Scale("article", "ViT-L/16, 224 px, batch 64, Adam lr 5e-5", batch_size=64,
                         learning_rate=5e-5, sgd_learning_rate=0.01, memory_steps=3, accuracy_epochs=1),
    },
    build_model=VIT_L16.build,
    load_data=VIT_L16.data,
    block_class=_vit_block,
    size_knob="image",
    check_scale=VIT_L16.check_scale,
)

VIT_H14_WORKLOAD = Workload(
    name="vit-h14",
    summary="torchvision ViT-H/14 at 518 px, 10-class head, batch 4 per GPU (the repo's later series)",
    source="the ViT-H/14 series (figure only): one GPU -> FSDP -> + activation checkpointing -> + CPU offload",
    num_classes=10,
    scales={
        # Batch 16, not 4: with 2 images per CPU rank the activations would not set the peak,
        # and checkpointing (the series' third bar) would have nothing to show.
        "smoke": Scale("smoke", "ViT 2 layers x 32 wide, 56 px patches of 14, batch 16", batch_size=16,
                       learning_rate=1e-3, sgd_learning_rate=0.05, memory_steps=3, accuracy_epochs=1),
        "article": Scale("article", "ViT-H/14, 518 px, batch 4 per GPU, Adam lr 5e-5", batch_size=4,
                         learning_rate=5e-5, sgd_learning_rate=0.01, memory_steps=3, accuracy_epochs=1),
    },
    build_model=VIT_H14.build,
    load_data=VIT_H14.data,
    block_class=_vit_block,
    size_knob="image",
    check_scale=VIT_H14.check_scale,
)

WORKLOADS: dict[str, Workload] = {VIT.name: VIT, VIT_H14_WORKLOAD.name: VIT_H14_WORKLOAD}

from memclaims.text import text_workloads  # noqa: E402 (text.py builds on Scale/Workload above)

WORKLOADS.update(text_workloads())


def workload(name: str) -> Workload:
    """A built-in workload, an ``hf:<model_type>[(key=value,...)]`` one, or one a user registered."""
    if name.startswith(HF_PREFIX):
        from memclaims import hf

        return hf.workload(name)
    if name in WORKLOADS:
        return WORKLOADS[name]
    from memclaims import user_workloads

    found = user_workloads.find(name)
    if found is not None:
        return found
    valid = [*WORKLOADS, *user_workloads.names(), f"{HF_PREFIX}<model_type>"]
    raise UsageError(f"unknown workload {name!r}; valid workloads: {', '.join(valid)}") from None


HF_PREFIX = "hf:"
