"""The ``memclaims_watch`` fixture in a user's own project (pytester, the installed plugin): the user's loop judged
against a baseline stored in the user's repository, the accept flow, a regression named by phase and metric, a leak,
and the budget marker."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

USER_TESTS = """
import os

import pytest
import torch
from torch import nn


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    if os.environ.get("USER_OPTIMIZER") == "adamw":
        return model, torch.optim.AdamW(model.parameters())
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train(model, optimizer, keep=None, steps=4):
    generator = torch.Generator().manual_seed(1)
    for _ in range(steps):
        inputs, targets = torch.randn(8, 16, generator=generator), torch.randint(0, 4, (8,), generator=generator)
        loss = nn.functional.cross_entropy(model(inputs), targets)
        if keep is not None:
            keep.append(loss)  # the loss kept with its graph: a leak
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def test_training(memclaims_watch):
    model, optimizer = build()
    with memclaims_watch(model, optimizer):
        train(model, optimizer)


def test_leaky_training(memclaims_watch):
    model, optimizer = build()
    kept = []
    with memclaims_watch(model, optimizer):
        train(model, optimizer, keep=kept)


@pytest.mark.memclaims_budget("5 KB")
def test_training_within_a_budget(memclaims_watch):
    model, optimizer = build()
    with memclaims_watch(model, optimizer):
        train(model, optimizer, steps=1)
"""


NODE = "test_user_training.py::test_training"


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_user_training=USER_TESTS)
    return pytester


def test_a_users_training_is_judged_like_memclaims_cases(project: pytest.Pytester,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # First run: no baseline yet. What it measured is the obtained file, with the command that accepts it; the leak
    # and the budget fail on their own, before any baseline.
    first = project.runpytest_inprocess("-p", "no:cacheprovider")
    first.assert_outcomes(failed=3)
    out = first.stdout.str()
    assert "no baseline for 'test_user_training.py::test_training'" in out and "memclaims baselines accept" in out
    assert "test_user_training.py::test_leaky_training: phases.forward.allocated_bytes grows across steps (a leak)" \
        in out
    assert ("test_user_training.py::test_training_within_a_budget: phases.optimizer_step.allocated_bytes 8.692e-06 GB "
            "(8.095e-06 GiB; 8,692 B) is above the budget 5e-06 GB (4.657e-06 GiB; 5,000 B) by ") in out, out
    obtained = list((project.path / "baselines").rglob("*.obtained.json"))
    assert len(obtained) == 1, obtained
    # --update-baselines stores it; the same training then passes against it.
    project.runpytest_inprocess("-p", "no:cacheprovider", NODE, "--update-baselines") \
        .assert_outcomes(passed=1)
    stored = [p for p in (project.path / "baselines").rglob("*.json") if "obtained" not in p.name]
    assert len(stored) == 1 and f'"{NODE}"' in stored[0].read_text(), stored
    project.runpytest_inprocess("-p", "no:cacheprovider", NODE).assert_outcomes(passed=1)
    # The user's optimizer changed (SGD with momentum -> AdamW): the optimizer step's peak and the state are named.
    monkeypatch.setenv("USER_OPTIMIZER", "adamw")
    regressed = project.runpytest_inprocess("-p", "no:cacheprovider", NODE)
    regressed.assert_outcomes(failed=1)
    out = regressed.stdout.str()
    assert "phases.optimizer_step.allocated_bytes" in out and "optimizer_state_bytes" in out, out
