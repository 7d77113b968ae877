"""Units of the multi-device techniques (#26): DDP's buckets in the sim, the cross-rank active check,
what a DeepSpeed recipe needs on each tier, and where the LLM bonus "before" bars run."""

from __future__ import annotations

import dataclasses

import torch

from fixtures.paths import ROOT
from memclaims.core.record import Record
from memclaims.measure import active, lightning_fsdp
from memclaims.recipes import requirements
from memclaims.recipes.recipe import resolve
from memclaims.report import series
from memclaims.sim.ddp import BUCKET_CAP_BYTES, FIRST_BUCKET_BYTES, bucket_numels
from memclaims.techniques.deepspeed_zero2 import DEEPSPEED_ON_CPU


def _params(*numels: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.empty(n, dtype=dtype, device="meta", requires_grad=True) for n in numels]


def test_buckets_close_at_the_first_cap_then_at_25_mib_in_gradient_ready_order() -> None:
    quarter_mib = 2**18 // 4  # fp32 elements of 256 KiB
    params = _params(*([quarter_mib] * 120))  # 30 MiB of gradients
    buckets = bucket_numels(params)
    sizes = [numel * 4 for _, numel in buckets]
    assert sizes[0] == FIRST_BUCKET_BYTES  # four 256 KiB gradients reach 1 MiB
    assert sizes[1] == BUCKET_CAP_BYTES
    assert sum(sizes) == 30 * 2**20  # every gradient in exactly one bucket
    frozen = _params(10, 20)
    frozen[0].requires_grad_(False)
    assert bucket_numels(frozen) == [(torch.float32, 20)]  # no bucket space for frozen parameters


def test_buckets_are_per_dtype() -> None:
    params = _params(100) + _params(50, dtype=torch.bfloat16)
    assert sorted(bucket_numels(params), key=str) == sorted([(torch.float32, 100), (torch.bfloat16, 50)], key=str)


def _rank(digest: str | None, rank: int, param_bytes: int = 400) -> Record:
    fields = {f.name: None for f in dataclasses.fields(Record) if f.default is dataclasses.MISSING
              and f.default_factory is dataclasses.MISSING}
    fields.update(recipe="vit-smoke/ddp", workload="vit", scale="smoke", techniques=["ddp"], device="cpu",
                  device_name="cpu", probe="cpu", precision="32-true", batch_size=8, accumulation_steps=1,
                  memory_steps=2, param_count=100, param_tensor_count=1, param_bytes=param_bytes, grad_bytes=400,
                  optimizer_state_bytes=800, load_peak_bytes=0, peak_allocated_bytes=0, nan_loss=False,
                  weights="random", data="x", versions={})
    return Record(**fields, devices=2, rank=rank, grad_digest=digest)


def test_ddp_ranks_with_different_gradients_fail_the_active_check() -> None:
    assert active.rank_problems([_rank("a", 0), _rank("a", 1)]) == []
    assert "gradients differ" in active.rank_problems([_rank("a", 0), _rank("b", 1)])[0]


def test_a_ddp_rank_without_the_whole_model_or_a_digest_fails() -> None:
    recipe = resolve("vit", "smoke", ["ddp"])
    assert any("not the whole" in p for p in active.problems(recipe, _rank("a", 0, param_bytes=200)))
    assert any("no gradient digest" in p for p in active.problems(recipe, _rank(None, 0)))


def test_deepspeed_needs_its_extra_and_cannot_run_on_cpu_ranks() -> None:
    gpu = requirements.for_techniques(["16-mixed", "deepspeed-zero2"], "gpu")
    assert gpu.packages == {"deepspeed"} and not gpu.unsupported
    assert requirements.for_techniques(["deepspeed-zero2"], "cpu").unsupported == (DEEPSPEED_ON_CPU,)
    assert requirements.INSTALL["deepspeed"] == "pip install 'memclaims[deepspeed]'"
    assert requirements.for_techniques(["deepspeed-zero2"], "sim").packages == frozenset()


def test_before_bars_run_ddp_on_cpu_ranks_and_say_why_deepspeed_does_not() -> None:
    bars = {b.named.name: b for b in series.plan("cpu", "smoke")}
    # BigBird's pooler gets no gradient: DDP runs it told to look for unused parameters, said so.
    assert bars["bigbird-before"].techniques == ("ddp",)
    assert any("find_unused_parameters=True" in s for s in bars["bigbird-before"].substitutions)
    assert {"ddp", "fsdp"} & set(series.plan("cuda", "article")[-2].techniques or ()) == {"ddp"}
    assert bars["distilbert-before"].techniques == ("16-mixed",)
    assert any(DEEPSPEED_ON_CPU in s for s in bars["distilbert-before"].substitutions)
    gpu = {b.named.name: b for b in series.plan("cuda", "article")}
    assert gpu["distilbert-before"].techniques == ("16-mixed", "deepspeed-zero2")
    assert not any("without" in s for s in gpu["distilbert-before"].substitutions)


def test_ddp_looks_for_unused_parameters_only_where_the_workload_has_them() -> None:
    """BigBird's pooler gets no gradient: plain "ddp" fails at its second step, so its DDP is told to
    look for unused parameters; every other workload keeps the scripts' plain "ddp"."""
    from lightning.fabric.strategies import DDPStrategy

    bigbird = lightning_fsdp.strategy(resolve("bigbird", "smoke", ["ddp"]))
    assert isinstance(bigbird, DDPStrategy) and bigbird._ddp_kwargs == {"find_unused_parameters": True}
    assert lightning_fsdp.strategy(resolve("vit", "smoke", ["ddp"])) == "ddp"


def test_ddp_on_cpu_ranks_syncs_its_states_in_place_not_in_a_bucket() -> None:
    """On gloo, DDP's bucketed init sync leaves a parameter-sized copy for gloo's thread to free, racing the
    reducer's buckets; CPU ranks turn it off and broadcast each state in place (the ddp technique's before_setup)."""
    from lightning.fabric.strategies import DDPStrategy

    vit = lightning_fsdp.strategy(resolve("vit", "smoke", ["ddp"]), 2, "cpu")
    bigbird = lightning_fsdp.strategy(resolve("bigbird", "smoke", ["ddp"]), 2, "cpu")
    assert isinstance(vit, DDPStrategy) and vit._ddp_kwargs == {"init_sync": False}
    assert bigbird._ddp_kwargs == {"find_unused_parameters": True, "init_sync": False}


def test_zero2_partitions_master_state_and_gradients_over_the_ranks() -> None:
    """The sim's stored rank of bonus_distilbert-before (ZeRO-2, 4 ranks) holds 1/4 of the fp32 master,
    Adam state and gradients; a rank holding the whole of either is named as not partitioned."""

    from memclaims.baselines.store import BaselineStore

    recipe = resolve("distilbert", "article", ["16-mixed", "deepspeed-zero2"])
    stored = BaselineStore(ROOT / "baselines").get("sim-article", f"{recipe.id}@4/rank0")
    assert stored is not None, "the sim baseline of the ZeRO-2 rank is missing"
    rank = stored.record
    assert rank.devices == 4 and active.problems(recipe, rank) == []
    whole_state = dataclasses.replace(rank, optimizer_state_bytes=12 * rank.param_count)
    assert any("optimizer_state_bytes" in p and "above 1/4" in p for p in active.problems(recipe, whole_state))
    whole_grads = dataclasses.replace(rank, grad_bytes=4 * rank.param_count)
    assert any("grad_bytes" in p and "partitions" in p for p in active.problems(recipe, whole_grads))
