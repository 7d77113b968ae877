"""Step time of one optimizer step, through pytest-benchmark (``--benchmark-autosave``/``--benchmark-compare``).

Memory is measured by the record cache (the same Records the technique cases compare with their
baselines); its figures travel in ``benchmark.extra_info`` so a saved benchmark run carries both.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch.nn.functional as F
from torch.utils.data import DataLoader

from memclaims.measure import optimizers
from memclaims.pytest.records import RecordCache

# Recipes whose optimizer step is one micro-batch (no accumulation), so one call = one step.
RECIPES = [("fabric",), ("bf16-true",), ("bf16-true", "sgd")]
MEMORY_FIELDS = ("peak_allocated_bytes", "load_peak_bytes", "optimizer_state_bytes", "param_bytes", "grad_bytes")


@pytest.mark.cpu
@pytest.mark.parametrize("techniques", RECIPES, ids=lambda t: "+".join(t))
def test_optimizer_step_time(techniques: tuple[str, ...], benchmark: Any, record_cache: RecordCache) -> None:
    from lightning.fabric import Fabric

    recipe = record_cache.recipe("cpu", "vit", techniques)
    record = record_cache.get("cpu", recipe)
    fabric = Fabric(accelerator="cpu", devices=1, precision=recipe.precision)
    model, _ = recipe.workload.build_model(recipe.scale)
    optimizer, _ = optimizers.build(recipe.optimizer, model, recipe.learning_rate, 100, owner=recipe.optimizer_owner)
    model, optimizer = fabric.setup(model, optimizer)
    bundle = recipe.workload.load_data(recipe.scale, None)
    loader = DataLoader(bundle.train, batch_size=recipe.micro_batch_size,
                        collate_fn=getattr(bundle, "collate_fn", None))
    inputs, targets = fabric.to_device(next(iter(loader)))
    model.train()

    def step() -> None:
        loss = F.cross_entropy(recipe.workload.logits(model, inputs), targets)
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()

    benchmark.extra_info.update({"recipe": recipe.id, "device_name": record.device_name,
                                 **{name: getattr(record, name) for name in MEMORY_FIELDS},
                                 "versions": record.versions})
    benchmark.pedantic(step, rounds=5, warmup_rounds=1, iterations=1)
