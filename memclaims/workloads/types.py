"""What a workload is (``Workload``) and its named sizes (``Scale``).

Apart from the workloads themselves (``memclaims.workloads.vit``, ``memclaims.workloads.text``, ``memclaims.workloads.hf``,
``memclaims.workloads.user``), so that each of those builds on these types without importing another.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memclaims.core.errors import UsageError

if TYPE_CHECKING:  # torch at run time only where a model is built: naming a workload costs no torch import
    import torch
    from torch import nn

    from memclaims.workloads import data


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
    # bitsandbytes keeps tensors under ``min_8bit_size`` elements (default 4096) in 32-bit state;
    # no smoke ViT tensor reaches that, so its smoke scales lower it and the 8-bit state is real.
    # None: bitsandbytes' default (article scale, where every weight matrix is far larger).
    min_8bit_size: int | None = None
    # The budgeted accuracy schedule (memclaims.report.budget): at most this many optimizer steps of
    # training, then accuracy on at most this many test examples; None: whole epochs / the whole
    # test set. The Record declares what ran (``accuracy_schedule``).
    accuracy_steps: int | None = None
    accuracy_test_examples: int | None = None
    # The recipe the article saw diverge (16-true alone, NaN near batch 300, claim 3) trains at least
    # this many steps under the budget, so the divergence claim can still be observed.
    divergence_steps: int | None = None
    # Size knobs (memclaims.recipes.recipe.Sizes); None: the workload's own size at this scale.
    image_size: int | None = None
    seq_len: int | None = None
    # Trained to its plateau (``converged``): accuracy there moves by tenths of a point under a
    # numerics change and by points under a training fault, so it is compared with its baseline and
    # the "keeps accuracy" claims are checked on it. Elsewhere accuracy is reported, not asserted.
    plateau: bool = False
    # A cosine decay of the learning rate over the whole run for every optimizer (SGD always has
    # one, as script 06): a plateau reached with the rate still high would move with every seed.
    anneal: bool = False


@dataclass(frozen=True)
class LoraTargets:
    """Where the ``lora`` technique puts peft's adapters on a workload's model (``peft.LoraConfig``)."""

    # Module names (suffixes) that get adapters; None: peft's default for the model's type.
    target_modules: tuple[str, ...] | None
    # Modules trained in full beside the adapters (the freshly initialised classification head);
    # peft matches them by suffix, so DistilBERT's "classifier" also keeps its pre_classifier.
    modules_to_save: tuple[str, ...] = ()
    # The adapters' rank, scale numerator and dropout (peft's ``LoraConfig`` names) as this workload's defaults
    # (``memclaims.workloads.user.define``'s ``lora``); None: memclaims' own (``memclaims.techniques.lora.DEFAULTS``).
    r: int | None = None
    lora_alpha: float | None = None
    lora_dropout: float | None = None


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
    # Parameters the loss never reaches (BigBird's pooler: its classification head reads the [CLS] state),
    # which DDP refuses at the second step unless told to look for them (DDPStrategy(find_unused_parameters=True)).
    unused_parameters: bool = False
    # Which size knob the model takes: "image" (--image-size) or "seq" (--seq-len); None: neither.
    size_knob: str | None = None
    # That knob's value at a scale (the --seq-len or --image-size given, else the scale's own), as a
    # prediction states what it assumed; None: the workload has no size knob.
    input_size: Callable[[Scale], int] | None = None
    # Raises UsageError for a size the model cannot take (image not a multiple of the patch, a
    # sequence longer than the position embeddings); None: any size.
    check_scale: Callable[[Scale], None] | None = None
    # For the sim: the randomly initialised architecture (scale, num_classes or None for the stock
    # head) and a micro-batch of synthetic inputs at full size (scale, batch) -> (inputs, targets).
    architecture: Callable[[Scale, int | None], nn.Module] | None = None
    fake_inputs: Callable[[Scale, int], tuple[object, torch.Tensor]] | None = None
    # (model, inputs) -> logits of shape (N, classes), when not ``model(**inputs).logits`` /
    # ``model(inputs)`` (a causal LM flattens its next-token logits).
    logits_fn: Callable[[nn.Module, Any], torch.Tensor] | None = None
    # Where the ``lora`` technique's adapters go; None: the workload does not take it (the registry's
    # ``workload_needs`` names this attribute and the reason).
    lora_targets: LoraTargets | None = None
    # A causal LM's vocabulary projection (model -> its nn.Linear), which the ``fused-linear-ce`` technique
    # takes out of the forward to compute the loss from the hidden states; None: the workload has none
    # (the registry's ``workload_needs`` names this attribute and the reason).
    fused_loss_head: Callable[[nn.Module], nn.Module] | None = None
    # How the ``tensor-parallel`` technique splits the model's nn.Linear layers (transformers' ``base_model_tp_plan``
    # format: module name pattern -> "colwise" | "rowwise"), where neither the model's config nor memclaims' layouts
    # of the built-in blocks say it (a user workload's ``define(tensor_parallel_plan=...)``); None: none given.
    tensor_parallel_plan: dict[str, str] | None = None

    def scale(self, name: str) -> Scale:
        try:
            return self.scales[name]
        except KeyError:
            raise UsageError(
                f"unknown scale {name!r} for workload {self.name!r}; valid scales: {', '.join(self.scales)}"
            ) from None

    def logits(self, model: nn.Module, inputs: object) -> torch.Tensor:
        if self.logits_fn is not None:
            return self.logits_fn(model, inputs)
        # nn.Module.__call__ is typed Any: the logits' type is the workload's contract.
        logits: torch.Tensor = model(**inputs).logits if isinstance(inputs, dict) else model(inputs)
        return logits
