"""The sim's fast dispatch-cache key (``memclaims.sim.cache_key``) is torch's own key, value for value, for every op
of a replay: the same lookups, so no output of the fake mode (and no prediction) can move."""

from __future__ import annotations

from typing import Any

import pytest
from torch._subclasses.fake_tensor import _BypassDispatchCache

from memclaims import sim
from memclaims.recipes.recipe import Sizes, resolve
from memclaims.sim import cache_key

pytestmark = [pytest.mark.sim]

# A small Llama (2 layers, 64 wide) and the smoke ViT: linears, attention, rotary views, 4-bit layers, checkpointing's
# recomputation, convolutions, autocast's casts, the grad scaler, the optimizer's foreach lists.
LLAMA = ("hf:llama(hidden_size=64,num_hidden_layers=2,num_attention_heads=2,num_key_value_heads=2,head_dim=32,"
         "intermediate_size=160)")
RECIPES = [pytest.param(LLAMA, ("bf16-true", "qlora", "activation-checkpointing"),
                        marks=pytest.mark.requires(bitsandbytes="cpu")),  # the sim's 4-bit layers are bitsandbytes'
           ("vit", ("16-mixed",))]


def _key(prep: Any, *call: Any) -> list[object] | tuple[str, str]:
    mode, torch_prep, args, state = call
    result: list[object] = []
    try:
        prep(result, args, state, []) if torch_prep is None else prep(mode, torch_prep, result, args, state, [])
    except _BypassDispatchCache as bypass:
        return ("bypass", bypass.reason)
    return result


@pytest.mark.parametrize(("workload", "techniques"), RECIPES, ids=lambda value: "+".join(value)[:20]
                         if isinstance(value, tuple) else value.split("(")[0])
def test_the_fast_key_is_torchs_for_every_op_of_a_replay(monkeypatch: pytest.MonkeyPatch, workload: str,
                                                         techniques: tuple[str, ...]) -> None:
    assert cache_key.SUPPORTED, "torch's TensorMetadata changed its fields: the sim runs on torch's own key"
    fast = cache_key.prep_args_for_hash
    compared: list[bool] = []

    def both(mode: Any, torch_prep: Any, result: list[object], args: Any, state: Any, ids: list[object]) -> None:
        mine, torchs = _key(fast, mode, torch_prep, args, state), _key(torch_prep, mode, None, args, state)
        assert mine == torchs, f"the fast key differs from torch's for {args!r:.300}"
        compared.append(isinstance(mine, list))
        fast(mode, torch_prep, result, args, state, ids)

    monkeypatch.setattr(cache_key, "prep_args_for_hash", both)
    sizes = Sizes(batch_size=2, seq_len=16) if workload.startswith("hf:") else Sizes(batch_size=2)
    sim.simulate(resolve(workload, "smoke", techniques, sizes), profile="current")
    assert sum(compared) > 500  # every op's key was built both ways (the nested lists' pieces among them)
