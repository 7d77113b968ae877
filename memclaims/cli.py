"""The ``memclaims`` console script: list, run, benchmark (and the commands of later modules).

Every option comes from the one table of options that the pytest plugin registers too
(``memclaims.core.settings``): ``--NAME`` here is ``--memclaims-NAME`` there, with the same default,
help and value check, and a relative path is taken from the working directory. Each call builds one
``Settings`` from what it was given; a handler reads it (its ``args``), never argparse's namespace.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from memclaims.core import library_eras, offline
from memclaims.core import settings as table
from memclaims.core.errors import MemclaimsError, OutOfMemory, UsageError
from memclaims.core.machine import Machine
from memclaims.core.names import ARTICLE_PROFILE, INSTALLED_TORCH_PROFILE
from memclaims.core.settings import Settings
from memclaims.techniques import technique_registry as registry

if TYPE_CHECKING:
    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Sizes
    from memclaims.techniques.base import TechniqueParameters

EXIT_FAILED_RUN = 1
EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line naming the bad value (CONTRACT: no usage dump)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # argparse takes a word that starts with "-" for an option unless it is a bare number, so
        # "--memory -5GB" was "expected one argument". Any "-" followed by a digit is a value here
        # (no option of the table is spelled so), for the table's check to name what is wrong.
        self._negative_number_matcher = re.compile(r"^-\.?\d")

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


class _OldSpelling(argparse.Action):
    """A deprecated spelling of an option: it works, and says once, in one line, what to write."""

    def __init__(self, option_strings: Sequence[str], dest: str, instead: str = "", **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.instead = instead

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(f"memclaims: warning: {option_string} is deprecated, use {self.instead}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _word(option: table.Option, command: str) -> Callable[[str], object]:
    """argparse's ``type`` for ``option``: the table's check, its message after argparse's
    ``argument --NAME:``."""
    def convert(text: str) -> object:
        try:
            return table.item(option, text, command)
        except table.BadValue as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    convert.__name__ = option.name
    return convert


def add_options(parser: argparse.ArgumentParser, command: str) -> None:
    """Every option of the table that ``command`` takes, as the table defines it."""
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for option, use in table.for_command(command):
        kwargs: dict[str, Any] = {"help": table.help_for(option, "cli", command).replace("%", "%%")}
        if option.kind == "flag":
            kwargs.update(action="store_true")
        else:
            kwargs.update(type=_word(option, command), metavar=table.metavar_for(option, command))
            if option.kind in ("list", "paths", "eras"):
                kwargs.update(nargs="*") if use.positional else kwargs.update(action="append")
            else:
                kwargs.update(default=table.default_for(option, command))
        if use.positional:
            kwargs.pop("metavar", None)
            parser.add_argument(option.attr, **kwargs)
            continue
        if use.required:
            kwargs.update(required=True)
        target: argparse._ActionsContainer = parser
        if option.exclusive:
            if option.exclusive not in groups:
                groups[option.exclusive] = parser.add_mutually_exclusive_group()
            target = groups[option.exclusive]
        names = [option.short, option.cli_option] if option.short else [option.cli_option]
        target.add_argument(*names, dest=option.attr, **kwargs)
        for old in option.cli_aliases:
            target.add_argument(old, dest=option.attr, action=_OldSpelling, instead=option.cli_option,
                                type=kwargs["type"], default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def settings_of(args: argparse.Namespace) -> Settings:
    """The call's one Settings: what ``args.command_key`` was given, else the table's defaults; a
    relative path stays relative, that is, taken from the working directory."""
    command = args.command_key
    return table.settings_from({option.attr: getattr(args, option.attr) for option, _ in table.for_command(command)},
                               Path(), command)


def selection_counts() -> dict[str, int]:
    return {name: registry.selection_size(name) for name in table.MATRICES}


def catalogue() -> dict[str, Any]:
    from memclaims.claims import catalogue as claim_registry
    from memclaims.recipes.named import NAMED_RECIPES
    from memclaims.recipes.requirements import unmet
    from memclaims.workloads.registry import WORKLOADS

    machine = _CatalogueMachine()
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
             "devices": r.devices, "published_peak_gb": r.published.peak_gb, "needs": unmet(r.needs(), machine)}
            for r in NAMED_RECIPES.values()
        ],
        "sim_profiles": _sim_profiles(),
        "library_eras": [{"era": e.name, "library": e.library, "releases": f"{e.first}-{e.last}", "changes": e.changes,
                          "source": e.source} for e in library_eras.ERAS],
        "case_counts": selection_counts(),
    }


class _CatalogueMachine(Machine):
    """This machine as the catalogue sees it: bitsandbytes installed or not, not stepped (its import and 8-bit
    step cost seconds; a case that needs it probes its backend when it runs)."""

    def bitsandbytes(self, device: str) -> str | None:
        import importlib.util

        return None if importlib.util.find_spec("bitsandbytes") else "not installed"


def _sim_profiles() -> dict[str, str]:
    from memclaims.sim import PROFILES

    return {p.name: p.summary for p in PROFILES.values()}


def cmd_list(args: Settings) -> int:
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
    from memclaims.workloads import user as user_workloads

    for name in user_workloads.names():
        print(f"  {name:<26} registered by the user (entry point or memclaims_workloads)")
    print("\nClaims (name, tiers, source):")
    for c in data["claims"]:
        print(f"  {c['name']:<26} {','.join(c['tiers']):<13} {c['source']}: {c['statement']}")
    print("\nNamed recipes (bonus scripts, ViT-H/14 series, course; what this machine lacks to run them, bitsandbytes "
          "as installed: its backend is probed when one runs):")
    for r in data["named_recipes"]:
        needs = "; ".join(r["needs"]) or "runnable"
        print(f"  {r['name']:<36} {r['workload']}: {'+'.join(r['techniques'])}  [{needs}]")
    print(f"\nSimulated GPUs (--device sim --sim-profile NAME; run and fit predict on {INSTALLED_TORCH_PROFILE!r}, "
          f"reproduce and fidelity on {ARTICLE_PROFILE!r}):")
    for name, summary in data["sim_profiles"].items():
        print(f"  {name:<26} {summary}")
    installed = {lib: library_eras.installed(lib) or "not installed" for lib in library_eras.LIBRARIES}
    others = ", ".join(f"{lib} {release}" for lib, release in installed.items() if lib != "torch")
    takers = ", ".join(table.BY_NAME["era"].cli)  # the commands the option table gives --era
    print(f"\nLibrary eras (--device sim --era LIBRARY=RELEASE on {takers}, e.g. --era bitsandbytes=0.41; "
          f"--memclaims-era in pytest): without one the sim replays the installed {others}, and torch as its profile "
          f"says (installed: {installed['torch']}):")
    for era in data["library_eras"]:
        print(f"  {era['library'] + ' ' + era['releases']:<26} {era['changes']}. Source: {era['source']}")
    counts = data["case_counts"]
    print(f"\nCases per workload and tier: singles {counts['singles']}, default {counts['default']} "
          f"(singles + the article's chain + a pairwise cover), full matrix {counts['full']}")
    return 0


def sizes_from(args: Settings) -> Sizes:
    """The size knobs of ``run`` / ``fit`` as a ``recipe.Sizes``."""
    from memclaims.recipes.recipe import Sizes

    return Sizes(batch_size=args.batch_size, seq_len=args.seq_len, image_size=args.image_size,
                 accumulation_steps=args.accumulation_steps)


def parameters_from(args: Settings) -> tuple[TechniqueParameters, ...]:
    """What ``--lora-r`` and the rest ask of the recipe's techniques (``Technique.parameters``' values)."""
    from memclaims.techniques import lora

    return lora.asked_by(args)


def workload_from(args: Settings) -> str:
    """The workload name, with ``--config`` overrides folded into an ``hf:`` name."""
    from memclaims.workloads.hf import with_config

    return with_config(args.workload, args.config, lambda line: print(f"memclaims: {line}", file=sys.stderr))


def techniques_from(args: Settings) -> tuple[list[str], list[str]]:
    """The technique names of ``-t`` (a stack's alias, ``adamw_bnb_8bit``, as the technique it names) and the
    ``"alias -> technique"`` notes to say once (``technique_registry.unalias``)."""
    return registry.unalias(args.technique or ())


def cmd_run(args: Settings) -> int:
    from memclaims.core import progress
    from memclaims.recipes.recipe import resolve
    from memclaims.recipes.run_options import RunOptions
    from memclaims.report import run_summary
    from memclaims.run import run_recipe, runs_ranks

    profile = sim_profile(args, INSTALLED_TORCH_PROFILE, args.device)  # a question about today (core/names.py)
    names, aliases = techniques_from(args)
    recipe = resolve(workload_from(args), args.scale, names, sizes_from(args), parameters_from(args))
    if args.download:
        _download_data(args.data_dir)
    print(offline.describe(args.download, "--download")[1], file=sys.stderr)  # how main set the Hub, in one line
    options = RunOptions(device=args.device, memory_steps=args.steps, evaluate=not args.no_eval,
                         data_dir=args.data_dir, devices=args.devices,  # --devices 1: one rank, not the default world
                         profile=profile, timeout_s=args.timeout or None,
                         evaluate_each_epoch=args.evaluate_each_epoch)
    device_words = f"the sim, {_profile_words(profile)}" if args.device == "sim" else args.device
    sharded = runs_ranks(recipe, options)
    said = f"{'predicting' if args.device == 'sim' else 'running'} {recipe.id} on {device_words}"
    # An alias is said once: here where only the Record follows (--json), else on the summary's techniques line.
    print(f"memclaims: {said}{', sharded' if sharded else ''}"
          + (f" ({', '.join(aliases)})" if aliases and args.json else ""), file=sys.stderr)
    with progress.ticking(recipe.id):
        records = run_recipe(recipe, options)
    if sharded:
        from memclaims.measure.distributed import DistributedResult

        result = DistributedResult.from_records(records)
        if args.json:
            print(result.to_json())
            return 0
        lines = run_summary.sharded_summary(recipe, result.records, _device_name(result.records[0], profile), aliases)
    else:
        (record,) = records
        if args.json:
            print(record.to_json())
            return 0
        lines = run_summary.summary(recipe, record, _device_name(record, profile), aliases)
    print("\n".join(lines))
    return 0


def sim_profile(args: Settings, default: str, device: str) -> str:
    """The profile a command predicts on: ``--sim-profile`` (else ``default``, the command's: core/names.py) with the
    older releases ``--era`` names (core/library_eras.py: the era travels in the profile's name). ``--era`` on a
    real ``device`` is refused in one line: a real run runs the installed releases, which no era changes."""
    if args.era and device != "sim":
        raise UsageError(f"--era replays an older library on the sim only, got --device {device!r}; use --device sim")
    return library_eras.profile_name(args.sim_profile or default, args.era)


def _device_name(record: Record, profile: str) -> str:
    """The device of a Record in words: ``simulated NVIDIA A100 (sm80), profile 'current'``, ``cpu (...)``."""
    if record.device == "sim":
        return f"{record.device_name}, sim profile {profile!r}"
    return f"{record.device} ({record.device_name})" if record.device_name else record.device


def _download_data(folder: Path | None) -> None:
    """--download: the data sets the data dir lacks, as pytest's --memclaims-download fetches them."""
    from memclaims.core.names import DATA_DIR_ENV
    from memclaims.workloads import download

    if folder is None:
        raise UsageError(f"--download needs a folder to download into: set --data-dir or ${DATA_DIR_ENV}")
    folder.mkdir(parents=True, exist_ok=True)
    try:
        lines = download.download(folder)
    except (OSError, RuntimeError) as error:  # no network, checksum mismatch
        raise UsageError(f"--download failed: {error}") from None
    for line in lines:
        print(f"memclaims: {line}", file=sys.stderr)


def _profile_words(name: str) -> str:
    """The profile and the releases it replays, in words (imported when a command says it)."""
    from memclaims.report.run_summary import profile_words

    return profile_words(name)


def cmd_benchmark(args: Settings) -> int:
    """Wall time of each CPU case of a selection, and the total: the tier's time budget, measured."""
    from memclaims.recipes import requirements
    from memclaims.recipes.recipe import for_workload, resolve
    from memclaims.recipes.run_options import RunOptions
    from memclaims.run import case_needs, run_recipe

    selection = for_workload(args.workload, registry.selection(args.matrix))
    total = 0.0
    timed = 0
    print(f"{'case':<60} {'seconds':>8}")
    for techniques in selection:
        recipe = resolve(args.workload, args.scale, techniques)
        skipped = requirements.reason(case_needs(recipe, "cpu"))  # as the cpu tier skips it (expandable-segments)
        if skipped:
            print(f"{recipe.id:<60} {'skipped':>8}  {skipped}", flush=True)
            continue
        timed += 1
        started = time.perf_counter()
        run_recipe(recipe, RunOptions(device="cpu", evaluate=not args.no_eval))
        elapsed = time.perf_counter() - started
        total += elapsed
        print(f"{recipe.id:<60} {elapsed:8.2f}", flush=True)
    print(f"{'total (' + str(timed) + ' cases)':<60} {total:8.2f}")
    return 0


def cmd_reproduce(args: Settings) -> int:
    from pathlib import Path

    from memclaims.baselines.store import BaselineStore
    from memclaims.report.reproduce import reproduce

    every = args.all
    profile = sim_profile(args, ARTICLE_PROFILE, args.device)  # reproduce: the article's profile (core/names.py)
    if args.source:
        return _reproduce_source(args, profile)
    if every and args.device == "sim":
        if args.era:  # each row of reproduce-all.md is replayed on the profile its published run needs
            raise UsageError("--era with --all: the published table replays each row on its own profile; leave out "
                             "--all (the article's chain, or --source NAME) to replay an era")
        return _reproduce_all(args)
    assert args.out is not None  # the command's default: reproduce/
    out = Path(args.out)
    if not args.baselines_dir.is_dir():  # refused at once, not an empty column after the runs (issue #49)
        if args.baselines_dir != table.default_for(table.BY_NAME["baselines-dir"], "reproduce"):
            raise UsageError(f"--baselines-dir {args.baselines_dir}: no such folder; give the folder that holds "
                             "measured/<environment>.json (a clone's baselines/)")
        print(f"memclaims: no {args.baselines_dir}/ here: the baseline column stays empty (--baselines-dir DIR "
              "names the folder)", file=sys.stderr)
    from memclaims.claims.runs import LAST_RUN_NAME

    if args.device == "sim":  # said before the replays, as run and fit say it
        print(f"memclaims: reproduce on the sim, {_profile_words(profile)}", file=sys.stderr)
    rows = reproduce(args.device, out, store=BaselineStore(args.baselines_dir), series=every,
                     profile=profile if args.device == "sim" else None,
                     last_run=Path(args.artifacts) / LAST_RUN_NAME)  # what `memclaims claims` reads
    print((out / "reproduce.md").read_text())
    print(f"wrote {out / 'reproduce.md'}, {out / 'reproduce.json'}, {out / 'reproduce.png'}", file=sys.stderr)
    return EXIT_FAILED_RUN if any(r.verdict == "does not hold" for r in rows) else 0


def _reproduce_source(args: Settings, profile: str) -> int:
    """One source's claims predicted on the sim (memclaims.report.source_claims), on ``profile``."""
    from pathlib import Path

    from memclaims.report import source_claims

    if args.device != "sim":
        raise UsageError(f"--source predicts on the sim only, got --device {args.device!r}; use --device sim "
                         "(the other tiers check a source's claims in pytest: memclaims claims --source NAME)")
    print(f"memclaims: reproduce {args.source} on the sim, {_profile_words(profile)}", file=sys.stderr)
    rows = source_claims.predict(args.source, profile)
    assert args.out is not None  # the command's default: reproduce/
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = source_claims.markdown(args.source, rows, profile)
    (out / f"source-{args.source}.md").write_text(text + "\n")
    (out / f"source-{args.source}.json").write_text(source_claims.to_json(rows) + "\n")
    print(text)
    print(f"wrote {out / f'source-{args.source}.md'}, {out / f'source-{args.source}.json'}", file=sys.stderr)
    return EXIT_FAILED_RUN if any(r.verdict == "does not hold" for r in rows) else 0


def _reproduce_all(args: Settings) -> int:
    """Every published memory number of both documents beside the sim's prediction (memclaims.report.published_table)."""
    from pathlib import Path

    from memclaims.report import published_table

    rows = published_table.build_table()
    assert args.out is not None  # the command's default: reproduce/
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = published_table.markdown(rows)
    (out / "reproduce-all.md").write_text(text + "\n")
    (out / "reproduce-all.json").write_text(published_table.to_json(rows) + "\n")
    print(text)
    print(f"wrote {out / 'reproduce-all.md'}, {out / 'reproduce-all.json'}", file=sys.stderr)
    return 0


def cmd_calibrate(args: Settings) -> int:
    from memclaims.baselines.store import BaselineStore
    from memclaims.recipes.recipe import parse_id
    from memclaims.report.calibration import calibrate

    if parse_id(args.recipe).distributed:  # ranks launched here, one baseline key per rank
        from memclaims.report.calibration import calibrate_ranks

        per_rank = calibrate_ranks(args.recipe, args.runs, BaselineStore(args.baselines_dir), device=args.device,
                                   devices=args.devices, timeout_s=args.timeout or None)
        print(json.dumps(per_rank, indent=2, sort_keys=True))
        return 0
    tolerances = calibrate(args.recipe, args.runs, BaselineStore(args.baselines_dir), device=args.device)
    print(json.dumps(tolerances, indent=2, sort_keys=True))
    return 0


def cmd_claims(args: Settings) -> int:
    """The claim catalogue: every claim, the tiers that check it (or why not), the last verdicts."""

    from memclaims.claims import catalogue
    from memclaims.claims import runs as claim_runs

    path = args.artifacts
    if path.suffix != ".json":
        path = path / claim_runs.LAST_RUN_NAME
    rows = catalogue.table(claim_runs.read(path))
    if args.source:
        from memclaims.core import published

        if args.source not in published.documents():
            raise UsageError(f"--source {args.source}: no such source; valid: {', '.join(published.documents())}")
        rows = [row for row in rows if row["document"] == args.source]
    if args.json:
        print(json.dumps({"claims": rows, "coverage": claim_runs.coverage(rows), "last_run_file": str(path)},
                         indent=2, sort_keys=True))
        return 0
    print("\n".join(claim_runs.render(rows)))
    state = "" if path.is_file() else " (absent: no pytest run has checked a claim here yet)"
    print(f"verdicts from {path}{state}")
    return 0


def cmd_accept(args: Settings) -> int:
    from memclaims.baselines.store import BaselineStore

    path, keys = BaselineStore(args.baselines_dir).accept(args.environment)
    for key in keys:
        print(f"accepted {key}")
    print(f"{len(keys)} baselines stored in {path}; review and commit it", file=sys.stderr)
    return 0


def cmd_spread(args: Settings) -> int:
    from pathlib import Path

    from memclaims.report import spread

    classes = [c for c in args.classes.split(",") if c]
    seeds = [123, *(int(s) for s in args.seeds.split(",") if s and int(s) != 123)]
    changes = [Path(p) for p in args.changes or []]
    missing = [str(p) for p in changes if not p.is_file()]
    if missing:
        raise UsageError(f"--changes {missing[0]}: no such file (the records.jsonl `memclaims upgrade` writes in its --out folder, or "
                         f"`python -m memclaims.report.candidate --out FILE` writes)")
    from memclaims.core import packaged

    # Before the measurement (many minutes): a run must not end unable to write.
    out = packaged.output_path(packaged.TOLERANCES, args.out, "memclaims baselines spread")
    print(f"memclaims: converged cases at seeds {seeds}, mutations, then the worker as "
          f"{', '.join(classes) or 'no other class'}; changes from {len(changes)} file(s)", file=sys.stderr)
    reuse = None
    if args.reuse_seeds:
        from memclaims.baselines.store import read_tolerances

        reuse = read_tolerances(out)
        if not reuse.get("accuracy", {}).get("recipes"):
            raise UsageError(f"--reuse-seeds: {out} holds no measured seeds to reuse; run without it first")
    data = spread.measure_noise(Path(args.baselines_dir), out, classes, changes, seeds, reuse=reuse)
    for recipe_id, entry in data["accuracy"]["recipes"].items():
        print(f"{recipe_id:<48} same {entry['same'] * 100:5.2f} points, after a change {entry['change'] * 100:5.2f} "
              f"points ({len(entry['by_change'])} changes measured)")
    print(f"loss per step after a change: {', '.join(f'{t * 100:.2f} %' for t in data['losses']['per_step'])}")
    print(f"wrote {out}", file=sys.stderr)
    return 0


def cmd_fit(args: Settings) -> int:
    from pathlib import Path

    from memclaims.report import fit

    if args.device != "sim":
        raise UsageError(f"fit predicts on the sim only, got --device {args.device!r}; valid devices: sim")
    assert args.memory is not None  # required by the command
    from memclaims.core import progress as progress_bar

    budget = fit.parse_size(args.memory)
    only, aliases = techniques_from(args)
    if aliases and not args.json:
        print(f"memclaims: {', '.join(aliases)}", file=sys.stderr)
    profile = sim_profile(args, INSTALLED_TORCH_PROFILE, args.device)  # what fits today (core/names.py)
    result = fit.fit(workload_from(args), budget, profile=profile, scale=args.scale, sizes=sizes_from(args),
                     exact=not args.extrapolate, only=tuple(only), devices=args.devices,
                     parameters=parameters_from(args),
                     # said once the budget is judged: a refusal stays one line
                     answering=None if args.json else
                     (lambda: print(f"memclaims: fit on the sim, {_profile_words(profile)}", file=sys.stderr)),
                     progress=None if args.json or progress_bar.shown() else  # a terminal shows the bar
                     (lambda recipe_id: print(f"memclaims: predicting {recipe_id}", file=sys.stderr, flush=True)))
    if args.plot:
        fit.plot(result, Path(args.plot))
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        print(json.dumps(result.as_dict(), indent=2, sort_keys=True))
    else:
        print("\n".join(fit.table(result)))
    return 0 if result.fits else 1  # docs/commands.md: 0 something fits, 1 nothing does, 2 a usage error


def cmd_fidelity(args: Settings) -> int:
    from memclaims.report import fidelity

    if args.era and not args.article_only:
        raise UsageError("--era replays an older library on the sim only, and fidelity's hf: rows are real runs on "
                         "the cpu of the installed releases; add --article-only")
    profile = sim_profile(args, ARTICLE_PROFILE, "sim")  # the article's rows: the article's profile (core/names.py)
    if not args.json and not args.hf_only:  # the hf: rows' sim side has its own profile (report/fidelity.py)
        print(f"memclaims: fidelity's article rows on the sim, {_profile_words(profile)}", file=sys.stderr)
    rows = fidelity.fidelity(profile, article=not args.hf_only, hf=not args.article_only,
                             progress=None if args.json else
                             (lambda recipe_id: print(f"memclaims: {recipe_id}", file=sys.stderr, flush=True)))
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2, sort_keys=True))
    else:
        print("\n".join(fidelity.table(rows)))
    return 0


def cmd_upgrade(args: Settings) -> int:
    from pathlib import Path

    from memclaims.baselines.store import BaselineStore
    from memclaims.report import upgrade

    specs = upgrade.parse_specs(args.spec) if args.spec or not args.newest else []
    if args.newest:
        specs += [s for s in upgrade.newest() if s.name not in {named.name for named in specs}]
    if args.accept and args.lock is None:
        raise UsageError("--accept bumps a lock: give it with --lock FILE (e.g. --lock locks/ci.txt)")
    tiers = [t for t in args.tiers.split(",") if t]
    from memclaims.report.candidate import TIERS

    unknown = [t for t in tiers if t not in TIERS]
    if unknown:
        raise UsageError(f"--tiers: unknown tier {unknown[0]!r}; valid tiers: {', '.join(TIERS)}")
    assert args.out is not None  # the command's default: upgrade/
    out = Path(args.out)
    report = upgrade.upgrade(specs, out, BaselineStore(args.baselines_dir), tiers=tiers,
                             env_dir=Path(args.env_dir) if args.env_dir else None,
                             lock_file=Path(args.lock) if args.lock else None,
                             progress=lambda text: print(f"memclaims upgrade: {text}", file=sys.stderr, flush=True))
    print("\n".join(upgrade.summary_lines(report)))
    print(f"wrote {out / 'upgrade.md'}, {out / 'upgrade.json'} and the candidate's Records {out / 'records.jsonl'}",
          file=sys.stderr)
    if not report.passed:
        if args.record or args.accept:
            print("memclaims upgrade: not recorded as tested: " + ("a number regressed" if report.regressions else
                  "a case failed to run" if report.errors else "nothing was compared"), file=sys.stderr)
        return EXIT_FAILED_RUN
    if args.accept:
        assert args.lock is not None
        if report.improvements:
            print(f"memclaims upgrade: the lock is not bumped: {len(report.improvements)} numbers improved past their "
                  "tolerance, so CI under the new lock would fail them as stale; refresh their baselines under the "
                  "candidate first (pytest --update-baselines in its --env-dir), then run this again", file=sys.stderr)
            return EXIT_FAILED_RUN
        import shutil

        shutil.copyfile(out / "lock.txt", args.lock)
        print(f"memclaims upgrade: wrote the candidate's lock over {args.lock}", file=sys.stderr)
    if args.record or args.accept:
        from memclaims.report import tested_release

        where = tested_release.record(report.stack, upgrade.moved(report))
        print(f"memclaims upgrade: recorded {', '.join(f'{p} {v}' for p, v in report.stack.items() if v)} as tested "
              f"in {where}", file=sys.stderr)
    return 0


def cmd_report(args: Settings) -> int:
    from memclaims.report import html_report, summary_document

    assert args.summary_file is not None  # positional, required
    data = summary_document.load(args.summary_file)
    out = args.out if args.out is not None else args.summary_file.with_suffix(".html")
    print(f"wrote {html_report.write(data, out)}")
    return 0


def cmd_history(args: Settings) -> int:
    from memclaims.report import history

    assert args.runs_dir is not None  # positional, required
    trends = history.read_runs(args.runs_dir)
    if args.json:
        print(json.dumps(trends.as_dict(), indent=2, sort_keys=True))
    else:
        print("\n".join(history.table(trends)))
    if args.plot is not None:
        print(f"wrote {history.plot(trends, args.plot)}", file=sys.stderr)
    return 0


# Each command: (name, help, handler). A nested name ("baselines calibrate") is a subcommand of
# the first word's command; its options are the table's rows that name it (memclaims.core.settings).
COMMANDS: tuple[tuple[str, str, Callable[[Settings], int]], ...] = (
    ("list", "techniques, workloads, scales and claims", cmd_list),
    ("run", "run one recipe: what it resolved, its peaks in GB and GiB, per phase (--json: its Record)", cmd_run),
    ("benchmark", "time each CPU case of a selection", cmd_benchmark),
    ("reproduce", "the article's chain on this machine beside the published numbers", cmd_reproduce),
    ("claims", "every claim of every source (the article, the course, the techniques' own documentation): tiers "
     "that check it, or why not, and the verdict of the last pytest run", cmd_claims),
    ("fit", "which technique combinations fit a memory budget (predicted on the sim)", cmd_fit),
    ("fidelity", "predictions vs published / measured peaks, beside the model-states-only estimate "
     "(accelerate, DeepSpeed)", cmd_fidelity),
    ("upgrade", "a candidate release (torch==2.15.0 ...) in an isolated environment, judged against the "
     "committed baselines: what moved, attributed", cmd_upgrade),
    ("report", "the HTML report of a pytest run, from its summary JSON (--memclaims-summary-json)", cmd_report),
    ("history", "trends over many runs' summary JSON files: where each metric first moved, and which "
     "library versions changed there", cmd_history),
    ("baselines calibrate", "tolerances from the spread of repeated runs", cmd_calibrate),
    ("baselines accept", "store a first run's obtained Records as the baselines", cmd_accept),
    ("baselines spread", "the measured noise of a numerics change: converged accuracy over seeds, CPU classes "
     "and library releases, loss steps (writes tolerances.json)", cmd_spread),
)
GROUPS = {"baselines": "measured baselines"}  # commands that only hold subcommands
# What `memclaims --help` tells a user (the module's docstring is for developers).
DESCRIPTION = ("Memory-saving techniques for PyTorch training, measured: the peak memory of a recipe (a workload and "
               "the techniques it combines) on the CPU (exact tensor bytes), a CUDA GPU, or the sim (predicted at "
               "article scale on a simulated A100), and the published claims about them checked. Start with "
               "`memclaims list`, then `memclaims run vit -t bf16-true --device sim`; each command takes --help.")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="memclaims", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    nested: dict[str, argparse._SubParsersAction[_Parser]] = {}
    for name, help_text, handler in COMMANDS:
        group, _, sub = name.rpartition(" ")
        if group and group not in nested:
            holder = commands.add_parser(group, help=GROUPS[group])
            nested[group] = holder.add_subparsers(dest=f"{group}_command", required=True, parser_class=_Parser)
        command = (nested[group] if group else commands).add_parser(sub, help=help_text)
        add_options(command, name)
        command.set_defaults(handler=handler, command_key=name)
    return parser


def parse(argv: Sequence[str] | None = None) -> tuple[Callable[[Settings], int], Settings]:
    """The handler of the command ``argv`` names, and the call's Settings (a bad value: UsageError)."""
    args = build_parser().parse_args(argv)
    return args.handler, settings_of(args)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        handler, settings = parse(argv)
        # Before any handler imports a Hub client: the libraries read their offline switch at import, and
        # the ranks and subprocesses a command starts inherit it (memclaims.core.offline).
        with offline.hub_mode(settings.download, "--download"):
            return int(handler(settings))
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
