"""The combined recipes of the article's LLM bonus scripts, the repo's ViT-H/14 series and the
course's 8-bit Adam lesson.

Each names its workload, its techniques and the published numbers. Some need what memclaims does
not have (DeepSpeed, DDP) or a CUDA GPU (CPU offload): ``unmet`` says which,
so a test or the CLI can skip the recipe with that reason instead of running something else. The
number of GPUs is not a requirement: sharded recipes run on as many as the machine has, and the
Record says how many; ``devices`` is what the published run used.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memclaims import techniques as registry
from memclaims.errors import UsageError
from memclaims.recipe import Recipe, resolve


@dataclass(frozen=True)
class Published:
    time_min: float | None
    peak_gb: float | None  # torch.cuda.max_memory_reserved() / 1e9, rank 0
    accuracy_pct: float | None
    note: str = ""


@dataclass(frozen=True)
class NamedRecipe:
    name: str
    workload: str
    techniques: tuple[str, ...]  # memclaims techniques (contract names)
    source: str
    published: Published
    devices: int = 1  # GPUs the published run used
    # What the script did that no memclaims technique expresses yet (e.g. DeepSpeed, 12-step accumulation).
    extra_needs: tuple[str, ...] = ()
    note: str = ""
    scale: str = "article"
    state_bytes: dict[str, int] = field(default_factory=dict)  # published optimizer-state figures

    def unmet(self, cuda_devices: int = 0) -> list[str]:
        """What this machine (with ``cuda_devices`` GPUs) and this registry lack to run the recipe;
        empty when runnable."""
        missing = [f"technique {t!r} (not registered yet)" for t in self.techniques if t not in registry.BY_NAME]
        missing += list(self.extra_needs)
        cuda_only = [t for t in self.techniques if t in registry.BY_NAME and "cuda" in registry.BY_NAME[t].requires]
        if cuda_only and cuda_devices < 1:
            missing.append(f"a CUDA GPU ({', '.join(cuda_only)})")
        return missing

    def resolve(self, cuda_devices: int = 0) -> Recipe:
        problems = self.unmet(cuda_devices)
        if problems:
            raise UsageError(f"named recipe {self.name!r} needs {'; '.join(problems)}")
        return resolve(self.workload, self.scale, self.techniques)


NAMED_RECIPES: dict[str, NamedRecipe] = {r.name: r for r in (
    NamedRecipe(
        "distilbert-before", "distilbert", ("16-mixed",), "bonus_distilbert-before",
        Published(0.71, 3.99, 92.95), devices=4,
        extra_needs=("DeepSpeed ZeRO stage 2 (strategy='deepspeed_stage_2'; no memclaims technique)",),
        note="Adam 5e-5, batch 12 per GPU, 1 epoch; the 'before' already shards optimizer state and gradients",
    ),
    NamedRecipe(
        "distilbert-after", "distilbert",
        ("bf16-true", "grad-accum", "fsdp", "cpu-offload", "delayed-init"), "bonus_distilbert-after",
        Published(5.55, 1.15, 90.43), devices=4,
        note="FSDP wrapping TransformerBlock + cpu_offload, bf16-true, init_module(empty_init=False), "
             "micro-batch 3 x 4 accumulation (grad-accum turns batch 12 into 3 x 4)",
    ),
    NamedRecipe(
        "bigbird-before", "bigbird", ("fabric",), "bonus_bigbird-before",
        Published(None, None, None, note="did not run: 'not possible without the optimizations'"), devices=4,
        extra_needs=("DDP over 4 GPUs (strategy='ddp'; no memclaims technique)",),
        note="fp32, batch 12 per GPU at up to 4096 tokens",
    ),
    NamedRecipe(
        "bigbird-after", "bigbird", ("bf16-true", "grad-accum", "fsdp", "cpu-offload", "delayed-init"),
        "bonus_bigbird-after", Published(75.94, 4.03, 93.10), devices=4,
        note="FSDP without a wrap policy + cpu_offload, bf16-true, init_module(empty_init=False), micro-batch 1 x 12 "
             "(BigBird's article scale accumulates 12 micro-batches)",
    ),
    # The repo's later ViT-H/14 series: one figure, bars read off to about +-0.1 GB.
    *(NamedRecipe(name, "vit-h14", ("16-mixed", *extra), "ViT-H/14 series (figure)",
                  Published(None, peak, None, note="read off the figure's bars, about +-0.1 GB"),
                  devices=devices, note="518 px, 16-mixed, batch 4 per GPU")
      for name, extra, peak, devices in (
          ("vit-h14-one-gpu", (), 22.6, 1),
          ("vit-h14-fsdp", ("fsdp",), 17.2, 4),
          ("vit-h14-fsdp-checkpointing", ("fsdp", "activation-checkpointing"), 9.0, 4),
          ("vit-h14-fsdp-checkpointing-offload", ("fsdp", "activation-checkpointing", "cpu-offload"), 6.7, 4),
      )),
    NamedRecipe(
        "distilbert-cased-adam8bit", "distilbert-cased", ("adam8bit",), "course: 8-bit Adam lesson",
        Published(None, None, None, note="eval accuracy 0.67 after epoch 1, 0.71 after epoch 2"),
        note="Adam8bit with the course's two parameter groups; state reported as 128 MiB vs AdamW 502 MiB",
        state_bytes={"adam8bit_reported_mib": 128, "adamw_reported_mib": 502, "estimate_mib": 125},
    ),
)}


def named_recipe(name: str) -> NamedRecipe:
    try:
        return NAMED_RECIPES[name]
    except KeyError:
        raise UsageError(f"unknown named recipe {name!r}; valid: {', '.join(NAMED_RECIPES)}") from None
