"""The ``lora`` technique: peft's LoRA adapters put on the model as it is built (issue #27).

``peft.get_peft_model(model, LoraConfig(...))`` freezes every base weight and adds rank-``r`` adapters
(``lora_A``, ``lora_B``) to the target modules (the recipe's, else ``Workload.lora_targets``: the attention's
query and value projections, or peft's default for an ``hf:`` model's type; ``memclaims.techniques.lora.effective``);
the classification head is trained in full (``modules_to_save``: peft keeps the original frozen and trains a copy). The optimizer is built
over all parameters, as peft's examples do; a frozen parameter never gets a gradient, so Adam keeps no
state for it. ``parameter_fields`` says what the run saw: lora's ``trainable_parameters`` and ``total_parameters``
(``memclaims.measure.active`` checks the fraction and the optimizer state against them), qlora's
``quantized_parameter_bytes`` (their parts of the Record, ``by_technique``).

The real engines call ``apply`` in the load phase (``memclaims.measure.pipeline``); the sim calls it on its
fake model (``memclaims.techniques.impl.peft_adapters_fake``), so both count the same parameters.
"""

from __future__ import annotations

import warnings
from typing import Any

from torch import nn

from memclaims.core.errors import UsageError


def config(chosen: dict[str, Any]) -> Any:
    """The ``peft.LoraConfig`` of the adapters (``chosen``: ``memclaims.techniques.lora.effective``'s arguments)."""
    from peft import LoraConfig

    targets, save = chosen["target_modules"], chosen["modules_to_save"]
    return LoraConfig(r=chosen["r"], lora_alpha=chosen["lora_alpha"], lora_dropout=chosen["lora_dropout"],
                      target_modules=list(targets) if targets is not None else None,
                      modules_to_save=list(save) or None)


def missing_targets(model: nn.Module, targets: tuple[str, ...]) -> list[str]:
    """The target names no module of ``model`` has: peft matches a name as the whole module name or its last
    dotted parts (``q_proj`` matches ``model.layers.0.self_attn.q_proj``)."""
    names = [name for name, _ in model.named_modules() if name]
    return [t for t in targets if not any(name == t or name.endswith(f".{t}") for name in names)]


def module_names(model: nn.Module) -> list[str]:
    """The last part of the name of each module of ``model`` that holds parameters of its own, once each, as a
    target the user could name."""
    return list(dict.fromkeys(name.rpartition(".")[2] for name, module in model.named_modules()
                              if name and any(True for _ in module.parameters(recurse=False))))


def apply(model: nn.Module, workload: str, chosen: dict[str, Any], asked: bool) -> nn.Module:
    """``model`` with LoRA adapters (a ``peft.PeftModel``): base weights frozen, adapters and head trainable.
    ``chosen``: the ``LoraConfig``'s arguments; ``asked``: whether the recipe asked them (a refusal names the
    option then, the workload's definition otherwise)."""
    from peft import get_peft_model

    targets = chosen["target_modules"]
    missing = missing_targets(model, tuple(targets)) if targets is not None else []
    if missing:
        where = "--lora-targets" if asked else f"workload {workload!r}'s lora target_modules"
        raise UsageError(f"{where} {','.join(targets)}: the model of workload {workload!r} has no module named "
                         f"{', '.join(missing)}; its modules: {', '.join(module_names(model))}")
    try:
        # autocast_adapter_dtype=False: adapters in the base layers' dtype, not upcast to fp32 from a half one.
        # Fabric's setup converts a true-precision model whole after this (adapters included), so a real run
        # ends the same either way; the sim, which builds in the target dtype and converts nothing, needs it.
        with warnings.catch_warnings():
            # peft reads transformers' deprecated ``is_gradient_checkpointing`` alias itself (peft 0.21 with
            # transformers 5.x): a FutureWarning for the user's run that is neither theirs nor memclaims' to act on.
            warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated",
                                    category=FutureWarning)
            adapted: nn.Module = get_peft_model(model, config(chosen), autocast_adapter_dtype=False)
    except ValueError as error:  # a model type peft has no default target modules for, or no module matched
        first = (str(error).strip().splitlines() or [""])[0][:200]
        raise UsageError(f"lora: peft cannot put adapters on workload {workload!r}: {first}") from None
    return adapted


def _elements(param: nn.Parameter) -> int:
    """A parameter's elements as the model defines them: a 4-bit weight's original shape, not its packed bytes."""
    state = getattr(param, "quant_state", None)
    return int(state.shape.numel()) if state is not None else param.numel()


def parameter_fields(model: nn.Module) -> dict[str, object]:
    """The adapted model's ``trainable_parameters`` (elements that require a gradient) and ``total_parameters``
    (every element, the head's frozen original and its trained copy included; a 4-bit weight by its
    original shape), and ``quantized_parameter_bytes`` (the 4-bit weights' packed storage, None without)."""
    params = list(model.parameters())
    quantized = [p for p in params if getattr(p, "quant_state", None) is not None]
    return {"trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
            "total_parameters": sum(_elements(p) for p in params),
            "quantized_parameter_bytes": sum(p.untyped_storage().nbytes() for p in quantized) if quantized else None}
