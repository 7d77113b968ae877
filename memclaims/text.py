"""Text workloads of the article's LLM bonus and the course's 8-bit Adam lesson, with their data.

Models are built from configs written here as data (the hub models' values), so nothing is
downloaded: pretrained weights are used only when they already sit in the local Hugging Face
cache. Data is IMDb from a local copy the user names, else a deterministic synthetic sentiment
set with a fixed-vocabulary tokenizer.
"""

from __future__ import annotations

import csv
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.utils.data import Dataset

from memclaims import data
from memclaims.errors import DataError, UsageError
from memclaims.workload_types import Scale, Workload

# The article's era: no SDPA / flash attention in these models' code paths.
ATTENTION = "eager"
IMDB_SPLIT = (35_000, 5_000, 10_000)  # train / val / test, as rasbt's local_dataset_utilities
IMDB_SEED = 123

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
# token ids are folded into it at smoke scale (see TokenizedTexts).
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
    values: dict[str, Any]
    smoke: dict[str, Any]
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


# --- synthetic sentiment data ------------------------------------------------------------------

POSITIVE = ("good", "great", "excellent", "wonderful", "superb", "brilliant", "enjoyable", "moving",
            "charming", "delightful", "masterpiece", "fun", "beautiful", "clever", "gripping", "loved")
NEGATIVE = ("bad", "awful", "terrible", "boring", "dull", "poor", "waste", "weak", "clumsy", "tedious",
            "mess", "stupid", "ugly", "predictable", "annoying", "hated")
NEUTRAL = ("the", "a", "film", "movie", "plot", "actor", "scene", "story", "director", "was", "is",
           "and", "of", "it", "this", "with", "ending", "cast", "music", "camera", "script", "time",
           "character", "role", "watch", "saw", "very", "quite", "rather", "some", "about", "her",
           "his", "they", "first", "then", "into", "long", "short", "year")
SPECIALS = ("[PAD]", "[CLS]", "[SEP]", "[UNK]")


class WordTokenizer:
    """A whitespace tokenizer over a fixed vocabulary: ids are stable and need no download."""

    def __init__(self) -> None:
        self.vocabulary: tuple[str, ...] = SPECIALS + POSITIVE + NEGATIVE + NEUTRAL
        self.ids = {word: i for i, word in enumerate(self.vocabulary)}
        self.pad_id, self.cls_id, self.sep_id, self.unk_id = 0, 1, 2, 3

    def encode(self, text: str, max_length: int) -> list[int]:
        words = [self.ids.get(w, self.unk_id) for w in text.lower().split()]
        return [self.cls_id, *words[: max_length - 2], self.sep_id]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(self.vocabulary[i] for i in ids)


class SyntheticReviews(Dataset[data.Example]):
    """Review ``i`` is generated from (seed, i) alone: deterministic, lazy, any size.

    A review mixes neutral words with sentiment words; the label's polarity always has strictly
    more sentiment words than the other, so the label is learnable (and unambiguous).
    """

    def __init__(self, size: int, seed: int, min_words: int, max_words: int) -> None:
        self.size, self.seed, self.min_words, self.max_words = size, seed, min_words, max_words
        self.tokenizer = WordTokenizer()

    def __len__(self) -> int:
        return self.size

    def text(self, index: int) -> tuple[str, int]:
        # Python's Random per row: ~50x cheaper than torch calls with a Generator, same determinism.
        rng = random.Random(self.seed * 1_000_003 + index)
        label = rng.randrange(2)
        length = rng.randint(self.min_words, self.max_words)
        strong = rng.randint(2, 4)  # words of the label's polarity
        weak = rng.randrange(strong - 1)  # fewer of the other polarity
        own, other = (POSITIVE, NEGATIVE) if label == 1 else (NEGATIVE, POSITIVE)
        words = rng.choices(NEUTRAL, k=max(0, length - strong - weak)) + rng.choices(own, k=strong) \
            + rng.choices(other, k=weak)
        rng.shuffle(words)
        return " ".join(words), label

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        text, label = self.text(index)
        return torch.tensor(self.tokenizer.encode(text, self.max_words + 2)), label


# --- IMDb from a local copy ---------------------------------------------------------------------


class TokenizedTexts(Dataset[data.Example]):
    """(text, label) rows tokenized on access with the model's own (cached) tokenizer."""

    def __init__(self, rows: list[tuple[str, int]], tokenizer: Any, max_length: int,
                 vocab_size: int | None = None) -> None:
        self.rows, self.tokenizer, self.max_length = rows, tokenizer, max_length
        self.vocab_size = vocab_size  # smoke scale: fold ids into the shrunk vocabulary

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        text, label = self.rows[index]
        ids = torch.tensor(self.tokenizer(text, truncation=True, max_length=self.max_length)["input_ids"])
        return (ids % self.vocab_size if self.vocab_size else ids), label


def _read_csv(path: Path) -> list[tuple[str, int]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return [(row["text"], int(row["label"])) for row in csv.DictReader(handle)]


def _read_acl(root: Path) -> list[tuple[str, int]]:
    """aclImdb/{train,test}/{pos,neg}/*.txt, in a fixed order before the seeded shuffle."""
    rows: list[tuple[str, int]] = []
    for split in ("test", "train"):
        for label, folder in ((1, "pos"), (0, "neg")):
            for path in sorted((root / split / folder).glob("*.txt")):
                rows.append((path.read_text(encoding="utf-8"), label))
    return rows


def _imdb_csvs(root: Path) -> list[Path]:
    return [root / f"{name}.csv" for name in ("train", "val", "test")]


def _acl_dir(root: Path) -> Path:
    return root / "aclImdb" if (root / "aclImdb").is_dir() else root


def _holds_acl(root: Path) -> bool:
    acl = _acl_dir(root)
    return all((acl / s / f).is_dir() for s in ("train", "test") for f in ("pos", "neg"))


def holds_imdb(root: Path) -> bool:
    """Whether ``root`` holds IMDb in a layout :func:`imdb_rows` reads: the article's CSVs or aclImdb/."""
    return all(p.is_file() for p in _imdb_csvs(root)) or _holds_acl(root)


def imdb_rows(root: Path) -> tuple[list[tuple[str, int]], list[tuple[str, int]], list[tuple[str, int]]]:
    """(train, val, test) rows: the article's CSVs if present, else the raw aclImdb folder split 35k/5k/10k."""
    csvs = _imdb_csvs(root)
    if all(p.is_file() for p in csvs):
        try:
            train, val, test = (_read_csv(p) for p in csvs)
        except (KeyError, ValueError) as error:
            raise DataError(f"IMDb CSVs in {root} lack the text,label columns ({error})") from None
        return train, val, test
    if not _holds_acl(root):
        raise DataError(
            f"data directory {root} does not hold IMDb (expected train.csv/val.csv/test.csv with text,label "
            f"columns, or the aclImdb/ folder with train|test/pos|neg); point --data-dir / "
            f"{data.DATA_DIR_ENV} at it, or unset it to use the synthetic sentiment set"
        )
    rows = _read_acl(_acl_dir(root))
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(IMDB_SEED)).tolist()
    shuffled = [rows[i] for i in order]
    a, b = IMDB_SPLIT[0], IMDB_SPLIT[0] + IMDB_SPLIT[1]
    return shuffled[:a], shuffled[a:b], shuffled[b:b + IMDB_SPLIT[2]]


# --- batches ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextBundle(data.DataBundle):
    # Pads each batch to its longest row (the runner passes it to the DataLoader).
    collate_fn: Callable[[list[Any]], Any] | None = field(default=None)


class PadToLongest:
    """Collate (ids, label) rows into ({input_ids, attention_mask}, labels), padded to the longest row."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, rows: list[tuple[torch.Tensor, int]]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        longest = max(len(ids) for ids, _ in rows)
        input_ids = torch.full((len(rows), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), longest), dtype=torch.long)
        for i, (ids, _) in enumerate(rows):
            input_ids[i, : len(ids)] = ids
            mask[i, : len(ids)] = 1
        labels = torch.tensor([label for _, label in rows], dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": mask}, labels


# Synthetic set sizes: smoke is small enough for seconds of training; article mirrors IMDb's split
# (train / test; rows are generated lazily, so the size costs nothing).
SYNTHETIC_SIZES = {"smoke": (512, 256), "article": (IMDB_SPLIT[0], IMDB_SPLIT[2])}


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

    return cast(nn.Module, AutoModelForSequenceClassification.from_config(config(model, scale),
                                                                          attn_implementation=ATTENTION))


def fake_inputs(model: TextModel, scale: Scale, batch: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """A micro-batch padded to the longest sequence the scale allows: the sim's worst case (IMDb
    batches of 12 nearly always hold a review past 512 tokens; BigBird's 4,096 is an upper bound)."""
    length = sequence_length(model, scale)
    ids = torch.zeros(batch, length, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": torch.ones(batch, length, dtype=torch.long)}, \
        torch.zeros(batch, dtype=torch.long)


def text_data(model: TextModel, scale: Scale, data_dir: str | os.PathLike[str] | None) -> TextBundle:
    root = data.kind_dir(data.resolve_data_dir(data_dir), "text")
    max_length = sequence_length(model, scale)
    if root is None:
        train_size, test_size = SYNTHETIC_SIZES[scale.name]
        low, high = synthetic_words(scale, max_length)
        return TextBundle(
            name="synthetic-sentiment",
            train=SyntheticReviews(train_size, data.SPLIT_SEED, low, high),
            test=SyntheticReviews(test_size, data.SPLIT_SEED + 1, low, high),
            collate_fn=PadToLongest(WordTokenizer().pad_id),
        )
    train, _val, test = imdb_rows(root)
    tokenizer = _cached_tokenizer(model.hub_name, root)
    vocab = SMOKE_VOCAB if scale.name == "smoke" else None
    return TextBundle(
        name="imdb",
        train=TokenizedTexts(train, tokenizer, max_length, vocab),
        test=TokenizedTexts(test, tokenizer, max_length, vocab),
        collate_fn=PadToLongest(int(tokenizer.pad_token_id or 0)),
    )


def _cached_tokenizer(hub_name: str, root: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(hub_name, local_files_only=True)
    except OSError:
        raise DataError(
            f"IMDb in {root} needs the {hub_name} tokenizer in the local Hugging Face cache, and it is not "
            "there; nothing is downloaded: fetch it once (e.g. `huggingface-cli download "
            f"{hub_name}`) or unset --data-dir / {data.DATA_DIR_ENV} to use the synthetic set"
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
            check_scale=lambda scale: check_scale(model, scale),
            architecture=lambda scale, classes: architecture(model, scale, classes),
            fake_inputs=lambda scale, batch: fake_inputs(model, scale, batch),
            # bonus_bigbird-after: FSDPStrategy(cpu_offload=True), no auto-wrap policy.
            fsdp_auto_wrap=name != "bigbird",
        )

    sources = {"distilbert": "bonus_distilbert-before / -after",
               "distilbert-cased": "course: mixed precision training with 8-bit Adam",
               "bigbird": "bonus_bigbird-before / -after"}
    blocks = {"distilbert": _distilbert_block, "distilbert-cased": _distilbert_block, "bigbird": _bigbird_block}
    built = [make(name, model, sources[name], blocks[name]) for name, model in TEXT_MODELS.items()]
    return {w.name: w for w in built}
