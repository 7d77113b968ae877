"""Image data with no download: CIFAR-10 from a directory the user names, else scikit-learn's digits."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, Subset

from memclaims.errors import DataError

DATA_DIR_ENV = "MEMCLAIMS_DATA_DIR"
SPLIT_SEED = 123  # the article's seed, reused for the offline split

# One example of the built-in data sets: an image or a row of token ids, and its class label.
Example = tuple[torch.Tensor, int]
Batch = tuple[dict[str, torch.Tensor], torch.Tensor]  # a collated text batch: (model inputs, labels)


@dataclass(frozen=True)
class DataBundle:
    name: str  # what the Record calls the data set
    # Examples only the bundle's collate step (the DataLoader's default, or TextBundle.collate_fn)
    # interprets: the built-in sets yield ``Example``, a user workload's sets anything.
    train: Dataset[Any]
    test: Dataset[Any]


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
    return DataBundle(name="cifar10", train=Subset(train, range(45_000)), test=test)


def resolve_data_dir(data_dir: str | os.PathLike[str] | None) -> Path | None:
    chosen = data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV) or None
    if chosen is None:
        return None
    path = Path(chosen).expanduser()
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
