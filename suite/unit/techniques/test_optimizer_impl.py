"""memclaims.techniques.optimizer_impl: the implementations' flags, what combines with them, the active check on
constructed Records, and transformers' ``TrainingArguments(optim=...)`` names against the Trainer's own choice."""

from __future__ import annotations

import pytest

from memclaims.core.errors import UsageError
from memclaims.core.record import Record
from memclaims.measure import active
from memclaims.pytest.testing import fake_record
from memclaims.recipes.recipe import resolve
from memclaims.techniques import optimizer_impl
from memclaims.techniques.optimizer_impl import (
    IMPLEMENTATIONS,
    TRAINER_OPTIMS,
    TrainerOptim,
    implementation_of,
    step_shape_problem,
    torch_flags,
    trainer_optim,
)


def test_each_implementation_is_torchs_pair_of_flags_and_back() -> None:
    assert [torch_flags(name) for name in IMPLEMENTATIONS] == [
        {"foreach": False, "fused": False}, {"foreach": True, "fused": False}, {"foreach": False, "fused": True}]
    assert torch_flags(None) == {}
    assert [implementation_of(**torch_flags(name)) for name in IMPLEMENTATIONS] == list(IMPLEMENTATIONS)
    # Flags left to torch (by device), or one of them: what torch's optimizers do with them.
    assert implementation_of(None, None) is None and implementation_of(False, None) == "for-loop"
    assert implementation_of(None, True) == "fused"
    with pytest.raises(UsageError, match="unknown optimizer implementation 'vectorized'; valid implementations: "
                                         "for-loop, foreach, fused"):
        torch_flags("vectorized")


@pytest.mark.parametrize("optimizer", [(), ("adamw",), ("sgd",)])
@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_a_recipe_carries_its_implementation_beside_its_optimizer(name: str, optimizer: tuple[str, ...]) -> None:
    recipe = resolve("vit", "smoke", (name, *optimizer))
    assert recipe.optimizer_impl == name and recipe.optimizer == (optimizer[0] if optimizer else "adam")
    assert recipe.id == f"vit-smoke/{'+'.join((*optimizer, name))}"  # the optimizer first, in registry order
    assert resolve("vit", "smoke", optimizer).optimizer_impl is None  # no choice: torch's default, as before


@pytest.mark.parametrize("other", ["adam8bit", "adamw8bit", "paged-adamw8bit", "adafactor", "deepspeed-zero2"])
def test_where_torchs_flags_do_not_reach_the_step_the_recipe_is_refused_with_the_reason(other: str) -> None:
    with pytest.raises(UsageError, match=f"'fused' does not combine with '{other}': .*(foreach= |its own optimizer)"):
        resolve("distilbert", "smoke", ("fused", other))


@pytest.mark.parametrize("others", [("bf16-true",), ("16-mixed", "grad-accum"), ("optimizer-in-backward",), ("fsdp",),
                                    ("ddp",), ("lora",), ("activation-offload",)])
def test_the_implementations_combine_with_the_rest(others: tuple[str, ...]) -> None:
    for name in IMPLEMENTATIONS:
        assert resolve("distilbert", "smoke", (name, *others)).optimizer_impl == name
    with pytest.raises(UsageError, match="at most one optimizer-impl technique per recipe"):
        resolve("vit", "smoke", ("fused", "foreach"))


# --- the shape of a step's temporaries ------------------------------------------------------------------------

LARGEST, GROUP = 12_288, 78_504  # the smoke ViT's largest parameter and all of its parameters (one group), fp32


@pytest.mark.parametrize(("name", "temporaries", "holds"), [
    ("fused", 0, True), ("fused", LARGEST - 1, True), ("fused", LARGEST, False), ("fused", GROUP, False),
    ("foreach", GROUP, True), ("foreach", 2 * GROUP, True), ("foreach", GROUP - 1, False), ("foreach", 24_704, False),
    ("for-loop", 24_704, True), ("for-loop", LARGEST, True), ("for-loop", LARGEST - 1, False),
    ("for-loop", GROUP, False),
])
def test_a_step_has_its_implementations_shape(name: str, temporaries: int, holds: bool) -> None:
    """Measured on the smoke ViT's Adam (suite/cases/techniques/test_optimizer_impl.py): for-loop 24,704 B (two of
    the largest parameter and the 128 B bias before it), foreach 78,504 B (the parameters), fused 0 B."""
    assert (step_shape_problem(name, temporaries, LARGEST, GROUP) is None) == holds


def test_where_two_of_the_largest_parameter_are_the_group_the_for_loop_cannot_be_told_from_foreach() -> None:
    # DistilBERT smoke: its 262,144 B embedding is 46 % of the parameters; for-loop 524,288 B, foreach 563,976 B.
    assert step_shape_problem("for-loop", 524_288, 262_144, 563_976) is None
    assert step_shape_problem("for-loop", 563_976, 262_144, 563_976) is not None
    assert step_shape_problem("foreach", 524_288, 262_144, 563_976) is not None
    # One parameter more than half of them: two of it are the whole group, and only the lower bound can hold.
    assert step_shape_problem("for-loop", 600_000, 300_000, 563_976) is None
    assert step_shape_problem("for-loop", 563_976, 300_000, 563_976) is None
    assert step_shape_problem("for-loop", 299_999, 300_000, 563_976) is not None


def _record(name: str, **seen: object) -> Record:
    observed = {"foreach": False, "fused": True, "largest_parameter_bytes": LARGEST, "group_parameter_bytes": [GROUP],
                "measured_step": 5, "step_temporary_bytes": 0, **seen}
    return fake_record(f"vit-smoke/{name}", techniques=[name], device="sim", precision="32-true", memory_steps=5,
                       param_count=GROUP // 4, param_bytes=GROUP, grad_bytes=GROUP, optimizer_state_bytes=2 * GROUP,
                       by_technique={name: observed})


def _problems(record: Record) -> list[str]:
    return [line for line in active.problems(resolve("vit", "smoke", tuple(record.techniques)), record)
            if "fused is not active" in line]


def test_the_check_reads_the_flags_and_the_step_as_observed() -> None:
    assert _problems(_record("fused")) == []
    assert _problems(_record("fused", fused=None)) == [
        "vit-smoke/fused: fused is not active: the optimizer's param groups say foreach=False, fused=None in phase "
        "optimizer_step; fused is foreach=False, fused=True"]
    assert _problems(_record("fused", step_temporary_bytes=GROUP)) == [
        "vit-smoke/fused: fused is not active: step_temporary_bytes is 78,504 B in phase optimizer_step (step 5): the "
        "fused kernel keeps no parameter-sized temporary, and this is at least the largest parameter's 12,288 B"]
    one_step = _record("fused", step_temporary_bytes=None, measured_step=1)
    assert _problems(one_step) == [
        "vit-smoke/fused: fused is not active: 1 optimizer step(s) measured in phase optimizer_step: the first creates "
        "the state, so no step showed its temporaries alone (measure 2 or more)"]
    missing = _record("fused")
    missing.by_technique = {}
    assert _problems(missing) == [
        "vit-smoke/fused: fused is not active: the Record has no by_technique.fused: the optimizer's implementation "
        "was not observed"]


def test_where_no_step_shows_its_temporaries_only_the_flags_are_checked() -> None:
    # A rank of the sim's sharded replays measures no step phase; optimizer-in-backward steps inside backward.
    rank = _record("fused", step_temporary_bytes=None, measured_step=0)
    rank.devices = 4
    assert _problems(rank) == []
    in_backward = _record("fused", step_temporary_bytes=GROUP)
    in_backward.by_technique["optimizer-in-backward"] = {"backward_optimizer_steps": 160}
    assert _problems(in_backward) == []


# --- transformers' TrainingArguments(optim=...) ----------------------------------------------------------------


def test_trainer_optim_names_map_to_techniques() -> None:
    assert trainer_optim("adamw_torch_fused") == ("adamw", "fused") == TrainerOptim("adamw", "fused")
    assert trainer_optim("adamw_torch") == ("adamw", None)  # torch's default for the device
    assert trainer_optim("adamw_torch_fused").techniques == ("adamw", "fused")
    assert trainer_optim("sgd").techniques == ("sgd",)
    assert trainer_optim("adamw_bnb_8bit") == trainer_optim("adamw_8bit") == ("adamw8bit", None)
    assert trainer_optim("paged_adamw_8bit") == ("paged-adamw8bit", None)
    for choice in TRAINER_OPTIMS.values():  # each resolves into a recipe as it stands
        assert resolve("distilbert", "smoke", choice.techniques).optimizer_impl == choice.implementation
    with pytest.raises(UsageError, match="TrainingArguments optim 'lion_8bit' builds no optimizer memclaims runs; "
                                         "mapped names: adamw_torch, adamw_torch_fused, sgd, "):
        trainer_optim("lion_8bit")


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.requires(bitsandbytes="cpu")) if name.endswith("8bit")
                                  else name for name in TRAINER_OPTIMS])
def test_trainer_optim_follows_the_trainers_own_choice(name: str, tmp_path) -> None:
    """What transformers' Trainer builds for ``optim=name`` (Trainer.get_optimizer_cls_and_kwargs, no model, no
    training), against the mapping: the class, and torch's fused= for the torch optimizers; bitsandbytes' 8 bits
    and paging for the 8-bit ones."""
    from transformers import Trainer, TrainingArguments
    from transformers.training_args import OptimizerNames

    args = TrainingArguments(output_dir=str(tmp_path), optim=name, use_cpu=True, report_to="none")
    assert trainer_optim(OptimizerNames(name)) == TRAINER_OPTIMS[name]  # the enum member as well as its name
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    choice = TRAINER_OPTIMS[name]
    torch_class = {"adamw": "AdamW", "sgd": "SGD"}.get(choice.optimizer)
    if torch_class is not None:
        assert cls.__module__.startswith("torch.optim") and cls.__name__ == torch_class
        assert implementation_of(kwargs.get("foreach"), kwargs.get("fused")) == choice.implementation
    elif choice.optimizer == "adafactor":
        assert cls.__name__ == "Adafactor" and choice.implementation is None
    else:
        assert cls.__module__.startswith("bitsandbytes") and kwargs["optim_bits"] == 8
        assert kwargs["is_paged"] == choice.optimizer.startswith("paged")


def test_the_module_keeps_to_core_at_import() -> None:
    # The registry loads before the plugin's preflight: the technique imports no torch at import time.
    assert "torch" not in vars(optimizer_impl)
