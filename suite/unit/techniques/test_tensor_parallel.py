"""The tensor-parallel technique's strategy (memclaims.techniques.tensor_parallel.TensorParallel): its plan alone and
with FSDP2, what it refuses and why, Lightning's strategy object, what a rank says ran, and its active check on
constructed Records."""

from __future__ import annotations

from typing import Any

import pytest

from memclaims.core.errors import UsageError
from memclaims.pytest.testing import fake_record
from memclaims.recipes.recipe import resolve
from memclaims.techniques.base import FSDP2_API
from memclaims.techniques.tensor_parallel import NAME, TP_WITH_FSDP2, TensorParallel, mesh_sizes

pytestmark = pytest.mark.cpu

HEADS_4 = "hf:llama(num_attention_heads=4,num_key_value_heads=4)"


def _strategy(recipe: Any) -> TensorParallel:
    strategy = recipe.distributed
    assert isinstance(strategy, TensorParallel), recipe.id
    return strategy


@pytest.mark.parametrize(("techniques", "world", "sizes", "fsdp", "reshard"), [
    (("tensor-parallel",), 2, (1, 2), None, None),
    (("tensor-parallel",), 8, (1, 8), None, None),
    (("tensor-parallel", "fsdp2"), 4, (2, TP_WITH_FSDP2), FSDP2_API, True),
    (("tensor-parallel", "fsdp2-no-reshard"), 8, (4, TP_WITH_FSDP2), FSDP2_API, False),
])
def test_the_plan_is_a_data_parallel_by_tensor_parallel_mesh(techniques, world, sizes, fsdp, reshard) -> None:
    recipe = resolve(HEADS_4, "smoke", techniques)
    plan = recipe.strategy_plan(world)
    assert mesh_sizes(plan) == sizes and plan.mesh_dim_names == ("data_parallel", "tensor_parallel")
    # The engines read who shares a batch: every rank of a tensor-parallel group trains on the same one.
    assert plan.data_parallel == sizes[0]
    assert plan.fsdp_api == fsdp and not plan.setup_moves_model
    if fsdp:
        assert plan.reshard_after_forward is reshard and plan.wrap_blocks


def test_a_2d_recipe_is_run_by_tensor_parallels_strategy_and_fsdp2_leaves_it_the_check() -> None:
    """With fsdp2 the recipe has two strategies; the registry puts tensor-parallel first, so its strategy runs the
    ranks (Recipe.distributed) and FSDP2's own check stands down (it would expect 1/N of every parameter)."""
    recipe = resolve("vit", "smoke", ["fsdp2", "tensor-parallel"])
    assert recipe.id == "vit-smoke/tensor-parallel+fsdp2"
    _strategy(recipe)
    fsdp2 = recipe.hooks[recipe.techniques.index("fsdp2")]
    said: list[str] = []
    fsdp2.check(recipe, fake_record(recipe.id, techniques=list(recipe.techniques), devices=4, param_bytes=10**9),
                None, said.append)
    assert said == []


def test_checkpointing_is_planned_after_the_split() -> None:
    recipe = resolve(HEADS_4, "smoke", ["tensor-parallel", "activation-checkpointing"])
    assert recipe.strategy_plan(2).checkpoint_blocks
    assert _strategy(recipe).block_policies  # the one-device engine's checkpointing stands down


@pytest.mark.parametrize(("other", "reason"), [
    ("fsdp", "combines tensor parallelism with FSDP2 only"),
    ("fsdp-hybrid", "FSDP1's FSDPStrategy takes no tensor-parallel plan"),
    ("ddp", "DDPStrategy replicates the whole model"),
    ("deepspeed-zero2", "DeepSpeed's engine"),
    ("16-mixed", "ModelParallelStrategy refuses precision 16-mixed"),
    ("lora", "lora.Linear"),
    ("init-module", "builds the model on the host"),
])
def test_what_it_does_not_combine_with_is_refused_with_the_reason(other, reason) -> None:
    with pytest.raises(UsageError, match="'tensor-parallel' does not combine with") as refused:
        resolve("vit", "smoke", ["tensor-parallel", other])
    assert reason in str(refused.value)


def test_cpu_offload_is_refused_as_fsdp1s() -> None:
    with pytest.raises(UsageError, match="FSDP1's CPUOffload"):
        resolve("vit", "smoke", ["tensor-parallel", "cpu-offload", "fsdp"])


@pytest.mark.parametrize(("workload", "techniques", "world", "refused"), [
    ("hf:llama", ("tensor-parallel",), 2, None),
    (HEADS_4, ("tensor-parallel",), 4, None),
    ("vit", ("tensor-parallel",), 4, None),  # its attention stays whole: no head count to divide
    ("hf:llama", ("tensor-parallel",), 1, "over 1 rank splits nothing"),
    ("hf:llama", ("tensor-parallel",), 4, "num_attention_heads is 2 heads, not divisible by 4"),
    ("bigbird", ("tensor-parallel",), 4, "attention.self.num_attention_heads is 2 heads, not divisible by 4"),
    ("hf:llama", ("tensor-parallel",), 3, "has 64 output features, not divisible by 3"),
    (HEADS_4, ("tensor-parallel", "fsdp2"), 2, "needs an even number of ranks, at least 4 (got 2)"),
    (HEADS_4, ("tensor-parallel", "fsdp2"), 6, None),
    ("hf:gpt2", ("tensor-parallel",), 2, "its config has no tensor-parallel plan"),
    ("hf:phi3", ("tensor-parallel",), 2, "splits layers.*.self_attn.qkv_proj as 'colwise_gather_output'"),
])
def test_the_ranks_refuse_what_the_split_cannot_do(workload, techniques, world, refused) -> None:
    recipe = resolve(workload, "smoke", techniques)
    said = _strategy(recipe).rank_refusal(recipe, "cpu", world)
    if refused is None:
        assert said is None
    else:
        assert said is not None and refused in said and said.startswith(recipe.id), said


def test_the_sim_refuses_a_family_without_a_layout_whatever_the_ranks() -> None:
    recipe = resolve("hf:gpt2", "smoke", ["tensor-parallel"])
    assert "no tensor-parallel plan" in (_strategy(recipe).sim_refusal(recipe) or "")
    covered = resolve("hf:llama", "smoke", ["tensor-parallel"])
    assert _strategy(covered).sim_refusal(covered) is None


def test_lightning_runs_it_as_model_parallel_strategy_with_the_plans_sizes() -> None:
    from lightning.fabric.strategies.model_parallel import ModelParallelStrategy

    from memclaims.techniques.impl.tensor_parallel_plan import TensorParallelize

    recipe = resolve(HEADS_4, "smoke", ["tensor-parallel", "fsdp2-no-reshard", "activation-checkpointing"])
    plan = recipe.strategy_plan(4)
    made = _strategy(recipe).lightning_strategy(plan, recipe, "cpu")
    assert isinstance(made, ModelParallelStrategy)
    assert (made._data_parallel_size, made._tensor_parallel_size) == (2, 2)
    parallelize = made._parallelize_fn
    assert isinstance(parallelize, TensorParallelize)
    assert (parallelize.checkpointing, parallelize.fsdp2_reshard, parallelize.workload) == (True, False, recipe.workload)


def test_a_rank_says_what_ran() -> None:
    recipe = resolve(HEADS_4, "smoke", ["tensor-parallel", "fsdp2"])
    plan = recipe.strategy_plan(4)
    assert _strategy(recipe).rank_notes(plan, 3, "cpu") == [
        "rank 3 of 4: Lightning ModelParallelStrategy (data_parallel 2 x tensor_parallel 2; FSDP2 fully_shard over "
        "data_parallel, reshard_after_forward=True) over gloo on the CPU"]


# --- the active check on constructed Records --------------------------------------------------------

SEEN = {"tensor_parallel_size": 2, "data_parallel_size": 1, "split_linears": 14, "sharded_linears": 14,
        "split_weight_elements": 81920, "local_split_weight_elements": 40960, "local_split_grad_elements": 40960,
        "colwise_linears": 10, "forward_colwise_local_outputs": 10, "forward_rowwise_partial_outputs": 4}


def _said(seen: dict[str, Any] | None, param_bytes: int = 689408) -> list[str]:
    """What the check says of rank 1 of 2 of hf:llama smoke (fp32: the whole model is 853,248 B) observed so."""
    recipe = resolve("hf:llama", "smoke", ["tensor-parallel"])
    record = fake_record(recipe.id, techniques=["tensor-parallel"], precision="32-true", devices=2, rank=1,
                         param_count=213312, param_bytes=param_bytes, by_technique={} if seen is None else {NAME: seen})
    said: list[str] = []
    _strategy(recipe).check(recipe, record, None, said.append)
    return said


def test_a_rank_that_holds_its_shards_and_ran_them_passes() -> None:
    assert _said(SEEN) == []


@pytest.mark.parametrize(("seen", "named"), [
    (None, "no observation of the split"),
    ({"sharded_linears": 0, "local_split_weight_elements": 81920, "local_split_grad_elements": 81920},
     "holds 0 of the layout's 14 linear layers as DTensor shards after phase load"),
    ({"local_split_weight_elements": 81920, "local_split_grad_elements": 81920},
     "holds local_split_weight_elements 81,920 of the split layers' 81,920 after phase load, not 1/2"),
    ({"local_split_grad_elements": 81920}, "local_split_grad_elements 81,920 after phase backward"),
    ({"forward_colwise_local_outputs": 0, "forward_rowwise_partial_outputs": 0},
     "in phase forward 0 of 10 column-wise layers gave 1/2 of their features"),
    ({"tensor_parallel_size": 1}, "split over 1 ranks, not the plan's 2"),
])
def test_a_rank_that_did_not_split_is_named_by_rank_metric_and_phase(seen, named) -> None:
    said = _said(None if seen is None else {**SEEN, **seen})
    assert any(named in line for line in said), said
    assert all(line.startswith("rank 1") for line in said), said


def test_a_rank_holding_the_whole_models_bytes_is_named() -> None:
    assert _said(SEEN, param_bytes=4 * 213312) == [
        "rank 1 of 2 holds param_bytes 853,248 B after phase load, not below the whole model's 853,248 B"]


def test_the_chain_floor_removes_the_split_share_of_the_state() -> None:
    record = fake_record("hf:llama-smoke/tensor-parallel", devices=2, param_count=100,
                         by_technique={NAME: {"split_weight_elements": 80, "tensor_parallel_size": 2}})
    removal = TensorParallel().removes(record)
    assert removal is not None and removal.state == pytest.approx(1 - 0.8 * 0.5)
