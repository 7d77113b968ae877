"""The ``memclaims`` console script: list, run, benchmark (and the commands of later modules)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, NoReturn

from memclaims import claims as claim_registry
from memclaims import techniques as registry
from memclaims.errors import MemclaimsError, OutOfMemory, UsageError
from memclaims.named_recipes import NAMED_RECIPES
from memclaims.workloads import GPU_SMOKE, WORKLOADS

EXIT_FAILED_RUN = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the bad value (CONTRACT: no usage dump)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _seconds(text: str) -> float:
    """A wall-clock limit in seconds; 0 means none."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds (0 for no limit), got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds (0 for no limit), got {text!r}")
    return value


def selection_counts() -> dict[str, int]:
    return {
        "singles": len(registry.singles(registry.single_process())),
        "default": len(registry.default_selection()),
        "full": len(registry.full_matrix()),
    }


def catalogue() -> dict[str, Any]:
    import torch

    gpus = torch.cuda.device_count()
    return {
        "techniques": [
            {"name": t.name, "summary": t.summary, "article_row": t.source,
             "requires": sorted(t.requires), "needs": sorted(t.needs)}
            for t in registry.TECHNIQUES
        ],
        "workloads": [
            {"name": w.name, "summary": w.summary, "source": w.source,
             "scales": {s.name: s.summary for s in w.scales.values()}}
            for w in WORKLOADS.values()
        ],
        "claims": [
            {"name": c.name, "statement": c.statement, "source": c.source,
             "tiers": [t for t in ("cpu", "sim", "gpu") if claim_registry.skip_reason(c, t) is None],
             "published": c.published}
            for c in claim_registry.CLAIMS
        ],
        "named_recipes": [
            {"name": r.name, "workload": r.workload, "techniques": list(r.techniques), "source": r.source,
             "devices": r.devices, "published_peak_gb": r.published.peak_gb, "needs": r.unmet(gpus)}
            for r in NAMED_RECIPES.values()
        ],
        "sim_profiles": _sim_profiles(),
        "case_counts": selection_counts(),
    }


def _sim_profiles() -> dict[str, str]:
    from memclaims.sim import PROFILES

    return {p.name: p.summary for p in PROFILES.values()}


def cmd_list(args: argparse.Namespace) -> int:
    data = catalogue()
    if args.json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return 0
    print("Techniques (name, article row, what it changes):")
    for t in data["techniques"]:
        extra = f"  [requires {', '.join(t['requires'])}]" if t["requires"] else ""
        print(f"  {t['name']:<26} {t['article_row']:<36} {t['summary']}{extra}")
    print("\nWorkloads and scales:")
    for w in data["workloads"]:
        print(f"  {w['name']:<26} {w['summary']}")
        for scale, summary in w["scales"].items():
            print(f"    {scale:<24} {summary}")
    print(f"  {'hf:<model_type>':<26} any transformers model type with a causal-LM or classification head, built "
          "offline from AutoConfig.for_model (--config key=value,... overrides)")
    from memclaims import user_workloads

    for name in user_workloads.names():
        print(f"  {name:<26} registered by the user (entry point or memclaims_workloads)")
    print("\nClaims (name, tiers, source):")
    for c in data["claims"]:
        print(f"  {c['name']:<26} {','.join(c['tiers']):<13} {c['source']}: {c['statement']}")
    print("\nNamed recipes (bonus scripts, ViT-H/14 series, course; what this machine lacks to run them):")
    for r in data["named_recipes"]:
        needs = "; ".join(r["needs"]) or "runnable"
        print(f"  {r['name']:<36} {r['workload']}: {'+'.join(r['techniques'])}  [{needs}]")
    print("\nSimulated GPUs (--device sim --profile NAME):")
    for name, summary in data["sim_profiles"].items():
        print(f"  {name:<26} {summary}")
    counts = data["case_counts"]
    print(f"\nCases per workload and tier: singles {counts['singles']}, default {counts['default']} "
          f"(singles + the article's chain + a pairwise cover), full matrix {counts['full']}")
    return 0


def sizes_from(args: argparse.Namespace) -> Any:
    """The size knobs of ``run`` / ``fit`` as a ``recipe.Sizes``."""
    from memclaims.recipe import Sizes

    return Sizes(batch_size=args.batch_size, seq_len=args.seq_len, image_size=args.image_size,
                 accumulation_steps=args.accumulation_steps)


def workload_from(args: argparse.Namespace) -> str:
    """The workload name, with ``--config`` overrides folded into an ``hf:`` name."""
    from memclaims.hf import with_config

    return with_config(args.workload, args.config)


def add_size_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch-size", type=_positive_int, default=None,
                        help="examples per optimizer step (before small-batch divides it)")
    sized = parser.add_mutually_exclusive_group()
    sized.add_argument("--seq-len", type=_positive_int, default=None, help="tokens per sequence (text workloads)")
    sized.add_argument("--image-size", type=_positive_int, default=None,
                       help="image side in pixels, a multiple of the patch (ViT workloads)")
    parser.add_argument("--accumulation-steps", type=_positive_int, default=None,
                        help="micro-batches per optimizer step under -t grad-accum")
    parser.add_argument("--config", default=None, metavar="K=V,...",
                        help="config overrides of an hf:<model_type> workload, e.g. hidden_size=4096,num_hidden_layers=32 "
                             "(and head=causal-lm|classification, attn_implementation=sdpa|eager)")


def cmd_run(args: argparse.Namespace) -> int:
    from memclaims.measure import measure, runs_ranks
    from memclaims.options import RunOptions
    from memclaims.recipe import resolve

    recipe = resolve(workload_from(args), args.scale, args.technique or [], sizes_from(args))
    options = RunOptions(device=args.device, memory_steps=args.steps, evaluate=not args.no_eval,
                         data_dir=args.data_dir, devices=args.devices if args.devices > 1 else None,
                         profile=args.profile, timeout_s=args.timeout or None)
    if runs_ranks(recipe, options):
        from memclaims.distributed import DistributedResult

        print(f"memclaims: running {recipe.id} on {args.device}, sharded", file=sys.stderr)
        text = DistributedResult.from_records(measure(recipe, options)).to_json()
    else:
        if args.device != "sim":
            print(f"memclaims: running {recipe.id} on {args.device}", file=sys.stderr)
        (record,) = measure(recipe, options)
        text = record.to_json()
    if args.json:
        print(text)
    else:
        _print_summary(json.loads(text))
    return 0


def _print_summary(record: dict[str, Any]) -> None:
    for key in sorted(record):
        value = record[key]
        if isinstance(value, (dict, list)):
            value = json.dumps(value, sort_keys=True)
        print(f"{key:<28} {value}")


def cmd_benchmark(args: argparse.Namespace) -> int:
    """Wall time of each CPU case of a selection, and the total: the tier's time budget, measured."""
    from memclaims.measure import measure
    from memclaims.options import RunOptions
    from memclaims.recipe import resolve

    selection = {"singles": registry.singles(registry.single_process()),
                 "default": registry.default_selection(), "full": registry.full_matrix()}[args.selection]
    total = 0.0
    print(f"{'case':<60} {'seconds':>8}")
    for techniques in selection:
        recipe = resolve(args.workload, args.scale, techniques)
        started = time.perf_counter()
        measure(recipe, RunOptions(device="cpu", evaluate=not args.no_eval))
        elapsed = time.perf_counter() - started
        total += elapsed
        print(f"{recipe.id:<60} {elapsed:8.2f}", flush=True)
    print(f"{'total (' + str(len(selection)) + ' cases)':<60} {total:8.2f}")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memclaims.baselines import BaselineStore
    from memclaims.report import reproduce

    every = bool(getattr(args, "all", False))
    if every and args.device == "sim":
        return _reproduce_all(args)
    out = Path(args.out)
    rows = reproduce(args.device, out, store=BaselineStore(args.baselines_dir), series=every)
    print((out / "reproduce.md").read_text())
    print(f"wrote {out / 'reproduce.md'}, {out / 'reproduce.json'}, {out / 'reproduce.png'}", file=sys.stderr)
    return EXIT_FAILED_RUN if any(r.verdict == "does not hold" for r in rows) else 0


def _reproduce_all(args: argparse.Namespace) -> int:
    """Every published memory number of both documents beside the sim's prediction (memclaims.sim.published_table)."""
    from pathlib import Path

    from memclaims.sim import published_table

    rows = published_table.build_table()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = published_table.markdown(rows)
    (out / "reproduce-all.md").write_text(text + "\n")
    (out / "reproduce-all.json").write_text(published_table.to_json(rows) + "\n")
    print(text)
    print(f"wrote {out / 'reproduce-all.md'}, {out / 'reproduce-all.json'}", file=sys.stderr)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from memclaims.baselines import BaselineStore
    from memclaims.recipe import parse_id
    from memclaims.report import calibrate

    if parse_id(args.recipe).sharded:  # ranks launched here, one baseline key per rank
        from memclaims.calibration import calibrate_ranks

        per_rank = calibrate_ranks(args.recipe, args.runs, BaselineStore(args.baselines_dir), device=args.device,
                                   devices=args.devices, timeout_s=args.timeout or None)
        print(json.dumps(per_rank, indent=2, sort_keys=True))
        return 0
    tolerances = calibrate(args.recipe, args.runs, BaselineStore(args.baselines_dir), device=args.device)
    print(json.dumps(tolerances, indent=2, sort_keys=True))
    return 0


def cmd_claims(args: argparse.Namespace) -> int:
    """The claim catalogue: every claim, the tiers that check it (or why not), the last verdicts."""
    from pathlib import Path

    from memclaims import claim_runs

    path = Path(args.results)
    if path.suffix != ".json":
        path = path / claim_runs.LAST_RUN_NAME
    rows = claim_runs.table(claim_runs.read(path))
    if args.json:
        print(json.dumps({"claims": rows, "coverage": claim_runs.coverage(rows), "last_run_file": str(path)},
                         indent=2, sort_keys=True))
        return 0
    print("\n".join(claim_runs.render(rows)))
    state = "" if path.is_file() else " (absent: no pytest run has checked a claim here yet)"
    print(f"verdicts from {path}{state}")
    return 0


def cmd_accept(args: argparse.Namespace) -> int:
    from memclaims.baselines import BaselineStore

    path, keys = BaselineStore(args.baselines_dir).accept(args.environment)
    for key in keys:
        print(f"accepted {key}")
    print(f"{len(keys)} baselines stored in {path}; review and commit it", file=sys.stderr)
    return 0


def cmd_spread(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memclaims import spread
    from memclaims.environment import cpu_class

    baseline_class = cpu_class()
    recipes = args.recipe or spread.cpu_recipes()
    classes = [c for c in args.classes.split(",") if c]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    print(f"memclaims: {len(recipes)} recipes x seeds {seeds} as {baseline_class}, then seed 123 as "
          f"{', '.join(classes)}", file=sys.stderr)
    by_seed = spread.measure_as(spread.NATIVE, recipes, [123, *[s for s in seeds if s != 123]])
    by_class = {c: spread.measure_as(c, recipes, [123]) for c in classes}
    from memclaims.recipe import parse_id

    results = [spread.Spread(recipe=r, precision=parse_id(r).precision, baseline_accuracy=by_seed[r]["123"],
                             by_class={c: by_class[c][r]["123"] for c in classes}, by_seed=by_seed[r])
               for r in recipes]
    path = Path(args.baselines_dir) / "tolerances.json"
    spread.write_atomically(path, spread.tolerances_document(results, classes, seeds, baseline_class))
    for s in results:
        print(f"{s.recipe:<64} tolerance {s.tolerance * 100:5.2f} points, across classes "
              f"{s.cross_class_tolerance * 100:5.2f} points")
    print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_fit(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memclaims import fit

    if args.device != "sim":
        raise UsageError(f"fit predicts on the sim only, got --device {args.device!r}; valid devices: sim")
    budget = fit.parse_size(args.memory)
    result = fit.fit(workload_from(args), budget, profile=args.profile, scale=args.scale, sizes=sizes_from(args),
                     exact=not args.extrapolate, only=tuple(args.technique or ()), progress=None if args.json else
                     (lambda recipe_id: print(f"memclaims: predicting {recipe_id}", file=sys.stderr, flush=True)))
    if args.plot:
        fit.plot(result, Path(args.plot))
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2, sort_keys=True))
    else:
        print("\n".join(fit.table(result)))
    return 0


def cmd_fidelity(args: argparse.Namespace) -> int:
    from memclaims import fidelity

    rows = fidelity.fidelity(args.profile, article=not args.hf_only, hf=not args.article_only,
                             progress=None if args.json else
                             (lambda recipe_id: print(f"memclaims: {recipe_id}", file=sys.stderr, flush=True)))
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2, sort_keys=True))
    else:
        print("\n".join(fidelity.table(rows)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="memclaims", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    listing = commands.add_parser("list", help="techniques, workloads, scales and claims")
    listing.add_argument("--json", action="store_true")
    listing.set_defaults(handler=cmd_list)

    running = commands.add_parser("run", help="run one recipe and print its Record")
    running.add_argument("workload", help=f"one of: {', '.join(WORKLOADS)}, hf:<model_type>, or a registered one")
    running.add_argument("-t", "--technique", action="append", metavar="TECHNIQUE",
                         help="repeat to combine; none means the Fabric fp32 reference")
    running.add_argument("--device", default="cpu", choices=("cpu", "cuda", "sim"))
    running.add_argument("--scale", default="smoke", choices=("smoke", "article", GPU_SMOKE),
                         help=f"{GPU_SMOKE}: the gpu tier's smoke scale (vit, vit-h14)")
    running.add_argument("--timeout", type=_seconds, default=0, metavar="SECONDS",
                         help="wall-clock limit of a sharded run's ranks (default 0: none)")
    running.add_argument("--steps", type=_positive_int, default=None, help="optimizer steps measured")
    running.add_argument("--no-eval", action="store_true", help="skip the accuracy phase")
    running.add_argument("--devices", type=_positive_int, default=1,
                         help="processes of a sharded recipe (default: 2 on the CPU, every GPU on CUDA)")
    running.add_argument("--profile", default="article", help="GPU profile of --device sim")
    running.add_argument("--data-dir", default=None, help="folder holding CIFAR-10 / IMDb (else offline data)")
    running.add_argument("--json", action="store_true", help="print the Record as JSON")
    add_size_options(running)
    running.set_defaults(handler=cmd_run)

    bench = commands.add_parser("benchmark", help="time each CPU case of a selection")
    bench.add_argument("--selection", default="default", choices=("singles", "default", "full"))
    bench.add_argument("--workload", default="vit")
    bench.add_argument("--scale", default="smoke", choices=("smoke", "article"))
    bench.add_argument("--no-eval", action="store_true")
    bench.set_defaults(handler=cmd_benchmark)

    repro = commands.add_parser("reproduce", help="the article's chain on this machine beside the published numbers")
    repro.add_argument("--device", default="cpu", choices=("cpu", "cuda", "sim"),
                       help="cpu: smoke scale, exact bytes; sim: article scale, predicted; cuda: article scale")
    repro.add_argument("--out", default="reproduce", help="folder for reproduce.md, .json and .png")
    repro.add_argument("--baselines-dir", default="baselines", help="baseline folder for the baseline column")
    repro.add_argument("--all", action="store_true",
                       help="also the ViT-H/14 series and the LLM bonus rows (cpu: smoke scale on CPU ranks, "
                            "about 2 min more on 2 cores); with --device sim: every published memory number of "
                            "both documents, predicted")
    repro.set_defaults(handler=cmd_reproduce)

    claims_cmd = commands.add_parser("claims", help="every claim of both documents: tiers that check it, or why "
                                     "not, and the verdict of the last pytest run")
    claims_cmd.add_argument("--json", action="store_true")
    claims_cmd.add_argument("--results", default="memclaims-results",
                            help="the last-run file, or the folder holding claims-last-run.json (pytest writes it "
                                 "under --memclaims-artifacts)")
    claims_cmd.set_defaults(handler=cmd_claims)

    fitting = commands.add_parser("fit", help="which technique combinations fit a memory budget (predicted on the sim)")
    fitting.add_argument("workload", help="a workload name, hf:<model_type>, or a registered one")
    fitting.add_argument("--memory", required=True, metavar="SIZE",
                         help="the budget: what PyTorch's allocator may take, the card's memory less the CUDA "
                              "context (0.3-1 GB); 24GB (decimal, 24e9 B) or 24GiB (binary, 24 x 2^30 B)")
    fitting.add_argument("--device", default="sim", help="sim (the only device that predicts)")
    fitting.add_argument("--profile", default="article", help="the simulated GPU (memclaims list shows them)")
    fitting.add_argument("--scale", default="article", choices=("smoke", "article"))
    fitting.add_argument("--extrapolate", action="store_true",
                         help="predict deep hf: models from 2- and 4-layer replays, linearly (fast, approximate: "
                              "+1.1 %% at LLaMA-7B's shape, +10 %% at an 8-layer 1024-wide model)")
    fitting.add_argument("--plot", default=None, metavar="PNG", help="bar chart of each prediction against the budget")
    fitting.add_argument("-t", "--technique", action="append", metavar="TECHNIQUE",
                         help="consider combinations of these techniques only (repeat; default: all single-process ones)")
    fitting.add_argument("--json", action="store_true")
    add_size_options(fitting)
    fitting.set_defaults(handler=cmd_fit)

    fid = commands.add_parser("fidelity", help="predictions vs published / measured peaks, beside the "
                              "model-states-only estimate (accelerate, DeepSpeed)")
    fid.add_argument("--profile", default="article", help="sim profile of the article rows")
    only = fid.add_mutually_exclusive_group()
    only.add_argument("--article-only", action="store_true", help="only the article's rows")
    only.add_argument("--hf-only", action="store_true", help="only the hf: models (cpu tier vs sim)")
    fid.add_argument("--json", action="store_true")
    fid.set_defaults(handler=cmd_fidelity)

    base = commands.add_parser("baselines", help="measured baselines")
    base_commands = base.add_subparsers(dest="baselines_command", required=True, parser_class=_Parser)
    cal = base_commands.add_parser("calibrate", help="tolerances from the spread of repeated runs")
    cal.add_argument("recipe", help="recipe id, e.g. vit-smoke/bf16-true")
    cal.add_argument("--runs", type=_positive_int, default=3)
    cal.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    cal.add_argument("--baselines-dir", default="baselines")
    cal.add_argument("--devices", type=_positive_int, default=None,
                     help="ranks of a sharded recipe (default: 2 on the CPU, every GPU on CUDA)")
    cal.add_argument("--timeout", type=_seconds, default=0, metavar="SECONDS",
                     help="wall-clock limit of each sharded run (default 0: none)")
    cal.set_defaults(handler=cmd_calibrate)
    acc = base_commands.add_parser("accept", help="store a first run's obtained Records as the baselines")
    acc.add_argument("environment", help="the environment id the failing cases printed, e.g. cpu-x86_64-avx2-cu130")
    acc.add_argument("--baselines-dir", default="baselines")
    acc.set_defaults(handler=cmd_accept)
    spr = base_commands.add_parser("spread", help="accuracy tolerances of the cpu tier from the spread over "
                                   "seeds and CPU classes (writes baselines/tolerances.json)")
    spr.add_argument("--seeds", default="1,2,3,4", help="seeds besides the article's 123")
    spr.add_argument("--classes", default="default", help="ATEN_CPU_CAPABILITY classes to run as, e.g. default,avx2")
    spr.add_argument("--recipe", action="append", help="recipe id (default: every cpu case of the default matrix)")
    spr.add_argument("--baselines-dir", default="baselines")
    spr.set_defaults(handler=cmd_spread)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.handler(args))
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except OutOfMemory as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAILED_RUN
    except MemclaimsError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
