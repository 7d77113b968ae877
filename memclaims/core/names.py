"""The public contract's names (CONTRACT.md): workloads, scales, sim profiles, tiers and devices (and
which device each tier uses), the article's seed, the data folder's variable, and the stack packages
each workload builds on. One definition each; imports only the standard library, so that the pytest
plugin and the environment preflight read them before torch is imported."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, get_args

DATA_DIR_ENV = "MEMCLAIMS_DATA_DIR"  # read by data_dir only


def data_dir(given: str | os.PathLike[str] | None) -> Path | None:
    """The data folder: ``given`` (the option), else ``$MEMCLAIMS_DATA_DIR`` (a relative one from the
    working directory), else None: offline data. The one place that reads the variable."""
    chosen = given if given is not None else os.environ.get(DATA_DIR_ENV) or None
    return None if chosen is None else Path(chosen).expanduser()


# The suite's tiers (its markers, less ``slow``) and the devices a run uses (CONTRACT.md).
Tier = Literal["cpu", "sim", "gpu", "dist"]
Device = Literal["cpu", "cuda", "sim"]  # cpu, cuda: real runs; sim: fake tensors, predicted
TIERS: tuple[Tier, ...] = get_args(Tier)
DEVICES: tuple[Device, ...] = get_args(Device)
# The device each tier's runs use: the one mapping. dist runs CPU ranks (gloo) unless its recipe's
# techniques ask for CUDA (memclaims.recipes.requirements).
_TIER_DEVICE: dict[str, Device] = {"cpu": "cpu", "sim": "sim", "gpu": "cuda", "dist": "cpu"}
_DEVICE_TIER: dict[str, Tier] = {"cpu": "cpu", "sim": "sim", "cuda": "gpu"}


def tier_device(tier: str) -> Device:
    """The device the runs of ``tier`` use (gpu -> cuda)."""
    return _TIER_DEVICE[tier]


def device_tier(device: str) -> Tier:
    """The tier whose runs use ``device`` (cuda -> gpu); a real CPU run is the cpu tier's."""
    return _DEVICE_TIER[device]

HF_PREFIX = "hf:"  # hf:<model_type>: a transformers model built offline from its config
# The built-in workloads' names: a user workload may not take one.
BUILT_IN_WORKLOADS = ("vit", "vit-h14", "distilbert", "distilbert-cased", "bigbird")

SEED = 123  # L.seed_everything(123) in every script of the article
# The gpu tier's smoke scale. A scale of its own, not a per-device variant of ``smoke``: a recipe
# id must name one model (baseline keys, ``recipe.parse_id``, ``memclaims run --scale``, the sim
# replay of a cpu case all resolve it), and ``vit-smoke/fabric`` meaning two models by device
# would break each of them. No '-' in the name: parse_id splits WORKLOAD-SCALE at the last '-'.
GPU_SMOKE = "gpusmoke"
# The simulated GPUs (memclaims.sim.profiles defines each; suite/unit/core/test_settings.py keeps the
# two lists equal): the options' table checks --memclaims-sim-profile / --sim-profile against them
# before torch is imported.
SIM_PROFILES = ("article", "current", "torch-2.1", "article-untimed", "article-math", "cpu-kernels", "a100", "h100",
                "h200")
# The profile of a sim run that names none (no --sim-profile, no --memclaims-sim-profile). A question about
# today ("what fits on my card": memclaims run and fit, a user workload's sim-tier cases) gets the installed
# torch's defaults: ``current``'s optimizer step and FSDP are the installed torch's and Lightning's, its kernels
# and workspaces today's (issue #43: the article's 2023 Adam step overstated a 2024 run's peak by 1.21x, current
# 1.03x). Reproducing the article (memclaims reproduce, fidelity, the article's claims, the built-in workloads'
# sim tier, whose committed baselines are baselines/measured/sim-article.json) gets the article's A100 and torch.
INSTALLED_TORCH_PROFILE = "current"
ARTICLE_PROFILE = "article"


def sim_tier_profile(workload: str, chosen: str | None = None) -> str:
    """The profile of ``workload``'s sim-tier cases: ``chosen`` (--memclaims-sim-profile) where given; else the
    article's for the built-in and ``hf:`` workloads (their committed sim baselines are the article profile's)
    and the installed torch's for a user's own workload."""
    if chosen:
        return chosen
    built_in = workload in BUILT_IN_WORKLOADS or workload.startswith(HF_PREFIX)
    return ARTICLE_PROFILE if built_in else INSTALLED_TORCH_PROFILE
# Optimizer steps the sim measures where none are asked for, at any scale (a real run measures its
# scale's memory_steps; memclaims.recipes.run_options.memory_steps picks). The peak needs the second step:
# gradients and optimizer state alive during the forward. With accumulation the scripts step at batch
# 0, then every accum-th batch, so two steps cover a whole cycle (batches 1..accum: state alive,
# gradients accumulating, then the step); later cycles repeat it allocation for allocation.
SIM_MEMORY_STEPS = 2
# The accuracy scale: small enough to train to its plateau in seconds (memclaims.workloads.vit).
CONVERGED = "converged"

# The stack packages a workload's model builds on beyond every run's (torch, lightning,
# torchmetrics): a run of that workload, and its sim, needs them working (the environment
# preflight, memclaims.run.needs).
_WORKLOAD_PACKAGES = {"vit": ("torchvision",), "vit-h14": ("torchvision",), "distilbert": ("transformers",),
                      "distilbert-cased": ("transformers",), "bigbird": ("transformers",)}


def workload_packages(name: str) -> tuple[str, ...]:
    """The stack packages a workload needs beyond every run's (``hf:gpt2`` -> transformers)."""
    if name.startswith(HF_PREFIX):
        return ("transformers",)
    return _WORKLOAD_PACKAGES.get(name, ())
