"""Deterministic settings for CUDA runs, checked against a fake torch (no GPU needed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from memclaims.measure.determinism import CUBLAS_WORKSPACE_CONFIG, deterministic


class FakeTorch:
    def __init__(self) -> None:
        self.backends = SimpleNamespace(cudnn=SimpleNamespace(deterministic=False, benchmark=True))
        self.mode = (False, False)
        self.calls: list[tuple[bool, bool]] = []

    def are_deterministic_algorithms_enabled(self) -> bool:
        return self.mode[0]

    def is_deterministic_algorithms_warn_only_enabled(self) -> bool:
        return self.mode[1]

    def use_deterministic_algorithms(self, mode: bool, *, warn_only: bool = False) -> None:
        self.mode = (mode, warn_only)
        self.calls.append(self.mode)


def test_cuda_runs_are_deterministic_inside_and_restored_after() -> None:
    fake, environ = FakeTorch(), {}
    with deterministic("cuda", torch_module=fake, environ=environ) as notes:
        assert fake.mode == (True, True)  # warn_only: ops with no deterministic kernel still run
        assert (fake.backends.cudnn.deterministic, fake.backends.cudnn.benchmark) == (True, False)
        assert environ["CUBLAS_WORKSPACE_CONFIG"] == CUBLAS_WORKSPACE_CONFIG == ":4096:8"
        assert any("deterministic CUDA" in n for n in notes)
    assert fake.mode == (False, False)
    assert (fake.backends.cudnn.deterministic, fake.backends.cudnn.benchmark) == (False, True)
    assert environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"  # read once per process: left set


@pytest.mark.parametrize("device", ["cpu", "sim"])
def test_other_devices_are_left_alone(device: str) -> None:
    fake, environ = FakeTorch(), {}
    with deterministic(device, torch_module=fake, environ=environ) as notes:
        assert notes == [] and fake.calls == [] and environ == {}


def test_a_users_workspace_setting_is_kept_and_a_nondeterministic_one_is_noted() -> None:
    fake = FakeTorch()
    with deterministic("cuda", torch_module=fake, environ={"CUBLAS_WORKSPACE_CONFIG": ":16:8"}) as notes:
        assert not any("not a deterministic" in n for n in notes)
    with deterministic("cuda", torch_module=fake, environ={"CUBLAS_WORKSPACE_CONFIG": ":4096:2"}) as notes:
        assert any("not a deterministic" in n for n in notes)


def test_the_runner_wraps_every_run_in_it(monkeypatch) -> None:
    from memclaims.measure import determinism, pipeline, runner
    from memclaims.recipes.recipe import resolve

    seen: list[str] = []
    original = determinism.deterministic

    def spy(device, **kwargs):
        seen.append(device)
        return original(device, **kwargs)

    monkeypatch.setattr(determinism, "deterministic", spy)
    monkeypatch.setattr(pipeline, "measure", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        runner.run(resolve("vit", "smoke", ("fabric",)), runner.RunOptions(device="cpu"))
    assert seen == ["cpu"]
