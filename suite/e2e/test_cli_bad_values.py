"""Bad values through ``--config`` and ``fit --memory``: one line and exit 2, at once, never a
traceback (issue #31); the values that pass run."""

from __future__ import annotations

import io
import json
import string
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from memclaims import cli, run, sim
from memclaims.core.errors import UsageError
from memclaims.recipes.recipe import resolve
from memclaims.report import fit, published_table, source_claims
from memclaims.workloads import hf

LLAMA_7B_PARAMETERS = 6_738_415_616  # LlamaConfig's defaults with the causal-LM head (Llama-2-7B's shape)


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def one_line_of(err: str, *names: str) -> bool:
    """One ``error:`` line that names one of ``names`` (the option, or a --config key)."""
    return err.startswith("error: ") and err.count("\n") == 1 and any(name in err for name in names)


class Replayed(Exception):
    """Raised where a replay would start: the value was judged good before it."""


@pytest.fixture
def no_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise Replayed

    monkeypatch.setattr(run, "run_recipe", refuse)  # memclaims run's engine call
    monkeypatch.setattr(fit, "predict", refuse)  # memclaims fit's first replay
    monkeypatch.setattr(published_table, "build_table", refuse)  # reproduce --all's replays, in worker processes
    monkeypatch.setattr(source_claims, "predict", refuse)  # reproduce --source's (its own import of the door)


@pytest.mark.parametrize(("argv", "message"), [
    (["run", "hf:llama", "--config", "hidden_size=foo", "--device", "sim"],
     "--config hidden_size=foo: LlamaConfig.hidden_size takes an integer, got 'foo'"),
    (["run", "hf:llama", "--config", "hidden_size=-1", "--device", "sim"],
     "--config hidden_size=-1: LlamaConfig ('llama') at scale 'article' refuses it: ValueError: The hidden size (-1) "
     "is not a multiple of the number of attention heads (32)."),
    (["fit", "vit", "--memory", "0GB", "--device", "sim"], "--memory '0GB' is not a positive budget (0 bytes)"),
    (["fit", "vit", "--memory", "-5GB"], "--memory '-5GB' is not a positive budget (-5000000000 bytes)"),
    # qlora's 4-bit base is the cheapest storage (a 7B in bf16 needs 13.5 GB; 4 bits a parameter, 3.37 GB).
    (["fit", "hf:llama", "--memory", "3GB"], f"nothing can fit: the parameters alone need {LLAMA_7B_PARAMETERS // 2:,} B"),
    (["fit", "hf:llama", "--memory", "10GB", "-t", "bf16-true", "-t", "lora"],
     f"nothing can fit: the parameters alone need {2 * LLAMA_7B_PARAMETERS:,} B"),
    # lora's parameters (issue #53): the option, the value and what it takes.
    (["run", "distilbert", "-t", "lora", "--lora-r", "0"], "--lora-r: expected a positive integer, got '0'"),
    (["fit", "hf:llama", "--memory", "24GB", "-t", "lora", "--lora-dropout", "1"],
     "--lora-dropout 1: expected a probability in [0, 1)"),
    (["run", "distilbert", "-t", "bf16-true", "--lora-r", "4"],
     "--lora-r: for -t lora or -t qlora, which the recipe (bf16-true) does not have"),
    # --era (issue #53): one option object for the commands the table gives it, the same check and line for each;
    # refused where the command would run the installed releases for real (a device, fidelity's hf: rows).
    *[([*command, "--era", "bitsandbytes=0.44"], f"memclaims {command[0]}: argument --era: bitsandbytes=0.44: no "
       "difference from the installed bitsandbytes is known in what the sim replays; known eras: bitsandbytes=0.39.0 "
       "to 0.43.1") for command in (["run", "hf:llama", "-t", "qlora", "--device", "sim"],
                                    ["fit", "hf:llama", "--memory", "24GB"], ["reproduce", "--device", "sim"],
                                    ["fidelity", "--article-only"])],
    (["reproduce", "--device", "sim", "--era", "torch=2.1"], "torch=2.1: torch's eras are sim profiles, not --era"),
    *[(argv, "--era replays an older library on the sim only, got --device 'cpu'; use --device sim") for argv in (
        ["run", "vit", "--device", "cpu", "--era", "bitsandbytes=0.41"],
        ["reproduce", "--era", "bitsandbytes=0.41"],  # reproduce's default device, the cpu
        ["reproduce", "--device", "cpu", "--all", "--era", "bitsandbytes=0.41"])],
    (["reproduce", "--device", "cuda", "--source", "course", "--era", "bitsandbytes=0.41"],
     "--era replays an older library on the sim only, got --device 'cuda'; use --device sim"),
    (["reproduce", "--device", "sim", "--all", "--era", "bitsandbytes=0.41"],
     "--era with --all: the published table replays each row on its own profile; leave out --all"),
    *[(["fidelity", *rows, "--era", "bitsandbytes=0.41"], "--era replays an older library on the sim only, and "
       "fidelity's hf: rows are real runs on the cpu of the installed releases; add --article-only")
      for rows in ([], ["--hf-only"])],
    # What the validators pass but the model (its build, its forward) refuses, found at resolution.
    (["run", "hf:llama", "--scale", "smoke", "--config", "hidden_act=foo", "--device", "sim"],
     "--config hidden_act=foo: the llama model at scale 'smoke' refuses it: KeyError"),
    (["run", "hf:llama", "--scale", "smoke", "--config", "num_key_value_heads=3", "--device", "sim"],
     "--config num_key_value_heads=3: the llama model's forward at scale 'smoke' refuses it: RuntimeError"),
])
@pytest.mark.usefixtures("no_replay")
def test_bad_values_are_one_line_and_exit_2_before_any_run(argv: list[str], message: str,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == 2
    assert message in one_line(capsys)


def test_values_take_the_config_fields_types() -> None:
    chosen = hf.spec("hf:llama(hidden_size=64.0,rms_norm_eps=1,num_key_value_heads=none,hidden_act=1)")
    assert chosen.overrides == {"hidden_size": 64, "rms_norm_eps": 1.0, "num_key_value_heads": None, "hidden_act": "1"}
    assert [type(v) for v in chosen.overrides.values()] == [int, float, type(None), str]
    # A key spelled through the config's attribute_map takes the mapped field's type (GPT-2's n_layer).
    assert hf.spec("hf:gpt2(num_hidden_layers=2.0)").overrides == {"num_hidden_layers": 2}
    assert type(hf.spec("hf:gpt2(num_hidden_layers=2.0)").overrides["num_hidden_layers"]) is int
    # The canonical id holds the converted values: one shape, one id.
    assert resolve("hf:llama(rms_norm_eps=1)", "smoke", []).workload.name == "hf:llama(rms_norm_eps=1.0)"


@pytest.mark.parametrize(("config", "message"), [
    ("hidden_size=true", "LlamaConfig.hidden_size takes an integer, got 'true'"),
    ("hidden_size=1.5", "LlamaConfig.hidden_size takes an integer, got '1.5'"),
    ("num_key_value_heads=foo", "LlamaConfig.num_key_value_heads takes an integer or none, got 'foo'"),
    ("tie_word_embeddings=1", "LlamaConfig.tie_word_embeddings takes true or false, got '1'"),
])
def test_values_no_member_of_the_type_takes_are_refused(config: str, message: str) -> None:
    with pytest.raises(UsageError, match=f"^--config {config.split('=')[0]}=.*{message}"):
        hf.spec(f"hf:llama({config})")


def test_the_floor_is_the_parameters_in_the_cheapest_precision_of_the_combinations() -> None:
    recipe = resolve("vit", "smoke", [])
    model, _ = recipe.workload.build_model(recipe.scale)  # the model a run builds, on the CPU
    count = sum(p.numel() for p in model.parameters())
    assert sim.parameter_count(recipe) == count > 0
    assert fit.parameter_floor(recipe, [("fabric",), ("bf16-true", "sgd")]) == (2 * count, count, "bfloat16")
    assert fit.parameter_floor(recipe, [("fabric",), ("16-mixed",)]) == (4 * count, count, "float32")  # fp32 masters
    # A sharded combination holds a share of the parameters (cpu-offload: none): no floor.
    assert fit.parameter_floor(recipe, [("fabric",), ("fsdp",)]) is None
    # qlora stores its base in 4 bits: every parameter at 4 bits is below what any qlora recipe holds.
    assert fit.parameter_floor(recipe, [("bf16-true",), ("bf16-true", "qlora")]) == (count // 2, count, "4 bits (qlora)")


@pytest.mark.usefixtures("no_replay")
def test_a_budget_below_the_floor_is_answered_without_a_replay_and_one_at_it_is_replayed() -> None:
    recipe = resolve("vit", "smoke", [])
    floor, _, dtype = fit.parameter_floor(recipe, [("fabric",), ("bf16-true",)]) or (0, 0, "")
    assert dtype == "bfloat16"
    with pytest.raises(UsageError, match=f"nothing can fit: the parameters alone need {floor:,} B"):
        fit.fit("vit", floor - 1, scale="smoke", only=("bf16-true",))
    with pytest.raises(Replayed):
        fit.fit("vit", floor, scale="smoke", only=("bf16-true",))


# --- properties: whatever a user types, one line and exit 2, or a run --------------------------

LLAMA_KEYS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "num_hidden_layers", "intermediate_size",
              "vocab_size", "max_position_embeddings", "rms_norm_eps", "initializer_range", "attention_dropout",
              "hidden_act", "tie_word_embeddings", "head_dim", "pad_token_id", "bos_token_id", "mlp_bias")
# Words a typo or a guess produces; "()/[],=+ " are refused by the id's syntax, tested elsewhere.
WORDS = st.one_of(
    st.integers(-3, 260).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr).filter(lambda text: "+" not in text),
    st.sampled_from(["true", "false", "none", "foo", "silu", "relu", "1e2", "-0.5", "0x10", "1_0"]),
    st.text(string.ascii_letters + string.digits + ".-_", min_size=1, max_size=5),
)


@pytest.mark.sim
@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(LLAMA_KEYS), WORDS, min_size=1, max_size=2))
def test_any_config_value_is_one_line_and_exit_2_or_a_run(overrides: dict[str, str]) -> None:
    config = ",".join(f"{key}={value}" for key, value in overrides.items())
    argv = ["run", "hf:llama", "--scale", "smoke", "--device", "sim", "--steps", "1", "--no-eval", "--json",
            "--config", config]
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = cli.main(argv)  # any exception but the CLI's own answers fails the property
    event(f"exit {status}")  # --hypothesis-show-statistics: how many examples ran, how many were refused
    if status == 0:
        assert json.loads(out.getvalue())["recipe"].startswith("hf:llama("), argv
    else:
        assert status == 2 and one_line_of(err.getvalue(), *overrides), (argv, err.getvalue())


MEMORY_UNITS = ("B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB", "gb", "G", "bytes", "")
SIZES = st.one_of(
    st.builds(lambda sign, number, space, unit: f"{sign}{number}{space}{unit}",
              st.sampled_from(["", "-", "+", "--"]),
              # Small numbers too: with B or KB they fall below the smallest model's parameters.
              st.one_of(st.integers(0, 10**15).map(str), st.integers(0, 200).map(str),
                        st.floats(0, 1e6).map(lambda x: f"{x:.4f}"),
                        st.sampled_from(["0", "0.0", ".5", "1e3", "nan", "inf"])),
              st.sampled_from(["", " "]), st.sampled_from(MEMORY_UNITS)),
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8),
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(SIZES)
@example("-5GB")
@example("0GB")
@example("1KB")  # positive, below the smoke ViT's 39,252 B of bfloat16 parameters
@example("80GiB")
def test_any_memory_text_is_one_line_and_exit_2_or_a_fit(text: str) -> None:
    floor, _, _ = fit.parameter_floor(resolve("vit", "smoke", []), [("fabric",), ("bf16-true",)]) or (0, 0, "")
    argv = ["fit", "vit", "--scale", "smoke", "--device", "sim", "-t", "bf16-true", "--json", "--memory", text]
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, redirect_stdout(io.StringIO()), redirect_stderr(err):
        patch.setattr(fit, "predict", _replayed)  # a good budget has been judged once a replay starts
        try:
            status = cli.main(argv)
        except Replayed:
            event("fit reached its replays")
            assert fit.parse_size(text) >= floor, text
            return
    event("exit 2")
    assert status == 2 and one_line_of(err.getvalue(), "--memory"), (text, err.getvalue())


def _replayed(*_args: Any, **_kwargs: Any) -> Any:
    raise Replayed
