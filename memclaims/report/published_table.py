"""Every published memory number of both documents beside the sim's prediction (``reproduce --device sim --all``).

The published numbers come only from ``memclaims/resources/published.json``, read through ``published()``
(one accessor: when that file becomes a claim catalogue, this is the one place to change). Each
row says how it is predicted; a row outside +-5 % carries the explanation of its residual, and a
row the sim cannot predict yet says why ("pending: ...").
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from memclaims.core import progress

if TYPE_CHECKING:
    from memclaims.core.record import Record

GB = 1e9  # the article prints max_memory_reserved() / 1e9: decimal GB
MIB = 2**20  # the course's "MB" are MiB
BAND = 0.05
# The ViT-H/14 one-GPU bar on a 24 GB card: an A10G as torch reports it (get_device_properties:
# total_memory=22587MB, i.e. MiB), less the CUDA context outside the caching allocator.
A10G_TOTAL_MEMORY_BYTES = 22_587 * MIB
CUDA_CONTEXT_BYTES = (400_000_000, 600_000_000, 1_100_000_000)


# --- the one accessor of memclaims/resources/published.json ------------------------------------------------


def published() -> dict[tuple[str, str], Any]:
    """The published numbers, keyed as this module reads them: {(section, script or key): value}."""
    from memclaims.core import published as published_numbers

    # The package's own file, not one under the working directory: the table is the same wherever
    # ``memclaims reproduce --device sim --all`` runs.
    data = published_numbers.data()
    numbers: dict[tuple[str, str], object] = {}
    for entry in data["vit_chain"] + data["multi_gpu"] + data["llm_bonus"]:
        numbers[("peak_reserved_gb", entry["script"])] = entry.get("peak_reserved_gb")
        numbers[("time_min", entry["script"])] = entry.get("time_min")
    for entry in data["model_loading"]:
        for key in ("load_peak_reserved_gb", "fp32_gb", "fp16_gb"):
            if key in entry:
                numbers[(key, entry["script"])] = entry[key]
    for entry in data["vit_h14_series"]["rows"]:
        numbers[("vit_h14_gb", entry["change"])] = entry["peak_reserved_gb"]
    for key, value in data["adam8bit"].items():
        numbers[("adam8bit", key)] = value
    return numbers


# --- rows ----------------------------------------------------------------------------------------


@dataclass
class Row:
    document: str  # "article" or "course"
    row: str
    what: str
    unit: str  # "GB" (decimal) or "MiB"
    published: float | None
    predicted: float | None = None
    residual: str = ""  # why the prediction is outside the band (shown only then), or why pending
    # Sharded rows: the untimed replay's band (``article-untimed``: cross-stream frees at once, the lower end;
    # plus ``sharded.backward_run_ahead_bound``, the upper end), printed beside the timeline's point prediction.
    lower: float | None = None
    upper: float | None = None
    # Seconds per optimizer step: the timeline's prediction on the profile's GPU, and the published minutes
    # over the optimizer steps of the run (``published_step_seconds``). None where either is unknown.
    predicted_step_s: float | None = None
    published_step_s: float | None = None
    cpu_s: float | None = None
    rss_mb: float | None = None
    profile: str = ""

    @property
    def ratio(self) -> float | None:
        if self.published and self.predicted is not None:
            return self.predicted / self.published
        return None

    @property
    def inside(self) -> bool:
        return self.ratio is not None and abs(self.ratio - 1) <= BAND

    @property
    def bounded(self) -> bool:
        """Outside the band, but published lies within the untimed replay's band."""
        return (not self.inside and self.published is not None and self.lower is not None
                and self.upper is not None and self.lower <= self.published <= self.upper)

    @property
    def step_ratio(self) -> float | None:
        if self.predicted_step_s is not None and self.published_step_s:
            return self.predicted_step_s / self.published_step_s
        return None


@dataclass(frozen=True)
class Prediction:
    """What a row's run predicts: the figure, the untimed band of a sharded row, the step time."""

    value: float
    lower: float | None = None
    upper: float | None = None
    step_s: float | None = None
    published_step_s: float | None = None


@dataclass(frozen=True)
class Spec:
    document: str
    row: str
    key: tuple[str, str]
    what: str
    unit: str
    predict: Callable[[], float | Prediction] | None
    profile: str = "article"
    residual: str = ""  # the explanation when outside the band, or the pending reason when predict is None


def _reserved_bytes(workload: str, techniques: tuple[str, ...], profile: str) -> tuple[int, Record]:
    """The recipe's predicted reserved peak (bytes), and its Record."""
    from memclaims.recipes.recipe import resolve
    from memclaims.recipes.run_options import RunOptions
    from memclaims.run import run_recipe

    record = run_recipe(resolve(workload, "article", techniques), RunOptions(device="sim", profile=profile))[0]
    assert record.peak_reserved_total_bytes is not None  # the sim always predicts the reserved total
    return record.peak_reserved_total_bytes, record


# The training splits the published minutes cover (one epoch): ARTICLE.md, "CIFAR-10 train = first 45,000
# images" and "IMDb sentiment, 35k/5k/10k split".
TRAIN_EXAMPLES = {"vit": 45_000, "vit-h14": 45_000, "distilbert": 35_000, "bigbird": 35_000}


def published_step_seconds(record: Record, minutes: float | None) -> float | None:
    """The published minutes of one epoch over its optimizer steps (each rank takes 1/devices of the split;
    the epoch's validation pass is in the minutes too, so this is an upper end of the training step)."""
    examples = TRAIN_EXAMPLES.get(record.workload)
    if minutes is None or examples is None:
        return None
    steps = -(-examples // ((record.devices or 1) * record.batch_size))
    return minutes * 60 / steps


def _minutes(script: str) -> float | None:
    minutes: float | None = published().get(("time_min", script))
    return minutes


def _sim(workload: str, techniques: tuple[str, ...], profile: str, script: str | None = None) -> Callable[[], Prediction]:
    def run() -> Prediction:
        reserved, record = _reserved_bytes(workload, techniques, profile)
        return Prediction(reserved / GB, step_s=record.predicted_step_s,
                          published_step_s=published_step_seconds(record, _minutes(script) if script else None))

    return run


UNTIMED = "article-untimed"


def _sim_sharded(workload: str, techniques: tuple[str, ...], profile: str, script: str | None = None
                 ) -> Callable[[], Prediction]:
    """Rank 0's reserved peak on the timeline (the point prediction), beside the untimed replay's band: its
    peak (``article-untimed`` frees the backward's cross-stream buffers at once: the lower end) and that plus
    ``sharded.backward_run_ahead_bound`` (a CPU far ahead of the GPU keeps them all taken: the upper end)."""
    def run() -> Prediction:
        from memclaims.sim.profiles import profile as named_profile
        from memclaims.sim.sharded import backward_run_ahead_bound, mixed_precision_dtypes

        reserved, record = _reserved_bytes(workload, techniques, profile)
        untimed, _ = _reserved_bytes(workload, techniques, UNTIMED)
        param_dtype, _ = mixed_precision_dtypes(record.precision, named_profile(profile).lightning_era)
        return Prediction(reserved / GB, untimed / GB,
                          (untimed + backward_run_ahead_bound(record.param_count, param_dtype)) / GB,
                          step_s=record.predicted_step_s,
                          published_step_s=published_step_seconds(record, _minutes(script) if script else None))

    return run


def _load_record(mode: str) -> Record:
    """The sim's load-only replay of the 07 script that loads by ``mode`` (the stock model, article profile)."""
    from memclaims.recipes.recipe import resolve
    from memclaims.recipes.run_options import LOAD_RECIPES, RunOptions
    from memclaims.run import run_recipe

    return run_recipe(resolve("vit", "article", LOAD_RECIPES[mode]), RunOptions(device="sim", load_only=True))[0]


def _load(mode: str) -> Callable[[], float]:
    def run() -> float:
        return (_load_record(mode).peak_reserved_bytes or 0) / GB

    return run


def _derived_param_bytes(itemsize: int) -> Callable[[], float]:
    def run() -> float:
        return _load_record("init-module").param_count * itemsize / GB

    return run


def _course_params() -> list[Any]:
    """distilbert-base-cased with the 2-label head, built on the meta device (shapes only)."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from memclaims.workloads.registry import WORKLOADS
    from memclaims.workloads.text import TEXT_MODELS, config

    cfg = config(TEXT_MODELS["distilbert-cased"], WORKLOADS["distilbert-cased"].scale("article"))
    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(cfg)
    return list(model.parameters())


def _course(kind: str) -> Callable[[], float]:
    def run() -> float:
        from memclaims.core import optim_state

        params = _course_params()
        if kind == "adam8bit_every_tensor":
            return float(optim_state.adam8bit_bytes(params, every_tensor=True))
        if kind == "adam8bit_mib":
            return optim_state.adam8bit_bytes(params, every_tensor=True) / MIB
        if kind == "adamw_mib":
            return optim_state.adamw_bytes(params) / MIB
        if kind == "estimate_mib":
            return optim_state.course_estimate_bytes(sum(p.numel() for p in params)) / MIB
        raise ValueError(kind)

    return run


_FSDP_RESIDUAL = (
    "FSDP1 rank 0 by per-rank accounting (memclaims.sim.sharded) as the 2023-06-23 nightly ran it, on the sim's "
    "timeline (memclaims.sim.timeline): no rate limiter (limit_all_gathers=False until pytorch PR #104900) and a "
    "CPU far ahead of the GPU, so every unsharded flat parameter and flat gradient freed with record_stream waits "
    "for the GPU to run its unit before its block is reused. With offload the device also holds each unit's "
    "_saved_grad_shard until the end-of-backward callback (+1/W model). The whole backward already runs ahead "
    "(the launch queue is unbounded by calibration, timeline.Timing.queue_depth), so no run-ahead is left to close "
    "the offload rows' 0.89: what is missing is not timing. NCCL buffers are outside the caching allocator (0)")
_VIT_H14_SERIES = (
    "the repo's 08-10-vit32 scripts of 2023-07-14 (08_baseline, 08c_fsdp-size-wrap, 09_fsdp-act-checkp, "
    "10_fsdp-cpu-offload); bars read off the repo's figures/overview.png against its gridlines (one GPU 22.63 GB; "
    "the same figure's ViT-L bars lie within 0.07 GB of the logged runs); software not logged: replayed as the "
    "article's (profile 'article')")
_VIT_H14_ONE_GPU_RESIDUAL = (
    f"{_VIT_H14_SERIES}. On an A100, the card of the ViT-L rows, the replay reserves 26.38 GB: allocated peak "
    "20.25 GB (0.896 of published) plus 6.1 GB of fragmentation between the nightly foreach Adam's two "
    "parameter-sized temporaries (2 x 2.53 GB, sim.eras) and the next forward's activations (at batch 4 the "
    "step's temporaries are half the activations, against a sixth on rows 02-05, which the same replay predicts "
    "within the band). The series' card is not recorded. Explained if it had 24 GB (A10G class): the run fits "
    "(it needs an allocator of about 21.5 GB; batch 8, 28.85 GB allocated, would not, so 4 is the largest "
    "power-of-two batch such a card takes), and when cudaMalloc fails torch frees its cached segments and "
    "retries, so max_memory_reserved stops at the allocator's limit: an A10G (total_memory 22,587 MiB = 23.68 "
    "GB) less a CUDA context of 0.4 / 0.6 / 1.1 GB gives 23.23 / 23.06 / 22.54 GB (1.028 / 1.020 / 0.997; "
    "RunOptions(limit_bytes=...) on the sim). Not proven: nothing records the card. On an A100 none of these closes the gap: "
    "torch 2.1's Adam (profile torch-2.1: one temporary) 1.060; GradScaler skipping the first steps (1 or 2: "
    "1.134 / 1.121); a knife-edge layout (+512 B on random requests: 1.156-1.164); a large transient block at "
    "the first convolution, as cuDNN's first call can allocate (2 / 4 / 6 GiB: this bar 1.103 / 1.088 / 1.005, "
    "but row 04, a patch convolution of similar size, 0.930 / 0.909 / 1.248). scripts/vit-h14-hypotheses "
    "reproduces these figures; scripts/gpu-check records this recipe's allocator history on a GPU and replays it "
    "through the model (memclaims.gpu.alloc_trace), which separates the allocator's rules from the request stream")
_VIT_H14_FSDP_RESIDUAL = (
    f"{_VIT_H14_SERIES}. The article's torch is needed: with torch 2.1's rate limiter (profile torch-2.1) the "
    "three FSDP bars come out 0.80 / 0.64 / 0.52, and nothing untimed is left to close that. Lightning of 2023 "
    "(PR #17670 to PR #21361, sharded.LIGHTNING_2023_FSDP_DTYPES): 16-mixed all-gathers fp32 parameters and "
    "autocast casts each weight per op. The FSDP bar's size_based_auto_wrap_policy (min_num_params=2e6) makes "
    "units finer than the block the replay wraps: under 0.1 GB of unsharded parameters apart. On the timeline as "
    "rows 08/09 (batch 4: the CPU's lead over the GPU, and so these bars, depend on timeline.Timing.dispatch_s)")
_DEEPSPEED_RESIDUAL = (
    "DeepSpeed ZeRO-2 rank 0 by per-rank accounting (memclaims.sim.replays.zero: fp16 model whole, fp32 master, Adam "
    "state and fp32 gradient at 1/4, two fp16 reduce buckets of Lightning's reduce_bucket_size = 2e8 elements "
    "(contiguous_gradients + overlap_comm: 0.8 GB), activations from the one-GPU 16-true replay, since "
    "DeepSpeed runs the model .half() without autocast). Low by about what the sim's one-GPU half-precision "
    "rows are (02-04: 0.93-0.95; the activations are 2/3 of this row). Unknowable here: DeepSpeed's and "
    "NCCL's buffers outside the caching allocator (0 in max_memory_reserved), where the allocator places the "
    "two 400 MB buckets among the activations' segments and the reduction stream's free blocks (the terms add "
    "allocations to one replay's reserved bytes), the fp16 grads_in_partition beside the fp32 one at the step")


def _zero2() -> float:
    from memclaims.sim.replays.zero import DISTILBERT_ONE_GPU, predict_distilbert_before

    workload, _, techniques = DISTILBERT_ONE_GPU
    return predict_distilbert_before(_reserved_bytes(workload, techniques, "article")[1]).total / GB


# The bonus "after" scripts (memclaims.recipes.named): FSDP + cpu_offload, bf16-true, init_module(empty_init=False),
# accumulation (3 x 4 for DistilBERT, 1 x 12 for BigBird), as the sim replays them.
_BONUS_AFTER = ("bf16-true", "grad-accum", "fsdp", "cpu-offload", "delayed-init")
_TEXT_FSDP_RESIDUAL = (
    "FSDP1 rank 0 as for row 09 (no rate limiter, offload's device-side gradient shards), eager attention "
    "as in 2023, 512 tokens (the script pads the whole split to its longest review, truncated at 512), on the "
    "timeline as row 09, whose loop reads the loss after every micro-batch (a synchronisation): the GPU's 3 x 512 "
    "tokens run in milliseconds, so little waits for it. Not explained; the untimed band's upper end (every "
    "cross-stream buffer of the backward taken at once) reaches published")
_BIGBIRD_RESIDUAL = (
    "over-predicted by the sequence length: the replay runs the tokenizer's maximum, 4,096 tokens; the "
    "script pads the whole split to its longest review (tokenizer padding=True, map(batch_size=None)), a "
    "length the offline replay cannot know (neither IMDb nor BigBird's tokenizer ships with a package). The "
    "block-sparse activations scale with it: at 3,072 tokens the replay gives 4.35 GB, 1.08 x published "
    "(memclaims run bigbird --device sim --scale article --seq-len 3072 with the recipe's techniques). One FSDP "
    "unit (no wrap policy), offload, 1 x 12 accumulation as the script ran it")

SPECS: tuple[Spec, ...] = (
    Spec("article", "01", ("peak_reserved_gb", "01_pytorch-vit"), "plain PyTorch, fp32", "GB",
         _sim("vit", ("pytorch",), "article", "01_pytorch-vit")),
    Spec("article", "01-2", ("peak_reserved_gb", "01-2_pytorch-fabric"), "Fabric, fp32", "GB",
         _sim("vit", ("fabric",), "article", "01-2_pytorch-fabric")),
    Spec("article", "02", ("peak_reserved_gb", "02_mixed-precision"), "16-mixed", "GB",
         _sim("vit", ("16-mixed",), "article", "02_mixed-precision")),
    Spec("article", "03", ("peak_reserved_gb", "03_bfloat16"), "bf16-true", "GB",
         _sim("vit", ("bf16-true",), "article", "03_bfloat16")),
    Spec("article", "04", ("peak_reserved_gb", "04_lower-batchsize"), "batch 16", "GB",
         _sim("vit", ("bf16-true", "small-batch"), "article", "04_lower-batchsize")),
    Spec("article", "05", ("peak_reserved_gb", "05_gradient-accum"), "micro-batch 4 x 4", "GB",
         _sim("vit", ("bf16-true", "small-batch", "grad-accum"), "article", "05_gradient-accum")),
    Spec("article", "06", ("peak_reserved_gb", "06_sgd-with-scheduler"), "SGD + cosine", "GB",
         _sim("vit", ("bf16-true", "small-batch", "grad-accum", "sgd"), "article", "06_sgd-with-scheduler")),
    Spec("article", "07_01", ("load_peak_reserved_gb", "07_01"), "load: fp32 on CPU, .to(cuda).to(fp16)", "GB",
         _load("build-then-convert")),
    Spec("article", "07_03", ("load_peak_reserved_gb", "07_03"), "load: init_module, 16-true", "GB",
         _load("init-module")),
    Spec("article", "07 derived fp32", ("fp32_gb", "(derived)"), "304,326,632 params x 4 B", "GB",
         _derived_param_bytes(4)),
    Spec("article", "07 derived fp16", ("fp16_gb", "(derived)"), "304,326,632 params x 2 B", "GB",
         _derived_param_bytes(2)),
    Spec("article", "08", ("peak_reserved_gb", "08_fsdp-with-01-2"), "FSDP x4 + checkpointing, rank 0", "GB",
         _sim_sharded("vit", ("fsdp", "activation-checkpointing"), "article", "08_fsdp-with-01-2"), residual=_FSDP_RESIDUAL),
    Spec("article", "09", ("peak_reserved_gb", "09_fsdp-cpu-offload-with-01-2"), "+ CPU offload, rank 0", "GB",
         _sim_sharded("vit", ("fsdp", "activation-checkpointing", "cpu-offload"), "article", "09_fsdp-cpu-offload-with-01-2"),
         residual=_FSDP_RESIDUAL),
    Spec("article", "11", ("peak_reserved_gb", "11_delay-allocation"), "+ init_module(empty_init=False), rank 0",
         "GB", _sim_sharded("vit", ("fsdp", "activation-checkpointing", "cpu-offload", "delayed-init"), "article", "11_delay-allocation"),
         residual=_FSDP_RESIDUAL),
    Spec("article", "ViT-H/14 one GPU", ("vit_h14_gb", "one GPU"), "16-mixed, batch 4, 518 px", "GB",
         _sim("vit-h14", ("16-mixed",), "article"), residual=_VIT_H14_ONE_GPU_RESIDUAL),
    Spec("article", "ViT-H/14 FSDP", ("vit_h14_gb", "FSDP"), "FSDP x4, rank 0", "GB",
         _sim_sharded("vit-h14", ("16-mixed", "fsdp"), "article"), residual=_VIT_H14_FSDP_RESIDUAL),
    Spec("article", "ViT-H/14 + checkpointing", ("vit_h14_gb", "+ activation checkpointing"), "FSDP x4, rank 0",
         "GB", _sim_sharded("vit-h14", ("16-mixed", "fsdp", "activation-checkpointing"), "article"),
         residual=_VIT_H14_FSDP_RESIDUAL),
    Spec("article", "ViT-H/14 + offload", ("vit_h14_gb", "+ CPU offload"), "FSDP x4, rank 0", "GB",
         _sim_sharded("vit-h14", ("16-mixed", "fsdp", "activation-checkpointing", "cpu-offload"), "article"),
         residual=_VIT_H14_FSDP_RESIDUAL),
    Spec("article", "bonus_distilbert-before", ("peak_reserved_gb", "bonus_distilbert-before"),
         "DistilBERT, DeepSpeed ZeRO-2 x4, 16-mixed, rank 0", "GB", _zero2, residual=_DEEPSPEED_RESIDUAL),
    Spec("article", "bonus_distilbert-after", ("peak_reserved_gb", "bonus_distilbert-after"),
         "DistilBERT, FSDP x4 + offload, bf16-true, 3 x 4", "GB", _sim_sharded("distilbert", _BONUS_AFTER, "article", "bonus_distilbert-after"),
         residual=_TEXT_FSDP_RESIDUAL),
    Spec("article", "bonus_bigbird-after", ("peak_reserved_gb", "bonus_bigbird-after"),
         "BigBird, FSDP x4 (no wrap) + offload, bf16-true, 1 x 12", "GB", _sim("bigbird", _BONUS_AFTER, "article", "bonus_bigbird-after"),
         residual=_BIGBIRD_RESIDUAL),
    Spec("course", "Adam8bit state", ("adam8bit", "adam8bit_state_reported_mib"),
         "bitsandbytes Adam8bit state, distilbert-base-cased", "MiB", _course("adam8bit_mib"),
         residual="the slides round to 128"),
    Spec("course", "Adam8bit state (measured)", ("adam8bit", "adam8bit_state_measured_bytes"),
         "every tensor of the state, bytes", "B", _course("adam8bit_every_tensor")),
    Spec("course", "AdamW state", ("adam8bit", "adamw_state_mib"), "torch AdamW state", "MiB", _course("adamw_mib")),
    Spec("course", "8-bit estimate", ("adam8bit", "estimate_8bit_state_mib"), "1 B x 2 states per parameter",
         "MiB", _course("estimate_mib")),
)


def _predict(index: int) -> tuple[float | Prediction, float, float]:
    """SPECS[index]'s prediction, with the CPU seconds it took and this process's peak RSS (MB)."""
    predict = SPECS[index].predict
    assert predict is not None
    started = time.process_time()
    value = predict()
    return value, time.process_time() - started, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _import_stack() -> None:
    """What every row's replay imports (torch, the fake-tensor mode and the dynamo it pulls in, Lightning,
    the model libraries), imported before any row runs, so that a row's ``cpu_s`` is its own replay and
    not the interpreter's start-up, whichever row a worker happens to run first."""
    import torch._subclasses.fake_tensor  # noqa: F401
    import torchvision  # noqa: F401
    import transformers  # noqa: F401

    import memclaims.run  # noqa: F401
    import memclaims.sim.replays  # noqa: F401


def build_table(only: set[str] | None = None, jobs: int | None = None) -> list[Row]:
    """Predict every row (``only``: a subset of row names); CPU seconds and peak RSS per row. ``jobs``: worker
    processes (default: one per CPU, at most one per row); each row is one deterministic replay, so they run
    apart (``spawn``: a fresh interpreter each, no forked torch state) and come back in the table's order."""
    numbers = published()
    chosen = [i for i, spec in enumerate(SPECS) if only is None or spec.row in only]
    predicted = [i for i in chosen if SPECS[i].predict is not None]
    jobs = max(1, min(jobs or os.cpu_count() or 1, len(predicted)))
    results: dict[int, tuple[float | Prediction, float, float]] = {}
    if jobs == 1:
        _import_stack()
        for i in progress.steps(predicted, "published rows"):
            results[i] = _predict(i)
    else:
        import concurrent.futures
        import multiprocessing

        # The costliest rows first (the sharded ones replay twice), so no worker is left with a long one at the end.
        order = sorted(predicted, key=lambda i: not _is_sharded(SPECS[i]))
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"),
                                                        initializer=_import_stack) as pool:
            futures = {pool.submit(_predict, i): i for i in order}
            for future in progress.steps(concurrent.futures.as_completed(futures), "published rows", len(futures)):
                results[futures[future]] = future.result()
    rows = []
    for i in chosen:
        spec = SPECS[i]
        row = Row(spec.document, spec.row, spec.what, spec.unit, numbers.get(spec.key), profile=spec.profile)
        if i not in results:
            row.residual = spec.residual
        else:
            value, cpu_s, rss_mb = results[i]
            if isinstance(value, Prediction):
                row.predicted, row.lower, row.upper = value.value, value.lower, value.upper
                row.predicted_step_s, row.published_step_s = value.step_s, value.published_step_s
            else:
                row.predicted = value
            row.cpu_s, row.rss_mb = round(cpu_s, 2), round(rss_mb, 1)
            if not row.inside:
                row.residual = spec.residual or "outside the band: not explained"
        rows.append(row)
    return rows


def _is_sharded(spec: Spec) -> bool:
    """A row that ``_sim_sharded`` predicts (two replays: timed and untimed)."""
    return getattr(spec.predict, "__qualname__", "").startswith("_sim_sharded.")


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if unit == "B" else (f"{value:.1f}" if unit == "MiB" else f"{value:.3f}")


def _band(row: Row) -> str:
    return "" if row.lower is None or row.upper is None else \
        f" (untimed {_fmt(row.lower, row.unit)} to {_fmt(row.upper, row.unit)})"


def _step(row: Row) -> str:
    if row.predicted_step_s is None:
        return "-"
    published = f" / {row.published_step_s:.3f}" if row.published_step_s else ""
    return f"{row.predicted_step_s:.3f}{published}"


def markdown(rows: list[Row]) -> str:
    lines = ["| document | row | what | unit | published | predicted | ratio | within +-5 % | step s predicted / "
             "published | residual |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r.ratio:.3f}" if r.ratio is not None else "-"
        inside = "yes" if r.inside else ("pending" if r.predicted is None else "bounded" if r.bounded else "no")
        lines.append(f"| {r.document} | {r.row} | {r.what} | {r.unit} | {_fmt(r.published, r.unit)} | "
                     f"{_fmt(r.predicted, r.unit)}{_band(r)} | {ratio} | {inside} | {_step(r)} | "
                     f"{r.residual if not r.inside else ''} |")
    within = sum(r.inside for r in rows)
    bounded = sum(r.bounded for r in rows)
    predicted = sum(r.predicted is not None for r in rows)
    lines.append("")
    within10 = sum(r.ratio is not None and abs(r.ratio - 1) <= 0.10 for r in rows)
    lines.append(f"{within} of {len(rows)} published numbers within +-5 %, {within10} within +-10 %, {bounded} more "
                 f"within the untimed replay's band ({predicted} predicted, {len(rows) - predicted} pending). GB are "
                 "decimal (max_memory_reserved / 1e9); MiB = 2**20 B. Step times: the sim's timeline on the profile's "
                 "GPU (memclaims.sim.timeline: roofline kernels, hardware peaks) against the published minutes of the "
                 "epoch over its optimizer steps (validation included).")
    return "\n".join(lines)


def to_json(rows: list[Row]) -> str:
    return json.dumps([dict(asdict(r), ratio=r.ratio, inside=r.inside, bounded=r.bounded, step_ratio=r.step_ratio)
                       for r in rows], indent=2)
