"""Workloads: a model and its data at a named scale.

``article`` scale is exactly the article's; ``smoke`` is the same model family shrunk so that a
case trains on two CPU cores in seconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from memclaims.core.errors import UsageError
from memclaims.core.names import CONVERGED, GPU_SMOKE
from memclaims.workloads.types import Scale, Workload

if TYPE_CHECKING:  # torch where a model or its data is built: naming a workload (list, claims) imports none
    from torch import nn

    from memclaims.workloads import data

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
    # The gpu tier's smoke scale (``gpusmoke``): the article model's width at a reduced image size,
    # large enough that every claim's difference is many 2 MiB allocator segments.
    gpusmoke: dict[str, int] | None = None
    # The accuracy scale (``converged``): small enough to train to its plateau in seconds on
    # scikit-learn's digits at their own 8 px (memclaims.workloads.types.CONVERGED).
    converged: dict[str, int] | None = None

    def _sizes(self, scale_name: str) -> dict[str, int] | None:
        if scale_name == GPU_SMOKE and self.gpusmoke is not None:
            return self.gpusmoke
        if scale_name == CONVERGED and self.converged is not None:
            return self.converged
        return self.smoke if scale_name == "smoke" else None

    def image_size(self, scale: Scale | str) -> int:
        """The scale's image size: its ``--image-size`` knob, else the family's size at that scale."""
        if isinstance(scale, Scale) and scale.image_size is not None:
            return scale.image_size
        sizes = self._sizes(scale.name if isinstance(scale, Scale) else scale)
        return sizes["image_size"] if sizes else self.article_image_size

    def patch_size(self, scale_name: str) -> int:
        sizes = self._sizes(scale_name)
        return sizes["patch_size"] if sizes else int(self.builder.rsplit("_", 1)[1])

    def check_scale(self, scale: Scale) -> None:
        size, patch = self.image_size(scale), self.patch_size(scale.name)
        if size % patch:
            valid = ", ".join(str(patch * k) for k in range(max(1, size // patch - 1), size // patch + 3))
            raise UsageError(f"image size {size} is not a multiple of the patch size {patch} of {self.builder} "
                             f"at scale {scale.name!r}; valid image sizes are multiples of {patch}, e.g. {valid}")

    # torchvision ships no type information: its models are cast to nn.Module where they leave this class.
    def architecture(self, scale: Scale | str, num_classes: int | None = 10) -> nn.Module:
        """Randomly initialised; ``num_classes=None`` keeps the stock 1000-class head (07 scripts)."""
        import torchvision.models as models

        sizes = self._sizes(scale.name if isinstance(scale, Scale) else scale)
        if sizes:
            return cast("nn.Module", models.VisionTransformer(num_classes=num_classes or 10,
                                                            **dict(sizes, image_size=self.image_size(scale))))
        model = getattr(models, self.builder)(weights=None, image_size=self.image_size(scale))
        if num_classes is not None:
            from torch import nn

            model.heads.head = nn.Linear(in_features=self.hidden_dim, out_features=num_classes)
        return cast("nn.Module", model)

    def _weights(self) -> Any:
        import torchvision.models as models

        enum_name, member = self.weights.split(".")
        return getattr(getattr(models, enum_name), member)

    def weights_cached(self) -> bool:
        url: str = self._weights().url
        filename = os.path.basename(url)
        import torch

        return (Path(torch.hub.get_dir()) / "checkpoints" / filename).is_file()

    def build(self, scale: Scale) -> tuple[nn.Module, str]:
        if self._sizes(scale.name) or not self.weights_cached() or scale.image_size is not None:
            # Another image size changes the position embedding: the hub weights do not fit it.
            return self.architecture(scale), "random"
        import torchvision.models as models

        # Loading from the hub cache never downloads: the file is already there.
        model = getattr(models, self.builder)(weights=self._weights())
        from torch import nn

        model.heads.head = nn.Linear(in_features=self.hidden_dim, out_features=10)
        return cast("nn.Module", model), "pretrained"

    def data(self, scale: Scale, data_dir: str | os.PathLike[str] | None) -> data.DataBundle:
        from memclaims.workloads import data
        if scale.name == CONVERGED:  # a fixed task: its accuracy baselines mean the same on every machine
            return data.digits(self.image_size(scale))
        return data.images(self.image_size(scale), data_dir)


def _vit_block() -> type[nn.Module]:
    from torchvision.models.vision_transformer import EncoderBlock

    return cast("type[nn.Module]", EncoderBlock)


# Five measured steps: step 1 creates the optimizer state, step 2 is the first steady step, and
# steps 3-5 must repeat its per-phase peaks exactly (memclaims.measure.steady); a few seconds at smoke scale.
SMOKE_MEMORY_STEPS = 5
# Smoke ViT tensors: attention in/out projections 3072/1024, MLP 2048, patch embedding 1536 (vit)
# elements; 1024 quantizes all of them (91 % of the parameters), norms, biases and embeddings stay fp32.
SMOKE_MIN_8BIT_SIZE = 1024
GPUSMOKE_IMAGE = 128  # 8 x 8 patches of 16 + the class token: 65 tokens
GPUSMOKE_IMAGE_H14 = 112  # 8 x 8 patches of 14 + the class token: 65 tokens
GPUSMOKE_LAYERS = 6
GPUSMOKE_ACCURACY_STEPS = 100  # digits: ~4.5 epochs at batch 64; CIFAR-10: a fixed budget
ARTICLE_ACCURACY_STEPS = 50
# The accuracy scale (memclaims.workloads.types.CONVERGED): chosen by measurement on 2 CPU cores
# (torch 2.14.1, fp32 Adam, plain loop): 48 wide, 2 layers, the digits' own 8 px in 4 patches of 4,
# batch 32, Adam lr 3e-3 annealed to 0 over 8 epochs reaches 96.4 % with a standard deviation over
# 5 seeds of 0.37 points (15 epochs: 97.1 %, the plateau); lr / 10 costs 6-10 points and lr x 10
# 8-12 points; about 3 s in fp32. Two memory steps: under grad-accum the first optimizer step
# follows one micro-batch (script 05 steps on batch 0), the second shows the accumulation at work
# (memclaims.measure.active).
CONVERGED_EPOCHS = 8
ARTICLE_TEST_EXAMPLES = 2_000

VIT_L16 = VitFamily("vit_l_16", "ViT_L_16_Weights.IMAGENET1K_V1", 224, 1024,
                    smoke=dict(image_size=16, patch_size=4, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64),
                    gpusmoke=dict(image_size=GPUSMOKE_IMAGE, patch_size=16, num_layers=GPUSMOKE_LAYERS,
                                  num_heads=12, hidden_dim=768, mlp_dim=3072),
                    converged=dict(image_size=8, patch_size=4, num_layers=2, num_heads=4, hidden_dim=48, mlp_dim=96))
# The repo's later series: ViT-H/14 fine-tuned end to end at 518 px (torchvision's SWAG weights).
VIT_H14 = VitFamily("vit_h_14", "ViT_H_14_Weights.IMAGENET1K_SWAG_E2E_V1", 518, 1280,
                    smoke=dict(image_size=56, patch_size=14, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64),
                    gpusmoke=dict(image_size=GPUSMOKE_IMAGE_H14, patch_size=14, num_layers=GPUSMOKE_LAYERS,
                                  num_heads=16, hidden_dim=1280, mlp_dim=5120))
VIT_FAMILIES = {"vit": VIT_L16, "vit-h14": VIT_H14}

def _vit_workload(family: VitFamily, name: str, *, summary: str, source: str, scales: dict[str, Scale]) -> Workload:
    """A ViT workload with the article's 10-class head (CIFAR-10): the family builds its model, loads
    its data and checks its sizes."""
    return Workload(name=name, summary=summary, source=source, num_classes=10, scales=scales,
                    build_model=family.build, load_data=family.data, block_class=_vit_block, size_knob="image",
                    input_size=family.image_size, check_scale=family.check_scale)


def _article_scale(summary: str, batch_size: int, accuracy_steps: int | None = None,
                   accuracy_test_examples: int | None = None, divergence_steps: int | None = None) -> Scale:
    """Both families at the article's size, with the article's learning rates (Adam 5e-5, script 06's
    SGD 0.01)."""
    return Scale("article", summary, batch_size=batch_size, learning_rate=5e-5, sgd_learning_rate=0.01,
                 memory_steps=3, accuracy_epochs=1, accuracy_steps=accuracy_steps,
                 accuracy_test_examples=accuracy_test_examples, divergence_steps=divergence_steps)


def _smoke_scale(summary: str, batch_size: int) -> Scale:
    """Both families' CPU smoke scale: its learning rates, and a lowered 8-bit threshold so that
    bitsandbytes really keeps 8-bit state for the small weights."""
    return Scale("smoke", summary, batch_size=batch_size, learning_rate=1e-3, sgd_learning_rate=0.05,
                 memory_steps=SMOKE_MEMORY_STEPS, accuracy_epochs=1, min_8bit_size=SMOKE_MIN_8BIT_SIZE)


def _gpu_smoke_scale(summary: str, batch_size: int, accuracy_test_examples: int | None = None) -> Scale:
    """Both families' gpu-tier smoke scale: full-width blocks, few layers, the budgeted schedule."""
    return Scale(GPU_SMOKE, summary, batch_size=batch_size, learning_rate=1e-4, sgd_learning_rate=0.01,
                 memory_steps=3, accuracy_epochs=1, accuracy_steps=GPUSMOKE_ACCURACY_STEPS,
                 accuracy_test_examples=accuracy_test_examples)


VIT = _vit_workload(VIT_L16, "vit",
    summary="torchvision ViT-L/16, 10-class head, CIFAR-10 (offline: scikit-learn digits)",
    source="01_pytorch-vit .. 11_delay-allocation",
    scales={
        "smoke": _smoke_scale("ViT 2 layers x 32 wide, 16 px patches of 4, batch 32", batch_size=32),
        # The nightly budget (memclaims.report.budget): 50 optimizer steps and 2,000 test images per case
        # instead of the article's epoch (703 steps, 10,000 images); --memclaims-accuracy-full-epochs
        # runs the article's epoch (weekly).
        "article": _article_scale("ViT-L/16, 224 px, batch 64, Adam lr 5e-5", batch_size=64,
                                  accuracy_steps=ARTICLE_ACCURACY_STEPS,
                                  accuracy_test_examples=ARTICLE_TEST_EXAMPLES, divergence_steps=400),
        GPU_SMOKE: _gpu_smoke_scale(f"the gpu tier's smoke: ViT-B/16 width (768, 12 heads, MLP 3072), "
                                    f"{GPUSMOKE_LAYERS} layers, {GPUSMOKE_IMAGE} px, batch 64", batch_size=64,
                                    accuracy_test_examples=ARTICLE_TEST_EXAMPLES),
        CONVERGED: Scale(CONVERGED, f"ViT 2 layers x 48 wide on the digits' 8 px (patches of 4), batch 32, trained "
                         f"{CONVERGED_EPOCHS} epochs to its plateau, learning rate annealed", batch_size=32,
                         learning_rate=3e-3, sgd_learning_rate=0.1, memory_steps=2, accuracy_epochs=CONVERGED_EPOCHS,
                         min_8bit_size=SMOKE_MIN_8BIT_SIZE, plateau=True, anneal=True),
    },
)

VIT_H14_WORKLOAD = _vit_workload(VIT_H14, "vit-h14",
    summary="torchvision ViT-H/14 at 518 px, 10-class head, batch 4 per GPU (the repo's later series)",
    source="the ViT-H/14 series (figure only): one GPU -> FSDP -> + activation checkpointing -> + CPU offload",
    scales={
        # Batch 16, not 4: with 2 images per CPU rank the activations would not set the peak,
        # and checkpointing (the series' third bar) would have nothing to show.
        "smoke": _smoke_scale("ViT 2 layers x 32 wide, 56 px patches of 14, batch 16", batch_size=16),
        "article": _article_scale("ViT-H/14, 518 px, batch 4 per GPU, Adam lr 5e-5", batch_size=4),
        GPU_SMOKE: _gpu_smoke_scale(f"the gpu tier's smoke: ViT-H/14 width (1280, 16 heads, MLP 5120), "
                                    f"{GPUSMOKE_LAYERS} layers, {GPUSMOKE_IMAGE_H14} px, batch 16", batch_size=16),
    },
)
