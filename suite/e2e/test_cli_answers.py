"""What `memclaims run` answers a person (a summary with units, the Record only with --json), the names users type
(the stacks' aliases, "did you mean"), and options refused rather than replaced (issue #49)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from memclaims.cli import main
from memclaims.core.errors import UsageError
from memclaims.pytest.testing import fake_record
from memclaims.recipes.recipe import resolve
from memclaims.report import run_summary
from memclaims.techniques import technique_registry as registry


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_run_prints_what_it_resolved_and_a_summary_with_units_not_the_record(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The stack's optim name is taken and said once as what it resolved to; the peak has its unit in decimal and
    binary units; the phases are a table; no raw Record field."""
    assert main(["run", "vit", "-t", "adamw_torch_fused", "--device", "sim", "--scale", "smoke", "--steps", "2"]) == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert len(lines) < 30, captured.out
    assert lines[0] == "vit-smoke/adamw+fused"
    assert "  techniques   adamw, fused (adamw_torch_fused -> adamw+fused)" in lines
    assert "adamw_torch_fused ->" not in captured.err  # said once
    assert any(line.startswith("  device       simulated NVIDIA A100") and "sim profile 'current'" in line
               for line in lines)
    peak = next(line for line in lines if line.startswith("peak reserved"))
    assert " MB (" in peak and " MiB)" in peak, peak
    table = lines.index(next(line for line in lines if line.lstrip().startswith("phase (MB)")))
    assert [line.split()[0] for line in lines[table + 1:table + 3]] == ["load", "forward"]
    assert "peak_allocated_bytes" not in captured.out and "param_tensor_count" not in captured.out


def test_sharded_summary_is_a_row_per_rank_and_the_largest(capsys: pytest.CaptureFixture[str]) -> None:
    recipe = resolve("vit", "smoke", ["fsdp"])
    records = [fake_record(recipe.id, devices=4, rank=rank, peak_allocated_bytes=10_000_000 * (rank + 1),
                           breakdown={"parameters": 1}, notes=["x" * 5000]) for rank in range(4)]
    lines = run_summary.sharded_summary(recipe, records, "cpu")
    assert max(len(line) for line in lines) < 200 and len(lines) < 30
    assert lines[-2].split()[:4] == ["max", "over", "ranks", "40.000"]
    assert [line.split()[0] for line in lines if line.startswith("  ") and line.split()[0].isdigit()] == \
        ["0", "1", "2", "3"]


def test_a_4bit_model_is_counted_by_its_original_shape_not_its_packed_storage() -> None:
    record = fake_record(param_count=4_544_008_192, by_technique={"lora": {"total_parameters": 8_030_261_248},
                                                                  "qlora": {"quantized_parameter_bytes": 3_500_000_000}})
    line = next(line for line in run_summary.memory_lines(record) if line.startswith("model"))
    assert line.startswith("model           8,030,261,248 parameters (4,544,008,192 elements as stored: 4-bit"), line


@pytest.mark.parametrize("alias, techniques", [
    ("adamw_bnb_8bit", ["adamw8bit"]), ("adamw_8bit", ["adamw8bit"]), ("paged_adamw_8bit", ["paged-adamw8bit"]),
    ("adamw_torch_fused", ["adamw", "fused"]), ("adamw_torch", ["adamw"]), ("adafactor", ["adafactor"]),
    ("sgd", ["sgd"]), ("gradient_checkpointing", ["activation-checkpointing"]), ("fp16", ["16-mixed"]),
    ("16", ["16-mixed"]), ("bf16", ["bf16-mixed"]), ("16-mixed", ["16-mixed"]), ("bf16-mixed", ["bf16-mixed"]),
])
def test_the_stacks_names_resolve_to_the_technique_they_mean(alias: str, techniques: list[str]) -> None:
    resolved, notes = registry.unalias([alias])
    assert resolved == techniques
    assert notes == ([] if alias in registry.BY_NAME else [f"{alias} -> {'+'.join(techniques)}"])


@pytest.mark.parametrize("argv, message", [
    (["run", "vit", "-t", "bf16-ture"], "unknown technique 'bf16-ture'; did you mean 'bf16-true'"),
    (["run", "llama"], "unknown workload 'llama'; did you mean 'hf:llama'?"),
    (["run", "hf:lama"], "unknown hf model type 'lama'; did you mean 'hf:llama'"),
    (["run", "vit", "-t", "checkpointing"], "technique 'checkpointing' is ambiguous: it means "
                                             "activation-checkpointing or selective-checkpointing"),
    (["run", "vit", "-t", "32"], "technique '32' is fp32, the reference's precision"),
    (["reproduce", "--baselines-dir", "no-such-dir"], "--baselines-dir no-such-dir: no such folder"),
])
def test_a_typo_gets_the_closest_names_and_an_option_is_refused_not_replaced(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = one_line(capsys)
    assert message in err and len(err) < 400, err


def test_every_alias_means_one_thing_or_is_refused_as_ambiguous() -> None:
    assert not set(registry.ALIASES) & set(registry.BY_NAME)
    assert not set(registry.ALIASES) & set(registry.AMBIGUOUS)
    for techniques in registry.ALIASES.values():
        registry.canonical(techniques)  # each names a valid combination
    with pytest.raises(UsageError, match="ambiguous"):
        registry.unalias(["checkpointing"])


def test_reproduce_reads_the_sibling_class_as_pytest_does_and_says_so(tmp_path: Path) -> None:
    """An avx512-bf16 machine with avx2 baselines: the column is filled from the sibling, and the report names it."""
    from fixtures.claim_worlds import fake_run
    from memclaims.baselines.store import BaselineStore
    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.report.reproduce import reproduce

    def on(capability: str, features: list[str]) -> dict[str, object]:
        return {"machine": "x86_64", "capability": capability, "half_features": features, "torch_build": "cpu"}

    def here(recipe: Recipe, device: str, evaluate: bool) -> Record:
        return dataclasses.replace(fake_run(recipe, device, evaluate), environment=on("avx512", ["bf16"]))

    store = BaselineStore(tmp_path / "baselines")
    stored = dataclasses.replace(fake_run(resolve("vit", "smoke", ("fabric",)), "cpu", True),
                                 environment=on("avx2", []))
    store.store_record(stored)
    rows = reproduce("cpu", tmp_path / "out", run_fn=here, store=store)
    fabric = next(r for r in rows if r.recipe == "vit-smoke/fabric")
    assert fabric.baseline_bytes is not None and fabric.baseline_environment == "cpu-x86_64-avx2-cpu"
    md = (tmp_path / "out" / "reproduce.md").read_text()
    assert "Baselines: read from the sibling class cpu-x86_64-avx2-cpu (this machine is cpu-x86_64-avx512-bf16-cpu" in md


def test_help_tells_a_user_what_memclaims_does(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "Memory-saving techniques for PyTorch training, measured" in out
    assert "Settings" not in out and "``" not in out  # not the module's developer docstring


def test_list_counts_the_full_matrix_without_listing_it_and_points_at_no_missing_file(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The full matrix's 55,737 combinations took seconds to list; list only needs their number."""
    def listed(*args: object) -> None:
        raise AssertionError("memclaims list listed the full matrix")

    monkeypatch.setattr(registry, "full_matrix", listed)
    monkeypatch.setattr(registry, "_full_matrix", listed)
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert f"full matrix {registry.count_valid(registry.single_process())}" in out
    assert "SIMULATION.md" not in out


def test_the_console_script_imports_no_training_library_before_a_command_needs_one() -> None:
    """--help, the parser and `claims` cost the interpreter, the option table and the catalogue, not torch's 2 s
    import."""
    import subprocess
    import sys

    code = ("import contextlib, io, sys, memclaims.cli as c; c.build_parser(); "
            "contextlib.redirect_stdout(io.StringIO()).__enter__(); "
            "assert c.main(['claims', '--artifacts', 'no-such-folder']) == 0; sys.stdout = sys.__stdout__; "
            "print(sorted(m for m in ('torch', 'lightning', 'transformers', 'bitsandbytes') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_devices_1_runs_one_rank_of_a_sharded_recipe_not_the_default_world(monkeypatch: pytest.MonkeyPatch) -> None:
    """FSDP over a world of 1 is what one GPU with CPU offload runs (the gpu check's fsdp-offload step): --devices 1
    is honoured, no longer replaced by the default 2 CPU ranks (issue #49)."""
    from memclaims.measure import distributed

    seen: list[int | None] = []

    from memclaims.recipes.run_options import RunOptions

    def ranks(recipe: object, options: RunOptions, devices: int | None = None, **kwargs: object) -> None:
        seen.append(options.devices)
        raise SystemExit(0)

    monkeypatch.setattr(distributed, "run_distributed", ranks)
    for argv in (["run", "vit", "-t", "fsdp", "--devices", "1"], ["run", "vit", "-t", "fsdp"]):
        with pytest.raises(SystemExit):
            main(argv)
    assert seen == [1, None]  # None: the default world (2 CPU ranks)
