"""GPU-minutes a selection of gpu-tier cases costs: a documented per-case model, no GPU needed.

The model (the session header prints its result; scripts/gpu-check measures the real thing):
- FLOPs per example, from the recipe's own model sizes: a transformer trains in
  about 6 x parameters x tokens FLOPs per example (forward 2, backward 4) plus attention scores
  (12 x layers x tokens^2 x width); scoring a test example costs a third of that.
- Sustained throughput of one H100-class GPU (assumed, not measured here): 25 TFLOP/s in float32
  (32-true: the scripts leave TF32 off), 300 TFLOP/s where matmuls run in fp16/bf16 (about a third
  of the dense peak, what a ViT-L at batch 64 sustains). An A100 is about 2.5x slower.
- Host time: 0.4 ms per CIFAR-10 example (decode, resize to 224 px, on the loader's one process),
  nothing for the offline digits (resized once, up front).
- Fixed cost per case: 20 s at article scale (building ViT-L/16 on the host, Fabric setup, the
  data set, cache flushes), 5 s at smaller scales; the sharded configurations add 30 s of process
  start once (the suite starts their ranks once for all of them, run_distributed_many).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

from memclaims.recipes.recipe import Recipe
from memclaims.recipes.run_options import RunOptions, accuracy_schedule, evaluates, resolve_memory_steps
from memclaims.techniques.base import PYTORCH

FP32_FLOPS = 25e12
HALF_FLOPS = 300e12
HOST_S_PER_CIFAR_EXAMPLE = 0.4e-3
CASE_OVERHEAD_S = {"article": 20.0}
DEFAULT_OVERHEAD_S = 5.0
SHARDED_START_S = 30.0
CIFAR_TRAIN, CIFAR_TEST, DIGITS_TRAIN, DIGITS_TEST = 45_000, 10_000, 1_438, 359


@dataclass(frozen=True)
class Estimate:
    recipe: str
    seconds: float
    train_examples: int
    test_examples: int


def _shape(recipe: Recipe) -> tuple[int, int, int, int]:
    """(parameters, tokens, layers, width) of a ViT recipe, from its model on the meta device."""
    return _vit_shape(recipe.workload.name, recipe.scale.name, recipe.workload.num_classes)


@functools.cache
def _vit_shape(workload: str, scale: str, num_classes: int) -> tuple[int, int, int, int]:
    """Counted from the architecture's sizes, not by building it: the session header runs this,
    and importing torchvision's models there (inside pytester's in-process sessions too) would load
    torch libraries that cannot be loaded twice. suite/unit/report/test_budget.py checks the count
    against the model torchvision builds."""
    from memclaims.workloads.vit import VIT_FAMILIES

    family = VIT_FAMILIES[workload]
    sizes = family._sizes(scale) or _ARTICLE_SIZES[family.builder]
    image, patch, layers = family.image_size(scale), sizes["patch_size"], sizes["num_layers"]
    width, mlp = sizes["hidden_dim"], sizes["mlp_dim"]
    tokens = (image // patch) ** 2 + 1
    block = 2 * width + (3 * width * width + 3 * width) + (width * width + width) + 2 * width \
        + (width * mlp + mlp) + (mlp * width + width)
    params = (3 * patch * patch * width + width) + width + tokens * width + layers * block + 2 * width \
        + width * num_classes + num_classes
    return params, tokens, layers, width


# torchvision's vit_l_16 / vit_h_14 sizes (their builders' arguments).
_ARTICLE_SIZES = {"vit_l_16": dict(patch_size=16, num_layers=24, hidden_dim=1024, mlp_dim=4096),
                  "vit_h_14": dict(patch_size=14, num_layers=32, hidden_dim=1280, mlp_dim=5120)}


def train_flops_per_example(recipe: Recipe) -> float:
    params, tokens, layers, width = _shape(recipe)
    return 6.0 * params * tokens + 12.0 * layers * tokens**2 * width


def estimate(recipe: Recipe, options: RunOptions, *, cifar: bool) -> Estimate:
    """Seconds on one H100-class GPU for one case of ``recipe`` run with ``options``."""
    half = recipe.precision != "32-true" and recipe.stack != PYTORCH
    flops = HALF_FLOPS if half else FP32_FLOPS
    per_example = train_flops_per_example(recipe)
    memory_steps = resolve_memory_steps(recipe, options)
    train = memory_steps * recipe.batch_size
    test = 0
    if evaluates(recipe, options):
        schedule = accuracy_schedule(recipe, options)
        if schedule["kind"] == "steps":
            train += schedule["optimizer_steps"] * recipe.batch_size
            test = min(schedule["test_examples"] or (CIFAR_TEST if cifar else DIGITS_TEST),
                       CIFAR_TEST if cifar else DIGITS_TEST)
        else:
            train += schedule["epochs"] * (CIFAR_TRAIN if cifar else DIGITS_TRAIN)
            test = CIFAR_TEST if cifar else DIGITS_TEST
    compute = (train * per_example + test * per_example / 3) / flops
    host = (train + test) * HOST_S_PER_CIFAR_EXAMPLE if cifar else 0.0
    fixed = CASE_OVERHEAD_S.get(recipe.scale.name, DEFAULT_OVERHEAD_S)
    return Estimate(recipe.id, compute + host + fixed, train, test)


def total_minutes(recipes: Iterable[tuple[Recipe, RunOptions]], *, cifar: bool) -> float:
    chosen = list(recipes)
    start = SHARDED_START_S if any(r.distributed for r, _ in chosen) else 0.0
    return (start + sum(estimate(r, o, cifar=cifar).seconds for r, o in chosen)) / 60
