"""Library eras on the sim (``memclaims.sim.library_eras``): a QLoRA prediction as with bitsandbytes 0.41 against
today's, by the bytes the old ``MatMul4Bit`` kept, derived from the model's shapes."""

from __future__ import annotations

import pytest

from memclaims import sim
from memclaims.core.library_eras import ERAS, profile_name
from memclaims.core.record import Record
from memclaims.recipes.recipe import Sizes, resolve
from memclaims.sim.library_eras import replaying

# The sim's 4-bit layers are bitsandbytes'; one worker under -n (--dist loadgroup): the two predictions run once.
pytestmark = [pytest.mark.sim, pytest.mark.requires(bitsandbytes="cpu"), pytest.mark.xdist_group("unit-library-eras")]

# A small Llama, every shape stated here: 3 layers, 64 wide, 2 heads of 32, 160 intermediate; 4 x 32 tokens.
LAYERS, HIDDEN, HEADS, HEAD_DIM, INTERMEDIATE = 3, 64, 2, 32, 160
BATCH, SEQ = 4, 32
WORKLOAD = (f"hf:llama(hidden_size={HIDDEN},num_hidden_layers={LAYERS},num_attention_heads={HEADS},"
            f"num_key_value_heads={HEADS},head_dim={HEAD_DIM},intermediate_size={INTERMEDIATE})")
BF16 = 2  # bytes per element of the 4-bit layers' compute dtype under bf16-true


def _kept_input_bytes() -> tuple[int, int]:
    """(every input the old MatMul4Bit kept for one step's graph, the part of it no one else keeps at the backward's
    start), from the shapes alone. Each decoder layer has seven 4-bit linears (qlora quantizes every nn.Linear but
    the head), whose inputs are four tensors: the attention norm's output (q_proj, k_proj, v_proj share it), the
    attention's output (o_proj), the MLP norm's output (gate_proj, up_proj share it), act(gate) * up (down_proj).
    The old forward kept A only where a gradient flows into the layer: the first layer's attention input comes from
    frozen embeddings through a frozen norm and needs none. At the backward's start today's graph already holds the
    attention's output (SDPA saves it for its backward; o_proj reads that very storage); LoRA's dropout (p=0.1) means
    q_proj's and v_proj's adapters save the dropout's output, not the norm's."""
    tokens = BATCH * SEQ
    attention_input = (LAYERS - 1) * HIDDEN
    attention_output = LAYERS * HEADS * HEAD_DIM
    mlp = LAYERS * (HIDDEN + INTERMEDIATE)
    every = tokens * (attention_input + attention_output + mlp) * BF16
    return every, every - tokens * attention_output * BF16


@pytest.fixture(scope="module")
def predictions() -> tuple[Record, Record]:
    recipe = resolve(WORKLOAD, "smoke", ("bf16-true", "qlora"), Sizes(batch_size=BATCH, seq_len=SEQ))
    return (sim.simulate(recipe, profile="current"),
            sim.simulate(recipe, profile=profile_name("current", ("bitsandbytes=0.41",))))


def test_a_qlora_prediction_as_with_bitsandbytes_041_holds_each_4bit_layers_input(predictions: tuple[Record, Record]
                                                                                   ) -> None:
    today, old = predictions
    every, at_backward = _kept_input_bytes()
    # The optimizer step: today no activation is alive; the old era's inputs live until the loop drops the loss.
    assert (old.phases["optimizer_step"]["allocated_bytes"]
            - today.phases["optimizer_step"]["allocated_bytes"]) == every
    # The step's peak (the backward's start, every saved activation alive): what the old era kept beyond them.
    assert old.peak_allocated_bytes - today.peak_allocated_bytes == at_backward
    assert old.probe == "sim:current+bitsandbytes=0.39.0-0.43.1"
    assert any(note.startswith("releases replayed: torch ") and "bitsandbytes 0.39.0-0.43.1" in note
               for note in old.notes)


def test_an_era_is_replayed_for_its_block_only() -> None:
    from bitsandbytes.autograd._functions import MatMul4Bit

    installed = MatMul4Bit.forward
    with replaying(ERAS):
        assert MatMul4Bit.forward is not installed
    assert MatMul4Bit.forward is installed


@pytest.mark.slow  # two 7B replays: 35 s of CPU and 1 GB; the 3-layer Llama above holds the same in CI
def test_the_7b_qlora_as_with_bitsandbytes_041() -> None:
    """docs/sim.md's 7B QLoRA (LlamaConfig's defaults: 32 layers of 4096, 11,008 intermediate; 8 x 512 tokens). One
    step's graph keeps 6.07 GB of inputs, alive through the optimizer step and through the next step's forward, whose
    end is now the peak: the previous graph's inputs and this one's beyond what its graph saves anyway. Within the
    allocator's unsplit remainders: a reused large block keeps up to 1 MiB it does not split off, per kept tensor."""
    layers, hidden, intermediate, tokens = 32, 4096, 11008, 8 * 512
    every = tokens * ((layers - 1) * hidden + layers * hidden + layers * (hidden + intermediate)) * BF16
    at_backward = every - tokens * layers * hidden * BF16
    slack = ((layers - 1) + 3 * layers) * 2**20  # one 1 MiB remainder per kept tensor, at most
    recipe = resolve("hf:llama", "article", ("bf16-true", "qlora"))
    today = sim.simulate(recipe, profile="current")
    old = sim.simulate(recipe, profile=profile_name("current", ("bitsandbytes=0.41",)))
    step = old.phases["optimizer_step"]["allocated_bytes"] - today.phases["optimizer_step"]["allocated_bytes"]
    assert abs(step - every) <= slack
    assert abs(old.peak_allocated_bytes - today.phases["forward"]["allocated_bytes"] - every - at_backward) <= slack
