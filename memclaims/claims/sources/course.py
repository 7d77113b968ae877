"""The course's slides and notebooks (``memclaims/resources/sources/course.json``): the optimizer-state arithmetic on
the article-scale DistilBERT's parameter shapes (``Lookup.parameters``), the same counts through its Trainer path and
its Accelerate loop, and what bitsandbytes stores."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from memclaims.claims.check import Check, Verdict, audited
from memclaims.claims.figures import MIB, step_counters
from memclaims.claims.lookup import Lookup, Techniques
from memclaims.claims.shared_keys import STACK_WORKLOAD
from memclaims.core import published

if TYPE_CHECKING:
    import torch

DOCUMENT = "course"


def _adamw_eight_bytes(tier: str, get: Lookup) -> Verdict:
    adam = get(("fabric",))
    per = (adam.optimizer_state_bytes - step_counters(adam)) / adam.param_count
    claimed = published.numbers("course-adamw-8-bytes")["bytes_per_param"]
    return Verdict(per == claimed, f"fp32 Adam state per parameter = {per:.4f} B (claim {claimed}), step counters aside")


def adam8bit_storage() -> tuple[torch.dtype, dict[str, torch.dtype]]:
    """(parameter dtype, {state name: dtype}) after one bitsandbytes Adam8bit step on the CPU, on a layer
    of 8,192 elements (above bitsandbytes' 4,096-element threshold for 8-bit state)."""
    import bitsandbytes as bnb
    import torch

    torch.manual_seed(0)
    layer = torch.nn.Linear(128, 64, bias=False)
    optimizer = bnb.optim.Adam8bit(layer.parameters(), lr=1e-3)
    layer(torch.randn(4, 128)).sum().backward()
    optimizer.step()
    states = {name: value.dtype for name, value in optimizer.state[layer.weight].items()
              if isinstance(value, torch.Tensor) and value.shape == layer.weight.shape}
    return layer.weight.dtype, states


def _eight_bit_storage(tier: str, get: Lookup) -> Verdict:
    """The slide: 'parameters stored in FP8, optimized in FP32', against what bitsandbytes stores."""
    parameters, states = adam8bit_storage()
    return Verdict(parameters.itemsize == 1,
                   f"after an Adam8bit step: parameters {parameters} ({parameters.itemsize} B each), optimizer states "
                   f"{', '.join(f'{k} {v}' for k, v in sorted(states.items()))}: the 8-bit values are the optimizer's "
                   f"two states, the parameters keep the model's dtype")


# --- the course, by exact arithmetic on the article-scale model's parameter shapes ----------------

# distilbert-base-cased with a 2-label head at the article's scale (the lookup's model facts: shapes only).
COURSE_MODEL = ("distilbert-cased", "article")


def _course(claim: str) -> Callable[[str, Lookup], Verdict]:
    def check(tier: str, get: Lookup) -> Verdict:
        from memclaims.core import optim_state

        params = get.parameters(*COURSE_MODEL)
        count = sum(p.numel() for p in params)
        numbers = published.numbers(claim)
        adamw, eight = optim_state.adamw_bytes(params), optim_state.adam8bit_bytes(params)
        if claim == "course-param-count":
            return Verdict((count, len(params)) == (numbers["params"], numbers["tensors"]),
                           f"{count:,} parameters in {len(params)} tensors (published {numbers['params']:,}, "
                           f"{numbers['tensors']})")
        if claim == "course-estimate-125":
            mib = optim_state.course_estimate_bytes(count) / MIB
            return Verdict(round(mib) == numbers["mib"], f"2 B x {count:,} = {mib:.2f} MiB (published {numbers['mib']} MB)")
        if claim == "course-bytes-per-param":
            per = eight / count
            return Verdict(numbers["bytes_per_param"] <= per <= 1.05 * numbers["bytes_per_param"],
                           f"bitsandbytes Adam8bit state: {per:.3f} B per parameter (claim {numbers['bytes_per_param']}; "
                           f"the rest is absmax per 256-block, quantization maps and fp32 state of small tensors)")
        if claim in ("course-adamw-elements", "course-adam8bit-elements"):
            elements = optim_state.adamw_elements(params)
            verdict = Verdict(elements == numbers["elements"], f"2 x {count:,} + {len(params)} step counters = "
                                                                f"{elements:,} (published {numbers['elements']:,})")
            return _with_stacks(claim, tier, get, verdict) if claim == "course-adam8bit-elements" else verdict
        if claim == "course-adamw-502":
            return Verdict(round(adamw / MIB) == numbers["mib"], f"AdamW state {adamw:,} B = {adamw / MIB:.2f} MiB "
                                                                  f"(published {numbers['mib']} MB)")
        if claim == "course-adam8bit-128":
            ok = round(eight / MIB) == numbers["mib"] and eight == numbers["measured_bytes"]
            verdict = Verdict(ok, f"Adam8bit state {eight:,} B = {eight / MIB:.2f} MiB (published {numbers['mib']} MB; "
                                  f"measured on the CPU with bitsandbytes 0.50.2: {numbers['measured_bytes']:,} B)")
            return _with_stacks(claim, tier, get, verdict)
        if claim == "course-quarter":
            from fractions import Fraction

            ratio = adamw / eight
            text = float(1 / Fraction(numbers["claim"]))  # the slide's "1/4"
            return Verdict(abs(ratio / text - 1) <= 0.05,
                           f"AdamW / Adam8bit = {ratio:.2f}x, {abs(ratio / text - 1):.1%} off the slide's {text:g}x "
                           f"(band 5 %); "
                           + audited(claim, f"{adamw / MIB:.0f} / {eight / MIB:.0f} MiB = {ratio:.2f}x"))
        raise KeyError(claim)

    return check


def _with_stacks(claim: str, tier: str, get: Lookup, verdict: Verdict) -> Verdict:
    """``verdict`` and the course's count through its Trainer and Accelerate code paths (issue #42)."""
    held, detail = _course_through_stacks(claim, tier, get)
    return Verdict(verdict.passed and held, f"{verdict.detail}; {detail}")



def _course_through_stacks(claim: str, tier: str, get: Lookup) -> tuple[bool, str]:
    """The course's optimizer-size count through its own code paths (the Trainer's ``trainer.optimizer.state``, the
    Accelerate loop's prepared optimizer) at smoke scale, against the same arithmetic the claim's check runs at the
    article's scale: what the course counts is what bitsandbytes holds."""
    from memclaims.core import optim_state

    params = get.parameters(STACK_WORKLOAD, "smoke")
    layout = optim_state.eight_bit_layout()
    expected = {"bytes": optim_state.adam8bit_bytes(params),
                "elements": sum(2 * p.numel() + (sum(layout.qmap_bytes) // 4 + 2 * math.ceil(p.numel() / layout.blocksize)
                                                 if p.numel() >= layout.min_8bit_size else 0) for p in params)}
    unit = "bytes" if claim == "course-adam8bit-128" else "elements"
    parts, ok = [], True
    for key in COURSE_STACKS:
        record = get(key)
        counted = record.observed(key[0], f"course_optimizer_size_{unit}")
        ok = ok and counted == expected[unit]
        parts.append(f"{record.recipe}: {counted:,} {unit}" if counted is not None else f"{record.recipe}: not counted")
    return ok, (f"through the course's code paths at smoke scale, compute_optimizer_size over the optimizer's state: "
                f"{'; '.join(parts)} (bitsandbytes' layout: {expected[unit]:,})")


# The course's Trainer path and its Accelerate loop (suite/cases/techniques/test_hf_trainer.py, test_accelerate.py).
COURSE_STACKS: tuple[Techniques, ...] = (("hf-trainer", "adam8bit"), ("accelerate", "bf16-mixed", "adam8bit"))


CHECKS: dict[str, Check] = {
    "course-adamw-8-bytes": Check(_adamw_eight_bytes, frozenset({"cpu", "sim"}), {"*": (("fabric",),)}),
    "course-fp8-parameters": Check(_eight_bit_storage, frozenset({"cpu"})),
    **{c: Check(_course(c), frozenset({"cpu"})) for c in (
        "course-param-count", "course-estimate-125", "course-bytes-per-param", "course-adamw-elements",
        "course-adamw-502", "course-quarter")},
    # The course's 8-bit counts, also through its Trainer path and its Accelerate loop (issue #42).
    **{c: Check(_course(c), frozenset({"cpu"}), {"cpu": COURSE_STACKS}, workload=STACK_WORKLOAD) for c in (
        "course-adam8bit-elements", "course-adam8bit-128")},
}
