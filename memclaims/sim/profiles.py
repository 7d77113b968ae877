"""Simulated GPUs as named data: which attention kernel runs per dtype, cuBLAS workspaces, allocator.

The attention kernel decides the activation memory (the math kernel stores full score matrices:
+19 % to +37 % at article scale, the article-math profile), and a CPU-only torch would pick neither
of the GPU kernels by itself, so the choice is stated here, per era, instead of inferred.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from memclaims.core import library_eras
from memclaims.core.errors import UsageError
from memclaims.core.library_eras import LibraryEra
from memclaims.sim.allocator import AllocatorConfig, MiB

KIB = 1024

# Attention kernels a profile can name. "flash" (flash-attention v2, torch >= 2.2), "flash-v1"
# (torch 2.0/2.1) and "efficient" keep O(L) state per row (output + log-sum-exp); "math"
# materialises the (L x L) score and probability matrices.
KERNELS = ("flash", "flash-v1", "efficient", "math")


@dataclass(frozen=True)
class Profile:
    name: str
    summary: str
    gpu: str
    torch_era: str
    # dtype name ("float32", "float16", "bfloat16") -> kernel of KERNELS
    attention: dict[str, str]
    # One cuBLAS workspace per handle; handles are per thread, and the forward (main thread) and
    # backward (autograd's device thread) use one each. Workspaces come from the caching allocator.
    cublas_workspace_bytes: tuple[int, ...]
    # Scratch the flash-attention v2 backward allocates beside its outputs (dq_accum in fp32 over
    # the sequence rounded to 128, softmax_d): a kernel detail meta kernels do not allocate.
    flash_backward_scratch: bool = True
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    # Whose optimizer step is replayed (``memclaims.sim.eras``): "installed" (this torch), or
    # "2023-06" (the article's nightly: foreach Adam held two parameter-sized temporaries).
    optimizer_era: str = "installed"
    # Whose Lightning FSDPPrecision is replayed (``memclaims.sim.sharded.mixed_precision_dtypes``):
    # "installed", or "2023" (Lightning PR #17670 of 2023-05-23 to PR #21361 of 2025-11-21, the
    # article's 2.1.0.dev0 and the 2.1-2.5 releases: "16-mixed" all-gathered fp32 parameters).
    lightning_era: str = "installed"
    # Device memory as torch.cuda.get_device_properties().total_memory reports it (bytes); None
    # for profiles that name no single card. The gpu-tier preflight checks that a case fits.
    total_memory_bytes: int | None = None
    # The timeline (memclaims.sim.timeline): whose peaks time the kernels (a key of timeline.GPUS), and
    # whether it runs. Without it, frees across streams happen at once and no step time is predicted.
    timing_gpu: str = "a100"
    timeline: bool = True
    # Older releases of bitsandbytes, peft or transformers replayed (``memclaims.core.library_eras``; the profile's
    # name then ends with theirs, ``current+bitsandbytes=0.39.0-0.43.1``); none: the installed ones.
    library_eras: tuple[LibraryEra, ...] = ()

    def releases(self) -> dict[str, str]:
        """The release of torch, bitsandbytes, peft and transformers whose behaviour the profile replays."""
        return library_eras.releases(self.torch_era, self.library_eras)

    def kernel(self, dtype_name: str) -> str:
        return self.attention.get(dtype_name, "math")


# torch 2.1 default CUBLAS_WORKSPACE_CONFIG ":4096:2:16:8" = 2 x 4 MiB + 8 x 16 KiB per handle.
_TORCH21_CUBLAS_WORKSPACE = 2 * 4096 * KIB + 8 * 16 * KIB  # 8.125 MiB
# Today's defaults (ATen/cuda/CublasHandlePool.cpp, getChosenWorkspaceSize): the same 8.125 MiB
# below sm90, ":4096:8" = 32 MiB on Hopper (sm90) and later. scripts/gpu-check prints the sizes a
# lent card really uses.
_SM80_CUBLAS_WORKSPACE = _TORCH21_CUBLAS_WORKSPACE
_SM90_CUBLAS_WORKSPACE = 4096 * 8 * KIB  # 32 MiB
GIB = 1024 * MiB
# What SDPA picks with the installed torch on sm80/sm90 for the ViT's unmasked attention: flash
# attention v2 for fp16/bf16, memory-efficient attention for fp32 (flash has no fp32 kernel).
_TODAY_ATTENTION = {"float32": "efficient", "float16": "flash", "bfloat16": "flash"}


def _gpu_tier_profile(name: str, gpu: str, workspace: int, total_memory: int) -> Profile:
    """A card the nightly gpu tier targets, with the installed torch's kernel choices."""
    return Profile(
        name=name,
        summary=f"{gpu} with the installed torch: flash v2 for fp16/bf16, memory-efficient attention "
                f"for fp32, cuBLAS workspaces 2 x {workspace / MiB:g} MiB, {total_memory / GIB:g} GiB; "
                "the gpu tier's preflight",
        gpu=gpu,
        torch_era="installed",
        attention=dict(_TODAY_ATTENTION),
        cublas_workspace_bytes=(workspace, workspace),
        total_memory_bytes=total_memory,
        timing_gpu=name,
    )


# The gpu tier's targets (memclaims.pytest.release_preflight). Capacities: the smallest common variant of each card,
# about what torch.cuda.get_device_properties().total_memory reports (the box says 40 / 80 / 141 GB;
# the driver keeps some), rounded down to 0.01 GiB.
GPU_TIER_PROFILES = ("a100", "h100", "h200")

# The article's card and stack; two later profiles below differ from it in one respect each.
_ARTICLE = Profile(
    name="article",
    summary="A100 with torch 2.1 (the article's era): memory-efficient attention for fp32, "
            "flash attention v1 for fp16/bf16 (v2 shipped in torch 2.2), cuBLAS workspaces "
            "2 x 8.125 MiB, the 2023-06 foreach Adam step (two parameter-sized temporaries), FSDP1 "
            "without the all-gather rate limiter, Lightning of 2023 (16-mixed FSDP all-gathers fp32)",
    gpu="NVIDIA A100 (sm80)",
    torch_era="2.1.0 nightly 2023-06-23, cu118",
    attention={"float32": "efficient", "float16": "flash-v1", "bfloat16": "flash-v1"},
    cublas_workspace_bytes=(_TORCH21_CUBLAS_WORKSPACE, _TORCH21_CUBLAS_WORKSPACE),
    optimizer_era="2023-06",
    lightning_era="2023",
)

# Named data, one profile a card and stack: "current" and "cpu-kernels" give the same fields other
# values, which the ``duplicates`` tool pairs by shape; each is a fact of its own.
PROFILES: dict[str, Profile] = {
    profile.name: profile
    for profile in (
        _ARTICLE,
        Profile(
            name="current",
            summary="A100 with today's torch defaults: SDPA picks flash v2 for fp16/bf16 and "
                    "memory-efficient for fp32 on sm80; cuBLAS and cuBLASLt share one 32 MiB "
                    "workspace per handle (assumed default, ':4096:8')",
            gpu="NVIDIA A100 (sm80)",
            torch_era="2.14 defaults",
            attention={"float32": "efficient", "float16": "flash", "bfloat16": "flash"},
            cublas_workspace_bytes=(32 * MiB, 32 * MiB),
        ),
        replace(
            _ARTICLE,
            name="torch-2.1",
            summary="A100 with the torch 2.1.0 release (2023-10): the article profile's kernels and "
                    "workspaces, with the foreach Adam after the July 2023 'minimize intermediates' "
                    "stack (one parameter-sized temporary) and FSDP1's all-gather rate limiter (PR "
                    "#104900): what changed after the article",
            torch_era="2.1.0 release, cu118/cu121",
            optimizer_era="installed",
        ),
        replace(
            _ARTICLE,
            name="article-untimed",
            summary="the article profile without the timeline (memclaims.sim.timeline): frees that wait for other "
                    "streams happen at once, the forward's unsharded buffers of FSDP1 without the rate limiter stay "
                    "taken until the first pre-backward hook; the replay before issue #29, whose sharded rows "
                    "bound the published figures from below",
            timeline=False,
        ),
        replace(
            _ARTICLE,
            name="article-math",
            summary="the article profile with the math attention kernel everywhere (what a CPU-only "
                    "torch picks): the ablation of the attention kernel (the math kernel stores the full score matrices)",
            attention={"float32": "math", "float16": "math", "bfloat16": "math"},
        ),
        Profile(
            name="cpu-kernels",
            summary="the kernels a CPU run of this torch uses (CPU flash attention, which lays its "
                    "output out like flash v2), no cuBLAS workspaces: for checking the replay "
                    "against the cpu tier's exact tensor accounting",
            gpu="none (CPU kernels)",
            torch_era="installed",
            attention={"float32": "flash", "float16": "flash", "bfloat16": "flash"},
            cublas_workspace_bytes=(),
            flash_backward_scratch=False,
        ),
        # The gpu tier sets CUBLAS_WORKSPACE_CONFIG=:4096:8 for deterministic accuracy
        # (memclaims.measure.determinism), so an A100 in the gpu tier has 32 MiB workspaces too.
        _gpu_tier_profile("a100", "NVIDIA A100-SXM4-40GB (sm80)", _SM90_CUBLAS_WORKSPACE, int(39.58 * GIB)),
        _gpu_tier_profile("h100", "NVIDIA H100 80GB HBM3 (sm90)", _SM90_CUBLAS_WORKSPACE, int(79.18 * GIB)),
        _gpu_tier_profile("h200", "NVIDIA H200 (sm90)", _SM90_CUBLAS_WORKSPACE, int(139.8 * GIB)),
    )
}


def profile(name: str) -> Profile:
    """The profile ``name``: one of ``PROFILES``, or one with library eras (``library_eras.profile_name``)."""
    base, eras = library_eras.split(name)
    try:
        found = PROFILES[base]
    except KeyError:
        raise UsageError(f"unknown sim profile {base!r}; valid profiles: {', '.join(PROFILES)}") from None
    if not eras:
        return found
    return replace(found, name=name, library_eras=eras,
                   summary=f"{found.summary}; as {'; '.join(era.describe() for era in eras)}")
