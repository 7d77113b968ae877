"""``memclaims fit``: which technique combinations fit a workload into N bytes of GPU memory.

Every valid single-process combination of the technique registry is predicted on the sim (the
full matrix; with ``devices`` N > 1 also the strategies' combinations, FSDP, DDP, ZeRO, each
replayed per rank on N simulated GPUs, the largest rank's peak compared), except those pruned because a
subset of their techniques already fits: adding a technique costs time or accuracy, so the cheaper
combination is the answer. The combination asked for (every technique given with ``-t``) is never
pruned: it is what the user would run, so it is always predicted and shown, marked as asked. The figure compared
with the budget is the article's: reserved memory, never reset, loading included.

The budget is what PyTorch's allocator may take from the card (its memory less the CUDA context,
about 0.3-1 GB). A combination whose reserved peak passes it is replayed again under that limit:
the native allocator, when ``cudaMalloc`` fails, frees its wholly free cached segments and retries,
so a run whose live tensors fit can still finish, with slower steps and ``max_memory_reserved`` near
the limit ("fits", ``frees_cache``); only a request that fails after that is "too big".

Cost and risk come from the article's own logs (``memclaims/resources/published.json``, the ViT-L/16
chain): each technique's time ratio is the ratio of consecutive rows' minutes, and its accuracy
change the difference of their test accuracies; 16-true's row records the divergence to NaN.
Techniques the article never timed have no ratio (shown as unknown, never guessed). They are the
ViT's: the table shows them for the article's workload only, never a ViT's times for a Llama.

With ``exact=False`` deep ``hf:`` models are predicted from two short replays (2 and 4 layers)
extrapolated linearly to the model's depth: every layer allocates the same tensors, but where
the peak falls and which cached blocks are reused change with depth, so it is approximate and
over-predicts (measured: LLaMA-7B bf16-true at batch 8 x 512, 81.51 GB replayed, 82.43 GB
extrapolated, +1.1 %; an 8-layer 1024-wide LLaMA, +10 %). The default replays every layer.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memclaims.techniques.base import TechniqueParameters

from memclaims.core import progress as progress_bar
from memclaims.core.errors import OutOfMemory, UsageError
from memclaims.core.precision import PRECISIONS
from memclaims.core.record import Record
from memclaims.recipes.recipe import Recipe, Sizes, applicable, resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.run import refuse, run_recipe
from memclaims.techniques import technique_registry as registry
from memclaims.techniques.base import Stack

_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$")
EXTRAPOLATION_LAYERS = (2, 4)
# The workload of the article's timed chain (published.json's vit_chain: ViT-L/16 on CIFAR-10): its
# time ratios and accuracy risks say nothing about another model.
TIMED_WORKLOAD = "vit"
# What the size knob is called in the header, by Workload.size_knob.
_KNOB_WORDS = {"seq": ("tokens", "--seq-len"), "image": ("px images", "--image-size")}


def parse_size(text: str) -> int:
    """``24GB`` (decimal: 24e9 B, as the article's /1e9) or ``24GiB`` (binary: 24 x 2^30 B) -> bytes."""
    match = _SIZE.match(text)
    unit = match.group(2).upper() if match else ""
    if not match or unit not in _UNITS:
        raise UsageError(f"--memory {text!r} is not a number with a unit; valid units: B, KB, MB, GB, TB "
                         "(decimal, 10^3 steps) and KiB, MiB, GiB, TiB (binary, 2^10 steps), e.g. 24GB or 80GiB")
    size = int(float(match.group(1)) * _UNITS[unit])
    if size < 1:
        raise UsageError(f"--memory {text!r} is not a positive budget ({size} bytes); give the memory PyTorch's "
                         "allocator may take, e.g. 24GB or 80GiB")
    return size


# --- the article's cost and risk per technique ------------------------------------------------------


@dataclass(frozen=True)
class Effect:
    time_ratio: float | None  # minutes with / minutes without, from consecutive article rows
    accuracy_change_points: float | None
    diverged: bool = False
    source: str = ""


@lru_cache(maxsize=1)
def article_effects() -> dict[str, Effect]:
    from memclaims.core import published

    rows = published.data()["vit_chain"]
    effects: dict[str, Effect] = {}
    previous: dict[str, Any] | None = None
    for row in rows:
        names = set(row["techniques"]) - {registry.REFERENCE}  # 01-2 (fabric) is the reference: no technique
        if row.get("nan"):
            for name in names:
                effects[name] = Effect(None, None, diverged=True, source=row["script"])
            continue
        if previous is not None and row.get("time_min") and previous.get("time_min"):
            before = set(previous["techniques"])
            added, removed = names - before, before - names
            replaced = 1.0
            for name in removed:  # 03 replaces 16-mixed: its ratio is taken against the reference
                earlier = effects.get(name)
                replaced *= earlier.time_ratio if earlier is not None and earlier.time_ratio else 1.0
            delta_acc = None
            if row.get("accuracy_pct") is not None and previous.get("accuracy_pct") is not None:
                delta_acc = row["accuracy_pct"] - previous["accuracy_pct"]
                for name in removed:
                    gone = effects.get(name)
                    delta_acc += (gone.accuracy_change_points or 0.0) if gone else 0.0
            if not names and before == {"pytorch"}:  # 01 -> 01-2: pytorch's effect is the inverse
                effects["pytorch"] = Effect(previous["time_min"] / row["time_min"],
                                            -delta_acc if delta_acc is not None else None, source=previous["script"])
            for name in added:
                if name not in effects:
                    effects[name] = Effect(row["time_min"] / previous["time_min"] * replaced, delta_acc,
                                           source=row["script"])
        previous = row
    return effects


def cost(techniques: tuple[str, ...]) -> tuple[float | None, str]:
    """(time ratio against the fp32 reference or None when a technique was never timed, risk text)."""
    effects = article_effects()
    ratio: float | None = 1.0
    risks: list[str] = []
    for name in techniques:
        if name in ("fabric",):
            continue
        effect = effects.get(name)
        if effect is None:
            if not registry.technique(name).hooks.load_only():  # load only: no training time
                ratio = None
            continue
        if effect.diverged:
            risks.append(f"{name}: diverged to NaN in the article")
            ratio = None
            continue
        if ratio is not None and effect.time_ratio is not None:
            ratio *= effect.time_ratio
        # Below a point: within the spread of the article's single runs (fabric vs pytorch: 0.21).
        if effect.accuracy_change_points is not None and effect.accuracy_change_points <= -1.0:
            risks.append(f"{name}: {effect.accuracy_change_points:+.2f} accuracy points in the article")
    return ratio, "; ".join(risks) or "none reported"


# --- predictions ---------------------------------------------------------------------------------


@dataclass
class FitRow:
    techniques: list[str]
    recipe: str
    status: str  # fits | too big | pruned | not predicted
    peak_reserved_bytes: int | None = None
    peak_allocated_bytes: int | None = None
    headroom_bytes: int | None = None
    time_ratio: float | None = None
    risk: str = ""
    note: str = ""
    frees_cache: bool = False  # fits only because the allocator frees its cache and retries
    asked: bool = False  # the combination given with -t: always predicted and shown

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    @property
    def label(self) -> str:
        """The techniques as the recipe id says them, with what was asked of them (``lora[r=8]``) and the ranks."""
        return self.recipe.rpartition("/")[2] if "/" in self.recipe else "+".join(self.techniques)


@dataclass
class FitResult:
    workload: str
    scale: str
    profile: str
    memory_bytes: int  # per GPU
    devices: int  # the GPUs a strategy's combination spreads over (1: single-process combinations only)
    method: str
    batch_size: int = 0  # examples per optimizer step the predictions assumed
    input_size: int | None = None  # tokens per sequence or image side they assumed (None: no size knob)
    size_knob: str | None = None  # "seq" or "image" (Workload.size_knob)
    apart: str | None = None  # why the techniques given do not combine into one asked combination
    rows: list[FitRow] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return any(row.status == "fits" for row in self.rows)

    @property
    def timed(self) -> bool:
        """Whether the article's time ratios and accuracy risks apply (its own workload)."""
        return self.workload == TIMED_WORKLOAD

    def assumed(self) -> str:
        """``batch 8 x 512 tokens (--batch-size, --seq-len)``: what every prediction assumed."""
        if self.input_size is None or self.size_knob not in _KNOB_WORDS:
            return f"batch {self.batch_size} (--batch-size)"
        words, option = _KNOB_WORDS[self.size_knob]
        return f"batch {self.batch_size} x {self.input_size} {words} (--batch-size, {option})"

    def ranked(self) -> list[FitRow]:
        """Fitting rows first (cheapest time, then most headroom), then too big (smallest first), then the rest."""
        order = {"fits": 0, "too big": 1, "pruned": 2, "not predicted": 3}

        def key(row: FitRow) -> tuple[Any, ...]:
            time = row.time_ratio if row.time_ratio is not None else float("inf")
            if row.status == "fits":
                return (0, bool(row.risk != "none reported"), time, -(row.headroom_bytes or 0))
            return (order[row.status], row.peak_reserved_bytes or 0, len(row.techniques))

        return sorted(self.rows, key=key)

    def as_dict(self) -> dict[str, object]:
        return {"workload": self.workload, "scale": self.scale, "profile": self.profile,
                "memory_bytes": self.memory_bytes, "devices": self.devices, "method": self.method,
                "batch_size": self.batch_size, "input_size": self.input_size, "size_knob": self.size_knob,
                "apart": self.apart,
                "rows": [r.as_dict() for r in self.ranked()]}


def _layers(recipe: Recipe) -> int | None:
    """The depth of an hf: model, when its config says it (None: not extrapolable)."""
    from memclaims.workloads import hf

    if not recipe.workload.name.startswith("hf:"):
        return None
    chosen = hf.spec(recipe.workload.name)
    return getattr(chosen.config(recipe.scale), "num_hidden_layers", None)


def _at_depth(recipe: Recipe, layers: int) -> Recipe:
    from memclaims.workloads import hf

    chosen = hf.spec(recipe.workload.name)
    name = hf.name_of(chosen.model_type, {**chosen.overrides, **hf._pseudo(chosen), "num_hidden_layers": layers})
    return resolve(name, recipe.scale.name, recipe.techniques, recipe.sizes, [asked for _, asked in recipe.parameters])


def _predicted(recipe: Recipe, profile: str, limit_bytes: int | None = None, devices: int | None = None) -> Record:
    """The recipe's sim Record on ``profile`` (through the one door, memclaims.run.run_recipe); a
    strategy's on ``devices`` simulated GPUs (its largest rank)."""
    return run_recipe(recipe, RunOptions(device="sim", profile=profile, limit_bytes=limit_bytes,
                                      devices=devices if recipe.distributed else None))[0]


def predict(recipe: Recipe, profile: str, exact: bool, devices: int | None = None) -> tuple[int, int, str]:
    """(peak reserved, peak allocated, how) for one recipe on the sim."""
    depth = _layers(recipe)
    low, high = EXTRAPOLATION_LAYERS
    if exact or depth is None or depth <= high:
        record = _predicted(recipe, profile, devices=devices)
        return int(record.peak_reserved_total_bytes or 0), record.peak_allocated_bytes, "replayed"
    a = _predicted(_at_depth(recipe, low), profile, devices=devices)
    b = _predicted(_at_depth(recipe, high), profile, devices=devices)

    def line(x: int, y: int) -> int:
        return int(round(x + (depth - low) * (y - x) / (high - low)))

    return (line(int(a.peak_reserved_total_bytes or 0), int(b.peak_reserved_total_bytes or 0)),
            line(a.peak_allocated_bytes, b.peak_allocated_bytes), f"extrapolated from {low} and {high} layers")


def fit(workload_name: str, memory_bytes: int, *, profile: str = "article", scale: str = "article",
        sizes: Sizes | None = None, exact: bool = True, only: tuple[str, ...] = (),
        progress: Callable[[str], None] | None = None, devices: int | None = None,
        answering: Callable[[], None] | None = None,
        parameters: tuple[TechniqueParameters, ...] = ()) -> FitResult:
    """``parameters``: what is asked of the techniques beyond their names (``--lora-r``: each combination with lora
    or qlora takes it); ``only``: consider combinations of these techniques only (default: every single-process one,
    and with ``devices`` N > 1 every technique); ``devices``: the GPUs a strategy spreads the run over;
    ``answering``: called once the question is judged answerable (profile, devices, budget), before any
    replay, so that what a command prints then never precedes a refusal's one line."""
    sizes = Sizes() if sizes is None else sizes
    from memclaims import sim

    sim.profile(profile)  # a bad profile name fails before any replay
    strategies = [name for name in only if registry.technique(name).distributed]
    if devices is not None and devices < 2 and strategies:
        raise UsageError(f"--devices {devices}: a strategy ({', '.join(strategies)}) spreads a run over at least "
                         "2 GPUs; give --devices 2 or more")
    pool = tuple(registry.technique(name) for name in only) or \
        (registry.TECHNIQUES if devices is not None and devices > 1 else None)
    candidates = registry.full_matrix(pool)
    # A training stack among -t (hf-trainer, accelerate, lightning-trainer) is what the user trains with, not a
    # technique to try: every combination runs through it, and the stack alone is the reference.
    stack = next((name for name in only if isinstance(registry.technique(name).hooks, Stack)), None)
    if stack is not None:
        candidates = [c for c in candidates if stack in c]
    base = (stack,) if stack is not None else (registry.REFERENCE,)
    if base not in candidates:  # "do I need any technique at all?" is always asked
        candidates.insert(0, base)
    # What the user would run: every technique given, in the registry's order (None: none given).
    asked = next((c for c in candidates if set(c) == set(only)), None) if only else None
    # The reference (no technique) first: it is the empty set, a subset of every combination.
    combos = sorted(candidates, key=lambda c: (c != base, len(c), cost(c)[0] or float("inf")))
    reference = resolve(workload_name, scale, [stack] if stack is not None else [], sizes)
    _check_floor(reference, candidates, memory_bytes)
    if answering:
        answering()
    measures = reference.workload.input_size
    result = FitResult(reference.workload.name, scale, profile, memory_bytes, devices or 1,
                       "replayed" if exact or not (_layers(reference) or 0) > EXTRAPOLATION_LAYERS[1]
                       else f"extrapolated from {EXTRAPOLATION_LAYERS[0]} and {EXTRAPOLATION_LAYERS[1]} layers",
                       batch_size=reference.batch_size, size_knob=reference.workload.size_knob,
                       input_size=measures(reference.scale) if measures is not None else None)
    if only and asked is None:  # -t named alternatives (fsdp, ddp): each valid combination of them is the answer
        try:
            resolve(workload_name, scale, only, sizes, applicable(parameters, only))
        except UsageError as reason:
            result.apart = str(reason)
    fitting: list[set[str]] = []
    for combo in progress_bar.steps(combos, f"fit {workload_name}"):
        ratio, risk = cost(combo)
        try:
            recipe = resolve(workload_name, scale, combo, sizes, applicable(parameters, combo))
            refuse(recipe, RunOptions(device="sim", profile=profile))
        except UsageError as reason:
            result.rows.append(FitRow(list(combo), f"{reference.workload.name}/{'+'.join(combo)}", "not predicted",
                                      time_ratio=ratio, risk=risk, note=str(reason), asked=combo == asked))
            continue
        cheaper = next((f for f in fitting if f < set(combo) - {registry.REFERENCE}), None)
        if cheaper is not None and combo != asked:
            result.rows.append(FitRow(list(combo), recipe.id, "pruned", time_ratio=ratio, risk=risk,
                                      note=f"{'+'.join(sorted(cheaper)) or registry.REFERENCE} already fits"))
            continue
        if progress:
            progress(recipe.id)
        reserved, allocated, how = predict(recipe, profile, exact, devices)
        frees_cache, note = False, how
        if reserved > memory_bytes and how == "replayed" and not recipe.distributed:
            try:
                capped = _predicted(recipe, profile, limit_bytes=memory_bytes)
            except OutOfMemory as error:
                note = f"{how}; under the budget: out of memory in the {error.phase} phase ({error})"
            else:
                frees_cache = True
                note = (f"{how}; {reserved / 1e9:.2f} GB reserved without a limit: fits because the allocator frees "
                        "its cache and retries (slower steps)")
                reserved, allocated = int(capped.peak_reserved_total_bytes or 0), capped.peak_allocated_bytes
        fits = reserved <= memory_bytes
        if fits:
            fitting.append(set(combo) - {registry.REFERENCE})
        result.rows.append(FitRow(list(combo), recipe.id, "fits" if fits else "too big", reserved, allocated,
                                  memory_bytes - reserved, ratio, risk, note, frees_cache, asked=combo == asked))
    return result


def _stored_bits(combo: tuple[str, ...]) -> tuple[int, str]:
    """(bits, what): the fewest bits a combination stores a parameter in: its precision's dtype, or fewer where
    a technique says so (``Hooks.stored_bits``: qlora's 4-bit base)."""
    techniques = list(map(registry.technique, combo))
    dtype = PRECISIONS[next((t.precision for t in techniques if t.precision), registry.FP32)].param_dtype
    fewest = (8 * dtype.itemsize, str(dtype).removeprefix("torch."))
    for technique in techniques:
        bits = technique.hooks.stored_bits()
        if bits is not None and bits < fewest[0]:
            fewest = (bits, f"{bits} bits ({technique.name})")
    return fewest


def parameter_floor(reference: Recipe, candidates: list[tuple[str, ...]]) -> tuple[int, int, str] | None:
    """(bytes, parameters, dtype): the fewest bytes any candidate holds on the device, its model's
    parameters in the narrowest dtype the candidates' precisions store them in, or fewer bits where a technique
    stores them so (qlora's 4-bit base: every parameter counted at 4 bits, a floor below its absmax and the layers
    it leaves unquantized) (the reference's model: no single-process technique changes the parameter count).
    None where there is no such floor: a sharded candidate holds a share of them, or none with cpu-offload; a
    workload the sim cannot build is left to the replays, which say why."""
    from memclaims import sim

    strategies = (registry.technique(name).distributed for combo in candidates for name in combo)
    if any(strategy is not None and strategy.shards_parameters for strategy in strategies):
        return None
    try:
        count = sim.parameter_count(reference)
    except UsageError:
        return None
    bits, what = min((_stored_bits(combo) for combo in candidates), key=lambda stored: stored[0])
    return count * bits // 8, count, what


def _check_floor(reference: Recipe, candidates: list[tuple[str, ...]], memory_bytes: int) -> None:
    """A budget below every candidate's parameters is answered before any replay."""
    floor = parameter_floor(reference, candidates)
    if floor is not None and memory_bytes < floor[0]:
        need, count, dtype = floor
        raise UsageError(f"--memory {memory_bytes:,} B: nothing can fit: the parameters alone need {need:,} B "
                         f"({need / 1e9:.3g} GB decimal; {count:,} parameters of {reference.workload.name} at scale "
                         f"{reference.scale.name!r} in {dtype}, the cheapest storage of the combinations)")


# --- output -------------------------------------------------------------------------------------


def _gb(value: int | None) -> str:
    return "-" if value is None else f"{value / 1e9:.2f}"


ASKED = "<- asked"


def table(result: FitResult, limit: int | None = None) -> list[str]:
    """The ranked predictions: what fits first, the asked combination always (marked), the assumptions in the
    header; the article's time and risk columns for its own workload only."""
    lines = [f"memclaims fit {result.workload} at {result.scale} scale, {result.assumed()}, on the sim "
             f"({result.profile} profile): budget {result.memory_bytes / 1e9:.2f} GB "
             f"({result.memory_bytes / 2**30:.2f} GiB)"
             f"{f' per GPU, strategies over {result.devices} GPUs (their largest rank)' if result.devices > 1 else ''}",
             f"GB are decimal (1e9 B); peaks are reserved bytes, loading included; {result.method}",
             f"{'rank':>4}  {'status':<13} {'peak GB':>8} {'headroom GB':>11} "
             + (f"{'time x':>7}  techniques  [accuracy risk]" if result.timed else "techniques")]
    ranked = result.ranked()
    shown = [r for r in ranked if r.status in ("fits", "too big")]
    if limit:
        shown = shown[:limit]
    asked = next((r for r in ranked if r.asked), None)
    for rank, row in enumerate(shown, 1):
        lines.append(_row(result, f"{rank:>4}", row))
    if asked is not None and asked not in shown:  # pruned away by a limit, or not predicted: said all the same
        lines.append(_row(result, f"{'-':>4}", asked))
    pruned = sum(r.status == "pruned" for r in result.rows)
    unpredicted = [r for r in result.rows if r.status == "not predicted" and not r.asked]
    lines.append(f"{len(shown)} predicted, {pruned} pruned (a smaller combination of the same techniques already "
                 f"fits), {len(unpredicted)} not predicted on the sim"
                 + (f" (e.g. {'+'.join(unpredicted[0].techniques)}: {unpredicted[0].note})" if unpredicted else ""))
    if asked is not None:
        lines.append(f"{ASKED}: every technique given with -t, always predicted; the other rows are the "
                     "smaller combinations of them")
    elif result.apart is not None:
        lines.append(f"the techniques given with -t do not combine ({result.apart}): each valid combination of them "
                     "is predicted")
    if result.timed:
        lines.append("time x: training time against the fp32 reference, accuracy risk: a drop or a divergence, both "
                     "from the article's ViT-L/16 logs (A100); ? = a technique the article never timed")
    if any(r.frees_cache for r in shown):
        lines.append("fits, retries: fits only because the allocator frees its cached segments and retries when the "
                     "budget is reached (torch does this before raising out of memory): slower steps")
    return lines


def _row(result: FitResult, rank: str, row: FitRow) -> str:
    status = "fits, retries" if row.frees_cache else row.status
    techniques = row.label
    if result.timed:
        time = "?" if row.time_ratio is None else f"{row.time_ratio:.2f}"
        techniques = f"{time:>7}  {techniques}  [{row.risk}]"
    line = f"{rank}  {status:<13} {_gb(row.peak_reserved_bytes):>8} {_gb(row.headroom_bytes):>11} {techniques}"
    if row.asked:
        line += f"  {ASKED}" + (f": {row.note}" if row.status in ("not predicted", "pruned") else "")
    return line


def plot(result: FitResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted((r for r in result.rows if r.peak_reserved_bytes is not None),
                  key=lambda r: r.peak_reserved_bytes or 0)
    height = max(3.0, 0.22 * len(rows) + 1.2)
    figure, axes = plt.subplots(figsize=(9, height))
    colours = ["tab:green" if r.status == "fits" else "tab:red" for r in rows]
    axes.barh([r.label for r in rows], [(r.peak_reserved_bytes or 0) / 1e9 for r in rows],
              color=colours)
    axes.axvline(result.memory_bytes / 1e9, color="black", linestyle="--",
                 label=f"budget {result.memory_bytes / 1e9:.1f} GB")
    axes.set_xlabel("predicted peak reserved memory (GB, 1e9 B)")
    axes.set_title(f"{result.workload}: {result.assumed().split(' (')[0]}, {result.scale} scale, "
                   f"{result.profile} profile; budget {result.memory_bytes / 1e9:.1f} GB"
                   f"{f' per GPU over {result.devices} GPUs' if result.devices > 1 else ''}", fontsize=9, wrap=True)
    axes.tick_params(axis="y", labelsize=7)
    axes.legend(loc="lower right")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
