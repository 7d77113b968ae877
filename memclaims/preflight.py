"""The environment preflight: a broken or mismatched install is one line, not thousands of tracebacks.

torchvision ships C++ operators compiled against one torch release; beside another they fail to
register and every module that imports torchvision raises. The suite then reports each test file
as a collection error. This check runs before anything imports the training stack and names the
packages, their versions and what to install.
"""

from __future__ import annotations

import importlib
from importlib import metadata

# torchvision 0.N pairs with torch 2.(N - 15): 0.29 <-> 2.14, 0.28 <-> 2.13 (torchvision's table).
_TORCHVISION_OFFSET = 15
# Imported in this order, each after what it builds on; a failure names the first broken one.
PACKAGES = ("torch", "torchvision", "lightning", "torchmetrics", "transformers", "bitsandbytes")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:200]


def matching_torchvision(torch_version: str) -> str:
    major, minor = _minor(torch_version)
    return f"0.{minor + _TORCHVISION_OFFSET}.*" if major == 2 else "the release built for it"


def problems() -> list[str]:
    """What is wrong with the installed stack, one line each; empty when the suite can run."""
    found: list[str] = []
    versions = {p: _version(p) for p in PACKAGES}
    for package, version in versions.items():
        if version is None:
            found.append(f"{package} is not installed; install the project with `pip install -e .[test]`")
    torch_version, vision_version = versions["torch"], versions["torchvision"]
    if torch_version and vision_version:
        (_, torch_minor), (_, vision_minor) = _minor(torch_version), _minor(vision_version)
        if vision_minor != torch_minor + _TORCHVISION_OFFSET:
            found.append(f"torchvision {vision_version} is built for torch 2.{vision_minor - _TORCHVISION_OFFSET}, "
                         f"but torch {torch_version} is installed; install torchvision=="
                         f"{matching_torchvision(torch_version)}")
    if found:
        return found
    for package in PACKAGES:
        try:
            importlib.import_module(package)
            if package == "torchvision":
                import torch

                torch.ops.torchvision.nms  # noqa: B018 - raises when the C++ operators did not register
        except Exception as error:  # any import failure is the finding; its first line names it
            found.append(f"{package} {versions[package]} does not import beside torch {torch_version}: "
                         f"{_first_line(error)}")
            break
    return found


def message(found: list[str]) -> str:
    return "memclaims: the installed packages cannot run the suite: " + "; ".join(found)
