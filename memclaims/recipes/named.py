"""The combined recipes of the article's LLM bonus scripts, the repo's ViT-H/14 series and the
course's 8-bit Adam lesson.

Each names its workload, its techniques and the published numbers. Some need what memclaims does
not have (DeepSpeed, DDP) or a CUDA GPU (CPU offload): ``needs`` says what, in
memclaims.recipes.requirements' terms, so a test skips the recipe with the same reason as every other case
and the CLI lists the same unmet needs (``unmet``). The number of GPUs is not a requirement:
sharded recipes run on as many as the machine has, and the Record says how many; ``devices`` is
what the published run used.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memclaims.core import published as published_numbers
from memclaims.core.errors import UsageError
from memclaims.core.machine import Machine
from memclaims.recipes import requirements
from memclaims.recipes.recipe import resolve

if TYPE_CHECKING:
    from memclaims.recipes.recipe import Recipe


@dataclass(frozen=True)
class Published:
    time_min: float | None
    peak_gb: float | None  # torch.cuda.max_memory_reserved() / 1e9, rank 0
    accuracy_pct: float | None
    note: str = ""


def _logged(section: str, script: str) -> Published:
    """A logged run's numbers, from memclaims/resources/published.json (their one source)."""
    row = published_numbers.row(section, script)
    return Published(row.get("time_min"), row.get("peak_reserved_gb"), row.get("accuracy_pct"), row.get("note", ""))


def _figure(index: int) -> Published:
    row = published_numbers.lookup(f"@vit_h14_series/rows/{index}")
    return Published(None, row["peak_reserved_gb"], None, note="read off the figure's bars, about +-0.1 GB")


def _course() -> tuple[Published, dict[str, int]]:
    course = published_numbers.data()["adam8bit"]
    accuracy = course["eval_accuracy"]
    note = f"eval accuracy {accuracy['epoch_1']} after epoch 1, {accuracy['epoch_2']} after epoch 2"
    return Published(None, None, None, note=note), {
        "adam8bit_reported_mib": course["adam8bit_state_reported_mib"],
        "adamw_reported_mib": course["adamw_state_mib"], "estimate_mib": course["estimate_8bit_state_mib"]}


@dataclass(frozen=True)
class NamedRecipe:
    name: str
    workload: str
    techniques: tuple[str, ...]  # memclaims techniques (contract names)
    source: str
    published: Published
    devices: int = 1  # GPUs the published run used
    # What the script did that no memclaims technique expresses yet (e.g. DeepSpeed, DDP): no
    # install makes these runnable, so they are requirements.Needs.unsupported.
    extra_needs: tuple[str, ...] = ()
    note: str = ""
    scale: str = "article"
    state_bytes: dict[str, int] = field(default_factory=dict)  # published optimizer-state figures

    def needs(self) -> requirements.Needs:
        """What running the recipe here needs: its techniques' (a CUDA GPU for offload, which moves
        the run there; bitsandbytes working where the run is, for 8-bit Adam), and what memclaims
        cannot express (DeepSpeed, DDP)."""
        return requirements.for_techniques(self.techniques, "cpu") | requirements.Needs(unsupported=self.extra_needs)

    def unmet(self, cuda_devices: int | None = None) -> list[str]:
        """The needs this machine (or one with ``cuda_devices`` GPUs) does not meet; empty when runnable."""
        return requirements.unmet(self.needs(), Machine(cuda_devices=cuda_devices))

    def resolve(self, cuda_devices: int | None = None) -> Recipe:
        problems = self.unmet(cuda_devices)
        if problems:
            raise UsageError(f"named recipe {self.name!r} cannot run here: {'; '.join(problems)}")
        return resolve(self.workload, self.scale, self.techniques)


NAMED_RECIPES: dict[str, NamedRecipe] = {r.name: r for r in (
    NamedRecipe(
        "distilbert-before", "distilbert", ("16-mixed", "deepspeed-zero2"), "bonus_distilbert-before",
        _logged("llm_bonus", "bonus_distilbert-before"), devices=4,
        note="Adam 5e-5, batch 12 per GPU, 1 epoch; the 'before' already shards optimizer state and gradients",
    ),
    NamedRecipe(
        "distilbert-after", "distilbert",
        ("bf16-true", "grad-accum", "fsdp", "cpu-offload", "delayed-init"), "bonus_distilbert-after",
        _logged("llm_bonus", "bonus_distilbert-after"), devices=4,
        note="FSDP wrapping TransformerBlock + cpu_offload, bf16-true, init_module(empty_init=False), "
             "micro-batch 3 x 4 accumulation (grad-accum turns batch 12 into 3 x 4)",
    ),
    NamedRecipe(
        "bigbird-before", "bigbird", ("ddp",), "bonus_bigbird-before",
        _logged("llm_bonus", "bonus_bigbird-before"), devices=4,
        note="fp32, batch 12 per GPU at up to 4096 tokens",
    ),
    NamedRecipe(
        "bigbird-after", "bigbird", ("bf16-true", "grad-accum", "fsdp", "cpu-offload", "delayed-init"),
        "bonus_bigbird-after", _logged("llm_bonus", "bonus_bigbird-after"), devices=4,
        note="FSDP without a wrap policy + cpu_offload, bf16-true, init_module(empty_init=False), micro-batch 1 x 12 "
             "(BigBird's article scale accumulates 12 micro-batches)",
    ),
    # The repo's later ViT-H/14 series: one figure, bars read off to about +-0.1 GB.
    *(NamedRecipe(name, "vit-h14", ("16-mixed", *extra), "ViT-H/14 series (figure)", _figure(index),
                  devices=devices, note="518 px, 16-mixed, batch 4 per GPU")
      for index, (name, extra, devices) in enumerate((
          ("vit-h14-one-gpu", (), 1),
          ("vit-h14-fsdp", ("fsdp",), 4),
          ("vit-h14-fsdp-checkpointing", ("fsdp", "activation-checkpointing"), 4),
          ("vit-h14-fsdp-checkpointing-offload", ("fsdp", "activation-checkpointing", "cpu-offload"), 4),
      ))),
    NamedRecipe(
        "distilbert-cased-adam8bit", "distilbert-cased", ("adam8bit",), "course: 8-bit Adam lesson",
        _course()[0], note="Adam8bit with the course's two parameter groups; its state against AdamW's",
        state_bytes=_course()[1],
    ),
)}
