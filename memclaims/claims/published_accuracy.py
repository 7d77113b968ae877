"""The published test accuracies, compared with this run's at article scale on a GPU.

Only where the data is the article's: CIFAR-10 for the ViT chain (01 -> 06, one GPU), IMDb for
DistilBERT's "after" run (4 GPUs), each with the pretrained weights the scripts fine-tune (from
scratch the ViT reaches about 60 %, not 96 %). What a target needs is data (``Needs``), checked
before anything runs (``unmet``), so a machine without it skips with a reason that says how to get
it, and a run that has it is compared (``check``).

The band: the article's own accuracies for runs it says keep the accuracy. Its chain (01 -> 06)
changes precision, batch size, accumulation and optimizer "without sacrificing accuracy", and its
logged accuracies spread over ``chain_spread()`` points (max - min of the logged values, read from
memclaims/resources/published.json); the same computation run twice spreads far less (01 plain PyTorch vs
01-2 Fabric, ``same_computation_spread()``). A run on another GPU and torch, whose rounding sends
training down another path, is as far from the article as the article's rows are from each other
at most: |measured - published| <= the chain's spread. Two-sided: a run far above the article's
number did not reproduce it either (another split, another test set). The comparison needs the
article's schedule: one whole epoch and the whole test set (``accuracy_schedule`` kind ``epochs``),
not the gpu tier's budget of 50 steps and 2,000 test images; ``--memclaims-accuracy-full-epochs``
asks for it. IMDb gets the same band: the article has no repeated text run to derive one from.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from memclaims.core import published
from memclaims.core.errors import DataError
from memclaims.core.record import Record
from memclaims.recipes.recipe import Recipe, resolve
from memclaims.recipes.run_options import RunOptions, accuracy_schedule

CLAIM = "logged-accuracies"
DOWNLOAD_HINT = "--memclaims-data-dir DIR --memclaims-download (needs internet, once)"


@dataclass(frozen=True)
class Needs:
    """What comparing a target with its published accuracy needs, as data (a skip mechanism reads it)."""

    cuda_devices: int  # the published run's GPUs (data parallel: fewer GPUs, other global batches)
    data: str  # "cifar10" or "imdb": Record.data of a run on the article's data
    weights: str  # the workload whose pretrained weights must be in the local cache
    scale: str = "article"


@dataclass(frozen=True)
class Target:
    name: str  # the logged run, e.g. "vit_chain/03_bfloat16"
    workload: str
    techniques: tuple[str, ...]
    reference: str  # "@section/script/accuracy_pct"
    needs: Needs

    @property
    def published_pct(self) -> float:
        return float(published.lookup(self.reference))

    def recipe(self) -> Recipe:
        return resolve(self.workload, self.needs.scale, self.techniques)


def targets() -> list[Target]:
    """Every logged accuracy memclaims can rerun as published: the single-GPU ViT chain on CIFAR-10,
    DistilBERT's "after" on IMDb (its "before" used DeepSpeed ZeRO-2 on 4 GPUs: memclaims has
    deepspeed-zero2, on CUDA ranks and on the sim, but a published accuracy is rerun on one GPU)."""
    from memclaims.recipes.named import NAMED_RECIPES

    result = [Target(f"vit_chain/{row['script']}", "vit", tuple(row["techniques"]),
                     f"@vit_chain/{row['script']}/accuracy_pct", Needs(1, "cifar10", "vit"))
              for row in published.data()["vit_chain"] if row.get("accuracy_pct") is not None]
    after = NAMED_RECIPES["distilbert-after"]
    result.append(Target(f"llm_bonus/{after.source}", after.workload, after.techniques,
                         f"@llm_bonus/{after.source}/accuracy_pct", Needs(after.devices, "imdb", after.workload)))
    return result


# --- the band --------------------------------------------------------------------------------------


def chain_spread() -> float:
    """Max - min of the chain's logged accuracies (points): runs the article says keep the accuracy."""
    values = [row["accuracy_pct"] for row in published.data()["vit_chain"] if row.get("accuracy_pct") is not None]
    return float(max(values) - min(values))


def same_computation_spread() -> float:
    """01 (plain PyTorch) vs 01-2 (Fabric): the same training twice, in points."""
    numbers = published.numbers("fabric-accuracy")
    return float(abs(numbers["fabric_pct"] - numbers["pytorch_pct"]))


# --- what this machine has ---------------------------------------------------------------------------


def data_available(kind: str, data_dir: str | os.PathLike[str] | None) -> bool:
    """The article's data set in the data dir (where memclaims.workloads.data / memclaims.workloads.text read it)."""
    from memclaims.workloads import data

    try:
        root = data.kind_dir(data.resolve_data_dir(data_dir), "images" if kind == "cifar10" else "text")
    except DataError:
        return False
    if root is None:
        return False
    if kind == "cifar10":
        return data.holds_cifar10(root)
    return data.holds_imdb(root)


def weights_cached(workload: str) -> bool:
    """The pretrained weights (and, for text, the tokenizer) in the local cache; never fetched."""
    from memclaims.workloads import text
    from memclaims.workloads.vit import VIT_FAMILIES

    if workload in text.TEXT_MODELS:
        from huggingface_hub import try_to_load_from_cache

        hub = text.TEXT_MODELS[workload].hub_name
        return text._cached_weights(hub) and isinstance(try_to_load_from_cache(hub, "tokenizer_config.json"), str)
    return workload in VIT_FAMILIES and VIT_FAMILIES[workload].weights_cached()


def _weights_hint(workload: str) -> str:
    from memclaims.workloads import text

    if workload in text.TEXT_MODELS:
        hub = text.TEXT_MODELS[workload].hub_name
        return f"{hub}'s weights and tokenizer in the Hugging Face cache (`huggingface-cli download {hub}` once)"
    from memclaims.workloads.vit import VIT_FAMILIES

    family = VIT_FAMILIES[workload]
    return (f"the {family.weights} weights of torchvision's {family.builder} in the torch hub cache "
            f"(`python -c \"import torchvision; torchvision.models.{family.builder}(weights='{family.weights.split('.')[1]}')\"` "
            "once, with internet)")


@dataclass(frozen=True)
class Facts:
    """What this session has: GPUs, the gpu tier's scale, run options, and how to look for data and weights."""

    cuda_devices: int
    gpu_scale: str
    options: RunOptions
    data_available: Callable[[str, str | os.PathLike[str] | None], bool] = data_available
    weights_cached: Callable[[str], bool] = weights_cached


def unmet(target: Target, facts: Facts) -> str | None:
    """Why this session cannot compare ``target`` with its published accuracy (None: it can)."""
    needs = target.needs
    if not facts.cuda_devices:
        return "needs a CUDA GPU: torch.cuda.is_available() is False on this machine"
    if facts.cuda_devices < needs.cuda_devices:
        return (f"needs {needs.cuda_devices} CUDA devices, as the published run ({facts.cuda_devices} here; data "
                "parallel on fewer GPUs trains on other global batches)")
    if facts.gpu_scale != needs.scale:
        return f"needs the article's scale: the gpu tier runs {facts.gpu_scale} (--memclaims-gpu-scale article)"
    if not facts.data_available(needs.data, facts.options.data_dir):
        name = {"cifar10": "CIFAR-10", "imdb": "IMDb"}[needs.data]
        return f"needs the article's data, {name}, in the data dir: {DOWNLOAD_HINT}"
    if not facts.weights_cached(needs.weights):
        return f"needs {_weights_hint(needs.weights)}"
    recipe = target.recipe()
    schedule = accuracy_schedule(recipe, facts.options)
    if schedule["kind"] != "epochs" or schedule["epochs"] != recipe.scale.accuracy_epochs:
        return (f"needs the article's schedule, {recipe.scale.accuracy_epochs} whole epoch(s) and the whole test set "
                f"(this run: {_schedule(schedule)}): add --memclaims-accuracy-full-epochs")
    return None


def _schedule(schedule: dict[str, object]) -> str:
    if schedule.get("kind") == "epochs":
        return f"{schedule.get('epochs')} epoch(s), {schedule.get('test_examples') or 'whole'} test set"
    return f"{schedule.get('optimizer_steps')} optimizer steps, {schedule.get('test_examples')} test examples"


# --- the verdict -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    passed: bool
    detail: str


def judge(target: Target, record: Record) -> Verdict:
    """The run's test accuracy against the published one, within the chain's spread (both sides).

    A Record that is not what the needs promised (another data set, random weights, a budgeted
    schedule, another scale) fails: it says what ran instead, so the number is never compared blind.
    """
    needs, expected, band = target.needs, target.published_pct, chain_spread()
    wrong = []
    if record.scale != needs.scale:
        wrong.append(f"scale {record.scale}, not {needs.scale}")
    if record.data != needs.data:
        wrong.append(f"data {record.data}, not {needs.data}")
    if record.weights != "pretrained":
        wrong.append(f"{record.weights} weights, not the pretrained ones")
    schedule = record.accuracy_schedule
    if schedule.get("kind") != "epochs" or schedule.get("epochs") != target.recipe().scale.accuracy_epochs:
        wrong.append(f"schedule {_schedule(schedule) if schedule else 'not declared'}, not the article's "
                     f"{target.recipe().scale.accuracy_epochs} whole epoch(s)")
    if record.accuracy is None:
        wrong.append("accuracy not measured")
    if wrong:
        return Verdict(False, f"{record.recipe} is not comparable with {target.name} ({expected:.2f} %): "
                              + "; ".join(wrong))
    assert record.accuracy is not None
    measured = 100 * record.accuracy
    delta = measured - expected
    within = abs(delta) <= band
    ranks = f", {record.devices} GPUs (published {needs.cuda_devices})" if needs.cuda_devices > 1 else ""
    return Verdict(within, f"{record.recipe}: test accuracy {measured:.2f} % on {record.data} "
                           f"({schedule.get('test_examples')} test examples{ranks}), published {expected:.2f} % "
                           f"({target.name}): {delta:+.2f} points, band +-{band:.2f} (the article's chain spread; "
                           f"the same computation twice: {same_computation_spread():.2f}) "
                           f"({'within band' if within else 'outside'})")
