"""The memclaims console script: listing, running one recipe, and one-line errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memclaims.cli import main

REQUIRED_RECORD_KEYS = {
    "recipe", "device", "scale", "param_count", "param_bytes", "grad_bytes", "optimizer_state_bytes",
    "load_peak_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "accuracy", "final_loss",
    "nan_loss", "step_time_s", "weights", "data", "versions",
}


def test_list_json_names_techniques_workloads_claims_and_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    techniques = {t["name"]: t for t in data["techniques"]}
    assert techniques["bf16-true"]["article_row"] == "03_bfloat16"
    assert "vit" in {w["name"] for w in data["workloads"]}
    assert {"smoke", "article"} <= set(next(w for w in data["workloads"] if w["name"] == "vit")["scales"])
    assert "init-module-load" in {c["name"] for c in data["claims"]}
    assert data["case_counts"]["singles"] <= data["case_counts"]["default"] <= data["case_counts"]["full"]
    named = {r["name"]: r for r in data["named_recipes"]}
    assert named["distilbert-after"]["published_peak_gb"] == 1.15
    assert named["distilbert-cased-adam8bit"]["needs"] == []
    assert "article" in data["sim_profiles"]
    (era,) = data["library_eras"]
    assert era["era"] == "bitsandbytes=0.39.0-0.43.1" and "PR #1270" in era["source"] and "MatMul4Bit" in era["changes"]


def test_claims_filtered_by_source(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["claims", "--json", "--source", "pytorch-docs", "--artifacts", str(tmp_path)]) == 0
    rows = json.loads(capsys.readouterr().out)["claims"]
    assert rows and {r["document"] for r in rows} == {"pytorch-docs"}
    assert "activation-offload-saved-on-host" in {r["claim"] for r in rows}
    assert main(["claims", "--source", "course", "--artifacts", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "-- course: Course 'Efficient AI Model Training" in out and "fabric-memory" not in out
    assert main(["claims", "--source", "nope"]) == 2
    from memclaims.core import published

    valid = ", ".join(published.documents())  # every packaged source, the new ones included
    assert {"article", "course", "pytorch-docs"} <= set(published.documents())
    assert f"--source nope: no such source; valid: {valid}\n" in capsys.readouterr().err


def test_list_text_shows_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "06_sgd-with-scheduler" in out and "vit" in out and "overall-20x" in out
    assert "run and fit predict on 'current', reproduce and fidelity on 'article'" in out
    assert "\n  bitsandbytes 0.39.0-0.43.1 MatMul4Bit.forward keeps its input A" in out  # each era, what it changes
    assert "Source: bitsandbytes PR #1270" in out  # and where that is written
    assert "--era LIBRARY=RELEASE on run, fit, reproduce, fidelity," in out  # the commands the option table gives it


@pytest.mark.cpu
def test_run_prints_one_record_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "vit", "-t", "bf16-true", "-t", "sgd", "--device", "cpu", "--scale", "smoke",
                 "--steps", "2", "--no-eval", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert REQUIRED_RECORD_KEYS <= set(record)
    assert record["recipe"] == "vit-smoke/bf16-true+sgd"
    assert record["accuracy"] is None and record["peak_reserved_bytes"] is None
    assert record["optimizer_state_bytes"] == 0
    for key in ("param_bytes", "grad_bytes", "load_peak_bytes", "peak_allocated_bytes"):
        assert isinstance(record[key], int) and record[key] > 0, key
    assert record["weights"] == "random" and record["data"] == "sklearn-digits"
    assert {"torch", "torchvision", "lightning", "transformers", "bitsandbytes", "python"} <= set(record["versions"])


def test_run_and_fit_take_the_optimizers_implementation(capsys: pytest.CaptureFixture[str]) -> None:
    """-t fused on the sim replays the fused step and records it; fit ranks the implementations among the rest."""
    assert main(["run", "vit", "-t", "fused", "--device", "sim", "--scale", "smoke", "--steps", "2", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["recipe"] == "vit-smoke/fused"
    assert record["by_technique"]["fused"]["fused"] is True and record["by_technique"]["fused"]["step_temporary_bytes"] == 0
    assert any(note.startswith("optimizer step: fused (foreach=False, fused=True)") for note in record["notes"])
    # A budget below every smoke peak: each combination is replayed, none pruned, and fit exits 1 (nothing fits).
    assert main(["fit", "vit", "-t", "fused", "-t", "foreach", "--scale", "smoke", "--memory", "20MB", "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {row["recipe"]: row["status"] for row in rows} == {
        "vit-smoke/fabric": "too big", "vit-smoke/fused": "too big", "vit-smoke/foreach": "too big"}


@pytest.mark.parametrize("argv, message", [
    (["run", "vit", "-t", "bogus"], "unknown technique 'bogus'; memclaims list shows all"),
    (["run", "vit", "-t", "fused", "-t", "adafactor"], "'fused' does not combine with 'adafactor': transformers' "
                                                       "Adafactor steps one parameter at a time"),
    (["run", "nope"], "unknown workload 'nope'; valid workloads: vit"),
    (["run", "vit", "-t", "16-true", "-t", "bf16-true"], "at most one precision technique"),
    (["run", "vit", "--steps", "zero"], "--steps: expected a positive integer, got 'zero'"),
    (["run", "vit", "--device", "tpu"], "invalid choice: 'tpu'"),
    (["run", "vit", "--scale", "huge"], "invalid choice: 'huge'"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], message: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_evaluate_each_epoch_reaches_the_run_and_is_off_by_default(monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import memclaims.run
    from memclaims.pytest.testing import fake_record

    asked = []

    def measure(recipe, options):  # type: ignore[no-untyped-def]
        asked.append(options.evaluate_each_epoch)
        return [fake_record()]

    monkeypatch.setattr(memclaims.run, "run_recipe", measure)
    assert main(["run", "distilbert", "--json", "--evaluate-each-epoch"]) == 0
    assert main(["run", "distilbert", "--json"]) == 0
    assert asked == [True, False]


def test_cuda_on_a_machine_without_one_is_a_clear_error(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the error path, on any machine
    assert main(["run", "vit", "--device", "cuda", "--no-eval"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_console_script_is_installed() -> None:
    result = subprocess.run([sys.executable, "-m", "memclaims.cli", "list", "--json"],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["techniques"]


@pytest.mark.sim
def test_reproduce_one_source_on_the_sim(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Its claims the sim checks are judged on replays at the article's scale; the rest say why not."""
    assert main(["reproduce", "--device", "sim", "--source", "bitsandbytes-docs", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# bitsandbytes-docs: The bitsandbytes documentation")
    assert "\n\nPredicted on the sim, profile 'article' (" in out  # what it replayed (--era's too: issue #53)
    row = next(line for line in out.splitlines() if line.startswith("| paged-optimizer-unified-memory |"))
    assert "| holds |" in row and "of optimizer state in unified memory" in row
    rows = json.loads((tmp_path / "source-bitsandbytes-docs.json").read_text())
    assert [(r["verdict"], r["profile"]) for r in rows] == [("holds", "article")]
    assert main(["reproduce", "--device", "cpu", "--source", "bitsandbytes-docs"]) == 2
    assert "--source predicts on the sim only" in capsys.readouterr().err
    assert main(["reproduce", "--device", "sim", "--source", "nope", "--out", str(tmp_path)]) == 2
    assert "--source nope: no such source" in capsys.readouterr().err


class _Asked(Exception):
    """Stops a command once it has said what it would predict on (no replay runs)."""


_BNB_OLD = "bitsandbytes=0.39.0-0.43.1"  # the era bitsandbytes=0.41 falls in (memclaims.core.library_eras)
# Where each command hands its profile on: the door's RunOptions, fit's and fidelity's argument, a source's.
_PROFILE_OF = {
    "memclaims.run.run_recipe": lambda args, kwargs: args[1].profile,
    # fit says its profile once the budget is judged (``answering``), just before its first replay
    "memclaims.report.fit.fit": lambda args, kwargs: (kwargs["answering"](), kwargs["profile"])[1],
    "memclaims.report.fidelity.fidelity": lambda args, kwargs: args[0],
    "memclaims.report.source_claims.predict": lambda args, kwargs: args[1],
}


@pytest.mark.parametrize("argv, where, expected", [
    (["run", "vit", "--device", "sim"], "memclaims.run.run_recipe", "current"),
    (["run", "vit", "--device", "sim", "--sim-profile", "article"], "memclaims.run.run_recipe", "article"),
    (["fit", "vit", "--memory", "24GB"], "memclaims.report.fit.fit", "current"),
    (["fit", "vit", "--memory", "24GB", "--sim-profile", "h100"], "memclaims.report.fit.fit", "h100"),
    (["fidelity"], "memclaims.report.fidelity.fidelity", "article"),
    (["reproduce", "--device", "sim", "--source", "course"], "memclaims.report.source_claims.predict", "article"),
    (["reproduce", "--device", "sim"], "memclaims.run.run_recipe", "article"),
    # --era (issue #53): every command the option table gives it replays the era, named in its profile's name.
    (["run", "vit", "--device", "sim", "--era", "bitsandbytes=0.41"], "memclaims.run.run_recipe", f"current+{_BNB_OLD}"),
    (["fit", "vit", "--memory", "24GB", "--era", "bitsandbytes=0.41"], "memclaims.report.fit.fit", f"current+{_BNB_OLD}"),
    (["reproduce", "--device", "sim", "--era", "bitsandbytes=0.41"], "memclaims.run.run_recipe", f"article+{_BNB_OLD}"),
    (["reproduce", "--device", "sim", "--source", "course", "--era", "bitsandbytes=0.41"],
     "memclaims.report.source_claims.predict", f"article+{_BNB_OLD}"),
    (["fidelity", "--article-only", "--era", "bitsandbytes=0.41"], "memclaims.report.fidelity.fidelity",
     f"article+{_BNB_OLD}"),
    (["fidelity", "--article-only", "--sim-profile", "h100", "--era", "bitsandbytes=0.41"],
     "memclaims.report.fidelity.fidelity", f"h100+{_BNB_OLD}"),
])
def test_the_default_sim_profile_is_the_installed_torch_except_where_the_article_is_reproduced(
        argv: list[str], where: str, expected: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """run and fit answer for today's torch (issue #43); fidelity and reproduce keep the article's profile; each names
    the profile it predicts on, and the releases it replays (an era's, issue #53), before it starts."""
    import importlib

    module, _, name = where.rpartition(".")
    asked: list[str] = []

    def ask(*args: Any, **kwargs: Any) -> Any:
        asked.append(_PROFILE_OF[where](args, kwargs))
        raise _Asked

    monkeypatch.setattr(importlib.import_module(module), name, ask)
    with pytest.raises(_Asked):
        main(argv)
    assert asked == [expected]
    err = capsys.readouterr().err
    assert f"on the sim, profile {expected!r} (" in err
    assert (f"bitsandbytes {_BNB_OLD.partition('=')[2]}, " in err) == ("+" in expected), err  # the era's releases


@pytest.mark.sim
def test_a_user_model_on_the_sim_runs_where_its_values_are_constants_and_is_one_line_where_they_are_data(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Lightning's demo Transformer (its decoder reads its causal mask's values) runs on the sim from the command
    line; a model whose forward branches on its input's values stops with one line naming the op, the module path
    and what to do, exit status 2, no traceback (issue #43)."""
    from memclaims.workloads import user as user_workloads

    monkeypatch.setenv("MEMCLAIMS_WORKLOADS", "fixtures.demo_transformer:make,fixtures.demo_transformer:reads_data")
    monkeypatch.setattr(user_workloads, "_env_specs_loaded", set())
    try:
        assert main(["run", "demo-transformer", "--device", "sim", "--scale", "smoke", "-t", "bf16-true",
                     "--json"]) == 0
        captured = capsys.readouterr()
        record = json.loads(captured.out)
        hub, predicting = captured.err.splitlines()[:2]  # the Hub line every run prints, then what it predicts
        assert hub.startswith("memclaims: Hugging Face Hub offline")
        assert predicting.startswith("memclaims: predicting demo-transformer-smoke/bf16-true on the sim, profile "
                                     "'current' (")
        # ... and the releases of the four libraries that move memory it replays (issue #53: the installed ones)
        assert re.search(r"\), replaying torch .+, bitsandbytes \S+ \(installed\), peft \S+ \(installed\), "
                         r"transformers \S+ \(installed\)$", predicting), predicting
        assert (record["probe"], record["step_examples"]) == ("sim:current", 4)
        assert main(["run", "reads-data", "--device", "sim", "--scale", "smoke"]) == 2
    finally:
        for name in ("demo-transformer", "reads-data"):
            user_workloads.forget(name)
    err = capsys.readouterr().err
    assert err.count("\n") == 3 and "Traceback" not in err  # the Hub line, the profile line, the one error line
    error = err.splitlines()[2]
    assert error.startswith("error: the sim cannot replay workload 'reads-data': module blocks.0 "
                            "(fixtures.demo_transformer.Gate) at ")
    assert "demo_transformer.py:" in error and "(aten._local_scalar_dense.default: " in error
    assert error.endswith("or run it with --device cpu or cuda")
