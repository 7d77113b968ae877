"""scripts/gpu-check on a machine without a GPU: arguments, the plan, that every command parses,
the time caps, and the report from recorded step outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from fixtures.paths import ROOT
from memclaims.gpu import check as gpucheck


def PARSE(args: list[str]) -> object:  # noqa: N802 - the CLI's parser, as scripts/gpu-check gives it
    from memclaims.cli import parse

    return parse(args)


def test_dry_run_lists_every_step_and_each_command_parses(tmp_path) -> None:
    # The script runs the `python` on PATH, as on the lent machine: this interpreter's.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run([str(ROOT / "scripts" / "gpu-check"), "--dry-run", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PATH": path})
    assert done.returncode == 0, done.stderr
    for name in ("facts", "smoke-tier", "cuda-01-2", "cuda-06", "fsdp-offload", "history", "allocator-trace", "sim"):
        assert f"] {name}: " in done.stdout
    assert "--memclaims-gpu-scale smoke" in done.stdout and str(tmp_path / "out" / "baselines") in done.stdout
    assert not (tmp_path / "out").exists()  # a dry run writes nothing
    assert gpucheck.check_parses(gpucheck.steps(tmp_path), PARSE) == []


def test_a_command_that_does_not_parse_is_reported() -> None:
    bad = gpucheck.Step("bad", (sys.executable, "-m", "memclaims.cli", "run", "vit", "--scale", "huge"), 1)
    problems = gpucheck.check_parses([bad], PARSE)
    assert len(problems) == 1 and "huge" in problems[0]


def test_gpu_steps_fit_eight_minutes() -> None:
    assert sum(step.timeout_s for step in gpucheck.steps(Path("x"))) <= gpucheck.LIMIT_S == 480
    assert gpucheck.sim_step().timeout_s < gpucheck.LIMIT_S  # beside the GPU steps, never after them


def test_without_outdir_or_gpu_it_says_why(capsys) -> None:
    assert gpucheck.main([]) == 2
    assert "needs OUTDIR" in capsys.readouterr().err
    import torch

    if not torch.cuda.is_available():
        assert gpucheck.main(["/tmp/never-written"]) == 2
        assert "needs a CUDA GPU" in capsys.readouterr().err
        assert not Path("/tmp/never-written").exists()


def test_report_puts_measured_beside_published_and_sim() -> None:
    record = {"peak_reserved_total_bytes": 26_000_000_000}
    results = {
        "facts": {"status": "ok", "seconds": 2.0, "json": {"name": "NVIDIA H200", "cublas_workspace_bytes_total": 67108864}},
        "cuda-01-2": {"status": "ok", "seconds": 20.0, "json": record},
        "cuda-02": {"status": "timed out after 30 s", "seconds": 30.0, "json": None},
        "sim": {"status": "ok", "seconds": 60.0, "json": {"01-2": {"peak_reserved_total_bytes": 26_500_000_000}}},
        "fsdp-offload": {"status": "ok", "seconds": 40.0, "json": {"rank0": {"peak_reserved_total_bytes": 5_000_000_000}}},
    }
    text = gpucheck.report(results)
    assert "| 01-2 | 26.84 | 26.00 | 26.50 | 0.969 |" in text
    assert "| 02 | 18.21 | - | - | - |" in text and "| cuda-02 | timed out after 30 s | 30 |" in text
    assert "- name: NVIDIA H200" in text and "rank-0 peak reserved 5.00 GB" in text


def test_last_json_reads_a_record_after_log_lines() -> None:
    out = "memclaims: running vit-article/fabric on cuda\n" + json.dumps({"a": 1, "b": {"c": 2}}, indent=2) + "\n"
    assert gpucheck._last_json(out) == {"a": 1, "b": {"c": 2}}
    assert gpucheck._last_json("no json here") is None
