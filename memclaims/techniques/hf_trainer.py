"""hf-trainer: the recipe trained by transformers' ``Trainer``, as the course's 8-bit Adam lesson trains DistilBERT.

The recipe's core fields are the Trainer's own switches (``trainer_arguments``): ``per_device_train_batch_size``,
``gradient_accumulation_steps``, ``bf16`` / ``fp16`` (accelerate's autocast), the checkpointing flag
(``activation_checkpointing``, ``gradient_checkpointing`` before transformers 5.2x), and the optimizer
(``trainer_optimizer``): the Trainer's own default where the recipe names none (TrainingArguments' ``optim``
default), torch's through ``optim``, bitsandbytes' 8-bit ones built as the course builds them and passed as
``optimizers=(optimizer, None)``; what the Trainer builds of each is its own ``get_optimizer_cls_and_kwargs``'
answer (``trainer_built``). The driver
(``memclaims.measure.stacks.hf_trainer_driver``) drives the probes from the Trainer's callbacks and its own calls; the
sim replays the Trainer's order (``loop_order``: gradients zeroed right after the step, the gradient norm clipped
before it, a step's micro-batches fetched before its first forward) and the optimizer the Trainer would build.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memclaims.core.errors import UsageError
from memclaims.techniques.base import ZERO_AFTER_STEP, LoopOrder, Observed, Say, Stack, Technique, observations
from memclaims.techniques.shared_conflicts import STACK_REFUSES_FABRIC_HOOKS, STACK_REFUSES_STRATEGIES, STRATEGY

if TYPE_CHECKING:
    import torch
    from torch import nn

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.recipes.run_options import RunOptions
    from memclaims.techniques.engine_protocols import SimLoop, SimSession

NAME = "hf-trainer"
# The course's weight decay on the decayed group (memclaims.measure.optimizers.WEIGHT_DECAY, repeated here because a
# technique module imports no engine; suite/unit/techniques/test_hf_trainer.py holds them equal).
WEIGHT_DECAY = 0.01
# TrainingArguments' max_grad_norm default (transformers 4.x and 5.x): the Trainer clips every step unless told not to.
MAX_GRAD_NORM = 1.0
# What the Trainer needs of a model to compute its loss itself (compute_loss: ``model(**inputs, labels=...)``).
TRANSFORMERS_MODULE = "transformers."

_PRECISIONS = frozenset({"16-mixed", "bf16-mixed"})
_OPTIMIZERS = frozenset({"sgd", "adamw", "adam8bit", "adamw8bit", "paged-adamw8bit", "adafactor"})
EXPRESSES = _PRECISIONS | _OPTIMIZERS | {"small-batch", "grad-accum", "activation-checkpointing",
                                         "expandable-segments"}
_TRUE_HALF = ("TrainingArguments has no true half precision: bf16 and fp16 are accelerate's autocast (mixed), the "
              "parameters stay in the model's dtype")
CONFLICTS: tuple[tuple[str, str], ...] = (
    ("16-true", _TRUE_HALF), ("bf16-true", _TRUE_HALF),
    (STRATEGY, STACK_REFUSES_STRATEGIES),
    *STACK_REFUSES_FABRIC_HOOKS.items(),
)


@dataclass(frozen=True)
class TrainerOptimizer:
    """The recipe's optimizer as the Trainer gets it."""

    optim: str | None  # TrainingArguments.optim the recipe sets; None: TrainingArguments' own default, or ``given``
    given: str | None  # the class built as the course builds it, passed as optimizers=(optimizer, None); None: the Trainer's
    weight_decay: float  # TrainingArguments.weight_decay (the Trainer's decay group: not LayerNorm, not biases)
    lr_scheduler_type: str  # TrainingArguments.lr_scheduler_type: the recipe's schedule


@dataclass(frozen=True)
class TrainerBuilt:
    """What the Trainer's ``create_optimizer`` builds: the class and its keyword arguments."""

    optimizer_class: str  # ``type(optimizer).__name__``, as the real run observes it
    kwargs: dict[str, object]  # the optimizer's arguments (``fused``, ``foreach``, ``betas``, ...), without the groups
    lineage: tuple[str, ...] = ()  # the class's bases by name (AdamW's: AdamW, Adam, Optimizer, object)

    @property
    def fused(self) -> bool:
        return self.kwargs.get("fused") is True


def trainer_optimizer(recipe: Recipe) -> TrainerOptimizer:
    """The recipe's optimizer in the Trainer's terms.

    The recipe's ``adam`` (no optimizer technique) is the Trainer's own choice: no ``optim`` given, TrainingArguments'
    default (``adamw_torch_fused`` in the locked transformers, where torch >= 2.8) with its default weight decay 0.0;
    ``adamw`` is torch's fused AdamW by name with the course's weight decay; ``sgd`` torch's SGD (no momentum: no state,
    no temporaries) with a cosine schedule as script 06. What each builds is the Trainer's own answer
    (``trainer_built``), never restated here. bitsandbytes' 8-bit optimizers are not the Trainer's ``adamw_bnb_8bit``:
    that one keeps every ``nn.Embedding``'s states in 32 bits (``register_module_override``), so the recipe's are built
    as the course builds its Adam8bit (memclaims.measure.optimizers: the course's two weight-decay groups) and passed in.
    """
    schedule = "cosine" if recipe.optimizer == "sgd" or recipe.scale.anneal else "constant"
    if recipe.optimizer == "adam":
        return TrainerOptimizer(None, None, 0.0, schedule)
    if recipe.optimizer == "adamw":
        return TrainerOptimizer("adamw_torch_fused", None, WEIGHT_DECAY, schedule)
    if recipe.optimizer in ("sgd", "adafactor"):
        return TrainerOptimizer(recipe.optimizer, None, 0.0, schedule)
    eight_bit = {"adam8bit": "Adam8bit", "adamw8bit": "AdamW8bit", "paged_adamw8bit": "PagedAdamW8bit"}
    return TrainerOptimizer(None, eight_bit[recipe.optimizer], WEIGHT_DECAY, schedule)


def trainer_built(recipe: Recipe) -> TrainerBuilt:
    """The optimizer the Trainer builds for the recipe: the class given (the course's), or the answer of
    ``Trainer.get_optimizer_cls_and_kwargs`` (the function ``create_optimizer`` calls) for the recipe's
    ``TrainingArguments``, so that a transformers release that changes its default or what an ``optim`` builds moves
    the real run's check and the sim's replay together. Imports transformers (only the Trainer's runs and replays ask)."""
    chosen = trainer_optimizer(recipe)
    if chosen.given is not None:
        return TrainerBuilt(chosen.given, {})
    from transformers import Trainer, TrainingArguments

    arguments: dict[str, Any] = {"optim": chosen.optim} if chosen.optim is not None else {}
    args = TrainingArguments(report_to="none", learning_rate=recipe.learning_rate, weight_decay=chosen.weight_decay,
                             use_cpu=True, **arguments)  # the device does not enter the choice; nothing is written
    cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
    return TrainerBuilt(cls.__name__, dict(kwargs), tuple(base.__name__ for base in cls.__mro__))


def trainer_arguments(recipe: Recipe) -> dict[str, Any]:
    """The recipe as TrainingArguments' switches (the engine adds where, how long and the quiet settings); the
    checkpointing flag under its generic key ``checkpointing`` (the engine names it as the installed version does)."""
    chosen = trainer_optimizer(recipe)
    arguments: dict[str, Any] = dict(
        per_device_train_batch_size=recipe.micro_batch_size, per_device_eval_batch_size=recipe.micro_batch_size,
        gradient_accumulation_steps=recipe.accumulation_steps,
        bf16=recipe.precision == "bf16-mixed", fp16=recipe.precision == "16-mixed",
        checkpointing="activation-checkpointing" in recipe.techniques,
        learning_rate=recipe.learning_rate, weight_decay=chosen.weight_decay, lr_scheduler_type=chosen.lr_scheduler_type,
        max_grad_norm=MAX_GRAD_NORM,
    )
    if chosen.optim is not None:
        arguments["optim"] = chosen.optim
    return arguments


def checkpointing(model: object) -> bool:
    """Whether a transformers model checkpoints its layers (``is_activation_checkpointing``; before transformers 5.2x,
    ``is_gradient_checkpointing``, a deprecated alias since)."""
    name = "is_activation_checkpointing" if hasattr(model, "is_activation_checkpointing") else "is_gradient_checkpointing"
    return bool(getattr(model, name, False))


def workload_refusal(recipe: Recipe) -> str | None:
    """Why the Trainer's own loss cannot train the workload: it asks the model for it (``labels`` in, ``loss`` out), as
    a transformers sequence classifier computes it; memclaims' loss of a causal LM or a torchvision model is its own."""
    work = recipe.workload
    if work.logits_fn is not None or not work.block_class().__module__.startswith(TRANSFORMERS_MODULE):
        return (f"{NAME!r} does not run on workload {work.name!r}: the Trainer's loss is the model's own from its "
                "labels (a transformers sequence classifier: distilbert, distilbert-cased, bigbird, "
                "hf:<type>(head=classification)); this workload's loss is memclaims' own")
    return None


class HfTrainer(Stack):
    name = NAME
    driver = "memclaims.measure.stacks.hf_trainer_driver:HfTrainerDriver"
    expresses = EXPRESSES
    # The Trainer checkpoints the blocks itself (its checkpointing switch calls the model's own enable()).
    checkpoints_blocks = True

    def loop_order(self, recipe: Recipe) -> LoopOrder:
        return LoopOrder(zero_grad=ZERO_AFTER_STEP, clips_gradients=True, max_grad_norm=MAX_GRAD_NORM,
                         prefetches=True, keeps_output=False)

    def refusal(self, recipe: Recipe, options: RunOptions) -> str | None:
        return self.unexpressed(recipe) or workload_refusal(recipe)

    def sim_refusal(self, recipe: Recipe) -> str | None:
        return self.unexpressed(recipe) or workload_refusal(recipe)

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        super().check(recipe, record, without, say)
        chosen, built = trainer_optimizer(recipe), trainer_built(recipe)
        asked = f"optim={chosen.optim}" if chosen.optim else "optimizers=(...)" if chosen.given else "its default optim"
        if record.device != "sim" and record.observed(NAME, "optimizer_class") != built.optimizer_class:
            say(f"the Trainer stepped {record.observed(NAME, 'optimizer_class')} after phase optimizer_step, expected "
                f"{built.optimizer_class} ({asked})")
        if built.fused and record.observed(NAME, "fused") is not True:  # the sim replays it fused too
            say(f"the Trainer's {built.optimizer_class} ({asked}) stepped with fused={record.observed(NAME, 'fused')} after phase "
                "optimizer_step")
        requested = trainer_arguments(recipe)["checkpointing"]
        if record.observed(NAME, "checkpointing") != requested:
            say(f"the model's activation checkpointing is {record.observed(NAME, 'checkpointing')} after phase load, the Trainer "
                f"was asked for {requested}")

    def sim_before_train(self, loop: SimLoop, optimizer: torch.optim.Optimizer) -> None:
        """The replay steps what the Trainer would build (``trainer_built``): its arguments set on the replay's groups
        (the default optim's ``fused=True``: no parameter-sized temporaries in the step), not a choice of memclaims'.
        The learning rate stays the schedule's; a class of another family than the replay's is refused by name."""
        built = trainer_built(loop.recipe)
        if not built.kwargs:  # passed in: the course's own optimizer, replayed as it is
            return
        replayed = [base.__name__ for base in type(optimizer).__mro__]
        if type(optimizer).__name__ not in built.lineage and built.optimizer_class not in replayed:
            raise UsageError(f"{loop.recipe.id}: the Trainer builds {built.optimizer_class}, which the sim does not "
                             f"replay (it steps {type(optimizer).__name__}); run it on the cpu tier")
        for group in optimizer.param_groups:
            group.update({key: value for key, value in built.kwargs.items() if key != "lr" and key in group})
            if built.fused:  # fused and foreach exclude each other; the replay's groups default to foreach on CUDA
                group["foreach"] = False

    def sim_observe(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                    session: SimSession) -> Observed:
        # What the replay stepped (memclaims' optimizer on fake tensors, bitsandbytes' by its state layout): whether
        # the step ran fused, and the checkpointing; the Trainer's class is the real run's to observe.
        groups = getattr(optimizer, "param_groups", [{}])
        return observations(NAME, fused=bool(groups[0].get("fused")) if groups else None,
                            checkpointing=checkpointing(model))


ENTRY = Technique(NAME, "transformers' Trainer runs the loop (the course's code path): TrainingArguments' switches, "
                  "its own default optimizer, zero_grad after the step", "course: 8-bit Adam lesson (Trainer)",
                  group="loop", stack=NAME, conflicts=CONFLICTS, in_cover=False,
                  in_default=False, hooks=HfTrainer())
