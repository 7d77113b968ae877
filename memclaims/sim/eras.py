"""Optimizer steps as an older torch ran them: the temporaries decide the step's peak.

The article ran a torch nightly of 2023-06-23. Its foreach Adam (``torch.optim.adam._multi_tensor_adam``,
which AdamW's ``_multi_tensor_adamw`` mirrored) kept two parameter-sized temporaries alive at
once in the update: ``exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs)`` and then the out-of-place
``denom = _foreach_add(exp_avg_sq_sqrt, eps)``, both bound to locals until the function returned.
In July 2023 the "[foreach] minimize intermediates to save peak memory" work (pytorch issue
#97712: "a minimum budget of 1 intermediate" for the Adam family, 2023-07-12; PR #104898 for
AdamW, 2023-07-10; the last, #105193, closed the issue on 2023-07-31; the Adam change sits in the
ghstack above PR #104669 of 2023-07-05, i.e. #104779/#104780, whose titles were not retrievable
here) made the add in place, leaving one temporary (``torch/optim/adam.py`` of today, whose step
the ``current`` profile replays).

Sources of the reconstruction (read through the search tool; the pytorch git mirror, 4 GB, was
too large to fetch here, so no commit hash of torch itself is quoted):
- pytorch PR #104669 (2023-07-05, before the stack landed) quotes the then-current update,
  ``_foreach_mul_`` + ``_foreach_add_`` for ``exp_avgs`` and ``_foreach_mul_`` + ``_foreach_addcmul_``
  for ``exp_avg_sqs``, and the reply explains ``_foreach_lerp_`` came later (PR #104781);
- a vendored copy of that era's ``torch/optim/adamw.py`` (``_multi_tensor_adamw`` beside
  ``_fused_adamw``, i.e. after fused AdamW landed in 2023-05 and before the July stack) in the
  code corpus, whose non-capturable branch is the sequence below;
- PR #104910's test comment: after the stack, foreach Adam needs one intermediate (three with
  ``capturable``), the budget ``_test_foreach_memory`` asserts.
Only the non-capturable, non-amsgrad path matters here (the scripts' defaults); ``amsgrad`` takes
the same two-temporary shape over ``max_exp_avg_sqs``. The sequence is written anew from that
description, against today's call signature, so today's ``Adam.step`` can call it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import torch
from torch import Tensor

# Eras a profile can name: "installed" replays the installed torch's step unchanged.
ERAS = ("installed", "2023-06")


def _step_value(step: Tensor) -> float:
    # Non-capturable steps are host tensors; on fake tensors ``.item()`` is unavailable, so the
    # bias corrections use step 1 (their value never changes an allocation).
    try:
        return float(step.item())
    except Exception:
        return 1.0


def multi_tensor_adam_2023_06(params: list[Tensor], grads: list[Tensor], exp_avgs: list[Tensor],
                              exp_avg_sqs: list[Tensor], max_exp_avg_sqs: list[Tensor],
                              state_steps: list[Tensor], grad_scale: Tensor | None, found_inf: Tensor | None,
                              *, amsgrad: bool, beta1: float | Tensor, beta2: float | Tensor, lr: float | Tensor,
                              weight_decay: float,
                              eps: float, maximize: bool, capturable: bool, differentiable: bool,
                              decoupled_weight_decay: bool = False, has_complex: bool = False) -> None:
    """foreach Adam / AdamW of the 2023-06 nightly, op for op in what it allocates."""
    if not params:
        return
    if capturable or differentiable or grad_scale is not None or found_inf is not None:
        raise NotImplementedError("the 2023-06 foreach Adam is reconstructed for capturable=False, "
                                  "differentiable=False, no grad scaler only")
    beta1, beta2, lr = float(beta1), float(beta2), float(lr)
    # torch types the argument list[list[Tensor | None]]; lists are invariant, so our list[list[Tensor]]
    # needs the same ignore torch's own _multi_tensor_adam carries for this call.
    grouped = torch.optim.Optimizer._group_tensors_by_device_and_dtype(
        [params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps])  # type: ignore[list-item]
    for groups, _ in grouped.values():
        # Every list passed in holds tensors only (no None entries), so each group does too.
        (device_params, grads_in, device_exp_avgs, device_exp_avg_sqs, device_max_exp_avg_sqs,
         device_state_steps) = (cast(list[Tensor], group) for group in groups)
        # torch's foreach ops return tuples; the gradients may be replaced by such a temporary.
        device_grads: list[Tensor] | tuple[Tensor, ...] = grads_in
        if maximize:
            device_grads = torch._foreach_neg(tuple(device_grads))  # a temporary, kept to the end
        torch._foreach_add_(device_state_steps, 1)
        if weight_decay != 0:
            if decoupled_weight_decay:  # _multi_tensor_adamw: in place on the parameters
                torch._foreach_mul_(device_params, 1 - lr * weight_decay)
            else:  # _multi_tensor_adam: an out-of-place copy of the gradients, kept to the end
                device_grads = torch._foreach_add(device_grads, device_params, alpha=weight_decay)
        torch._foreach_mul_(device_exp_avgs, beta1)
        torch._foreach_add_(device_exp_avgs, device_grads, alpha=1 - beta1)
        torch._foreach_mul_(device_exp_avg_sqs, beta2)
        torch._foreach_addcmul_(device_exp_avg_sqs, device_grads, device_grads, 1 - beta2)

        steps = [_step_value(step) for step in device_state_steps]
        step_size = [-(lr / (1 - beta1 ** s)) for s in steps]
        bias_correction2_sqrt = [math.sqrt(1 - beta2 ** s) for s in steps]
        if amsgrad:
            torch._foreach_maximum_(device_max_exp_avg_sqs, device_exp_avg_sqs)
            exp_avg_sq_sqrt = torch._foreach_sqrt(device_max_exp_avg_sqs)
        else:
            exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)  # temporary 1
        torch._foreach_div_(exp_avg_sq_sqrt, bias_correction2_sqrt)
        # The line July 2023 made in place: a second parameter-sized temporary while the first lives.
        denom = torch._foreach_add(exp_avg_sq_sqrt, eps)  # temporary 2
        torch._foreach_addcdiv_(device_params, device_exp_avgs, denom, step_size)


@contextmanager
def optimizer_era(era: str) -> Iterator[None]:
    """Run ``torch.optim.Adam``/``AdamW`` foreach steps as ``era`` did, for the duration of the block.

    Today's ``adam()`` looks ``_multi_tensor_adam`` up in its module at call time (AdamW is Adam
    with ``decoupled_weight_decay=True``), so swapping that one module attribute is enough.
    """
    if era not in ERAS:
        raise ValueError(f"unknown optimizer era {era!r}; valid eras: {', '.join(ERAS)}")
    if era == "installed":
        yield
        return
    import torch.optim.adam as adam_module

    original = adam_module._multi_tensor_adam
    adam_module._multi_tensor_adam = multi_tensor_adam_2023_06
    try:
        yield
    finally:
        adam_module._multi_tensor_adam = original
