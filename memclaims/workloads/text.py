"""Text workloads of the article's LLM bonus and the course's 8-bit Adam lesson, with their data.

Models are built from configs written here as data (the hub models' values), so nothing is
downloaded: pretrained weights are used only when they already sit in the local Hugging Face
cache. Data is IMDb from a local copy the user names, else a deterministic synthetic sentiment
set with a fixed-vocabulary tokenizer.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from memclaims.core.errors import DataError, UsageError
from memclaims.core.names import DATA_DIR_ENV
from memclaims.workloads.types import LoraTargets, Scale, Workload

if TYPE_CHECKING:  # torch where a model or its data is built: naming a workload (list, claims) imports none
    import torch
    from torch import nn
    from transformers import PreTrainedTokenizerBase

    from memclaims.workloads import data

# The article's era: no SDPA / flash attention in these models' code paths.
ATTENTION = "eager"

# --- configs, as data ------------------------------------------------------------------------

# distilbert-base-uncased / -cased config.json; the two differ only in vocab_size.
DISTILBERT = dict(
    activation="gelu", attention_dropout=0.1, dim=768, dropout=0.1, hidden_dim=3072,
    initializer_range=0.02, max_position_embeddings=512, n_heads=12, n_layers=6, pad_token_id=0,
    qa_dropout=0.1, seq_classif_dropout=0.2, sinusoidal_pos_embds=False, tie_weights_=True,
)
DISTILBERT_VOCAB = {"distilbert-base-uncased": 30522, "distilbert-base-cased": 28996}
# Smoke scale also shrinks the vocabulary: with the full one, the embedding is 95 % of a 64-wide
# model and its optimizer steps dominate the run. The synthetic tokenizer needs < 100 ids; IMDb
# token ids are folded into it at smoke scale (see data.TokenizedTexts).
SMOKE_VOCAB = 1024
DISTILBERT_SMOKE = dict(n_layers=2, n_heads=2, dim=64, hidden_dim=128, max_position_embeddings=64,
                        vocab_size=SMOKE_VOCAB)

# google/bigbird-roberta-base config.json.
BIGBIRD = dict(
    attention_probs_dropout_prob=0.1, attention_type="block_sparse", block_size=64, bos_token_id=1,
    eos_token_id=2, hidden_act="gelu_new", hidden_dropout_prob=0.1, hidden_size=768,
    initializer_range=0.02, intermediate_size=3072, layer_norm_eps=1e-12,
    max_position_embeddings=4096, num_attention_heads=12, num_hidden_layers=12,
    num_random_blocks=3, pad_token_id=0, sep_token_id=66, type_vocab_size=2, vocab_size=50358,
    rescale_embeddings=False, use_bias=True,
)
# Block-sparse attention needs seq > (5 + 2 * random blocks) * block_size = 28 tokens here,
# which the smoke data always exceeds, so smoke scale runs the same attention kind as article.
BIGBIRD_SMOKE = dict(num_hidden_layers=2, num_attention_heads=2, hidden_size=64, intermediate_size=128,
                     max_position_embeddings=64, block_size=4, num_random_blocks=1, vocab_size=SMOKE_VOCAB)

SMOKE_SEQ = 64


@dataclass(frozen=True)
class TextModel:
    hub_name: str
    config_class: str  # transformers class name
    values: Mapping[str, object]
    smoke: Mapping[str, object]
    max_length: int  # truncation at article scale


def config(model: TextModel, scale: Scale) -> Any:
    import transformers

    values = dict(model.values, num_labels=2)
    if scale.name == "smoke":
        values.update(model.smoke)
    return getattr(transformers, model.config_class)(**values)


def _cached_weights(hub_name: str) -> bool:
    """True when the hub model's weights are already in the local cache (checked, never fetched)."""
    from huggingface_hub import try_to_load_from_cache

    for filename in ("model.safetensors", "pytorch_model.bin"):
        if isinstance(try_to_load_from_cache(hub_name, filename), str):
            return True
    return False


def build_text_model(model: TextModel, scale: Scale) -> tuple[nn.Module, str]:
    from transformers import AutoModelForSequenceClassification

    cfg = config(model, scale)
    if scale.name == "article" and _cached_weights(model.hub_name):
        # local_files_only: a cache hit or an error, never a download.
        loaded = AutoModelForSequenceClassification.from_pretrained(
            model.hub_name, config=cfg, local_files_only=True, attn_implementation=ATTENTION)
        return loaded, "pretrained"
    return AutoModelForSequenceClassification.from_config(cfg, attn_implementation=ATTENTION), "random"


def synthetic_words(scale: Scale, max_length: int) -> tuple[int, int]:
    """Review length range in words. At article scale reviews reach the truncation length, as IMDb's
    do (batches of 12 then pad to about 512 / 4096 tokens), so activation memory is the article's."""
    if scale.name == "smoke":
        return min(8, max_length - 2), max_length - 2
    return max_length // 4, max_length - 2


def sequence_length(model: TextModel, scale: Scale) -> int:
    """Tokens per sequence at most: the ``--seq-len`` knob, else the scale's truncation length."""
    if scale.seq_len is not None:
        return scale.seq_len
    return SMOKE_SEQ if scale.name == "smoke" else model.max_length


def check_scale(model: TextModel, scale: Scale) -> None:
    """A sequence longer than the position embeddings cannot run (one line, the valid range)."""
    positions = int(config(model, scale).max_position_embeddings)
    length = sequence_length(model, scale)
    if not 4 <= length <= positions:
        raise UsageError(f"sequence length {length} does not fit {model.hub_name} at scale {scale.name!r}: "
                         f"valid lengths are 4 to {positions} (its position embeddings)")


def architecture(model: TextModel, scale: Scale, num_classes: int | None = 2) -> nn.Module:
    """Randomly initialised, in the era's attention implementation (the sim builds this)."""
    from transformers import AutoModelForSequenceClassification

    return cast("nn.Module", AutoModelForSequenceClassification.from_config(config(model, scale),
                                                                          attn_implementation=ATTENTION))


def fake_inputs(model: TextModel, scale: Scale, batch: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A micro-batch padded to the longest sequence the scale allows: the sim's worst case (IMDb
    batches of 12 nearly always hold a review past 512 tokens; BigBird's 4,096 is an upper bound)."""
    length = sequence_length(model, scale)
    import torch

    ids = torch.zeros(batch, length, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones(batch, length, dtype=torch.long)}, \
        torch.zeros(batch, dtype=torch.long)


def text_data(model: TextModel, scale: Scale, data_dir: str | os.PathLike[str] | None) -> data.TextBundle:
    from memclaims.workloads import data

    root = data.kind_dir(data.resolve_data_dir(data_dir), "text")
    max_length = sequence_length(model, scale)
    if root is None:
        train_size, test_size = data.SYNTHETIC_SIZES[scale.name]
        low, high = synthetic_words(scale, max_length)
        return data.TextBundle(
            name="synthetic-sentiment",
            train=data.SyntheticReviews(train_size, data.SPLIT_SEED, low, high),
            test=data.SyntheticReviews(test_size, data.SPLIT_SEED + 1, low, high),
            collate_fn=data.PadToLongest(data.WordTokenizer().pad_id),
        )
    train, _val, test = data.imdb_rows(root)
    tokenizer = _cached_tokenizer(model.hub_name, root)
    vocab = SMOKE_VOCAB if scale.name == "smoke" else None
    return data.TextBundle(
        name="imdb",
        train=data.TokenizedTexts(train, tokenizer, max_length, vocab),
        test=data.TokenizedTexts(test, tokenizer, max_length, vocab),
        collate_fn=data.PadToLongest(int(tokenizer.pad_token_id or 0)),
    )


def _cached_tokenizer(hub_name: str, root: Path) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(hub_name, local_files_only=True)
    except OSError:
        raise DataError(
            f"IMDb in {root} needs the {hub_name} tokenizer in the local Hugging Face cache, and it is not "
            "there; nothing is downloaded: fetch it once (e.g. `huggingface-cli download "
            f"{hub_name}`) or unset --data-dir / {DATA_DIR_ENV} to use the synthetic set"
        ) from None


# --- workloads ----------------------------------------------------------------------------------


def _distilbert_block() -> type[nn.Module]:
    from transformers.models.distilbert.modeling_distilbert import TransformerBlock

    return TransformerBlock


def _bigbird_block() -> type[nn.Module]:
    from transformers.models.big_bird.modeling_big_bird import BigBirdLayer

    return BigBirdLayer


def _distilbert_model(hub_name: str) -> TextModel:
    return TextModel(hub_name, "DistilBertConfig", dict(DISTILBERT, vocab_size=DISTILBERT_VOCAB[hub_name]),
                     DISTILBERT_SMOKE, max_length=512)


BIGBIRD_MODEL = TextModel("google/bigbird-roberta-base", "BigBirdConfig", BIGBIRD, BIGBIRD_SMOKE, max_length=4096)
# Workload name -> the model it builds.
TEXT_MODELS: dict[str, TextModel] = {
    "distilbert": _distilbert_model("distilbert-base-uncased"),
    "distilbert-cased": _distilbert_model("distilbert-base-cased"),
    "bigbird": BIGBIRD_MODEL,
}
# The lora technique: the attention's query and value projections (the LoRA paper's choice and peft's
# default for BERT-like types), the 2-label head trained in full (DistilBERT's pre_classifier too: peft
# matches "classifier" as a suffix).
LORA_TARGETS = {
    "distilbert": LoraTargets(("q_lin", "v_lin"), ("classifier",)),
    "distilbert-cased": LoraTargets(("q_lin", "v_lin"), ("classifier",)),
    "bigbird": LoraTargets(("query", "value"), ("classifier",)),
}
ARTICLE_BATCH = 12  # bonus scripts: 12 per GPU (DistilBERT before/after: 3 x 4 with grad-accum; BigBird after: 1 x 12)


@lru_cache(maxsize=1)
def text_workloads() -> dict[str, Workload]:
    """The text workloads, keyed by name; built on first call."""
    def scales(summary: str, max_length: int, accumulation_steps: int) -> dict[str, Scale]:
        return {
            "smoke": Scale("smoke", f"{summary} shrunk to 2 layers x 64 wide, seq <= {SMOKE_SEQ}, batch 32",
                           batch_size=32, learning_rate=1e-3, sgd_learning_rate=0.05, memory_steps=3,
                           accuracy_epochs=3),
            "article": Scale("article", f"{summary}, batch {ARTICLE_BATCH}, up to {max_length} tokens, lr 5e-5",
                             batch_size=ARTICLE_BATCH, learning_rate=5e-5, sgd_learning_rate=0.01,
                             memory_steps=3, accuracy_epochs=1, accumulation_steps=accumulation_steps),
        }

    def make(name: str, model: TextModel, source: str, block: Callable[[], type[nn.Module]]) -> Workload:
        return Workload(
            name=name,
            summary=f"{model.hub_name}, 2-label head, IMDb (offline: synthetic sentiment)",
            source=source,
            num_classes=2,
            scales=scales(model.hub_name, model.max_length, 12 if name == "bigbird" else 4),
            build_model=lambda scale: build_text_model(model, scale),
            load_data=lambda scale, data_dir: text_data(model, scale, data_dir),
            block_class=block,
            size_knob="seq",
            input_size=lambda scale: sequence_length(model, scale),
            check_scale=lambda scale: check_scale(model, scale),
            architecture=lambda scale, classes: architecture(model, scale, classes),
            fake_inputs=lambda scale, batch: fake_inputs(model, scale, batch),
            # bonus_bigbird-after: FSDPStrategy(cpu_offload=True), no auto-wrap policy.
            fsdp_auto_wrap=name != "bigbird",
            # BigBirdForSequenceClassification builds BigBirdModel with its pooler and never calls it.
            unused_parameters=name == "bigbird",
            lora_targets=LORA_TARGETS[name],
        )

    sources = {"distilbert": "bonus_distilbert-before / -after",
               "distilbert-cased": "course: mixed precision training with 8-bit Adam",
               "bigbird": "bonus_bigbird-before / -after"}
    blocks = {"distilbert": _distilbert_block, "distilbert-cased": _distilbert_block, "bigbird": _bigbird_block}
    built = [make(name, model, sources[name], blocks[name]) for name, model in TEXT_MODELS.items()]
    return {w.name: w for w in built}
