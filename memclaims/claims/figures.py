"""The figures every source's checks read from a Record and the way a verdict's detail prints them: the peak claims
compare (``peak``, named by ``peak_metric``), Adam's step counters, the model state, and the units and bands of the
detail text."""

from __future__ import annotations

from memclaims.core.record import Record

ADAM_STEP_BYTES = 4  # torch keeps Adam's ``step`` as a float32 scalar tensor per parameter
GB = 1e9
MIB = 2**20

# Scales whose differences are hundreds of MiB or more (the article's own): claims compare the
# article's figure, reserved memory. At any other scale a difference can be a few 2 MiB segments,
# which reserved granularity (and cuBLAS workspaces) would hide, so claims compare allocated bytes.
RESERVED_SCALES = frozenset({"article"})

MODEL_STATE = ("param_bytes", "grad_bytes", "optimizer_state_bytes")


def peak_metric(record: Record) -> str:
    """The Record field claims compare for ``record``, named in every verdict's detail."""
    if record.scale in RESERVED_SCALES:
        for name in ("peak_reserved_total_bytes", "peak_reserved_bytes"):
            if getattr(record, name):
                return name
    return "peak_allocated_bytes"


def peak(record: Record) -> int:
    """The memory figure claims compare (``peak_metric``): reserved at article scale where the
    allocator reports it, else allocated (live) bytes."""
    figure: int = getattr(record, peak_metric(record))  # one of the Record's int byte counts
    return figure


def step_counters(record: Record) -> int:
    """Bytes of Adam's step counters in the record's optimizer state (host tensors: cpu only)."""
    expected = 2 * record.param_bytes
    extra = record.optimizer_state_bytes - expected
    return extra if extra == ADAM_STEP_BYTES * record.param_tensor_count else 0


def in_mib(n: int | float) -> str:
    return f"{n / MIB:.2f} MiB"


def in_gb(record: Record) -> str:
    """The record's ``peak`` in GB (decimal)."""
    return f"{peak(record) / GB:.2f} GB"


def model_state(record: Record) -> str:
    """The record's parameter, gradient and optimizer-state bytes, in MiB."""
    return ", ".join(f"{key.removesuffix('_bytes')} {in_mib(getattr(record, key))}" for key in MODEL_STATE)


def within(value: float, low: float, high: float) -> str:
    if value < low:
        return f"outside, {low - value:.3f} below"
    if value > high:
        return f"outside, {value - high:.3f} above"
    return "within band"


def as_factor(ratio: float) -> str:
    return f"{1 / ratio:.1f}x" if ratio < 1 else f"ratio {ratio:.3f}"


def then(text: str) -> str:
    """``text`` as a further clause of a detail ('; text'), or nothing."""
    return f"; {text}" if text else ""


def recipe_pair(a: Record, b: Record) -> str:
    return f"{a.recipe} / {b.recipe}"
