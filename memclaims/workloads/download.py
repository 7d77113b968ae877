"""``--memclaims-download``: the article's data sets fetched into the data dir, on runners with internet.

Off by default and never run in CI here: nothing downloads at test time unless asked. Images go to
``<data-dir>/images`` (torchvision's CIFAR-10, python version), text to ``<data-dir>/text`` (IMDb,
the Stanford aclImdb archive); ``memclaims.workloads.data`` reads each from its own folder.
"""

from __future__ import annotations

from pathlib import Path

IMAGES, TEXT = "images", "text"
IMDB_URL = "https://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz"
IMDB_MD5 = "7c2ac02c03563afcf9b574c7e56c153a"


def fetch_cifar10(folder: Path) -> None:
    from torchvision import datasets

    datasets.CIFAR10(root=str(folder), train=True, download=True)  # one archive holds both splits


def fetch_imdb(folder: Path) -> None:
    from torchvision.datasets.utils import download_and_extract_archive

    download_and_extract_archive(IMDB_URL, str(folder), md5=IMDB_MD5)


def download(data_dir: Path) -> list[str]:
    """Fetch what ``data_dir`` lacks; returns one line per data set saying what happened."""
    lines = []
    for name, folder, unpacked, fetch in (("CIFAR-10", data_dir / IMAGES, "cifar-10-batches-py", fetch_cifar10),
                                          ("IMDb", data_dir / TEXT, "aclImdb", fetch_imdb)):
        if (folder / unpacked).is_dir():
            lines.append(f"{name}: already in {folder}")
        else:
            folder.mkdir(parents=True, exist_ok=True)
            fetch(folder)
            lines.append(f"{name}: downloaded into {folder}")
    return lines
