"""``hf:<model_type>`` workloads: any transformers architecture, built offline from its config.

``hf:llama`` is ``AutoConfig.for_model("llama")`` (no hub access: the config class's defaults),
randomly initialised; overrides are part of the name, so that a recipe id says which shape ran:
``hf:llama(hidden_size=4096,num_hidden_layers=32)``. The CLI's ``--config k=v,...`` builds that
name. Values take the config field's type, and what the config, the model or a fake forward
refuses is one ``UsageError`` line at resolution (``hf_values``). Two keys are not config attributes:

- ``head``: ``causal-lm`` (next-token logits; the default when the architecture has such a head)
  or ``classification`` (2 labels, as the article's IMDb scripts);
- ``attn_implementation``: ``sdpa`` (today's transformers default; the sim profile picks the GPU
  kernel) or ``eager`` (the 2023 era's explicit softmax(QK^T)V).

Scales: ``smoke`` shrinks every size attribute the config has (2 layers, 64 wide, 1,024 tokens of
vocabulary) unless overridden, sequences of 64, batch 8; ``article`` is the config as given
(defaults + overrides), sequences of 512 (capped at the position embeddings), batch 8. Data:
synthetic token sequences (``data.SyntheticReviews``' words, fixed length), or IMDb from a local
data directory tokenized with the tokenizer saved in its ``tokenizer/`` folder.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.utils.data import Dataset

from memclaims.core.errors import DataError, UsageError
from memclaims.core.names import DATA_DIR_ENV, HF_PREFIX
from memclaims.workloads import data, hf_values
from memclaims.workloads.hf_values import format_value, parse_value
from memclaims.workloads.types import LoraTargets, Scale, Workload

if TYPE_CHECKING:  # transformers where a model or its tokenizer is made
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

HEADS = ("causal-lm", "classification")
ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
PSEUDO_KEYS = ("head", "attn_implementation")
# Smoke scale: these standard attribute names (transformers maps them onto each config's own,
# e.g. GPT-2's n_layer) are shrunk where the config has them and the user did not set them.
SMOKE_SIZES = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, num_key_value_heads=2,
                   intermediate_size=128, vocab_size=1024, head_dim=32)
SPECIAL_TOKENS = ("bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id")
SEQ = {"smoke": 64, "article": 512}
BATCH = {"smoke": 8, "article": 8}
LEARNING_RATE = {"smoke": 1e-3, "article": 5e-5}
NUM_LABELS = 2
DRY_LAYERS = 2  # the depth of the fake forward that checks --config values at resolution
# ``AutoConfig.for_model`` raises this many-line text for an unknown type; our message is one line.
_FORBIDDEN_IN_VALUES = set("()/[],=+ ")
# transformers' tensor-parallel plan of a config (module pattern -> style), which the tensor-parallel technique reads:
# a workload name carries it as one value, ``pattern:style;pattern:style`` (``plan_text``), for a family whose config
# has none (opt, bert, ...) or to split other layers than its own plan does.
TP_PLAN = "base_model_tp_plan"


def plan_text(plan: Mapping[str, str]) -> str:
    """A tensor-parallel plan as one ``--config`` value: ``decoder.layers.*.fc1:colwise;decoder.layers.*.fc2:rowwise``."""
    return ";".join(f"{pattern}:{style}" for pattern, style in plan.items())


def plan_of(text: str) -> dict[str, str]:
    """The inverse of ``plan_text``; UsageError naming the part that is not ``pattern:style``."""
    plan: dict[str, str] = {}
    for part in filter(None, text.split(";")):
        pattern, sep, style = part.rpartition(":")
        if not sep or not pattern or not style:
            raise UsageError(f"--config {TP_PLAN}={text}: {part!r} is not MODULE_PATTERN:STYLE (e.g. "
                             "layers.*.mlp.up_proj:colwise;layers.*.mlp.down_proj:rowwise)")
        plan[pattern] = style
    if not plan:
        raise UsageError(f"--config {TP_PLAN}={text}: name at least one MODULE_PATTERN:STYLE")
    return plan


# --- names -------------------------------------------------------------------------------------


def parse_config(text: str) -> dict[str, object]:
    """``key=value,key=value`` -> {key: value}; one clear error for a malformed item."""
    overrides: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise UsageError(f"malformed --config item {item!r}; expected KEY=VALUE[,KEY=VALUE...]")
        if _FORBIDDEN_IN_VALUES & set(value):
            raise UsageError(f"--config value {value!r} of {key!r} may not hold any of "
                             f"{''.join(sorted(_FORBIDDEN_IN_VALUES))!r} (it becomes part of the recipe id)")
        overrides[key] = parse_value(value)
    return overrides


def name_of(model_type: str, overrides: dict[str, object]) -> str:
    """The canonical workload name: keys sorted, so one shape has one id."""
    if not overrides:
        return f"{HF_PREFIX}{model_type}"
    items = ",".join(f"{k}={format_value(overrides[k])}" for k in sorted(overrides))
    return f"{HF_PREFIX}{model_type}({items})"


def parse_name(name: str) -> tuple[str, dict[str, object]]:
    body = name.removeprefix(HF_PREFIX)
    model_type, paren, rest = body.partition("(")
    if paren and not rest.endswith(")"):
        raise UsageError(f"malformed workload {name!r}; expected hf:MODEL_TYPE or hf:MODEL_TYPE(key=value,...)")
    return model_type, parse_config(rest[:-1]) if paren else {}


def with_config(workload_name: str, config_text: str | None, note: Callable[[str], None] | None = None) -> str:
    """``memclaims run hf:llama --config k=v`` or ``--config path/config.json``: the workload name with the
    overrides in it; ``note`` hears which keys of a config.json a workload name cannot carry."""
    if not config_text:
        return workload_name
    if not workload_name.startswith(HF_PREFIX):
        raise UsageError(f"--config applies to hf:<model_type> workloads only, not {workload_name!r}")
    model_type, overrides = parse_name(workload_name)
    if config_text.endswith(".json") or Path(config_text).is_file():
        read, left_out = config_file(Path(config_text), model_type)
        if left_out and note is not None:
            note(f"--config {config_text}: left out {', '.join(left_out)} (a workload name carries a config's "
                 "numbers, flags and words; these are neither, or say what the file is rather than the model's shape)")
        return name_of(model_type, {**overrides, **read})
    return name_of(model_type, {**overrides, **parse_config(config_text)})


# What a config.json says about itself or its checkpoint, not about the model's shape: memclaims' precision
# techniques choose the dtype, its head option the head class.
_ABOUT_THE_FILE = ("architectures", "dtype", "torch_dtype", "transformers_version", "_name_or_path", "model_type")


def config_file(path: Path, model_type: str) -> tuple[dict[str, object], list[str]]:
    """A config.json read as transformers reads it (``AutoConfig.from_pretrained`` on the file): the keys whose
    value differs from the model type's defaults, and those left out (not a scalar, or about the file)."""
    from transformers import AutoConfig

    if not path.is_file():
        raise UsageError(f"--config {str(path)!r}: no such file; give a config.json or KEY=VALUE[,KEY=VALUE...]")
    try:
        loaded = AutoConfig.from_pretrained(str(path))
    except (OSError, ValueError) as error:  # JSONDecodeError is a ValueError; an unknown model_type too
        raise UsageError(f"--config {str(path)!r} is not a config transformers reads: {str(error).splitlines()[0]}") \
            from None
    if loaded.model_type != model_type:
        raise UsageError(f"--config {str(path)!r} describes a {loaded.model_type!r} model, the workload is "
                         f"{HF_PREFIX}{model_type}; use {HF_PREFIX}{loaded.model_type}")
    defaults = AutoConfig.for_model(model_type).to_dict()
    overrides: dict[str, object] = {}
    left_out: list[str] = []
    # to_dict leaves the tensor-parallel plan out (transformers keeps it off the saved file); the file's own is read
    plan, default_plan = getattr(loaded, TP_PLAN, None), getattr(_default_config(model_type), TP_PLAN, None)
    given = {TP_PLAN: plan} if plan and plan != default_plan else {}
    for key, value in sorted({**loaded.to_dict(), **given}.items()):
        if value == defaults.get(key):
            continue
        if key == TP_PLAN and isinstance(value, dict) and not _FORBIDDEN_IN_VALUES & set(plan_text(value)):
            value = plan_text(value)  # a plan the name can carry (module patterns have no brackets or commas)
        scalar = isinstance(value, (bool, int, float, str)) and not _FORBIDDEN_IN_VALUES & set(str(value))
        if key in _ABOUT_THE_FILE or not scalar:
            left_out.append(key)
        else:
            overrides[key] = value
    return overrides, left_out


# --- configs -----------------------------------------------------------------------------------


def default_head(model_type: str) -> str:
    """causal-lm for decoder models; classification for encoders (BERT-likes also have a causal-LM
    class, but their masked-LM one says what they are) and for types without a causal-LM head."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    causal, _ = _mappings()
    return "causal-lm" if model_type in causal and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES \
        else "classification"


def _mappings() -> tuple[dict[str, str], dict[str, str]]:
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    )

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), dict(MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES)


def model_types() -> list[str]:
    """Model types with a causal-LM or sequence-classification head in the installed transformers."""
    causal, classification = _mappings()
    return sorted(set(causal) | set(classification))


@dataclass(frozen=True)
class HfSpec:
    model_type: str
    overrides: dict[str, Any]  # config attributes only
    head: str
    attn_implementation: str

    def config(self, scale: Scale) -> PretrainedConfig:
        from transformers import AutoConfig

        default = _default_config(self.model_type)
        values: dict[str, Any] = {}
        if scale.name == "smoke":
            values.update({k: v for k, v in SMOKE_SIZES.items()
                           if getattr(default, k, None) is not None and k not in self.overrides})
            vocab = int(self.overrides.get("vocab_size", values.get("vocab_size", 0)) or 0)
            for key in SPECIAL_TOKENS:  # special ids must stay inside the shrunk vocabulary
                token = getattr(default, key, None)
                if vocab and isinstance(token, int) and token >= vocab and key not in self.overrides:
                    values[key] = vocab - 1
        values.update(self.overrides)
        if isinstance(values.get(TP_PLAN), str):
            values[TP_PLAN] = plan_of(values[TP_PLAN])
        if self.head == "classification":
            values.setdefault("num_labels", NUM_LABELS)
            if getattr(default, "pad_token_id", None) is None:
                values.setdefault("pad_token_id", 0)  # sequence classification needs one for batches > 1
        return hf_values.refused(f"{type(default).__name__} ({self.model_type!r}) at scale {scale.name!r}",
                                 self.overrides, lambda: AutoConfig.for_model(self.model_type, **values))


@cache
def _default_config(model_type: str) -> PretrainedConfig:
    from transformers import AutoConfig

    if model_type not in model_types():
        from memclaims.core.suggest import did_you_mean

        raise UsageError(f"unknown hf model type {model_type!r}" + did_you_mean(
            model_type, model_types(), f"transformers {_version()} has {len(model_types())} model types with a "
            "causal-LM or classification head", HF_PREFIX))
    return AutoConfig.for_model(model_type)


def _version() -> str:
    import transformers

    return transformers.__version__


def spec(name: str) -> HfSpec:
    model_type, overrides = parse_name(name)
    default = _default_config(model_type)
    causal, classification = _mappings()
    head = overrides.pop("head", default_head(model_type))
    attention = overrides.pop("attn_implementation", "sdpa")
    if head not in HEADS:
        raise UsageError(f"unknown head {head!r}; valid heads: {', '.join(HEADS)}")
    if head == "causal-lm" and model_type not in causal or head == "classification" and model_type not in classification:
        raise UsageError(f"hf model type {model_type!r} has no {head} head in transformers {_version()}; valid heads "
                         f"for it: {', '.join(h for h, m in zip(HEADS, (causal, classification)) if model_type in m)}")
    if attention not in ATTENTION_IMPLEMENTATIONS:
        raise UsageError(f"unknown attn_implementation {attention!r}; valid: {', '.join(ATTENTION_IMPLEMENTATIONS)}")
    unknown = [k for k in overrides if not hasattr(default, k)]
    if unknown:
        valid = sorted(k for k in {*default.to_dict(), *getattr(default, "attribute_map", {}), *PSEUDO_KEYS}
                       if not k.startswith("_"))
        raise UsageError(f"config key {unknown[0]!r} is not an attribute of {type(default).__name__} "
                         f"({model_type!r}); valid keys: {', '.join(valid)}")
    plan = overrides.pop(TP_PLAN, None)  # one text in the name; a dict in the config (HfSpec.config)
    overrides = hf_values.converted(overrides, type(default), getattr(default, "attribute_map", {}))
    if plan is not None:
        overrides[TP_PLAN] = plan_text(plan_of(str(plan)))
    return HfSpec(model_type, overrides, head, attention)


def positions(config: object) -> int | None:
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) else None


def sequence_length(spec_: HfSpec, scale: Scale) -> int:
    if scale.seq_len is not None:
        return scale.seq_len
    limit = positions(spec_.config(scale))
    return min(SEQ[scale.name], limit) if limit else SEQ[scale.name]


def check_scale(spec_: HfSpec, name: str, scale: Scale) -> None:
    limit = positions(spec_.config(scale))
    length = sequence_length(spec_, scale)
    if length < 4 or (limit is not None and length > limit):
        raise UsageError(f"sequence length {length} does not fit {name} at scale {scale.name!r}: valid lengths are "
                         f"4 to {limit if limit else 'any'} (its max_position_embeddings)")
    if spec_.overrides:
        _dry_forward(name, scale)


# --- models ------------------------------------------------------------------------------------


def architecture(spec_: HfSpec, scale: Scale) -> nn.Module:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    config, attention = spec_.config(scale), spec_.attn_implementation
    auto: Any = AutoModelForCausalLM if spec_.head == "causal-lm" else AutoModelForSequenceClassification
    # A config its validators pass can still name what the model has not (hidden_act=foo).
    model = hf_values.refused(f"the {spec_.model_type} model at scale {scale.name!r}", spec_.overrides,
                              lambda: auto.from_config(config, attn_implementation=attention))
    if hasattr(model.config, "use_cache"):
        model.config.use_cache = False  # training: no key/value cache (Trainer does the same)
    return cast(nn.Module, model)  # from_config is unannotated: a PreTrainedModel, an nn.Module


# Config attributes with which a causal LM's logits are more than its vocabulary projection (gemma2's
# tanh soft-capping, cohere's logit_scale, granite's logits_scaling): the fused loss would drop them.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


def fused_loss_head(spec_: HfSpec, config: object) -> Callable[[nn.Module], nn.Module] | None:
    """The vocabulary projection of a causal LM whose logits are that projection alone (for the
    ``fused-linear-ce`` technique); None for classification heads and transformed logits."""
    if spec_.head != "causal-lm" or any(getattr(config, key, None) not in (None, 1, 1.0) for key in LOGIT_TRANSFORMS):
        return None
    return _output_embeddings


def _output_embeddings(model: nn.Module) -> nn.Module:
    head: nn.Module = model.get_output_embeddings()  # type: ignore[operator]  # a PreTrainedModel's
    return head


def causal_logits(model: nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """(B*L, vocab) next-token logits: a view of the model's output, no copy (see ``CausalBatch``)."""
    logits: torch.Tensor = model(**inputs).logits
    return logits.reshape(-1, logits.shape[-1])


def block_class(model_type: str) -> type[nn.Module]:
    """The decoder/encoder layer class FSDP and activation checkpointing wrap: ``_no_split_modules``."""
    import transformers

    causal, classification = _mappings()
    class_name = causal.get(model_type) or classification[model_type]
    if isinstance(class_name, (tuple, list)):
        class_name = class_name[0]
    model_class = getattr(transformers, class_name)
    names = list(getattr(model_class, "_no_split_modules", None) or [])
    module = __import__(model_class.__module__, fromlist=["_"])
    for name in names:
        if hasattr(module, name):
            return cast(type[nn.Module], getattr(module, name))
    # No _no_split_modules (BERT): the class repeated in the model's longest stack of layers.
    smoke = architecture(spec(f"{HF_PREFIX}{model_type}"), Scale("smoke", "", 1, 0.0, 0.0, 1, 1))
    stacks = [list(m) for m in smoke.modules() if isinstance(m, nn.ModuleList) and len(m)
              and len({type(x) for x in m}) == 1]
    if stacks:
        return type(max(stacks, key=len)[0])
    raise UsageError(f"hf model type {model_type!r} names no block class to wrap (_no_split_modules: "
                     f"{names or 'none'}); fsdp and activation-checkpointing need one")


@cache
def _dry_forward(name: str, scale: Scale) -> None:
    """A config its validators pass can still fail the forward (num_key_value_heads that do not
    divide the heads, attention_dropout=2, vocab_size=0): one training-mode forward of a one-row batch
    on fake tensors (shapes only, no memory; transformers skips its data-dependent mask checks on
    them, as in the sim) says so when the recipe is resolved, not mid-run. A forward fake tensors
    cannot run at all fails for the default config too: then it says nothing about the values and
    the run decides."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    chosen = spec(name)

    def forward(which: HfSpec) -> None:
        # Two layers stand for all (each layer is built from the same values): a 7B model's dry run
        # costs what a smoke model's does.
        depth = getattr(which.config(scale), "num_hidden_layers", None)
        if isinstance(depth, int) and depth > DRY_LAYERS:
            which = dataclasses.replace(which, overrides={**which.overrides, "num_hidden_layers": DRY_LAYERS})
        with FakeTensorMode():
            model = architecture(which, scale).train()
            inputs, _ = fake_inputs(which, scale, 1)
            causal_logits(model, inputs) if which.head == "causal-lm" else model(**inputs)

    try:
        forward(chosen)
        return
    except UsageError:
        raise
    except Exception as error:
        failure = error
    try:
        forward(HfSpec(chosen.model_type, {}, chosen.head, chosen.attn_implementation))
    except Exception:
        return  # fake tensors cannot run this model's forward at all: the run decides
    what = f"the {chosen.model_type} model's forward at scale {scale.name!r}"
    raise hf_values.refusal(what, chosen.overrides, failure) from failure


# --- data --------------------------------------------------------------------------------------


class SyntheticSequences(Dataset[data.Example]):
    """Fixed-length token sequences from ``data.SyntheticReviews``' words, tiled to the length, with
    the review's sentiment label: deterministic, offline, learnable by both heads."""

    def __init__(self, size: int, seed: int, length: int, vocab_size: int) -> None:

        self.reviews = data.SyntheticReviews(size, seed, 8, max(8, min(30, length - 2)))
        self.length, self.vocab_size = length, vocab_size

    def __len__(self) -> int:
        return len(self.reviews)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        ids, label = self.reviews[index]
        tiled = ids.repeat(-(-self.length // len(ids)))[: self.length]
        return tiled % self.vocab_size, label


class CausalBatch:
    """Collate rows into ({input_ids}, next-token targets of shape (B*L,)).

    The target of the last position wraps to the first token (``roll``), so the logits are used
    whole, as a view: transformers' own loss pads the labels rather than slicing the logits, to
    the same end (no copy of the (B, L, vocab) logits).
    """

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, rows: list[tuple[torch.Tensor, int]]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        longest = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((len(rows), longest), self.pad_id, dtype=torch.long)
        for i, (ids, _) in enumerate(rows):
            input_ids[i, : len(ids)] = ids
        return {"input_ids": input_ids}, torch.roll(input_ids, -1, dims=1).reshape(-1)


class ClassBatch:
    """Collate equal-length rows into ({input_ids}, labels): no padding, so no attention mask."""

    def __call__(self, rows: list[tuple[torch.Tensor, int]]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return {"input_ids": torch.stack([ids for ids, _ in rows])}, torch.tensor([label for _, label in rows])


def load_data(spec_: HfSpec, scale: Scale, data_dir: str | os.PathLike[str] | None) -> data.DataBundle:
    root = data.resolve_data_dir(data_dir)
    length = sequence_length(spec_, scale)
    vocab = int(spec_.config(scale).vocab_size)
    if root is None:
        train_size, test_size = data.SYNTHETIC_SIZES[scale.name]
        collate: Callable[[list[data.Example]], data.Batch] = \
            CausalBatch(0) if spec_.head == "causal-lm" else ClassBatch()
        return data.TextBundle(name="synthetic-tokens", train=SyntheticSequences(train_size, data.SPLIT_SEED, length, vocab),
                               test=SyntheticSequences(test_size, data.SPLIT_SEED + 1, length, vocab), collate_fn=collate)
    tokenizer = _local_tokenizer(root)
    train, _val, test = data.imdb_rows(root)
    pad = int(tokenizer.pad_token_id or 0)
    collate = CausalBatch(pad) if spec_.head == "causal-lm" else data.PadToLongest(pad)
    return data.TextBundle(name="imdb", train=data.TokenizedTexts(train, tokenizer, length, vocab),
                           test=data.TokenizedTexts(test, tokenizer, length, vocab), collate_fn=collate)


def _local_tokenizer(root: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    folder = root / "tokenizer"
    if not folder.is_dir():
        raise DataError(f"IMDb in {root} needs a tokenizer for an hf: workload: save one to {folder} "
                        f"(tokenizer.save_pretrained), or unset --data-dir / {DATA_DIR_ENV} for synthetic tokens")
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def fake_inputs(spec_: HfSpec, scale: Scale, batch: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A synthetic micro-batch of the data's shape, for the sim."""
    length = sequence_length(spec_, scale)
    ids = torch.zeros(batch, length, dtype=torch.long)
    targets = torch.zeros(batch * length if spec_.head == "causal-lm" else batch, dtype=torch.long)
    return {"input_ids": ids}, targets


# --- the workload ------------------------------------------------------------------------------


def workload(name: str) -> Workload:
    """The ``hf:`` workload of that name, under its canonical name (keys sorted, defaults dropped);
    one object per canonical name, so a recipe and ``parse_id(recipe.id)`` are equal."""
    chosen = spec(name)
    return _workload(name_of(chosen.model_type, {**chosen.overrides, **_pseudo(chosen)}))


@cache
def _workload(canonical: str) -> Workload:
    chosen = spec(canonical)

    def scale(scale_name: str) -> Scale:
        return Scale(scale_name, f"{canonical}: {'2 layers x 64 wide, ' if scale_name == 'smoke' else 'as configured, '}"
                     f"sequences of {SEQ[scale_name]}, batch {BATCH[scale_name]}", batch_size=BATCH[scale_name],
                     learning_rate=LEARNING_RATE[scale_name], sgd_learning_rate=LEARNING_RATE[scale_name] * 10,
                     memory_steps=3, accuracy_epochs=1)

    article_config = chosen.config(scale("article"))
    vocab = int(article_config.vocab_size)
    smoke_vocab = int(chosen.config(scale("smoke")).vocab_size)
    causal = chosen.head == "causal-lm"
    return Workload(
        name=canonical,
        summary=f"transformers {chosen.model_type} ({chosen.head} head, {chosen.attn_implementation} attention), "
                "random init from AutoConfig.for_model, synthetic tokens",
        source="hf: AutoConfig.for_model (offline)",
        # Causal LM: classes are the vocabulary (next-token accuracy); the smoke vocabulary is smaller,
        # and accuracy only needs an upper bound on the class ids it sees.
        num_classes=max(vocab, smoke_vocab) if causal else NUM_LABELS,
        scales={"smoke": scale("smoke"), "article": scale("article")},
        build_model=lambda s: (architecture(chosen, s), "random"),
        load_data=lambda s, data_dir: load_data(chosen, s, data_dir),
        block_class=lambda: block_class(chosen.model_type),
        size_knob="seq",
        input_size=lambda s: sequence_length(chosen, s),
        check_scale=lambda s: check_scale(chosen, canonical, s),
        architecture=lambda s, _classes: architecture(chosen, s),
        fake_inputs=lambda s, batch: fake_inputs(chosen, s, batch),
        logits_fn=causal_logits if causal else None,
        # peft's default target modules for the model type (memclaims.techniques.impl.peft_adapters refuses a type it has
        # none for); a classification head ("classifier" or "score" by architecture) trained in full.
        lora_targets=LoraTargets(None, () if causal else ("classifier", "score")),
        fused_loss_head=fused_loss_head(chosen, article_config),
    )


def _pseudo(chosen: HfSpec) -> dict[str, object]:
    """Non-default head / attention, kept in the canonical name."""
    extra: dict[str, object] = {}
    if chosen.head != default_head(chosen.model_type):
        extra["head"] = chosen.head
    if chosen.attn_implementation != "sdpa":
        extra["attn_implementation"] = chosen.attn_implementation
    return extra
