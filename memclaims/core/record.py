"""The Record: everything one run measured, in bytes and seconds, plus the environment it ran in.

The key names are the public contract (docs/measurement.md, docs/commands.md): baseline files store Records.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field, fields
from enum import StrEnum
from importlib import metadata
from typing import Any

VERSIONED_PACKAGES = ("torch", "torchvision", "lightning", "transformers", "bitsandbytes", "torchmetrics")

# The memory categories of ``Record.breakdown``, in the order reports list them. Every probe fills
# these four; the CPU probe also counts registered buffers apart (none in these models' training
# state), under BUFFERS.
# A StrEnum: its members are the strings themselves, so a breakdown keyed by them is written to
# JSON and read back unchanged, and a misspelt category is an AttributeError, not a new key.
class Category(StrEnum):
    PARAMETERS = "parameters"
    GRADIENTS = "gradients"
    OPTIMIZER_STATE = "optimizer_state"
    ACTIVATIONS = "activations_and_temporaries"
    BUFFERS = "buffers"


PARAMETERS = Category.PARAMETERS
GRADIENTS = Category.GRADIENTS
OPTIMIZER_STATE = Category.OPTIMIZER_STATE
ACTIVATIONS = Category.ACTIVATIONS
CATEGORIES = (PARAMETERS, GRADIENTS, OPTIMIZER_STATE, ACTIVATIONS)
BUFFERS = Category.BUFFERS


def installed_versions(packages: tuple[str, ...] = VERSIONED_PACKAGES) -> dict[str, str | None]:
    """Each package's installed version (None where missing), read from package metadata: nothing is
    imported, so this is cheap."""
    versions: dict[str, str | None] = {}
    for package in packages:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def library_versions() -> dict[str, str | None]:
    """A Record's ``versions``: the installed libraries, Python, and the CUDA torch runs on."""
    versions = installed_versions()
    versions["python"] = platform.python_version()
    import torch  # here, not at the top: reading and writing Records must not cost a torch import

    versions["cuda"] = torch.version.cuda if torch.cuda.is_available() else None
    return versions


def environment_facts(device: str) -> dict[str, Any]:
    """The facts behind a real device's baseline environment id (memclaims.core.environment)."""
    from memclaims.core import environment

    if device == "cuda":
        import torch

        # A run against faked CUDA statistics (the suite's own tests) has no device to describe.
        return environment.cuda_description() if torch.cuda.is_available() else {}
    return environment.cpu_class_description()


def device_name(device: str) -> str:
    import torch

    if device == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return f"cpu-{platform.machine()}"


@dataclass
class Record:
    recipe: str
    workload: str
    scale: str
    techniques: list[str]
    device: str
    device_name: str
    probe: str
    precision: str  # what Fabric really ran (on the CPU, 16-mixed runs as bf16-mixed)
    batch_size: int
    accumulation_steps: int
    memory_steps: int
    param_count: int
    param_tensor_count: int
    param_bytes: int
    grad_bytes: int
    optimizer_state_bytes: int
    load_peak_bytes: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int | None
    accuracy: float | None
    final_loss: float | None
    nan_loss: bool
    nan_step: int | None
    step_time_s: float | None
    weights: str
    data: str
    versions: dict[str, str | None]
    # The article's figure: reserved memory never reset, loading included (CUDA only).
    peak_reserved_total_bytes: int | None = None
    # For init-module recipes: the load peak of building in fp32 then converting (07_01).
    reference_load_peak_bytes: int | None = None
    # Peak resident set size of the process during the run (host memory; what the process held
    # before counts too). Per rank in a distributed run; CPU offload raises it.
    host_peak_bytes: int | None = None
    # Host memory per step phase, by counter (``rss_bytes``: resident set; ``python_blocks``: Python's
    # allocated blocks) and phase: per occurrence in the measured steps (forward and backward once per
    # micro-batch) what it ``gained`` (signed) and the ``level`` at its end, relative to the start of
    # the first measured step (memclaims.measure.host). Not comparable run to run, so not in
    # baselines' comparison; memclaims.measure.host_steady judges growth within the run. Empty for
    # the sim and in Records made before the field existed.
    host_steps: dict[str, dict[str, dict[str, list[int]]]] = field(default_factory=dict)
    # Processes (CPU) or GPUs of the run, and this Record's rank among them.
    devices: int = 1
    rank: int = 0
    # What decides the numbers besides the versions: CPU capability class and bf16/AMX features,
    # torch's build; or GPU model, CUDA and cuDNN (memclaims.core.environment). Names the baseline file.
    environment: dict[str, Any] = field(default_factory=dict)
    # Per phase (load, train, forward, backward, optimizer_step, zero_grad, evaluation, ...):
    # allocated_bytes (absolute peak), above_start_bytes (peak minus what was live when the phase
    # began), reserved_bytes (CUDA and sim, else null). Step phases: the largest over the steps.
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Each step phase's absolute peak, one entry per occurrence in the measured steps (forward and
    # backward once per micro-batch), so that growth from step to step (a leak) is visible.
    step_peaks: dict[str, list[int]] = field(default_factory=dict)
    # What the techniques really did, observed rather than configured (memclaims.measure.active checks it):
    # examples and micro-batches of the last measured optimizer step, the dtypes the linear layers
    # computed in, optimizer state bytes by dtype (uint8: 8-bit state), parameter bytes by device
    # type after setup (CPU offload: none on cuda), and bitsandbytes' 8-bit threshold used;
    # nn.Linear calls made inside the first backward pass (activation checkpointing recomputes its
    # blocks there; 0 without it; None in Records made before the field existed).
    step_examples: int | None = None
    step_micro_batches: int | None = None
    compute_dtypes: list[str] = field(default_factory=list)
    recomputed_linear_calls: int | None = None
    # FSDP ranks: parameter elements the rank held unsharded (all-gathered, not yet resharded) right
    # after the first measured forward pass: every parameter under SHARD_GRAD_OP, only the root's (which
    # FSDP keeps for the backward) under FULL_SHARD. None: not a sharded run, or made before the field.
    forward_unsharded_params: int | None = None
    # FSDP ranks: which FSDP ran, "fsdp1" (FullyShardedDataParallel's flat parameters: Lightning's FSDPStrategy,
    # the sim's FSDP1 replay) or "fsdp2" (fully_shard's per-parameter shards: ModelParallelStrategy, the CPU
    # ranks, the sim's FSDP2 replay). None: not a sharded run, or made before the field.
    fsdp_api: str | None = None
    # The sim's timeline (memclaims.sim.timeline): seconds per optimizer step predicted on the profile's GPU
    # (the last measured step, synchronised after it). None off the sim, or with fewer than two steps.
    predicted_step_s: float | None = None
    optimizer_state_by_dtype: dict[str, int] = field(default_factory=dict)
    param_bytes_by_device: dict[str, int] = field(default_factory=dict)
    # Model state kept on the host while the model trains on a device (CPU offload), by category of
    # CATEGORIES: what moved from device to host, compared with the baseline like the device's bytes
    # (metric ``host_state.<category>_bytes``). Empty where nothing is offloaded, and on the cpu device,
    # where the host is the device.
    host_state_bytes: dict[str, int] = field(default_factory=dict)
    min_8bit_size: int | None = None
    # DDP ranks: SHA-256 of every gradient's bytes after the first step's backward (after DDP's
    # all-reduce), equal on every rank when gradients are all-reduced; null elsewhere.
    grad_digest: str | None = None
    breakdown: dict[str, int] = field(default_factory=dict)  # by category, at the training peak
    memory_losses: list[float | None] = field(default_factory=list)  # null once diverged
    notes: list[str] = field(default_factory=list)
    # What the accuracy phase ran (memclaims.recipes.run_options.accuracy_schedule): kind "epochs" or "steps",
    # epochs / optimizer_steps, and the test examples it scored; empty when not evaluated.
    accuracy_schedule: dict[str, Any] = field(default_factory=dict)
    # After each epoch of the accuracy phase, where the run was asked for it (RunOptions.evaluate_each_epoch):
    # {"epoch": 1, "eval_loss": ..., "eval_accuracy": ..., "eval_f1": ...} as the course's Trainer logs.
    epoch_evaluations: list[dict[str, float]] = field(default_factory=list)
    # Where each tested package's release lies against the range memclaims was tested with
    # (memclaims.core.tested_versions): "inside", "newer", "older" or "unknown". Empty in Records made
    # before the field existed (baseline files load as they are).
    versions_tested: dict[str, str] = field(default_factory=dict)
    # What a technique observes of itself, by technique name (its module's ``observe`` / ``sim_observe`` and its
    # loop helper return ``{"by_technique": {name: {...}}}``: memclaims.techniques.base), e.g.
    # ``{"fused-linear-ce": {"fused_loss_calls": 3, ...}}``; the fields a technique observed before issue #51 kept
    # flat move here when a Record is read (``migrate``, ``RETIRED_FIELDS``). A technique adds no field to this
    # class. Left out of the JSON while empty, so a Record no technique observed reads as before.
    by_technique: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def baseline_key(self) -> str:
        """Where a baseline file stores this Record: the recipe id, plus the world size and rank
        for a rank of a multi-device run (``vit-smoke/fsdp@2/rank1``), whose numbers depend on both."""
        if self.devices == 1:
            return self.recipe
        return f"{self.recipe}@{self.devices}/rank{self.rank}"

    def __post_init__(self) -> None:
        self.by_technique = observed_parts(self.by_technique)

    def observed(self, technique: str, key: str, default: object = None) -> Any:
        """What ``technique`` observed under ``key`` (its ``by_technique`` part); ``default`` where the part has no
        ``key`` (a key it holds as None reads None: ``techniques.base.observations``). The one reader of the parts."""
        return self.by_technique.get(technique, {}).get(key, default)

    def to_dict(self) -> dict[str, Any]:
        fields_ = asdict(self)
        if not fields_["by_technique"]:  # the Records of every technique before it: unchanged
            del fields_["by_technique"]
        return fields_

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, allow_nan=False)

    @classmethod
    def from_dict(cls, raw: dict[str, object]) -> Record:
        """The Record of ``raw``, in either form (``migrate``); keys no field has are left out."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in migrate(raw).items() if k in known})


# Observations of a technique the Record kept as flat fields until issue #51 (schema 1 of the baseline files), and the
# technique whose ``by_technique`` part holds each now, under the same key. A frozen table of the old form, not a
# registry: a technique added since keeps its observations in its part and is never listed here.
RETIRED_FIELDS: dict[str, str] = {
    **dict.fromkeys(("fused_loss_calls", "fused_loss_rows", "fused_loss_classes", "fused_loss_chunk_rows",
                     "fused_loss_fallbacks"), "fused-linear-ce"),
    "paged_state_bytes": "paged-adamw8bit",
    "expandable_segment_bytes": "expandable-segments",
    "trainable_parameters": "lora",
    "total_parameters": "lora",
    "quantized_parameter_bytes": "qlora",
    "offloaded_activation_bytes": "activation-offload",
    "backward_optimizer_steps": "optimizer-in-backward",
    "backward_grad_peak_bytes": "optimizer-in-backward",
}


def observed_parts(parts: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The Record's ``by_technique`` of what the techniques returned (``techniques.base.observations``): a None kept
    ("observed, and there was none", as the stored Records hold it since the parts exist), except under a retired
    field's key (``RETIRED_FIELDS``), where None meant "not observed" (every Record carried every field) and
    ``migrate`` drops it from the old form; a part left empty is no part. One rule read off the stored files, so a
    Record made today equals the migrated one made before it (records snapshot: 0 differences) and no baseline file
    is rewritten; ``Record.observed`` reads None (or its default) either way, so no verdict tells the two apart."""
    kept = {technique: {key: value for key, value in part.items() if value is not None or key not in RETIRED_FIELDS}
            for technique, part in parts.items()}
    return {technique: part for technique, part in kept.items() if part}


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """A Record's dict in today's form: each retired flat field (``RETIRED_FIELDS``) moved, under its own key, into
    its technique's ``by_technique`` part, or dropped where it is null (the old form's "not observed": every Record
    carried every field). A value the part holds already stays. A dict in today's form comes back equal; ``raw`` is
    left unchanged."""
    if not RETIRED_FIELDS.keys() & raw.keys():
        return raw
    out = {k: v for k, v in raw.items() if k not in RETIRED_FIELDS}
    parts = {name: dict(part) for name, part in (raw.get("by_technique") or {}).items()}
    for key, technique in RETIRED_FIELDS.items():
        if raw.get(key) is not None:
            parts.setdefault(technique, {}).setdefault(key, raw[key])
    if parts:
        out["by_technique"] = parts
    return out
