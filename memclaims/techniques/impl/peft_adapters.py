"""The ``lora`` technique: peft's LoRA adapters put on the model as it is built (issue #27).

``peft.get_peft_model(model, LoraConfig(...))`` freezes every base weight and adds rank-``RANK`` adapters
(``lora_A``, ``lora_B``) to the workload's target modules (``Workload.lora_targets``: the attention's query
and value projections, or peft's default for an ``hf:`` model's type); the classification head is trained
in full (``modules_to_save``: peft keeps the original frozen and trains a copy). The optimizer is built
over all parameters, as peft's examples do; a frozen parameter never gets a gradient, so Adam keeps no
state for it. ``parameter_fields`` says what the run saw: lora's ``trainable_parameters`` and ``total_parameters``
(``memclaims.measure.active`` checks the fraction and the optimizer state against them), qlora's
``quantized_parameter_bytes`` (their parts of the Record, ``by_technique``).

The real engines call ``apply`` in the load phase (``memclaims.measure.pipeline``); the sim calls it on its
fake model (``memclaims.techniques.impl.peft_adapters_fake``), so both count the same parameters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from memclaims.core.errors import UsageError

if TYPE_CHECKING:
    from memclaims.workloads.types import Workload

# peft's LoraConfig defaults are r=8, lora_alpha=8; alpha 16 (scale 2) is the documented examples' choice.
RANK = 8
ALPHA = 16
DROPOUT = 0.1


def config(workload: Workload) -> Any:
    """The ``peft.LoraConfig`` of ``workload``'s adapters."""
    from peft import LoraConfig

    targets = workload.lora_targets
    if targets is None:
        raise UsageError(f"workload {workload.name!r} names no modules for LoRA adapters (Workload.lora_targets)")
    return LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=DROPOUT,
                      target_modules=list(targets.target_modules) if targets.target_modules is not None else None,
                      modules_to_save=list(targets.modules_to_save) or None)


def apply(model: nn.Module, workload: Workload) -> nn.Module:
    """``model`` with LoRA adapters (a ``peft.PeftModel``): base weights frozen, adapters and head trainable."""
    from peft import get_peft_model

    try:
        # autocast_adapter_dtype=False: adapters in the base layers' dtype, not upcast to fp32 from a half one.
        # Fabric's setup converts a true-precision model whole after this (adapters included), so a real run
        # ends the same either way; the sim, which builds in the target dtype and converts nothing, needs it.
        adapted: nn.Module = get_peft_model(model, config(workload), autocast_adapter_dtype=False)
    except ValueError as error:  # a model type peft has no default target modules for, or no module matched
        first = (str(error).strip().splitlines() or [""])[0][:200]
        raise UsageError(f"lora: peft cannot put adapters on workload {workload.name!r}: {first}") from None
    return adapted


def _elements(param: nn.Parameter) -> int:
    """A parameter's elements as the model defines them: a 4-bit weight's original shape, not its packed bytes."""
    state = getattr(param, "quant_state", None)
    return int(state.shape.numel()) if state is not None else param.numel()


def parameter_fields(model: nn.Module) -> dict[str, Any]:
    """The adapted model's ``trainable_parameters`` (elements that require a gradient) and ``total_parameters``
    (every element, the head's frozen original and its trained copy included; a 4-bit weight by its
    original shape), and ``quantized_parameter_bytes`` (the 4-bit weights' packed storage, None without)."""
    params = list(model.parameters())
    quantized = [p for p in params if getattr(p, "quant_state", None) is not None]
    return {"trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
            "total_parameters": sum(_elements(p) for p in params),
            "quantized_parameter_bytes": sum(p.untyped_storage().nbytes() for p in quantized) if quantized else None}
