"""Every option of both front ends, as one table, and the one :class:`Settings` built from it.

The pytest plugin (``--memclaims-NAME`` on the command line, ``memclaims_NAME`` in the ini file) and
the ``memclaims`` command line (``--NAME``) both register their options from ``OPTIONS``: the same
names, defaults, help and value checks. Each builds one frozen ``Settings`` from it, once per pytest
session (``memclaims.pytest.plugin``) and once per command-line call (``memclaims.cli``); everything
downstream reads that object. An option one front end lacks is still defined here, marked with
where it applies (``pytest``, ``ini``, ``cli``: the commands that take it).

The one rule for relative paths: ``base / path``, where ``base`` is the pytest rootdir in pytest and
the working directory on the command line (``settings_from``); each path option says so in its help.
A bad value is one line naming the option, the value and what is valid (``BadValue``: the front end
adds the option's spelling and turns it into pytest.UsageError or exit status 2).

Data only: imports nothing of the training stack, since the plugin registers these options before the
environment preflight has looked at torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from memclaims.core import library_eras
from memclaims.core.errors import UsageError
from memclaims.core.names import (
    ARTICLE_PROFILE,
    BUILT_IN_WORKLOADS,
    DATA_DIR_ENV,
    DEVICES,
    GPU_SMOKE,
    INSTALLED_TORCH_PROFILE,
    SIM_MEMORY_STEPS,
    SIM_PROFILES,
    Device,
    data_dir,
)

Matrix = Literal["singles", "default", "full"]  # memclaims.techniques.technique_registry.SELECTIONS
GpuScale = Literal["article", "smoke"]  # the gpu tier's scale: smoke runs each workload's gpusmoke scale
Summary = Literal["problems", "all"]
Scale = Literal["smoke", "article", "gpusmoke"]  # memclaims.core.names' scale names
MATRICES: tuple[str, ...] = get_args(Matrix)
GPU_SCALES: tuple[str, ...] = get_args(GpuScale)
SUMMARIES: tuple[str, ...] = get_args(Summary)
SCALES: tuple[str, ...] = get_args(Scale)


# What a value must look like. Each parses a text (from a command line or an ini file) into the
# Settings field's type; "list" and "paths" collect a repeated option (or a positional's words).
Kind = Literal["flag", "count", "choice", "text", "path", "percent", "events", "megabytes", "seconds", "number",
               "lines", "list", "paths", "eras"]
# Kinds whose value is a tuple of words: "list" and "paths" a repeated option's, "lines" an ini line list's, "eras"
# both a repeated option's and comma-separated words' (pytest's option is given once).
TUPLE_KINDS = ("list", "paths", "lines", "eras")
PATH_KINDS = ("path", "paths")
Front = Literal["pytest", "ini", "cli"]
BASE = {"pytest": "the rootdir", "ini": "the rootdir", "cli": "the working directory"}


class BadValue(ValueError):
    """A value an option does not take: what was expected and what was given, in one line (the front
    end puts the option's spelling before it)."""


_UNSET: object = object()


@dataclass(frozen=True)
class Use:
    """How a command of the ``memclaims`` command line takes an option, where it differs from the table."""

    default: object = _UNSET
    help: str | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    required: bool = False
    positional: bool = False  # ``memclaims run WORKLOAD``: an argument, not ``--workload``


USE = Use()  # as the table defines it


@dataclass(frozen=True)
class Option:
    name: str  # kebab-case: --memclaims-NAME, memclaims_NAME (ini), --NAME (command line)
    kind: Kind
    help: str
    default: Any = None  # parsed, before a path is taken relative to its base
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    pytest: bool = False  # a pytest command-line option
    ini: bool | None = None  # an ini option; None: wherever it is a pytest option
    pytest_flag: str | None = None  # a pytest spelling outside the namespace (--update-baselines)
    # Other pytest plugins' spellings of the same request that pytest takes for it too (--force-regen).
    pytest_aliases: tuple[str, ...] = ()
    cli: Mapping[str, Use] = field(default_factory=dict)  # command ("baselines accept") -> how it takes it
    cli_aliases: tuple[str, ...] = ()  # old spellings on the command line: they work, with a warning
    short: str | None = None  # -t
    exclusive: str | None = None  # options of one group a command takes at most one of

    @property
    def attr(self) -> str:
        """The Settings field, the pytest dest without its prefix, the command line's dest."""
        return self.name.replace("-", "_")

    @property
    def in_ini(self) -> bool:
        return self.pytest if self.ini is None else self.ini

    @property
    def pytest_option(self) -> str:
        return self.pytest_flag or f"--memclaims-{self.name}"

    @property
    def pytest_dest(self) -> str:
        return self.pytest_option.removeprefix("--").replace("-", "_")

    @property
    def ini_name(self) -> str:
        return f"memclaims_{self.attr}"

    @property
    def cli_option(self) -> str:
        return f"--{self.name}"


def _flags(*commands: str) -> dict[str, Use]:
    return {command: USE for command in commands}


_SIZE_COMMANDS = _flags("run", "fit")
_BASELINE_COMMANDS = _flags("reproduce", "upgrade", "baselines calibrate", "baselines accept", "baselines spread")

OPTIONS: tuple[Option, ...] = (
    # --- both front ends, or pytest only ---------------------------------------------------------
    Option("matrix", "choice", "the technique combinations that become cases: singles, default (singles + the "
           "article's chain + a pairwise cover) or full", default="default", choices=MATRICES, pytest=True,
           cli=_flags("benchmark"), cli_aliases=("--selection",)),
    Option("gpu-scale", "choice", "scale of the gpu tier: article, or smoke (each workload's gpusmoke scale where "
           "it has one: ViT-B/16 width at 128 px for vit)", default="article", choices=GPU_SCALES, pytest=True),
    Option("steps", "count", f"optimizer steps measured per run (default: the scale's; {SIM_MEMORY_STEPS} on the sim)", metavar="N", pytest=True,
           cli=_flags("run")),
    Option("accuracy-epochs", "count", "epochs of the accuracy phase per case (default: the scale's; 1 at "
           "article scale, as the article)", metavar="N", pytest=True),
    Option("accuracy-full-epochs", "flag", "accuracy from whole epochs and the whole test set even where the "
           "scale has a budgeted schedule (article scale: 50 steps, 2,000 test images); the weekly run",
           default=False, pytest=True),
    Option("vit-h14", "flag", "also run the ViT-H/14 series (518 px, 16-mixed, batch 4 per GPU) in the gpu tier",
           default=False, pytest=True),
    Option("sim-profile", "choice", f"the simulated GPU and torch of the sim tier and of --device sim (memclaims "
           f"list shows the profiles; default: {INSTALLED_TORCH_PROFILE}, the installed torch's defaults, for run, fit "
           f"and a user workload's sim tier; {ARTICLE_PROFILE}, the article's A100 and torch of 2023, for fidelity, "
           "reproduce and the built-in workloads' sim tier)", choices=SIM_PROFILES, metavar="NAME", pytest=True,
           cli=_flags("run", "fit", "fidelity"), cli_aliases=("--profile",)),
    Option("era", "eras", "an older release of a library to predict for, where what it changes is known "
           "(memclaims list shows the eras and their sources): e.g. bitsandbytes=0.41, whose 4-bit matmul kept its "
           "input for backward; repeat it, or separate with commas, for several libraries; default: the installed "
           "releases", default=(), metavar="LIBRARY=RELEASE", pytest=True,
           cli=_flags("run", "fit", "reproduce", "fidelity")),
    Option("workload", "text", "the workload the technique matrix runs on: vit, another built-in, "
           "hf:<model_type>, or one registered by an entry point (group memclaims.workloads.vit) or "
           "memclaims_workloads", default="vit", metavar="NAME", pytest=True,
           cli={"benchmark": USE, **dict.fromkeys(("run", "fit"), Use(
               positional=True, help=f"one of: {', '.join(BUILT_IN_WORKLOADS)}, hf:<model_type>, or a "
               "registered one"))}),
    Option("workloads", "lines", "workload factories to register, one package.module:factory per line (each "
           "returns a memclaims Workload; see memclaims.workloads.user.define)", default=(), ini=True),
    Option("data-dir", "path", f"folder holding CIFAR-10 / IMDb (default: ${DATA_DIR_ENV}, else offline data)",
           metavar="DIR", pytest=True, cli=_flags("run")),
    Option("download", "flag", "download CIFAR-10 into <data-dir>/images and IMDb into <data-dir>/text before "
           "anything runs, where missing, and let the Hugging Face libraries reach the Hub (otherwise memclaims "
           "runs them offline: HF_HUB_OFFLINE=1); needs internet and a data dir; off by default", default=False,
           pytest=True, cli=_flags("run")),
    Option("update-baselines", "flag", "store the Records of the cases that ran as their baselines, instead of "
           "comparing (pytest-regressions' --force-regen is taken for it)", default=False, pytest=True, ini=False,
           pytest_flag="--update-baselines", pytest_aliases=("--force-regen",)),
    Option("strict", "flag", "fail when a metric is better than its baseline beyond tolerance (stale baseline)",
           default=False, pytest=True),
    Option("accept-regressions", "flag", "with --update-baselines: store a Record even where it is worse than its "
           "baseline (otherwise the case fails and nothing is stored)", default=False, pytest=True),
    Option("summary", "choice", "end-of-run baseline table: 'problems' (what is not ok, worst first; the default) "
           "or 'all' (every metric; also with -v)", default="problems", choices=SUMMARIES, pytest=True),
    Option("time-threshold", "percent", "fail when the step time grows by more than PCT percent over its baseline "
           "(default: step time is only reported)", metavar="PCT", pytest=True),
    Option("summary-json", "path", "write the run's summary as JSON to PATH: every baseline comparison, the "
           "failures, the claims' verdicts, the versions (what memclaims report and memclaims history read)",
           metavar="PATH", pytest=True),
    Option("html", "path", "write the run's report as one self-contained HTML file to PATH", metavar="PATH",
           pytest=True),
    Option("summary-file", "path", "a summary JSON written by pytest --memclaims-summary-json", metavar="SUMMARY",
           cli={"report": Use(positional=True, required=True)}),
    Option("runs-dir", "path", "a folder holding the summary JSON files of many runs (searched recursively)",
           metavar="DIR", cli={"history": Use(positional=True, required=True)}),
    Option("baselines-dir", "path", "the baseline folder, holding measured/<environment>.json (default: "
           "baselines/)", default=Path("baselines"), metavar="DIR", pytest=True, cli=_BASELINE_COMMANDS),
    Option("artifacts", "path", "the results folder: pytest writes the claims' verdicts there "
           "(claims-last-run.json, which memclaims claims reads, given the folder or the file) and the "
           "breakdown JSON and CUDA snapshot of a case that fails on memory (default: memclaims-results/)",
           default=Path("memclaims-results"), metavar="DIR", pytest=True, cli=_flags("claims"),
           cli_aliases=("--results",)),
    Option("memory-history", "events", "CUDA allocator events recorded per case for the snapshot saved on a "
           "memory failure; 0 turns recording off", default=100_000, metavar="N", pytest=True),
    Option("snapshot-max-mb", "megabytes", "largest CUDA snapshot file kept per case, in decimal MB (oldest "
           "events, then stack frames, are dropped to fit)", default=50.0, metavar="MB", pytest=True),
    # --- the command line only -------------------------------------------------------------------
    Option("recipe", "text", "recipe id, e.g. vit-smoke/bf16-true", default="",
           cli={"baselines calibrate": Use(positional=True)}),
    Option("source", "text", "only the claims of this source (a document name of memclaims claims: "
           "article, course, pytorch-docs...)", default="", metavar="NAME",
           cli={"claims": USE, "reproduce": Use(help="with --device sim: predict this source's claims on the sim, "
                                                     "published beside predicted (source-NAME.md, .json)")}),
    Option("environment", "text", "the environment id the failing cases printed, e.g. cpu-x86_64-avx2-cu130",
           default="", cli={"baselines accept": Use(positional=True)}),
    Option("spec", "list", "requirements of the candidate, e.g. torch==2.15.0 lightning==2.6.6", default=(),
           cli={"upgrade": Use(positional=True)}),
    Option("technique", "list", "repeat to combine; none means the Fabric fp32 reference", default=(),
           metavar="TECHNIQUE", short="-t",
           cli={"run": USE, "fit": Use(help="consider combinations of these techniques only (repeat; default: "
                                            "all single-process ones)")}),
    Option("device", "choice", "cpu: a real run, exact tensor bytes; cuda: a real run, allocator statistics; "
           "sim: predicted on fake tensors", default="cpu", choices=DEVICES,
           cli={"run": USE,
                "reproduce": Use(help="cpu: smoke scale, exact bytes; sim: article scale, predicted; cuda: "
                                      "article scale"),
                "baselines calibrate": Use(choices=("cpu", "cuda")),
                "fit": Use(default="sim", choices=("sim",), help="sim (the only device that predicts)")}),
    Option("scale", "choice", f"smoke, article, or {GPU_SMOKE} (the gpu tier's smoke scale: vit, vit-h14)",
           default="smoke", choices=SCALES,
           cli={"run": USE, "benchmark": Use(choices=("smoke", "article"), help="smoke or article"),
                "fit": Use(default="article", choices=("smoke", "article"), help="smoke or article")}),
    Option("timeout", "seconds", "stop a sharded run whose ranks make no progress (no phase begun or ended) for this long (default 0: never)", default=0.0,
           metavar="SECONDS", cli=_flags("run", "baselines calibrate")),
    Option("no-eval", "flag", "skip the accuracy phase", default=False, cli=_flags("run", "benchmark")),
    Option("evaluate-each-epoch", "flag", "also evaluate (eval loss, accuracy, F1) after every epoch of an "
           "epochs accuracy schedule, as the course's Trainer logs (the Record's epoch_evaluations; one "
           "device)", default=False, cli=_flags("run")),
    Option("devices", "count", "processes of a sharded recipe (default: 2 on the CPU, every GPU on CUDA, 4 on the sim)",
           metavar="N", cli={**_flags("run", "baselines calibrate"),
                             "fit": Use(help="GPUs of the budget: also consider the strategies (FSDP, DDP, ZeRO) "
                                             "over N GPUs, each GPU within --memory (default: one GPU)")}),
    Option("batch-size", "count", "examples per optimizer step (before small-batch divides it)", metavar="N",
           cli=_SIZE_COMMANDS),
    Option("seq-len", "count", "tokens per sequence (text workloads)", metavar="N", cli=_SIZE_COMMANDS,
           exclusive="size"),
    Option("image-size", "count", "image side in pixels, a multiple of the patch (ViT workloads)", metavar="N",
           cli=_SIZE_COMMANDS, exclusive="size"),
    Option("accumulation-steps", "count", "micro-batches per optimizer step under -t grad-accum", metavar="N",
           cli=_SIZE_COMMANDS),
    Option("config", "text", "config overrides of an hf:<model_type> workload, e.g. hidden_size=4096,"
           "num_hidden_layers=32 (and head=causal-lm|classification, attn_implementation=sdpa|eager), or a "
           "config.json file, read as transformers reads it", metavar="K=V,...|FILE", cli=_SIZE_COMMANDS),
    # lora's and qlora's parameters (memclaims.techniques.lora): each recipe that asks one has its own id and baselines.
    Option("lora-r", "count", "the LoRA adapters' rank (peft's LoraConfig r) of -t lora / -t qlora (default: the "
           "workload's, else 8)", metavar="N", pytest=True, cli=_SIZE_COMMANDS),
    Option("lora-alpha", "number", "the LoRA adapters' scale numerator (peft's lora_alpha: the output is scaled by "
           "alpha / r; default: the workload's, else 16)", metavar="ALPHA", pytest=True, cli=_SIZE_COMMANDS),
    Option("lora-dropout", "number", "the dropout before the LoRA adapters (peft's lora_dropout, in [0, 1); "
           "default: the workload's, else 0.1)", metavar="P", pytest=True, cli=_SIZE_COMMANDS),
    Option("lora-targets", "text", "the modules that get LoRA adapters, comma-separated (peft's target_modules, "
           "matched as suffixes of the model's module names, e.g. q_proj,v_proj; default: the workload's, for an "
           "hf: model peft's default for its type)", metavar="NAME,...", pytest=True, cli=_SIZE_COMMANDS),
    Option("memory", "text", "the budget: what PyTorch's allocator may take, the card's memory less the CUDA "
           "context (0.3-1 GB); 24GB (decimal, 24e9 B) or 24GiB (binary, 24 x 2^30 B)", metavar="SIZE",
           cli={"fit": Use(required=True)}),
    Option("extrapolate", "flag", "predict deep hf: models from 2- and 4-layer replays, linearly (fast, "
           "approximate: +1.1 % at LLaMA-7B's shape, +10 % at an 8-layer 1024-wide model)", default=False,
           cli=_flags("fit")),
    Option("plot", "path", "bar chart of each prediction against the budget", metavar="PNG",
           cli={"fit": USE, "history": Use(help="each metric that moved, over the runs (relative to its first run)")}),
    Option("article-only", "flag", "only the article's rows", default=False, cli=_flags("fidelity"),
           exclusive="only"),
    Option("hf-only", "flag", "only the hf: models (cpu tier vs sim)", default=False, cli=_flags("fidelity"),
           exclusive="only"),
    Option("all", "flag", "also the ViT-H/14 series and the LLM bonus rows (cpu: smoke scale on CPU ranks, about "
           "2 min more on 2 cores); with --device sim: every published memory number of both documents, "
           "predicted", default=False, cli=_flags("reproduce")),
    Option("out", "path", "where the command writes", metavar="DIR",
           cli={"reproduce": Use(default=Path("reproduce"), help="folder for reproduce.md, .json and .png"),
                "upgrade": Use(default=Path("upgrade"), help="folder for upgrade.md, upgrade.json and records.jsonl"),
                "report": Use(metavar="HTML", help="the HTML file to write (default: SUMMARY with .html)"),
                "baselines spread": Use(metavar="FILE", help="default: the packaged tolerances.json where "
                                        "memclaims runs from a writable checkout; elsewhere "
                                        "BASELINES_DIR/tolerances.json, which the baseline store then reads")}),
    Option("tiers", "text", "what the candidate measures (python -m memclaims.report.candidate --help)",
           default="cpu,converged,dist,sim", cli=_flags("upgrade")),
    Option("env-dir", "path", "keep (and reuse) the candidate environment here", metavar="DIR",
           cli=_flags("upgrade")),
    Option("newest", "flag", "also each tested package (torch, torchvision, lightning, torchmetrics, transformers, "
           "bitsandbytes) at its newest release that installs beside the rest", default=False, cli=_flags("upgrade")),
    Option("lock", "path", "the candidate is this lock (e.g. locks/ci.txt) with the specs applied, compiled by uv "
           "beside it (OUT/lock.txt), instead of the specs beside this environment's releases", metavar="FILE",
           cli=_flags("upgrade")),
    Option("record", "flag", "when no number regressed and every case ran, record the candidate's releases as "
           "tested, with what they moved (memclaims/resources/tested_versions.json; a checkout only)", default=False,
           cli=_flags("upgrade")),
    Option("accept", "flag", "bump the lock: with --lock, when no number regressed or went stale and every case "
           "ran, write the candidate's lock over FILE and record its releases as tested", default=False,
           cli=_flags("upgrade")),
    Option("runs", "count", "runs whose spread gives the tolerances", default=3, metavar="N",
           cli=_flags("baselines calibrate")),
    Option("seeds", "text", "seeds besides the article's 123", default="1,2,3,4", cli=_flags("baselines spread")),
    Option("classes", "text", "ATEN_CPU_CAPABILITY classes to run as, e.g. default,avx2", default="default",
           cli=_flags("baselines spread")),
    Option("changes", "paths", "Records of another library release (the records.jsonl memclaims upgrade writes in --out, or python -m "
           "memclaims.report.candidate --out FILE in that environment); repeat", default=(), metavar="FILE",
           cli=_flags("baselines spread")),
    Option("reuse-seeds", "flag", "keep the seeds and mutations of the existing file (measured on this stack): "
           "only the changes are read again, in seconds", default=False, cli=_flags("baselines spread")),
    Option("json", "flag", "print JSON", default=False,
           cli={**_flags("list", "claims", "fit", "fidelity", "history"), "run": Use(help="print the Record as JSON")}),
)
BY_NAME: dict[str, Option] = {option.name: option for option in OPTIONS}


def for_command(command: str) -> list[tuple[Option, Use]]:
    """The options ``memclaims COMMAND`` takes, in the table's order."""
    return [(option, option.cli[command]) for option in OPTIONS if command in option.cli]


def default_for(option: Option, command: str | None = None) -> object:
    """The option's default, in ``command`` where it differs there."""
    use = option.cli.get(command) if command else None
    return option.default if use is None or use.default is _UNSET else use.default


def choices_for(option: Option, command: str | None = None) -> tuple[str, ...]:
    use = option.cli.get(command) if command else None
    return use.choices if use is not None and use.choices is not None else option.choices


def help_for(option: Option, front: Front, command: str | None = None) -> str:
    """The help text each front end shows: the table's (or the command's own), where a relative path
    is taken from, and on pytest's command line the ini name."""
    use = option.cli.get(command) if front == "cli" and command else None
    text = use.help if use is not None and use.help is not None else option.help
    if option.kind in PATH_KINDS:
        text += f" (a relative path is taken from {BASE[front]})"
    if front == "pytest" and option.in_ini:
        text += f" (ini: {option.ini_name})"
    if front == "cli" and option.cli_aliases and not (use is not None and use.positional):
        text += f" (old spelling {', '.join(option.cli_aliases)}: deprecated)"
    return text


def metavar_for(option: Option, command: str | None = None) -> str | None:
    """``{a,b,c}`` for a choice, as argparse shows choices; else the table's (or the command's)."""
    use = option.cli.get(command) if command else None
    if use is not None and use.metavar is not None:
        return use.metavar
    choices = choices_for(option, command)
    if choices and option.metavar is None:
        return "{" + ",".join(choices) + "}"
    return option.metavar


def text_default(option: Option) -> str | list[str]:
    """The default as an ini file would spell it (``parse`` reads it back as ``option.default``)."""
    value = option.default
    if option.kind == "lines":
        return list(value)
    if option.kind == "eras":
        return ",".join(value)
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse(option: Option, raw: Any, command: str | None = None) -> object:
    """The value of ``option`` given as ``raw`` (a text; a bool for a pytest flag; a list for an ini
    line list), checked; an empty text means the default. Raises BadValue."""
    kind = option.kind
    if kind == "lines":
        lines = raw.splitlines() if isinstance(raw, str) else list(raw or ())
        return tuple(line.strip() for line in lines if line.strip())
    if kind in ("list", "paths"):  # the command line's repeated option: a list of words, or None
        return tuple(item(option, word) for word in raw or ())
    if kind == "eras":  # words separated by commas, given once (pytest, the ini file) or repeated (the command line)
        words = [raw] if isinstance(raw, str) else list(raw or ())
        return tuple(item(option, word) for text in words for word in text.split(",") if word.strip())
    if isinstance(raw, bool) and kind == "flag":
        return raw
    text = "" if raw is None else str(raw).strip()
    if not text:
        return default_for(option, command)
    if kind == "flag":
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise BadValue(f"expected true or false, got {text!r}")
    return item(option, text, command)


def item(option: Option, text: str, command: str | None = None) -> Any:
    """One word's value (the command line's ``type``: argparse calls it per occurrence)."""
    kind = option.kind
    if kind == "count":
        if not text.isdigit() or int(text) < 1:
            raise BadValue(f"expected a positive integer, got {text!r}")
        return int(text)
    if kind == "events":
        if not text.isdigit():
            raise BadValue(f"expected a number of events (0 turns recording off), got {text!r}")
        return int(text)
    if kind == "choice":
        choices = choices_for(option, command)
        if text not in choices:
            raise BadValue(f"invalid choice: {text!r} (choose from {', '.join(choices)})")
        return text
    if kind in PATH_KINDS:
        return Path(text).expanduser()
    if kind == "eras":  # one word, or the command line's comma-separated words (memclaims.core.library_eras)
        try:
            library_eras.profile_name("", (text,))
        except UsageError as error:
            raise BadValue(str(error)) from None
        return text.strip()
    if kind == "number":
        value = _number(text)
        if value is None or value < 0:
            raise BadValue(f"expected a number >= 0, got {text!r}")
        return value
    if kind in ("percent", "megabytes", "seconds"):
        number = _number(text.removesuffix("%") if kind == "percent" else text)
        if kind == "percent" and (number is None or number < 0):
            raise BadValue(f"expected a percentage (a number >= 0, e.g. 20 or 20%), got {text!r}")
        if kind == "megabytes" and (number is None or int(number * 10**6) < 1):
            raise BadValue(f"expected a positive size in decimal MB, got {text!r}")
        if kind == "seconds" and (number is None or number < 0):
            raise BadValue(f"expected seconds (0 for no limit), got {text!r}")
        return number
    return text  # text, list, lines: any words


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


@dataclass(frozen=True)
class Settings:
    """Every option's value for one pytest session or one command-line call: checked, typed, paths
    taken from their base. One field per option of ``OPTIONS``; an option the front end (or the
    command) does not take holds its default."""

    # Typed field declarations, one per option: the ``duplicates`` tool pairs a run of them with
    # ``workloads.types.Scale``'s by shape (``name: int | None = None``); the two hold different facts.

    matrix: Matrix = "default"
    gpu_scale: GpuScale = "article"
    steps: int | None = None
    accuracy_epochs: int | None = None
    accuracy_full_epochs: bool = False
    vit_h14: bool = False
    sim_profile: str | None = None  # one of memclaims.core.names.SIM_PROFILES; None: the context's (names.py)
    era: tuple[str, ...] = ()  # LIBRARY=RELEASE words, each checked (memclaims.core.library_eras.era_of)
    workload: str = "vit"
    workloads: tuple[str, ...] = ()
    data_dir: Path | None = None  # the option, else $MEMCLAIMS_DATA_DIR, else None (offline data)
    download: bool = False
    update_baselines: bool = False
    strict: bool = False
    accept_regressions: bool = False
    summary: Summary = "problems"
    time_threshold: float | None = None
    summary_json: Path | None = None
    html: Path | None = None
    summary_file: Path | None = None
    runs_dir: Path | None = None
    baselines_dir: Path = Path("baselines")
    artifacts: Path = Path("memclaims-results")
    memory_history: int = 100_000
    snapshot_max_mb: float = 50.0
    recipe: str = ""
    source: str = ""
    environment: str = ""
    spec: tuple[str, ...] = ()
    technique: tuple[str, ...] = ()
    device: Device = "cpu"
    scale: Scale = "smoke"
    timeout: float = 0.0
    no_eval: bool = False
    evaluate_each_epoch: bool = False
    devices: int | None = None
    batch_size: int | None = None
    seq_len: int | None = None
    image_size: int | None = None
    accumulation_steps: int | None = None
    config: str | None = None
    lora_r: int | None = None
    lora_alpha: float | None = None
    lora_dropout: float | None = None
    lora_targets: str | None = None
    memory: str | None = None
    extrapolate: bool = False
    plot: Path | None = None
    article_only: bool = False
    hf_only: bool = False
    all: bool = False
    out: Path | None = None
    tiers: str = "cpu,converged,dist,sim"
    env_dir: Path | None = None
    newest: bool = False
    lock: Path | None = None
    record: bool = False
    accept: bool = False
    runs: int = 3
    seeds: str = "1,2,3,4"
    classes: str = "default"
    changes: tuple[Path, ...] = ()
    reuse_seeds: bool = False
    json: bool = False

    @property
    def snapshot_max_bytes(self) -> int:
        return int(self.snapshot_max_mb * 10**6)


def settings_from(values: Mapping[str, Any], base: Path, command: str | None = None) -> Settings:
    """The Settings of the parsed ``values`` (by field name; a missing one takes its default, in
    ``command`` where it has its own): a relative path is taken from ``base`` (the rootdir in pytest,
    the working directory, ``Path()``, on the command line); an unset data dir is ``$MEMCLAIMS_DATA_DIR``."""
    chosen: dict[str, Any] = {}
    for option in OPTIONS:
        value = values.get(option.attr, _UNSET)
        if value is _UNSET or (value is None and option.kind in TUPLE_KINDS):
            value = default_for(option, command)
        if option.kind in TUPLE_KINDS:
            value = tuple(value)
        if option.kind == "path" and value is not None:
            value = base / value
        elif option.kind == "paths":
            value = tuple(base / path for path in value)
        chosen[option.attr] = value
    chosen["data_dir"] = data_dir(chosen["data_dir"])
    return Settings(**chosen)

