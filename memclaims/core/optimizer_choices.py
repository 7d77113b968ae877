"""The optimizer choices that are the field's own switches, as plain data the techniques and the engines both read
(no torch at import): torch.optim's ``foreach=``/``fused=`` per implementation of a step, and bitsandbytes' paging
threshold. The technique modules own what shows a choice ran (``memclaims.techniques.optimizer_impl``,
``paged_adamw8bit``); ``memclaims.measure.optimizers`` builds the optimizers with these.
"""

from __future__ import annotations

from memclaims.core.errors import UsageError

IMPLEMENTATIONS = ("for-loop", "foreach", "fused")
# The recipe optimizers (core field values) torch implements all three ways.
TORCH_IMPLEMENTED = ("adam", "adamw", "sgd")
# torch.optim's keyword arguments for each implementation.
_FLAGS: dict[str, dict[str, bool]] = {
    "for-loop": {"foreach": False, "fused": False},
    "foreach": {"foreach": True, "fused": False},
    "fused": {"foreach": False, "fused": True},
}

# bitsandbytes puts a state of this many elements or more of a CUDA parameter in CUDA unified memory
# (Optimizer8bit.get_state_buffer: ``p.numel() < 1e5`` stays an ordinary tensor; on the CPU it warns and
# falls back); the paged-adamw8bit technique and the sim's 8-bit model read it.
PAGED_MIN_NUMEL = 100_000


def torch_flags(implementation: str | None) -> dict[str, bool]:
    """torch.optim's ``foreach=`` and ``fused=`` for ``implementation``; {} for None (torch's default)."""
    if implementation is None:
        return {}
    try:
        return dict(_FLAGS[implementation])
    except KeyError:
        raise UsageError(f"unknown optimizer implementation {implementation!r}; valid implementations: "
                         f"{', '.join(IMPLEMENTATIONS)}") from None
