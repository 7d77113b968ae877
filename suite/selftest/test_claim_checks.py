"""Every check of memclaims/claims/catalogue.py on constructed Records: it holds on a world shaped like the
claim, and fails when that world is broken the way the claim guards against.

The worlds: on the sim and gpu tiers, peaks, accuracies and times are the published ones (the sim's
05 row at the replay's 1.010, see claims.SIM_BANDS); on the cpu tier every row is derived
from one fp32 breakdown by the rules the cpu checks use (claims.DERIVATIONS), with bf16-mixed
keeping 3/4 of the activations.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

import memclaims.claims.catalogue as claims
from memclaims.claims.accuracy import BY_CLAIM as ACCURACY_PAIRS
from memclaims.claims.lookup import Key, Lookup, Variant
from memclaims.core import published
from memclaims.core.errors import UsageError
from memclaims.core.record import Record
from suite.selftest.test_baselines import fake_record

N = 20_000  # parameters of the constructed model
TENSORS = 32
ACTIVATIONS = 2_000_000  # fp32 activations of the reference at the full batch
GB = 1e9

Techniques = tuple[str, ...]
CHAIN_05 = ("bf16-true", "small-batch", "grad-accum")
STAND_IN = ("bf16-true",)  # a recipe the article did not log takes 03's published figure
SIM_05_FIDELITY = 1.010  # what the replay (the 2023-06 optimizer era) predicts for 05 against the published figure


# 16-true's first loss is an untrained 10-class head's, ln 10 (claim 16-true-loss-batch-0), then NaN.
UNTRAINED_LOSSES: list[float | None] = [2.3026, None, None]


def _cpu(techniques: Techniques) -> Record:
    half = "bf16-true" in techniques or "16-true" in techniques
    width = 2 if half else 4
    params = width * N
    steps = 4 * TENSORS
    state = 0 if "sgd" in techniques else 2 * params + steps
    activations = ACTIVATIONS * (0.5 if half else 0.75 if "bf16-mixed" in techniques else 1.0)
    activations /= 4 ** sum(t in techniques for t in ("small-batch", "grad-accum"))
    breakdown = {"parameters": params, "gradients": params, "optimizer_state": state,
                 "activations_and_temporaries": int(activations), "buffers": 0}
    peak = sum(breakdown.values())
    return fake_record(f"vit-smoke/{'+'.join(techniques)}", techniques=list(techniques), param_count=N,
                       param_tensor_count=TENSORS, param_bytes=params, grad_bytes=params, optimizer_state_bytes=state,
                       peak_allocated_bytes=peak, breakdown=breakdown, load_peak_bytes=2 * N,
                       reference_load_peak_bytes=4 * N if "init-module" in techniques else None,
                       accuracy=0.6, nan_loss=False, memory_losses=UNTRAINED_LOSSES if "16-true" in techniques else [])


def _article(techniques: Techniques, tier: str) -> Record:
    width = 2 if ("bf16-true" in techniques or "16-true" in techniques) else 4
    params = width * N
    state = 0 if "sgd" in techniques else 2 * params
    try:
        row = published.chain_row(techniques)
    except UsageError:
        row = published.chain_row(STAND_IN)
    key = tuple(row["techniques"])
    gb = row["peak_reserved_gb"]
    if tier == "sim" and key == ("bf16-true", "small-batch", "grad-accum"):
        gb *= SIM_05_FIDELITY
    if techniques == ("sgd",):  # the fabric row without Adam's state
        gb = published.chain_row(("fabric",))["peak_reserved_gb"] - state / GB - 8 * N / GB
    load = published.numbers("init-module-load")
    batch = 16 if "small-batch" in techniques else 64
    return fake_record(f"vit-article/{'+'.join(techniques)}", scale="article", device="sim" if tier == "sim" else "cuda",
                       techniques=list(techniques), param_count=N, param_tensor_count=TENSORS, param_bytes=params,
                       grad_bytes=params, optimizer_state_bytes=state, peak_allocated_bytes=int(gb * GB),
                       peak_reserved_bytes=int(gb * GB), peak_reserved_total_bytes=int(gb * GB),
                       load_peak_bytes=int(load["init_module_gb"] * GB),
                       reference_load_peak_bytes=int(load["build_then_convert_gb"] * GB),
                       accuracy=(row["accuracy_pct"] or 90.0) / 100, batch_size=batch,
                       step_time_s=(row["time_min"] or 1.0) * batch / 1000, nan_loss="16-true" in techniques and
                       "init-module" not in techniques,
                       memory_losses=UNTRAINED_LOSSES if "16-true" in techniques else [])


def load_record(techniques: Techniques, init_module_factor: float = 1.0) -> Record:
    """The sim's load-only replay of a 07 script (RunOptions.load_only): the published reserved peaks, the
    stock model's published parameter count."""
    numbers = published.numbers("init-module-load")
    gb = (numbers["init_module_gb"] * init_module_factor if "init-module" in techniques
          else numbers["build_then_convert_gb"])
    params = published.numbers("init-module-param-count")["params"]
    peak = int(gb * GB)
    return fake_record(f"vit-article/{'+'.join(techniques)}", scale="article", device="sim", techniques=list(techniques),
                       precision="16-true", memory_steps=0, param_count=params, param_bytes=2 * params, grad_bytes=0,
                       optimizer_state_bytes=0, load_peak_bytes=peak, peak_allocated_bytes=peak,
                       peak_reserved_bytes=peak, peak_reserved_total_bytes=peak, accuracy=None)


def fake_load(init_module_factor: float = 1.0) -> Callable[[Any, str], Record]:
    """memclaims.report.reproduce's ``load_fn``: the load-only replays of ``load_record``."""
    return lambda recipe, device: load_record(recipe.techniques, init_module_factor)


BATCH_ONE_FRACTION = 0.2  # 05 at micro-batch 1: a fifth of its peak at micro-batch 4, an 80 % cut


UNUSED_BY_DEFAULT = 400 * 2**20  # the sim's fabric: reserved less allocated at the peak
FORWARD_KEEPS = 1_500_000  # what the reference's forward pass keeps for backward (phases.forward.above_start_bytes)


def _record(key: Key, tier: str) -> Record:
    if isinstance(key, Variant):
        if key.load_only:
            return load_record(key.techniques)
        return _memory(_article(key.techniques, tier), BATCH_ONE_FRACTION)  # a smaller micro-batch
    if key in (claims.OFFLOAD, claims.IN_BACKWARD, claims.EXPANDABLE, claims.PAGED, claims.LORA, claims.FUSED_LOSS):
        return _beyond(key, tier)
    if key in SHARDED_08:
        return _sharded(key, tier)
    record = _cpu(key) if tier == "cpu" else _article(key, tier)
    if key == ("fabric",):
        forward = {"above_start_bytes": FORWARD_KEEPS, "allocated_bytes": record.peak_allocated_bytes}
        record = dataclasses.replace(record, phases={"forward": forward})
        if tier == "sim":  # the default allocator's segments keep rests it cannot hand out: 400 MiB
            record = dataclasses.replace(record, peak_allocated_bytes=record.peak_allocated_bytes - UNUSED_BY_DEFAULT)
    return record


def _beyond(key: Key, tier: str) -> Record:
    """The issue-27 techniques, from the reference: the step in backward frees 95 % of the gradients at
    the peak; save_on_cpu packs the forward's saved tensors and the parameters, and on a device (not
    on the CPU, where nothing is copied) 97 % of the saved activations leave it."""
    plain = _record(("fabric",), tier)
    names = dict(recipe=plain.recipe.replace("fabric", "+".join(key)), techniques=list(key))
    if key == claims.PAGED:  # AdamW8bit's run, its two large states (2 B per parameter) out of the allocator
        eight = _record(claims.EIGHT_BIT_ADAMW, tier)
        paged = 2 * N
        return dataclasses.replace(eight, **names, peak_allocated_bytes=eight.peak_allocated_bytes - paged,
                                   paged_state_bytes=paged)
    if key == claims.EXPANDABLE:  # the same tensors; the reserved memory less the default's rests
        reserved = plain.peak_allocated_bytes + UNUSED_BY_DEFAULT // 3
        return dataclasses.replace(plain, **names, peak_reserved_total_bytes=reserved, expandable_segment_bytes=reserved)
    if key == claims.LORA:  # 2 % of the parameters trainable (adapters and head), Adam's state for them only
        trainable = N // 50
        return dataclasses.replace(plain, **names, trainable_parameters=trainable, total_parameters=N + trainable,
                                   optimizer_state_bytes=8 * trainable + 4 * TENSORS)
    if key == claims.FUSED_LOSS:  # 4,096 tokens x 50,257 classes in chunks of 64: the fp32 logits and their
        logits = 4 * LOSS_TOKENS * LOSS_CLASSES  # gradient no longer at the peak
        return dataclasses.replace(plain, **names, peak_allocated_bytes=plain.peak_allocated_bytes - 2 * logits,
                                   fused_loss_calls=plain.memory_steps, fused_loss_rows=LOSS_TOKENS,
                                   fused_loss_classes=LOSS_CLASSES, fused_loss_chunk_rows=64, fused_loss_fallbacks=0)
    if key == claims.IN_BACKWARD:
        return dataclasses.replace(plain, **names, grad_bytes=0,
                                   peak_allocated_bytes=plain.peak_allocated_bytes - int(0.95 * plain.grad_bytes),
                                   backward_optimizer_steps=TENSORS * plain.memory_steps)
    kept = FORWARD_KEEPS if tier == "cpu" else int(0.03 * FORWARD_KEEPS)
    return dataclasses.replace(plain, **names, phases={"forward": {**plain.phases["forward"], "above_start_bytes": kept}},
                               offloaded_activation_bytes=FORWARD_KEEPS + plain.param_bytes)


LOSS_TOKENS, LOSS_CLASSES = 4096, 50257  # GPT-2 at 8 x 512 tokens


SHARDED_08 = (claims.FULL_SHARD_08, claims.SHARD_GRAD_OP_08, claims.NO_SHARD_08, claims.FSDP2_08,
              claims.FSDP2_NO_RESHARD_08)
# FSDP2's reshard settings hold what the FSDP1 strategy of the same behaviour holds (a world's shapes alike).
_AS_FSDP1 = {claims.FSDP2_08: claims.FULL_SHARD_08, claims.FSDP2_NO_RESHARD_08: claims.SHARD_GRAD_OP_08}
RANKS = 4
ROOT = N // 100  # the root unit's parameters: what FULL_SHARD leaves gathered after the forward
SHARDED_PEAK = int(6.59 * GB)  # a FULL_SHARD rank of the 08 recipe


def _sharded(key: Key, tier: str, as_: Techniques | None = None) -> Record:
    """Rank 0 of 4 of the 08 recipe under a sharding strategy (``as_``: the strategy that really ran, for a
    world where the recipe's fell back to it): FULL_SHARD holds 1/4 of the fp32 model, its gradients and
    Adam state and leaves the root gathered after the forward; SHARD_GRAD_OP the same shards with every
    parameter gathered (its peak 3/4 of the model higher); NO_SHARD all of it."""
    ran = as_ or tuple(key)  # type: ignore[arg-type]
    # The API that ran: FSDP2's for its techniques, unless the world has them fall back to an FSDP1 strategy.
    asked = tuple(key)  # type: ignore[arg-type]
    api = "fsdp2" if asked in _AS_FSDP1 and as_ not in (claims.FULL_SHARD_08, claims.SHARD_GRAD_OP_08) else "fsdp1"
    ran = _AS_FSDP1.get(ran, ran)
    whole = 4 * N
    share = whole if ran == claims.NO_SHARD_08 else whole // RANKS
    gathered = N if ran == claims.SHARD_GRAD_OP_08 else 0 if ran == claims.NO_SHARD_08 else ROOT
    peak = SHARDED_PEAK + (3 * (4 * share - 4 * whole // RANKS) if ran == claims.NO_SHARD_08 else 0) \
        + (3 * whole // RANKS if ran == claims.SHARD_GRAD_OP_08 else 0)
    techniques = tuple(key)  # type: ignore[arg-type]
    return fake_record(f"vit-article/{'+'.join(techniques)}", scale="article", device=tier, techniques=list(techniques),
                       devices=RANKS, rank=0, param_count=N, param_tensor_count=TENSORS, param_bytes=share,
                       grad_bytes=share, optimizer_state_bytes=2 * share, forward_unsharded_params=gathered, fsdp_api=api,
                       peak_allocated_bytes=peak, peak_reserved_bytes=peak, peak_reserved_total_bytes=peak)


def world(tier: str) -> dict[Key, Record]:
    wanted: set[Key] = {t for c in claims.CHECKS.values() for t in c.recipes_on(tier)}
    wanted |= {("fabric",), ("sgd",), ("16-true",)}
    return {t: _record(t, tier) for t in wanted}


def _memory(record: Record, factor: float) -> Record:
    fields = ("peak_allocated_bytes", "peak_reserved_bytes", "peak_reserved_total_bytes", "load_peak_bytes")
    return dataclasses.replace(record, **{f: int(getattr(record, f) * factor) for f in fields
                                          if getattr(record, f) is not None})


def break_world(name: str, tier: str, records: dict[Key, Record], monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the claim false in ``records`` (or in what the check reads besides Records)."""
    check = claims.CHECKS[name]
    if isinstance(check.run, claims.Ratio):
        numerator = check.run.on(tier)[0]
        records[numerator] = _memory(records[numerator], 1.5)
    elif isinstance(check.run, claims.TimeRatio):
        candidate, reference = records[check.run.candidate], records[check.run.reference]
        expected = (candidate.step_time_s / candidate.batch_size) / (reference.step_time_s / reference.batch_size)
        factor = 2.0 if abs(expected - 1) <= 0.1 else 1 / expected**2
        records[check.run.candidate] = dataclasses.replace(candidate, step_time_s=candidate.step_time_s * factor)
    elif name in ACCURACY_PAIRS:
        candidate = ACCURACY_PAIRS[name].on(tier)[0]
        tolerance = claims.accuracy_tolerance(name, records[candidate].scale)
        records[candidate] = dataclasses.replace(records[candidate], accuracy=records[candidate].accuracy - tolerance - 0.01)
    elif name == "init-module-load":
        key = ("16-true", "init-module")
        records[key] = dataclasses.replace(records[key], load_peak_bytes=int(records[key].load_peak_bytes * 1.5))
        records[claims.LOAD_INIT_MODULE] = load_record(claims.LOAD_INIT_MODULE.techniques, 1.5)
    elif name in ("adam-two-states", "course-adamw-8-bytes"):
        fabric = records[("fabric",)]
        records[("fabric",)] = dataclasses.replace(fabric, optimizer_state_bytes=3 * fabric.param_bytes)
    elif name == "sgd-two-thirds":
        records[("sgd",)] = dataclasses.replace(records[("sgd",)], optimizer_state_bytes=records[("sgd",)].param_bytes)
    elif name == "forward-peak-above-fp32-model":
        records[("fabric",)] = dataclasses.replace(records[("fabric",)], peak_allocated_bytes=2 * N,
                                                   peak_reserved_bytes=2 * N, peak_reserved_total_bytes=2 * N)
    elif name == "bf16-true-no-nan":
        records[("bf16-true",)] = dataclasses.replace(records[("bf16-true",)], nan_loss=True, nan_step=5)
    elif name == "16-true-nan":
        records[("16-true",)] = dataclasses.replace(records[("16-true",)], nan_loss=False)
    elif name == "chain-combines":
        key = ("bf16-true", "small-batch")
        records[key] = _memory(records[("bf16-true",)], 1.01)
    elif name == "optimizer-in-backward-gradients":  # hooks lost: the gradients live as without it
        plain = records[("fabric",)]
        records[claims.IN_BACKWARD] = dataclasses.replace(records[claims.IN_BACKWARD], grad_bytes=plain.grad_bytes,
                                                          peak_allocated_bytes=plain.peak_allocated_bytes)
    elif name == "lora-few-trainable-parameters":  # adapters silently not applied: everything trains
        adapted = records[claims.LORA]
        records[claims.LORA] = dataclasses.replace(adapted, trainable_parameters=adapted.total_parameters,
                                                   optimizer_state_bytes=records[("fabric",)].optimizer_state_bytes)
    elif name == "fused-linear-ce-logits-never-whole":  # one chunk of every token: the whole logits buffer again
        fused = records[claims.FUSED_LOSS]
        records[claims.FUSED_LOSS] = dataclasses.replace(fused, fused_loss_chunk_rows=fused.fused_loss_rows,
                                                         peak_allocated_bytes=records[("fabric",)].peak_allocated_bytes)
    elif name == "activation-offload-saved-on-host":  # packed, but the device copies stay
        records[claims.OFFLOAD] = dataclasses.replace(records[claims.OFFLOAD], phases=records[("fabric",)].phases)
    elif name == "paged-optimizer-unified-memory":  # the states stayed in the caching allocator
        records[claims.PAGED] = dataclasses.replace(records[claims.EIGHT_BIT_ADAMW], paged_state_bytes=0)
    elif name == "expandable-segments-fewer-slivers":  # the setting did not take: the default's segments
        records[claims.EXPANDABLE] = dataclasses.replace(records[("fabric",)], expandable_segment_bytes=0)
    elif name == "activation-offload-no-copy-on-cpu":  # a host copy of every saved tensor (pinned on the CPU)
        offload = records[claims.OFFLOAD]
        forward = offload.phases["forward"]
        copied = {**forward, "allocated_bytes": forward["allocated_bytes"] + FORWARD_KEEPS}
        records[claims.OFFLOAD] = dataclasses.replace(offload, phases={"forward": copied})
    elif name == "fsdp-no-shard-replicates":  # the strategy fell back to FULL_SHARD: a quarter on each rank
        records[claims.NO_SHARD_08] = _sharded(claims.NO_SHARD_08, tier, as_=claims.FULL_SHARD_08)
    elif name == "fsdp-shard-grad-op-shards-outside-computation":  # fell back to FULL_SHARD: resharded after forward
        records[claims.SHARD_GRAD_OP_08] = _sharded(claims.SHARD_GRAD_OP_08, tier, as_=claims.FULL_SHARD_08)
    elif name == "fsdp2-no-reshard-keeps-unsharded":  # reshard_after_forward=False ignored: resharded after forward
        records[claims.FSDP2_NO_RESHARD_08] = _sharded(claims.FSDP2_NO_RESHARD_08, tier, as_=claims.FSDP2_08)
    elif name == "batch-1-further-75":
        records[claims.MICRO_BATCH_ONE] = _memory(records[CHAIN_05], 0.6)
    elif name == "bf16-supported":
        _fake_cuda(monkeypatch, bf16=False)
    elif name == "bf16-range-for-precision":  # a bfloat16 with float16's range and precision
        import torch

        real_finfo = torch.finfo
        monkeypatch.setattr(torch, "finfo", lambda dtype: real_finfo(torch.float16 if dtype == torch.bfloat16 else dtype))
    elif name == "mixed-precision-keeps-fp32-ops":  # an autocast that runs the loss in bfloat16 too
        import torch
        import torch.nn.functional as F

        real_ce = F.cross_entropy
        monkeypatch.setattr(F, "cross_entropy", lambda *a, **k: real_ce(*a, **k).to(torch.bfloat16))
    elif name == "course-fp8-parameters":  # what bitsandbytes really stores: parameters in float32
        monkeypatch.setattr(claims, "adam8bit_storage", REAL_ADAM8BIT_STORAGE)
    elif name == "course-quarter":  # a 1.5x larger 8-bit state: AdamW / Adam8bit = 2.6x, not 4x
        from memclaims.core import optim_state

        real_bytes = optim_state.adam8bit_bytes
        monkeypatch.setattr(optim_state, "adam8bit_bytes", lambda params, **k: int(1.5 * real_bytes(params, **k)))
    else:  # counts and arithmetic on published numbers: the published number off by half
        real = published.numbers

        def off(claim_id: str) -> dict[str, Any]:
            return {k: v * 1.5 if isinstance(v, (int, float)) and claim_id == name else v
                    for k, v in real(claim_id).items()}

        monkeypatch.setattr(published, "numbers", off)


def _fake_cuda(monkeypatch: pytest.MonkeyPatch, bf16: bool) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, **k: "constructed A100")


REAL_ADAM8BIT_STORAGE = claims.adam8bit_storage


def _prepare_holding(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if name == "bf16-supported":
        _fake_cuda(monkeypatch, bf16=True)
    if name == "course-fp8-parameters":  # the slide's world: parameters stored in 8 bits
        import torch

        monkeypatch.setattr(claims, "adam8bit_storage",
                            lambda: (torch.float8_e4m3fn, {"state1": torch.uint8, "state2": torch.uint8}))


CASES = [(tier, name) for name, check in claims.CHECKS.items() for tier in sorted(check.tiers)]


def _lookup(records: dict[Key, Record]) -> Lookup:
    """The records by key; a model's parameters as memclaims.run builds them on the meta device."""
    from memclaims.run import model_parameters

    return Lookup(lambda key: records[key if isinstance(key, Variant) else tuple(key)], model_parameters)


@pytest.mark.parametrize(("tier", "name"), CASES, ids=[f"{t}:{n}" for t, n in CASES])
def test_check_holds_on_a_world_where_the_claim_holds(tier: str, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _prepare_holding(name, monkeypatch)
    verdict = claims.CHECKS[name].run(tier, _lookup(world(tier)))
    assert verdict.passed, verdict.detail
    assert verdict.detail


@pytest.mark.parametrize(("tier", "name"), CASES, ids=[f"{t}:{n}" for t, n in CASES])
def test_check_fails_on_a_world_where_it_does_not(tier: str, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _prepare_holding(name, monkeypatch)
    records = world(tier)
    break_world(name, tier, records, monkeypatch)
    verdict = claims.CHECKS[name].run(tier, _lookup(records))
    assert not verdict.passed, verdict.detail


def test_audited_details_say_text_logs_and_this_run() -> None:
    verdict = claims.CHECKS["overall-20x"].run("sim", _lookup(world("sim")))
    assert "text 20x, logs 26.84 / 2.02 = 13.3x, this run 13.3x" in verdict.detail
    verdict = claims.CHECKS["init-module-load"].run("sim", _lookup(world("sim")))
    assert "text 50 %, logs 1 - 0.65 / 1.24 = 47.6 %, this run 47.6%" in verdict.detail


def test_sim_ratio_detail_says_within_or_outside_by_how_much() -> None:
    records = world("sim")
    assert "within band" in claims.CHECKS["small-batch-memory"].run("sim", _lookup(records)).detail
    records[("bf16-true", "small-batch")] = _memory(records[("bf16-true", "small-batch")], 1.2)
    detail = claims.CHECKS["small-batch-memory"].run("sim", _lookup(records)).detail
    assert "outside, 0.150 above" in detail, detail
