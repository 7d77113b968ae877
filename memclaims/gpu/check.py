"""``scripts/gpu-check OUTDIR``: the prepared run for a lent GPU, under 8 minutes on one H200.

Steps (each a subprocess with its own time limit, so one failure does not stop the rest):
1. device facts: name, CUDA, memory, cuBLAS workspace bytes as the allocator sees them;
2. the smoke gpu tier (``gpusmoke``, singles selection) into a scratch baseline folder under OUTDIR;
3. five article-scale rows with ``--steps 3 --no-eval``, beside the published GB and the sim's
   prediction (profile h100, same recipe; simulated on the host while the GPU steps run);
4. FSDP + activation checkpointing + CPU offload on one GPU;
5. the cost of memory history: one article row with history off and with 100,000 entries;
6. ViT-H/14 16-mixed (the article's one bar the sim does not explain) with the allocator's history
   on: the trace is saved and replayed through the sim's allocator model (``memclaims.gpu.alloc_trace``),
   which tests the model's rules apart from its reconstruction of the requests.
Writes ``OUTDIR/gpu-check.md`` (every step's output under ``OUTDIR/logs``, the trace as
``OUTDIR/vit-h14.trace.json.gz``). The device tool brings back 8 files at most, so pack the folder:
``scripts/gpu-check /tmp/check; tar -czf $OUT/gpu-check.tgz -C /tmp check``.
``--dry-run`` prints the commands and checks that each parses, without running anything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memclaims.core import offline, published
from memclaims.techniques import technique_registry as registry

GB = 1e9  # the article's unit: decimal GB of max_memory_reserved
# The article's chain rows this check runs: 01-2 (the reference) to 06, but 05 (accumulation, four
# micro-batches a step), left out to keep the run under its 8 minutes.
SKIPPED_ROWS = ("05",)
SIM_PROFILE = "h100"
OFFLOAD = ("fsdp", "activation-checkpointing", "cpu-offload")
OFFLOAD_SCRIPT = "09_fsdp-cpu-offload-with-01-2"  # the article's logged run of OFFLOAD, on 4 GPUs
HISTORY_ENTRIES = 100_000
TRACE_WORKLOAD, TRACE_TECHNIQUES = "vit-h14", ("16-mixed",)
TRACE_FILE = "vit-h14.trace.json.gz"
TRACE_STEPS = 3
TRACE_ENTRIES = 1_000_000  # no stack traces: ~40,000 events for three ViT-H/14 steps, all kept


def rows() -> list[tuple[str, tuple[str, ...], float]]:
    """(row, techniques, published GB) of each chain row the check runs, from published.json."""
    found = []
    for techniques in registry.CHAIN:
        entry = published.chain_row(techniques)
        row = entry["script"].split("_")[0]  # "01-2_pytorch-fabric" -> "01-2"
        if row not in SKIPPED_ROWS:
            found.append((row, techniques, float(entry["peak_reserved_gb"])))
    return found


@dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]
    timeout_s: int


def _memclaims(*args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "memclaims.cli", *args)


def _techniques(techniques: Sequence[str]) -> tuple[str, ...]:
    return tuple(a for t in techniques for a in ("-t", t))


LIMIT_S = 480  # the whole run, caps included: under 8 minutes on one H200


def steps(outdir: Path) -> list[Step]:
    """The GPU steps, run one after the other; ``sim_step`` runs beside them on the host."""
    plan = [Step("facts", (sys.executable, "-m", "memclaims.gpu.check", "--facts"), 20),
            # singles: every technique once plus the claims' recipes (~2.5 min by memclaims.report.budget; the
            # default selection's 37 cases would need ~5 of the 8 minutes).
            Step("smoke-tier", (sys.executable, "-m", "pytest", "-m", "gpu", "--memclaims-gpu-scale", "smoke",
                                "--memclaims-matrix", "singles",
                                "--update-baselines", "--memclaims-baselines-dir", str(outdir / "baselines"),
                                "--memclaims-summary-json", str(outdir / "smoke-summary.json"),
                                "--memclaims-artifacts", str(outdir / "artifacts"), "-p", "no:cacheprovider",
                                "-q", "-rfE"), 190)]
    for row, techniques, _ in rows():
        plan.append(Step(f"cuda-{row}", _memclaims("run", "vit", *_techniques(techniques), "--device", "cuda",
                                                    "--scale", "article", "--steps", "3", "--no-eval", "--json"), 26))
    plan.append(Step("fsdp-offload", _memclaims("run", "vit", *_techniques(OFFLOAD), "--device", "cuda", "--scale",
                                                "article", "--steps", "3", "--no-eval", "--devices", "1",
                                                "--timeout", "45", "--json"), 50))
    plan.append(Step("history", (sys.executable, "-m", "memclaims.gpu.check", "--history-cost"), 40))
    plan.append(Step("allocator-trace", (sys.executable, "-m", "memclaims.gpu.check", "--allocator-trace",
                                         str(outdir / TRACE_FILE)), 50))
    return plan


def sim_step() -> Step:
    """The sim's predictions of the five rows, one process on the host, beside the GPU steps."""
    return Step("sim", (sys.executable, "-m", "memclaims.gpu.check", "--sim-rows"), LIMIT_S - 30)


def sim_rows() -> dict[str, object]:
    from memclaims.recipes.recipe import resolve
    from memclaims.recipes.run_options import RunOptions
    from memclaims.run import run_recipe

    options = RunOptions(device="sim", profile=SIM_PROFILE)
    return {row: {"peak_reserved_total_bytes": run_recipe(resolve("vit", "article", techniques),
                                                       options)[0].peak_reserved_total_bytes}
            for row, techniques, _ in rows()}


# --- steps that run inside this module --------------------------------------------------------


def facts() -> dict[str, object]:
    """The card, CUDA, and the cuBLAS workspace bytes a first matmul allocates on each handle."""
    import torch

    from memclaims.measure.determinism import deterministic

    props = torch.cuda.get_device_properties(0)
    found: dict[str, object] = {"name": torch.cuda.get_device_name(0), "capability": f"sm{props.major}{props.minor}",
                             "total_memory_bytes": props.total_memory, "torch": torch.__version__,
                             "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()}
    with deterministic("cuda"):  # the gpu tier's setting: what its Records include
        found["CUBLAS_WORKSPACE_CONFIG"] = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        a = torch.randn(256, 256, device="cuda", requires_grad=True)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        (a @ a).sum().backward()  # forward on this thread, backward on autograd's: two handles
        torch.cuda.synchronize()
        del a
        found["cublas_workspace_bytes_total"] = torch.cuda.memory_allocated() - before
    return found


def history_cost() -> dict[str, object]:
    """One article row (bf16-true, 3 steps) with history off and on: step time and snapshot size."""
    import tempfile

    from memclaims.measure import diagnosis
    from memclaims.recipes.recipe import resolve
    from memclaims.recipes.run_options import RunOptions
    from memclaims.run import run_recipe

    recipe = resolve("vit", "article", ("bf16-true",))
    result: dict[str, object] = {"recipe": recipe.id}
    with tempfile.TemporaryDirectory() as folder:
        diagnosis.set_snapshot_dir(Path(folder))
        for entries in (0, HISTORY_ENTRIES):
            diagnosis.set_history_entries(entries)
            started = time.perf_counter()
            record = run_recipe(recipe, RunOptions(device="cuda", memory_steps=3, evaluate=False))[0]
            snapshot = diagnosis.recipe_snapshot(recipe.id)
            result[f"history_{entries}"] = {
                "wall_s": round(time.perf_counter() - started, 2), "step_time_s": record.step_time_s,
                "peak_reserved_total_bytes": record.peak_reserved_total_bytes,
                "snapshot_bytes": snapshot.stat().st_size if snapshot else None}
    return result


def allocator_trace(path: Path) -> dict[str, object]:
    """ViT-H/14 16-mixed at the article's scale, history on: the GPU's peaks, its trace (saved to
    ``path``) replayed through the allocator model, and the sim's prediction of the same run."""
    import pickle
    import tempfile

    from memclaims.gpu import alloc_trace
    from memclaims.measure import diagnosis
    from memclaims.recipes.recipe import resolve
    from memclaims.recipes.run_options import RunOptions
    from memclaims.run import run_recipe

    recipe = resolve(TRACE_WORKLOAD, "article", TRACE_TECHNIQUES)
    with tempfile.TemporaryDirectory() as folder:
        diagnosis.set_snapshot_dir(Path(folder))
        diagnosis.set_snapshot_max_bytes(10**10)  # the replay needs the history from its start
        diagnosis.set_history_entries(TRACE_ENTRIES)
        diagnosis.set_history_stacks(False)
        record = run_recipe(recipe, RunOptions(device="cuda", memory_steps=TRACE_STEPS, evaluate=False))[0]
        snapshot_file = diagnosis.recipe_snapshot(recipe.id)
        if snapshot_file is None:
            raise RuntimeError(f"{recipe.id}: no allocator snapshot was written")
        snapshot = pickle.loads(snapshot_file.read_bytes())
    events = alloc_trace.from_snapshot(snapshot)
    gpu = {"device_name": record.device_name, "versions": record.versions,
           "peak_reserved_total_bytes": record.peak_reserved_total_bytes,
           "peak_allocated_bytes": record.peak_allocated_bytes}
    alloc_trace.save(path, events, {"recipe": recipe.id, "steps": TRACE_STEPS, **gpu})
    simulated = run_recipe(recipe, RunOptions(device="sim", profile=SIM_PROFILE, memory_steps=TRACE_STEPS,
                                           allocator_events=True))
    predicted, sim_events = simulated[0], simulated.allocator_events or []
    return {"recipe": recipe.id, "trace": str(path), "events": len(events), "gpu": gpu,
            "sim": {"profile": SIM_PROFILE, "peak_reserved_total_bytes": predicted.peak_reserved_total_bytes,
                    "peak_allocated_bytes": predicted.peak_allocated_bytes},
            "replay": asdict(alloc_trace.replay(events)),
            "request_difference": alloc_trace.request_difference(events, sim_events)}


# --- the report ------------------------------------------------------------------------------


def _gb(value: object) -> str:
    return f"{value / GB:.2f}" if isinstance(value, (int, float)) else "-"


def report(results: dict[str, dict[str, Any]]) -> str:
    lines = ["# gpu-check", ""]
    device = results.get("facts", {}).get("json") or {}
    lines += [f"- {k}: {v}" for k, v in device.items()] or ["- device facts: not available"]
    lines += ["", "| step | status | seconds |", "|---|---|---|"]
    lines += [f"| {name} | {r['status']} | {r['seconds']:.0f} |" for name, r in results.items()]
    lines += ["", "Article rows (--steps 3 --no-eval), peak reserved, decimal GB:", "",
              f"| row | published | measured | sim ({SIM_PROFILE}) | measured / published |", "|---|---|---|---|---|"]
    for row, _, published_gb in rows():
        cuda = (results.get(f"cuda-{row}", {}).get("json") or {}).get("peak_reserved_total_bytes")
        sim = ((results.get("sim", {}).get("json") or {}).get(row) or {}).get("peak_reserved_total_bytes")
        ratio = f"{cuda / GB / published_gb:.3f}" if cuda else "-"
        lines.append(f"| {row} | {published_gb:.2f} | {_gb(cuda)} | {_gb(sim)} | {ratio} |")
    offload = results.get("fsdp-offload", {}).get("json") or {}
    logged = published.row("multi_gpu", OFFLOAD_SCRIPT)
    lines += ["", f"FSDP + checkpointing + offload, one GPU: rank-0 peak reserved "
              f"{_gb((offload.get('rank0') or {}).get('peak_reserved_total_bytes'))} GB "
              f"(published {logged['peak_reserved_gb']:.2f} GB per GPU on {logged['devices']})"]
    history = results.get("history", {}).get("json") or {}
    if history:
        off, on = history.get("history_0", {}), history.get(f"history_{HISTORY_ENTRIES}", {})
        lines += ["", f"Memory history ({HISTORY_ENTRIES:,} entries) on {history.get('recipe')}: step time "
                  f"{off.get('step_time_s')} s -> {on.get('step_time_s')} s, snapshot {on.get('snapshot_bytes')} B"]
    lines += _trace_report(results.get("allocator-trace", {}).get("json") or {})
    return "\n".join(lines) + "\n"


def _trace_report(found: dict[str, Any]) -> list[str]:
    if not found:
        return []
    gpu, predicted, replayed = found.get("gpu") or {}, found.get("sim") or {}, found.get("replay") or {}
    lines = ["", f"{found.get('recipe')} ({found.get('events')} history events, {found.get('trace')}), decimal GB:", "",
             "| | peak reserved | peak allocated |", "|---|---|---|",
             f"| GPU | {_gb(gpu.get('peak_reserved_total_bytes'))} | {_gb(gpu.get('peak_allocated_bytes'))} |",
             f"| sim ({predicted.get('profile')}) | {_gb(predicted.get('peak_reserved_total_bytes'))} "
             f"| {_gb(predicted.get('peak_allocated_bytes'))} |",
             f"| GPU's requests through the allocator model | {_gb(replayed.get('model_reserved_peak_bytes'))} "
             f"| - |", "",
             f"Segments: GPU {replayed.get('gpu_segments')}, model {replayed.get('model_segments')}; requests on which "
             f"they disagree: {replayed.get('disagreements')}; first: {replayed.get('first')}"]
    differences = found.get("request_difference") or []
    if differences:
        lines += ["", "Request sizes counted differently (GPU vs sim): " + ", ".join(
            f"{d['request_bytes']:,} B {d['gpu']} vs {d['sim']}" for d in differences)]
    return lines


def _last_json(text: str) -> object:
    """The JSON document a command printed last (Records are printed with indent)."""
    start = text.rfind("\n{\n") + 1 if "\n{\n" in text else text.find("{")
    try:
        return json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        return None


def _record(outdir: Path, results: dict[str, dict[str, object]], step: Step, status: str, out: str,
            parsed: object, started: float) -> None:
    results[step.name] = {"status": status, "seconds": time.monotonic() - started, "json": parsed}
    (outdir / "logs" / f"{step.name}.log").write_text(out)
    print(f"gpu-check: {step.name}: {status} ({results[step.name]['seconds']:.0f} s)", file=sys.stderr)
    (outdir / "gpu-check.md").write_text(report(results))  # after every step: a cut-off run keeps its table


def run_all(outdir: Path) -> int:
    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / "logs").mkdir(exist_ok=True)
    results: dict[str, dict[str, object]] = {}
    sims = sim_step()
    sims_started = time.monotonic()
    background = subprocess.Popen(sims.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for step in steps(outdir):
        started = time.monotonic()
        try:
            done = subprocess.run(step.argv, capture_output=True, text=True, timeout=step.timeout_s)
            status, out = ("ok" if done.returncode == 0 else f"exit {done.returncode}"), done.stdout + done.stderr
            parsed = _last_json(done.stdout)
        except subprocess.TimeoutExpired as error:
            status, out, parsed = f"timed out after {step.timeout_s} s", str(error.stdout or ""), None
        _record(outdir, results, step, status, out, parsed, started)
    try:
        out, _ = background.communicate(timeout=max(1.0, sims.timeout_s - (time.monotonic() - sims_started)))
        status = "ok" if background.returncode == 0 else f"exit {background.returncode}"
    except subprocess.TimeoutExpired:
        background.kill()
        out, status = background.communicate()[0], f"timed out after {sims.timeout_s} s"
    _record(outdir, results, sims, status, out, _last_json(out), sims_started)
    return 0 if all(r["status"] == "ok" for r in results.values()) else 1


def check_parses(plan: list[Step], parse: Callable[[list[str]], object]) -> list[str]:
    """Every memclaims command parses with ``parse`` (the CLI's own parser, given by the front end
    that runs this: a check of the commands sits above them); returns the problems found."""
    from memclaims.core.errors import UsageError

    problems = []
    for step in plan:
        if step.argv[1:3] == ("-m", "memclaims.cli"):
            try:
                parse(list(step.argv[3:]))
            except (UsageError, SystemExit) as error:
                problems.append(f"{step.name}: {error}")
    return problems


def main(argv: Sequence[str] | None = None, parse: Callable[[list[str]], object] | None = None) -> int:
    """scripts/gpu-check; ``parse``: the CLI's parser, for --dry-run's check of the commands."""
    parser = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.splitlines()[0])
    parser.add_argument("outdir", nargs="?", help="folder for gpu-check.md, logs/ and the scratch baselines")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, check they parse, run nothing")
    parser.add_argument("--facts", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--history-cost", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sim-rows", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--allocator-trace", type=Path, metavar="FILE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # Offline as every memclaims command (memclaims.core.offline), for this process and the pytest and
    # memclaims commands each step starts.
    with offline.hub_mode(False, "memclaims run --download"):
        return _main(args, parse)


def _main(args: argparse.Namespace, parse: Callable[[list[str]], object] | None) -> int:
    if args.facts:
        print(json.dumps(facts(), indent=2))
        return 0
    if args.history_cost:
        print(json.dumps(history_cost(), indent=2))
        return 0
    if args.allocator_trace:
        print(json.dumps(allocator_trace(args.allocator_trace), indent=2))
        return 0
    if args.sim_rows:
        print(json.dumps(sim_rows(), indent=2))
        return 0
    if not args.outdir:
        print("error: scripts/gpu-check needs OUTDIR (a folder for the report)", file=sys.stderr)
        return 2
    outdir = Path(args.outdir)
    if args.dry_run:
        plan = steps(outdir) + [sim_step()]
        for step in plan:
            print(f"[{step.timeout_s:>4} s] {step.name}: {' '.join(step.argv)}")
        print(f"total limit {sum(s.timeout_s for s in plan[:-1])} s of GPU steps; the sim runs beside them")
        problems = check_parses(plan, parse) if parse is not None else ["no parser to check the commands with"]
        for problem in problems:
            print(f"error: {problem}", file=sys.stderr)
        return 2 if problems else 0
    import torch

    if not torch.cuda.is_available():
        print("error: scripts/gpu-check needs a CUDA GPU; torch.cuda.is_available() is False (try --dry-run)",
              file=sys.stderr)
        return 2
    return run_all(outdir)


if __name__ == "__main__":
    from memclaims.cli import parse

    sys.exit(main(parse=parse))
