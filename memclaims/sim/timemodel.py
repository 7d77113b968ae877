"""A roofline model of step time, to set the article's time claims against a prediction.

Each aten op of one training step (forward, backward, optimizer) runs on meta tensors under a
dispatch mode that takes its FLOPs from torch's own formulas (``torch.utils.flop_counter``) and
its bytes moved as the bytes of its tensor inputs and outputs (views move nothing). The op's time
is ``max(FLOPs / peak throughput for its dtype, bytes / memory bandwidth)``; a step is the sum,
a training example is a step over the batch. This ignores kernel launch overhead, caching and
fusion, so it predicts what the hardware bounds, not what a 2023 nightly achieved: small
micro-batches (script 05) are launch-bound on a real GPU and predicted far too fast here.

TF32 as the scripts set it: 01 and 01-2 leave torch's default (fp32 matmuls at full fp32; cuDNN
convolutions, the patch embedding, in TF32 by default); 02 on call
``torch.set_float32_matmul_precision("high")`` (fp32 matmuls in TF32). Mixed precision runs the
FLOP-counted ops (matmuls, convolutions, attention) in 16 bits at half the operand bytes and the
rest in fp32: autocast's policy, approximated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from memclaims.recipes.recipe import Recipe, resolve
from memclaims.sim.timeline import A100_40GB, GpuPeaks, op_seconds
from memclaims.techniques import technique_registry as registry


@dataclass(slots=True)  # an accumulator of four sums, updated on every op
class Tally:
    seconds: float = 0.0
    flops: float = 0.0
    bytes: float = 0.0
    compute_bound_seconds: float = 0.0


class RooflineMode(TorchDispatchMode):
    def __init__(self, gpu: GpuPeaks, *, tf32_matmul: bool, mixed: bool) -> None:
        # TorchDispatchMode.__init__ is unannotated, and mypy's untyped_calls_exclude does not
        # reach calls through super().
        super().__init__()  # type: ignore[no-untyped-call]
        self.gpu, self.tf32_matmul, self.mixed = gpu, tf32_matmul, mixed
        self.tally = Tally()

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: tuple[type, ...], args: tuple[object, ...] = (),
                               kwargs: dict[str, object] | None = None) -> object:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns):
            return out  # a view: no data moves
        # The sim's timeline times each op with the same roofline (memclaims.sim.timeline.op_seconds).
        cost = op_seconds(func, args, kwargs, out, self.gpu, tf32_matmul=self.tf32_matmul, mixed=self.mixed)
        self.tally.seconds += cost.seconds
        self.tally.compute_bound_seconds += cost.seconds if cost.compute_bound else 0.0
        self.tally.flops += cost.flops
        self.tally.bytes += cost.bytes
        return out


@dataclass(frozen=True)
class StepTime:
    recipe: str
    step_s: float
    example_ms: float
    tflop_per_step: float
    gb_moved_per_step: float
    compute_bound_share: float


def predict(recipe: Recipe, gpu: GpuPeaks = A100_40GB) -> StepTime:
    """One optimizer step of ``recipe`` (every micro-batch, then the optimizer), on meta tensors."""
    from memclaims.measure import optimizers

    half = {"bf16-true": torch.bfloat16, "16-true": torch.float16}.get(recipe.precision)
    mixed = recipe.precision in ("16-mixed", "bf16-mixed")
    tf32 = recipe.precision != "32-true"  # 02 on set matmul precision "high"
    with torch.device("meta"):
        model, _ = recipe.workload.build_model(recipe.scale) if recipe.scale.name == "smoke" else (
            _article_model(recipe), "random")
        if half is not None:
            model = model.to(half)
        optimizer, _ = optimizers.build(recipe.optimizer, model, recipe.learning_rate, 100, owner=recipe.optimizer_owner)
        size = 224 if recipe.scale.name == "article" else 16
        inputs = torch.empty(recipe.micro_batch_size, 3, size, size, dtype=half or torch.float32)
        targets = torch.zeros(recipe.micro_batch_size, dtype=torch.long)
    mode = RooflineMode(gpu, tf32_matmul=tf32, mixed=mixed)
    with mode:
        for _ in range(recipe.accumulation_steps):
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
            loss.backward()
    optimizer_bytes = _optimizer_bytes(recipe, model)
    mode.tally.seconds += optimizer_bytes / (gpu.bandwidth_gb_s * 1e9)
    mode.tally.bytes += optimizer_bytes
    t = mode.tally
    return StepTime(recipe.id, t.seconds, 1e3 * t.seconds / recipe.batch_size, t.flops / 1e12, t.bytes / 1e9,
                    t.compute_bound_seconds / t.seconds if t.seconds else 0.0)


def _article_model(recipe: Recipe) -> torch.nn.Module:
    import torchvision

    model = torchvision.models.vit_l_16(weights=None)
    model.heads.head = torch.nn.Linear(1024, recipe.workload.num_classes)
    return cast(torch.nn.Module, model)  # torchvision ships no type information


def _optimizer_bytes(recipe: Recipe, model: torch.nn.Module) -> int:
    """Adam reads parameter, gradient and two states and writes parameter and two states (7 passes
    over the parameter bytes); SGD reads parameter and gradient and writes the parameter (3)."""
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    return (3 if recipe.optimizer == "sgd" else 7) * params


def predicted_ratio(candidate: tuple[str, ...], reference: tuple[str, ...], gpu: GpuPeaks = A100_40GB) -> float:
    """Predicted time per example, candidate / reference, at article scale."""
    a, b = (predict(resolve("vit", "article", t), gpu) for t in (candidate, reference))
    return a.example_ms / b.example_ms


CHAIN = registry.CHAIN  # 01-2 -> 06


def chain_table(gpu: GpuPeaks = A100_40GB) -> list[dict[str, object]]:
    """Predicted time per example of each chain row, and its ratio to the fp32 reference, beside
    the published epoch time and its ratio (published numbers from memclaims/resources/published.json)."""
    from memclaims.core import published

    logged = [published.chain_row(t) for t in CHAIN]
    predictions = [predict(resolve("vit", "article", t), gpu) for t in CHAIN]
    reference = predictions[0].example_ms
    published_reference = logged[0]["time_min"]
    rows = []
    for entry, prediction in zip(logged, predictions):
        script, minutes = entry["script"], entry["time_min"]
        rows.append({"script": script, "recipe": prediction.recipe,
                     "predicted_ms_per_example": round(prediction.example_ms, 4),
                     "predicted_ratio": round(prediction.example_ms / reference, 4),
                     "published_min": minutes, "published_ratio": round(minutes / published_reference, 4),
                     "tflop_per_step": round(prediction.tflop_per_step, 3),
                     "gb_moved_per_step": round(prediction.gb_moved_per_step, 2),
                     "compute_bound_share": round(prediction.compute_bound_share, 3)})
    return rows


if __name__ == "__main__":
    import json

    print(json.dumps(chain_table(), indent=2))
