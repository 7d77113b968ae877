"""Sharded runs inside a SLURM allocation, on CPU ranks: memclaims' ranks use Lightning's own
environment, torchrun's workers torchrun's, whatever SLURM variables the job exported."""

from __future__ import annotations

import pytest

from memclaims.measure import distributed, launcher, lightning_fsdp
from memclaims.recipes.run_options import DEFAULT_TIMEOUT_S

# What `srun` exports to a one-task job step: Lightning's SLURMEnvironment.detect() is True with these.
SLURM = {"SLURM_NTASKS": "1", "SLURM_JOB_NAME": "nightly", "SLURM_JOB_ID": "4242", "SLURM_PROCID": "0",
         "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NTASKS_PER_NODE": "1"}


@pytest.fixture
def in_slurm_job(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SLURM.items():
        monkeypatch.setenv(name, value)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID", launcher.SPAWNED_RANK_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.dist
@pytest.mark.slow  # nightly only (pytest -n 2): keeps CI under 15 minutes on 2 cores
def test_spawned_ranks_under_slurm_are_distinct_lightning_ranks(in_slurm_job) -> None:
    reports = launcher.launch(lightning_fsdp.environment_report, 2, timeout_s=300)  # a loaded 2-core CI box
    for rank, report in enumerate(reports):
        assert report["slurm"] == [], report
        assert report["environment"] == "LightningEnvironment", report
        assert (report["global_rank"], report["local_rank"], report["world_size"]) == (rank, rank, 2), report


def test_strip_slurm_removes_only_slurm_variables() -> None:
    environ = {"SLURM_PROCID": "3", "SLURM_JOB_NAME": "x", "PATH": "/bin", "MASTER_PORT": "1"}
    assert sorted(launcher.strip_slurm(environ)) == ["SLURM_JOB_NAME", "SLURM_PROCID"]
    assert environ == {"PATH": "/bin", "MASTER_PORT": "1"}


def test_torchrun_under_slurm_uses_torchelastic() -> None:
    torchrun = {**SLURM, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                "MASTER_ADDR": "node0", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "nightly"}
    assert type(lightning_fsdp.cluster_environment(torchrun)).__name__ == "TorchElasticEnvironment"
    assert type(lightning_fsdp.cluster_environment({**torchrun, launcher.SPAWNED_RANK_ENV: "1"})).__name__ == \
        "LightningEnvironment"
    assert lightning_fsdp.cluster_environment(SLURM) is None  # no ranks of ours: Lightning decides


def test_no_timeout_means_no_deadline() -> None:
    assert launcher._group_timeout(None) is None
    assert launcher._group_timeout(5).total_seconds() == 5


# --- calibrate on a sharded recipe: ranks launched here, one key per rank ------------------------


def _rank_records(run: int):
    from memclaims.pytest.testing import fake_record

    # rank 1's peak varies 10 % between runs, rank 0's not at all
    return [fake_record("vit-smoke/fsdp", devices=2, rank=0, peak_allocated_bytes=10_000_000),
            fake_record("vit-smoke/fsdp", devices=2, rank=1, peak_allocated_bytes=10_000_000 + run * 1_000_000)]


def test_calibrate_sharded_recipe_stores_one_baseline_per_rank(tmp_path, monkeypatch, capsys) -> None:
    from memclaims import cli
    from memclaims.baselines.store import BaselineStore
    from memclaims.report import calibration

    launched: list[tuple[str, int | None, float | None]] = []
    runs = iter(range(3))

    def fake_launch(recipe, device, devices, timeout_s):
        launched.append((recipe.id, devices, timeout_s))
        return _rank_records(next(runs))

    monkeypatch.setattr(calibration, "_launch", fake_launch)
    assert cli.main(["baselines", "calibrate", "vit-smoke/fsdp", "--runs", "3", "--devices", "2",
                     "--baselines-dir", str(tmp_path)]) == 0
    assert launched == [("vit-smoke/fsdp", 2, None)] * 3  # no wall-clock limit unless asked
    from memclaims.core.environment import environment_id

    stored = BaselineStore(tmp_path).load(environment_id(_rank_records(0)[0]), fresh=True)
    assert set(stored) == {"vit-smoke/fsdp@2/rank0", "vit-smoke/fsdp@2/rank1"}
    rank0, rank1 = (stored[f"vit-smoke/fsdp@2/rank{r}"].tolerances for r in (0, 1))
    assert "peak_allocated_bytes" not in rank0  # no spread: the cpu default, which is not stored
    assert rank1["peak_allocated_bytes"] == pytest.approx(3 * 2_000_000 / 11_000_000)


def test_cli_run_timeout_is_an_option_not_a_hidden_limit(monkeypatch, capsys) -> None:
    from memclaims import cli

    seen: list[float | None] = []

    def fake(recipe, options, devices=None, *, timeout_s=DEFAULT_TIMEOUT_S):
        seen.append(timeout_s)
        raise SystemExit(0)

    monkeypatch.setattr(distributed, "run_distributed", fake)
    for argv in (["run", "vit", "-t", "fsdp"], ["run", "vit", "-t", "fsdp", "--timeout", "90"]):
        with pytest.raises(SystemExit):
            cli.main(argv)
    assert seen == [None, 90.0]
    assert cli.main(["run", "vit", "-t", "fsdp", "--timeout", "soon"]) == 2
    assert "expected seconds" in capsys.readouterr().err


def test_sharded_fabric_is_given_the_environment_memclaims_chose(monkeypatch, in_slurm_job) -> None:
    import lightning.fabric

    from memclaims.recipes.recipe import resolve
    from memclaims.recipes.run_options import RunOptions

    built: list[dict] = []

    class Recorder:
        def __init__(self, **kwargs) -> None:
            built.append(kwargs)

        def launch(self) -> None: ...

    monkeypatch.setattr(lightning.fabric, "Fabric", Recorder)
    recipe = resolve("vit", "smoke", ("fsdp",))
    monkeypatch.setenv(launcher.SPAWNED_RANK_ENV, "1")
    lightning_fsdp.sharded_fabric(recipe, RunOptions(device="cuda", devices=2))
    monkeypatch.delenv(launcher.SPAWNED_RANK_ENV)
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1",
                        "TORCHELASTIC_RUN_ID": "x"}.items():
        monkeypatch.setenv(name, value)
    lightning_fsdp.sharded_fabric(recipe, RunOptions(device="cuda", devices=2))
    assert [type(kw["plugins"][0]).__name__ for kw in built] == ["LightningEnvironment", "TorchElasticEnvironment"]
