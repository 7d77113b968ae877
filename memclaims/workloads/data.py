"""The data sets, with no download: images (CIFAR-10 from a directory the user names, else
scikit-learn's digits) and text (IMDb from a directory, else a deterministic synthetic sentiment set
with a built-in tokenizer). Imports only ``core``: every workload builds on it."""

from __future__ import annotations

import csv
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Subset

from memclaims.core.errors import DataError
from memclaims.core.names import DATA_DIR_ENV
from memclaims.core.names import data_dir as given_data_dir

if TYPE_CHECKING:  # the model's own tokenizer, made where a workload loads its data
    from transformers import PreTrainedTokenizerBase

SPLIT_SEED = 123  # the article's seed, reused for the offline split

# One example of the built-in data sets: an image or a row of token ids, and its class label.
Example = tuple[torch.Tensor, int]
Batch = tuple[dict[str, torch.Tensor], torch.Tensor]  # a collated text batch: (model inputs, labels)

# The article trains on the first 45,000 CIFAR-10 images (the next 5,000 validate): local_utilities.py.
CIFAR10_TRAIN_IMAGES = 45_000


@dataclass(frozen=True)
class DataBundle:
    name: str  # what the Record calls the data set
    # Examples only the bundle's collate step (the DataLoader's default, or TextBundle.collate_fn)
    # interprets: the built-in sets yield ``Example``, a user workload's sets anything.
    train: Dataset[object]
    test: Dataset[object]


class ResizedImages(Dataset[Example]):
    """Images as separate per-sample tensors, resized up front when small, else on access.

    Per-sample storages matter for the CPU probe: indexing one big tensor makes views of its
    storage inside the measured phase, and the probe would count the whole data set as live
    memory, which a GPU run keeps on the host. At 224 px the set would not fit up front (1 GB).
    """

    EAGER_MAX_SIZE = 64

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, size: int) -> None:
        self.size = size
        self.labels = [int(label) for label in labels]
        self.eager = size <= self.EAGER_MAX_SIZE
        self.images = [self._resize(image) if self.eager else image.clone() for image in images]

    def _resize(self, image: torch.Tensor) -> torch.Tensor:
        if image.shape[-1] == self.size:
            return image.clone()
        resized = F.interpolate(image.unsqueeze(0), size=(self.size, self.size), mode="bilinear", align_corners=False)
        return resized.squeeze(0)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = self.images[index]
        return (image if self.eager else self._resize(image)), self.labels[index]


def digits(image_size: int) -> DataBundle:
    """scikit-learn's bundled 8x8 digits (1,797 images, 10 classes), as 3-channel images in [0, 1]."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.tensor(bunch.images, dtype=torch.float32).div_(16.0).unsqueeze(1).expand(-1, 3, -1, -1)
    labels = torch.tensor(bunch.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(SPLIT_SEED))
    test_size = len(labels) // 5
    dataset = ResizedImages(images, labels, image_size)
    return DataBundle(
        name="sklearn-digits",
        train=Subset(dataset, order[test_size:].tolist()),
        test=Subset(dataset, order[:test_size].tolist()),
    )


def holds_cifar10(root: Path) -> bool:
    """Whether ``root`` holds CIFAR-10's python version, the folder torchvision reads."""
    return (root / "cifar-10-batches-py").is_dir()


def cifar10(root: Path, image_size: int) -> DataBundle:
    """CIFAR-10 as the article used it: first 45,000 training images, the 10,000 test images."""
    from torchvision import datasets, transforms

    if not holds_cifar10(root):
        raise DataError(
            f"data directory {root} does not hold CIFAR-10 (expected {root / 'cifar-10-batches-py'}/, "
            "the python version of the data set); point --data-dir / "
            f"{DATA_DIR_ENV} at the folder that contains it, or unset it to use the offline digits"
        )
    preprocess = transforms.Compose([transforms.Resize((image_size, image_size)), transforms.ToTensor()])
    try:
        train = datasets.CIFAR10(root=str(root), train=True, transform=preprocess, download=False)
        test = datasets.CIFAR10(root=str(root), train=False, transform=preprocess, download=False)
    except RuntimeError as error:  # torchvision's integrity check
        raise DataError(f"CIFAR-10 in {root} is incomplete or corrupt: {error}") from None
    return DataBundle(name="cifar10", train=Subset(train, range(CIFAR10_TRAIN_IMAGES)), test=test)


def resolve_data_dir(data_dir: str | os.PathLike[str] | None) -> Path | None:
    """The data folder (``memclaims.core.names.data_dir``: the option, else the variable),
    which must exist; None: offline data."""
    path = given_data_dir(data_dir)
    if path is None:
        return None
    if not path.is_dir():
        raise DataError(f"data directory {path} does not exist; create it or unset --data-dir / {DATA_DIR_ENV}")
    return path


def kind_dir(root: Path | None, kind: str) -> Path | None:
    """``root/kind`` (``images`` or ``text``, where --memclaims-download puts them) when it exists,
    else ``root`` itself (a folder holding the data set directly)."""
    if root is None:
        return None
    return root / kind if (root / kind).is_dir() else root


def images(image_size: int, data_dir: str | os.PathLike[str] | None) -> DataBundle:
    root = kind_dir(resolve_data_dir(data_dir), "images")
    return digits(image_size) if root is None else cifar10(root, image_size)


# --- text ---------------------------------------------------------------------------------------

IMDB_SPLIT = (35_000, 5_000, 10_000)  # train / val / test, as rasbt's local_dataset_utilities
IMDB_SEED = 123


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


class SyntheticReviews(Dataset[Example]):
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


class TokenizedTexts(Dataset[Example]):
    """(text, label) rows tokenized on access with the model's own (cached) tokenizer."""

    def __init__(self, rows: list[tuple[str, int]], tokenizer: PreTrainedTokenizerBase, max_length: int,
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
            f"{DATA_DIR_ENV} at it, or unset it to use the synthetic sentiment set"
        )
    rows = _read_acl(_acl_dir(root))
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(IMDB_SEED)).tolist()
    shuffled = [rows[i] for i in order]
    a, b = IMDB_SPLIT[0], IMDB_SPLIT[0] + IMDB_SPLIT[1]
    return shuffled[:a], shuffled[a:b], shuffled[b:b + IMDB_SPLIT[2]]


# --- batches ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TextBundle(DataBundle):
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
