"""Size knobs in recipes and ids, hf:<model_type> workloads from configs, and their bad input."""

from __future__ import annotations

import pytest
import torch

from memclaims import cli
from memclaims.core.errors import UsageError
from memclaims.measure.runner import run
from memclaims.recipes.recipe import Sizes, parse_id, resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.workloads import hf

TINY_LLAMA = "hidden_size=32,intermediate_size=64,num_attention_heads=2,num_key_value_heads=2,vocab_size=128"


# --- size knobs ----------------------------------------------------------------------------------


def test_ids_without_knobs_are_unchanged_and_with_knobs_round_trip() -> None:
    assert resolve("vit", "smoke", ["sgd", "bf16-true"]).id == "vit-smoke/bf16-true+sgd"
    sized = resolve("vit", "smoke", ["bf16-true", "grad-accum"], Sizes(batch_size=8, image_size=32, accumulation_steps=2))
    assert sized.id == "vit-smoke[batch=8,image=32,accum=2]/bf16-true+grad-accum"
    assert parse_id(sized.id) == sized
    assert (sized.batch_size, sized.accumulation_steps, sized.micro_batch_size) == (8, 2, 4)
    text = resolve("distilbert", "smoke", [], Sizes(seq_len=32))
    assert text.id == "distilbert-smoke[seq=32]/fabric" and parse_id(text.id) == text
    # Two sizes of one recipe never share a baseline key.
    assert resolve("vit", "smoke", [], Sizes(batch_size=8)).id != resolve("vit", "smoke", []).id


@pytest.mark.parametrize(("workload", "techniques", "sizes", "message"), [
    ("vit", [], Sizes(image_size=30), "image size 30 is not a multiple of the patch size 4"),
    ("vit", [], Sizes(image_size=200), None),  # 200 = 16 x 12.5 at article scale: checked below
    ("distilbert", [], Sizes(seq_len=65), "sequence length 65 does not fit distilbert-base-uncased"),
    ("distilbert", [], Sizes(image_size=32), "takes no --image-size"),
    ("vit", [], Sizes(seq_len=32), "takes no --seq-len"),
    ("vit", ["bf16-true"], Sizes(accumulation_steps=2), "needs the grad-accum technique"),
])
def test_sizes_a_model_cannot_take_are_one_clear_error(workload: str, techniques: list[str], sizes: Sizes,
                                                       message: str | None) -> None:
    if message is None:
        with pytest.raises(UsageError, match="not a multiple of the patch size 16 of vit_l_16"):
            resolve(workload, "article", techniques, sizes)
        return
    with pytest.raises(UsageError, match=message):
        resolve(workload, "smoke", techniques, sizes)


def test_malformed_sized_ids_are_refused() -> None:
    with pytest.raises(UsageError, match="malformed size 'batch=x'"):
        parse_id("vit-smoke[batch=x]/fabric")


@pytest.mark.parametrize("argv", [
    ["run", "vit", "--image-size", "30"],
    ["run", "hf:nope"],
    ["run", "hf:gpt2", "--config", "n_layr=2"],
    ["run", "vit", "--config", "hidden_size=8"],
    ["run", "vit", "--seq-len", "8", "--image-size", "16"],
    ["fit", "vit", "--memory", "80G"],
    ["fit", "vit", "--memory", "80GB", "--device", "cuda"],
])
def test_cli_bad_sizes_and_configs_exit_2_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_the_image_size_knob_reaches_the_model_and_the_data() -> None:
    recipe = resolve("vit", "smoke", [], Sizes(batch_size=8, image_size=24))
    record = run(recipe, RunOptions(device="cpu", memory_steps=1, evaluate=False))
    default = run(resolve("vit", "smoke", []), RunOptions(device="cpu", memory_steps=1, evaluate=False))
    assert record.recipe == recipe.id and record.batch_size == 8
    # 24 px in patches of 4: 36 patches + class token, against 16 + 1 at 16 px, 32 wide.
    assert record.param_count - default.param_count == (37 - 17) * 32


# --- hf: workloads ----------------------------------------------------------------------------


def test_config_overrides_are_canonical_and_reach_the_config() -> None:
    name = hf.with_config("hf:llama", f"num_hidden_layers=3,{TINY_LLAMA}")
    assert name == hf.with_config("hf:llama", f"{TINY_LLAMA},num_hidden_layers=3")  # keys sorted
    recipe = resolve(name, "article", ["bf16-true"])
    assert parse_id(recipe.id) == recipe
    config = hf.spec(name).config(recipe.scale)
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (3, 32, 128)
    smoke = hf.spec("hf:gpt2").config(resolve("hf:gpt2", "smoke", []).scale)
    assert (smoke.n_layer, smoke.n_embd, smoke.vocab_size) == (2, 64, 1024)  # GPT-2's own attribute names


def test_a_config_json_is_read_as_transformers_reads_it(tmp_path, capsys) -> None:
    """--config path/config.json (the transformers habit): the keys that differ from the type's defaults become the
    workload's shape; what a name cannot carry is said once, never silently dropped; a bad file is one line."""
    from transformers import LlamaConfig

    path = tmp_path / "config.json"
    LlamaConfig(hidden_size=64, intermediate_size=172, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=4, vocab_size=128, architectures=["LlamaForCausalLM"],
                rope_scaling={"rope_type": "linear", "factor": 2.0}).to_json_file(str(path))
    notes: list[str] = []
    name = hf.with_config("hf:llama", str(path), notes.append)
    assert name == ("hf:llama(head_dim=16,hidden_size=64,intermediate_size=172,num_attention_heads=4,"
                    "num_hidden_layers=3,num_key_value_heads=4,vocab_size=128)")
    config = hf.spec(name).config(resolve(name, "article", []).scale)
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (3, 64, 128)
    assert len(notes) == 1 and "left out" in notes[0] and "architectures" in notes[0] and "rope" in notes[0]
    assert cli.main(["run", "hf:llama", "--config", str(path), "--device", "sim", "--scale", "smoke", "--no-eval",
                     "--json"]) == 0
    assert f"memclaims: --config {path}: left out" in capsys.readouterr().err
    with pytest.raises(UsageError, match="describes a 'llama' model, the workload is hf:gpt2; use hf:llama"):
        hf.with_config("hf:gpt2", str(path))
    with pytest.raises(UsageError, match="no such file; give a config.json or KEY=VALUE"):
        hf.with_config("hf:llama", str(tmp_path / "missing.json"))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(UsageError, match="is not a config transformers reads"):
        hf.with_config("hf:llama", str(tmp_path / "broken.json"))


@pytest.mark.parametrize(("name", "message"), [
    ("hf:not-a-model", "unknown hf model type 'not-a-model'; transformers .* has .* model types with a causal-LM or classification head$"),
    ("hf:gpt2(n_layr=2)", "config key 'n_layr' is not an attribute of GPT2Config .* valid keys: .*n_layer"),
    ("hf:gpt2(head=seq2seq)", "unknown head 'seq2seq'; valid heads: causal-lm, classification"),
])
def test_bad_hf_names_are_one_clear_error(name: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        resolve(name, "smoke", [])


def test_sequence_longer_than_the_positions_is_refused() -> None:
    with pytest.raises(UsageError, match="sequence length 2000 does not fit hf:gpt2 .* 4 to 1024"):
        resolve("hf:gpt2", "article", [], Sizes(seq_len=2000))


@pytest.mark.parametrize(("name", "head", "logits"), [("hf:gpt2", "causal-lm", (8 * 16, 1024)),
                                                      ("hf:bert", "classification", (8, 2))])
def test_heads_and_synthetic_batches(name: str, head: str, logits: tuple[int, int]) -> None:
    recipe = resolve(name, "smoke", [], Sizes(seq_len=16))
    assert hf.spec(name).head == head
    model, weights = recipe.workload.build_model(recipe.scale)
    bundle = recipe.workload.load_data(recipe.scale, None)
    inputs, targets = bundle.collate_fn([bundle.train[i] for i in range(8)])
    assert weights == "random" and inputs["input_ids"].shape == (8, 16)
    out = recipe.workload.logits(model, inputs)
    assert tuple(out.shape) == logits and targets.shape[0] == logits[0]
    assert int(targets.max()) < recipe.workload.num_classes
    if head == "causal-lm":  # next-token targets: row i's target at t is its token at t + 1
        assert torch.equal(targets.view(8, 16)[:, :-1], inputs["input_ids"][:, 1:])


def test_block_class_comes_from_the_model() -> None:
    assert resolve("hf:gpt2", "smoke", []).workload.block_class().__name__ == "GPT2Block"
    assert resolve("hf:bert", "smoke", []).workload.block_class().__name__ == "BertLayer"  # no _no_split_modules


@pytest.mark.requires(bitsandbytes="cpu")
def test_hf_gpt2_trains_on_the_cpu_in_bf16_with_adam8bit() -> None:
    recipe = resolve("hf:gpt2", "smoke", ["bf16-true", "adam8bit"])
    record = run(recipe, RunOptions(device="cpu", memory_steps=2, evaluate=False))
    assert record.recipe == "hf:gpt2-smoke/bf16-true+adam8bit" and record.workload == "hf:gpt2"
    assert record.param_bytes == 2 * record.param_count  # bf16
    # 8-bit states: under 2 x 4 bytes per parameter (fp32 Adam), over 2 x 1 byte.
    assert 2 * record.param_count <= record.optimizer_state_bytes < 8 * record.param_count
    assert record.memory_losses and all(loss is not None for loss in record.memory_losses)


# --- a tensor-parallel plan through the config (issue #53) ----------------------------------------

OPT_PLAN = {"decoder.layers.*.fc1": "colwise", "decoder.layers.*.fc2": "rowwise"}


def test_a_config_json_plan_reaches_the_tensor_parallel_layout(tmp_path) -> None:
    """opt's config has no base_model_tp_plan: one given in a config.json, as transformers reads it, goes into the
    workload name and from there into the model's config, where the tensor-parallel technique finds it."""
    import json

    from memclaims.techniques.impl.tensor_parallel_plan import layout
    from memclaims.techniques.tensor_parallel import meta_model

    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "opt", "num_hidden_layers": 2, "base_model_tp_plan": OPT_PLAN}))
    name = hf.with_config("hf:opt", str(path))
    assert name == "hf:opt(base_model_tp_plan=decoder.layers.*.fc1:colwise;decoder.layers.*.fc2:rowwise," \
                   "num_hidden_layers=2)"
    recipe = resolve(name, "smoke", ["tensor-parallel"])
    assert parse_id(recipe.id).id == recipe.id
    found = layout(meta_model(recipe), recipe.workload.block_class())
    assert found.linears == (("model.decoder.layers.0.fc1", "colwise"), ("model.decoder.layers.1.fc1", "colwise"),
                             ("model.decoder.layers.0.fc2", "rowwise"), ("model.decoder.layers.1.fc2", "rowwise"))


def test_a_malformed_plan_value_is_one_line() -> None:
    with pytest.raises(UsageError, match="--config base_model_tp_plan=fc1: 'fc1' is not MODULE_PATTERN:STYLE"):
        hf.spec("hf:opt(base_model_tp_plan=fc1)")
