"""Tensor parallelism's layouts (memclaims.techniques.impl.tensor_parallel_plan): which linear layers of each covered
family split column-wise or row-wise, read on the meta device (no memory), and what is refused and why. The split
itself runs over gloo in suite/cases/techniques/test_tensor_parallel.py."""

from __future__ import annotations

import pytest
from torch import nn

from memclaims.core.errors import UsageError
from memclaims.recipes.recipe import resolve
from memclaims.techniques.impl.tensor_parallel_plan import COLWISE, ROWWISE, Layout, layout, refusal
from memclaims.techniques.tensor_parallel import meta_model

pytestmark = pytest.mark.cpu


def _layout(workload: str) -> Layout:
    recipe = resolve(workload, "smoke", [])
    return layout(meta_model(recipe), recipe.workload.block_class())


def _per_block(found: Layout, block: str) -> list[tuple[str, str]]:
    return [(name.removeprefix(block), style) for name, style in found.linears if name.startswith(block)]


@pytest.mark.parametrize(("workload", "block", "expected"), [
    # Megatron-LM's split of a llama block, as transformers' own plan gives it: q/k/v and the MLP's gate and up by
    # columns, the attention output and the MLP's down projection by rows.
    ("hf:llama", "model.layers.1.", [("self_attn.q_proj", COLWISE), ("self_attn.k_proj", COLWISE),
                                     ("self_attn.v_proj", COLWISE), ("self_attn.o_proj", ROWWISE),
                                     ("mlp.gate_proj", COLWISE), ("mlp.up_proj", COLWISE),
                                     ("mlp.down_proj", ROWWISE)]),
    ("distilbert", "distilbert.transformer.layer.1.", [
        ("attention.q_lin", COLWISE), ("attention.k_lin", COLWISE), ("attention.v_lin", COLWISE),
        ("attention.out_lin", ROWWISE), ("ffn.lin1", COLWISE), ("ffn.lin2", ROWWISE)]),
    ("bigbird", "bert.encoder.layer.1.", [
        ("attention.self.query", COLWISE), ("attention.self.key", COLWISE), ("attention.self.value", COLWISE),
        ("attention.output.dense", ROWWISE), ("intermediate.dense", COLWISE), ("output.dense", ROWWISE)]),
    # torchvision's ViT: the MLP only (nn.MultiheadAttention's projection is one fused parameter).
    ("vit", "encoder.layers.encoder_layer_1.", [("mlp.0", COLWISE), ("mlp.3", ROWWISE)]),
])
def test_each_family_splits_its_blocks_linears(workload, block, expected) -> None:
    found = _layout(workload)
    assert sorted(_per_block(found, block)) == sorted(expected)
    assert len(found.linears) == 2 * len(expected)  # both smoke blocks, nothing outside them


def test_the_layouts_say_where_they_come_from_and_what_stays_whole() -> None:
    assert _layout("hf:llama").source == "transformers' base_model_tp_plan of 'llama'"
    vit = _layout("vit")
    assert "nn.MultiheadAttention" in vit.whole and "nn.MultiheadAttention" in vit.note()
    assert _layout("bigbird").heads == (("bert.encoder.layer.0.attention.self", "num_attention_heads"),
                                        ("bert.encoder.layer.1.attention.self", "num_attention_heads"))
    assert dict(_layout("hf:llama").config_heads) == {"num_attention_heads": 2, "num_key_value_heads": 2}


@pytest.mark.parametrize(("workload", "reason"), [
    ("hf:gpt2", "'gpt2': its config has no tensor-parallel plan (base_model_tp_plan)"),
    ("hf:gpt_neox", "splits embed_in as 'embedding_rowwise'; memclaims applies 'colwise' and 'rowwise' only"),
    ("hf:mixtral", "memclaims applies 'colwise' and 'rowwise' only"),
])
def test_a_family_it_does_not_cover_is_refused_with_the_reason(workload, reason) -> None:
    with pytest.raises(UsageError, match="tensor-parallel does not cover") as refused:
        _layout(workload)
    assert reason in str(refused.value)


def test_a_model_of_no_known_block_is_refused() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
    with pytest.raises(UsageError, match="no layout of its linear layers; covered: vit"):
        layout(model, nn.Sequential)


@pytest.mark.parametrize(("size", "said"), [
    (2, None), (4, "num_attention_heads is 2 heads, not divisible by 4"),
    (5, "model.layers.0.self_attn.q_proj (colwise) has 64 output features, not divisible by 5"),
])
def test_the_split_must_divide_features_and_heads(size, said) -> None:
    recipe = resolve("hf:llama", "smoke", [])
    text = refusal(meta_model(recipe), recipe.workload.block_class(), size)
    assert text == said if said is None else said in (text or "")


# --- a workload's own plan (issue #53: define(tensor_parallel_plan=...)) ------------------------------


def test_a_workloads_own_plan_splits_the_modules_it_names() -> None:
    from fixtures.tensor_parallel_user import PLAN, Block, Net

    found = layout(Net(32, 2), Block, PLAN)
    assert found.linears == (("blocks.0.up", COLWISE), ("blocks.1.up", COLWISE), ("blocks.0.down", ROWWISE),
                             ("blocks.1.down", ROWWISE))  # the plan's order, then the model's
    assert found.source == "the workload's tensor_parallel_plan"
    assert refusal(Net(32, 2), Block, 8, PLAN) is None  # 128 up features, 128 down inputs: 8 ranks divide them
    assert "blocks.0.up (colwise) has 96 output features, not divisible by 64" in (refusal(Net(24, 2), Block, 64, PLAN)
                                                                                  or "")


@pytest.mark.parametrize(("plan", "said"), [
    ({"blocks.*.gate": "colwise"}, "tensor-parallel: the workload's tensor_parallel_plan names blocks.*.gate, which "
                                   "matches no module of the model; its nn.Linear layers: embed, head, blocks.0.up, "
                                   "blocks.0.down, blocks.1.up, blocks.1.down"),
    ({"blocks.*.norm": "colwise"}, "splits blocks.0.norm (LayerNorm) as 'colwise'; memclaims splits nn.Linear layers"),
])
def test_a_plan_naming_what_the_model_lacks_is_one_line_naming_it(plan: dict[str, str], said: str) -> None:
    from fixtures.tensor_parallel_user import Block, Net

    with pytest.raises(UsageError) as refused:
        layout(Net(32, 2), Block, plan)
    assert said in str(refused.value) and "\n" not in str(refused.value), str(refused.value)


def test_define_refuses_a_style_torch_has_no_plain_class_for() -> None:
    from fixtures.tensor_parallel_user import make

    with pytest.raises(UsageError, match=r"tensor_parallel_plan=...\): blocks.\*.up -> 'colwise_gather_output'; the "
                                         "styles are 'colwise' and 'rowwise'"):
        make({"blocks.*.up": "colwise_gather_output"})
