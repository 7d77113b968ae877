"""The environment: the preflight's one line for a broken install, and the committed CPU baselines
holding under every ATen CPU class this machine can run as (CI may land on any of them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from memclaims import preflight
from memclaims.environment import _cpu_flags, cpu_capability

ROOT = Path(__file__).resolve().parents[2]

# A torchvision whose C++ operators do not register beside the installed torch fails at import
# with this (the real message of torchvision's meta registrations).
_BROKEN_TORCHVISION = 'raise RuntimeError("operator torchvision::nms does not exist")\n'


def test_a_matching_stack_passes_the_preflight() -> None:
    assert preflight.problems() == []


def test_a_torchvision_built_for_another_torch_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = preflight._version
    monkeypatch.setattr(preflight, "_version", lambda p: "0.28.0" if p == "torchvision" else real(p))
    found = preflight.problems()
    torch_version = real("torch")
    assert found == [f"torchvision 0.28.0 is built for torch 2.13, but torch {torch_version} is installed; "
                     f"install torchvision=={preflight.matching_torchvision(torch_version or '')}"]


def test_a_broken_install_stops_pytest_with_one_line(tmp_path: Path) -> None:
    shim = tmp_path / "shim" / "torchvision"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(_BROKEN_TORCHVISION)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "shim"), str(ROOT)])}
    # A plugin option on the command line must not turn the finding into "unrecognized arguments".
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           "--memclaims-matrix", "singles", str(ROOT / "suite" / "test_claims.py")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 4, output  # pytest's usage error: nothing ran
    assert "torchvision" in output and "does not import beside torch" in output
    assert "operator torchvision::nms does not exist" in output
    assert "Traceback" not in output and len(output.strip().splitlines()) <= 3, output


def runnable_classes() -> list[str]:
    """ATen classes below this machine's own: each is a CPU that CI may land on."""
    flags = _cpu_flags()
    classes = ["default"]
    if "avx2" in flags:
        classes.append("avx2")
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        classes.append("avx512")
    return [c for c in classes if c != cpu_capability()]


# The cases most sensitive to the CPU class: bf16 arithmetic differs where bf16 instructions do,
# and the fp32 reference. Each is a real smoke-scale training run against the committed baseline.
_SENSITIVE = ("cpu:vit-smoke/fabric] or cpu:vit-smoke/bf16-true] or cpu:vit-smoke/bf16-mixed] or "
              "cpu:vit-smoke/bf16-true+small-batch+grad-accum]")


@pytest.mark.cpu
@pytest.mark.slow
@pytest.mark.parametrize("cpu_class", runnable_classes() or [pytest.param(
    "none", marks=pytest.mark.requires(unsupported="this machine runs only ATen's default class"))])
def test_committed_baselines_hold_under_another_cpu_class(cpu_class: str) -> None:
    env = {**os.environ, "ATEN_CPU_CAPABILITY": cpu_class}
    done = subprocess.run([sys.executable, "-m", "pytest", "suite/test_techniques.py", "-m", "cpu", "-q",
                           "-p", "no:cacheprovider", "-k", _SENSITIVE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"the committed baselines fail as ATEN_CPU_CAPABILITY={cpu_class}:\n{output[-4000:]}"
    assert "4 passed" in output
