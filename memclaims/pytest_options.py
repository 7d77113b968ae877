"""The command-line and ini options of memclaims' pytest plugin.

Apart from the plugin because it must import nothing but pytest (and the technique registry,
which imports nothing outside the standard library): with a broken install the environment
preflight (conftest.py) still registers them, so that a command line naming them reaches the
preflight's one line instead of an "unrecognized arguments" error.
"""

from __future__ import annotations

from typing import Any

import pytest

from memclaims import techniques

SELECTIONS = tuple(techniques.SELECTIONS)  # the names --memclaims-matrix takes


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("memclaims", "memclaims: memory-claim regression cases")

    def add(name: str, help: str, default: Any = None, **kwargs: Any) -> None:
        group.addoption(f"--memclaims-{name}", dest=f"memclaims_{name.replace('-', '_')}",
                        default=None, help=f"{help} (ini: memclaims_{name.replace('-', '_')})", **kwargs)
        parser.addini(f"memclaims_{name.replace('-', '_')}", help, default=default)

    add("matrix", "which combinations become cases: singles, default (singles + the article's "
        "chain + a pairwise cover) or full", default="default", choices=SELECTIONS)
    add("gpu-scale", "scale of the gpu tier: article, or smoke (each workload's gpusmoke scale where it "
        "has one: ViT-B/16 width at 128 px for vit)", default="article", choices=("article", "smoke"))
    add("steps", "optimizer steps measured per case (default: the scale's)", default="")
    add("accuracy-epochs", "epochs of the accuracy phase per case (default: the scale's; 1 at article "
        "scale, as the article)", default="")
    add("accuracy-full-epochs", "accuracy from whole epochs and the whole test set even where the scale has a "
        "budgeted schedule (article scale: 50 steps, 2,000 test images); the weekly run",
        default="false", action="store_const", const="true")
    add("vit-h14", "also run the ViT-H/14 series (518 px, 16-mixed, batch 4 per GPU) in the gpu tier",
        default="false", action="store_const", const="true")
    add("sim-profile", "the simulated GPU of the sim tier (memclaims list shows the profiles)", default="article")
    add("workload", "the workload the technique matrix runs on: vit, another built-in, hf:<model_type>, or one "
        "registered by an entry point (group memclaims.workloads) or memclaims_workloads", default="vit")
    parser.addini("memclaims_workloads", "workload factories to register, one package.module:factory per line "
                  "(each returns a memclaims Workload; see memclaims.user_workloads.define)", type="linelist",
                  default=[])
    add("data-dir", "folder holding CIFAR-10 / IMDb (default: $MEMCLAIMS_DATA_DIR, else offline data)", default="")
    add("download", "download CIFAR-10 into <data-dir>/images and IMDb into <data-dir>/text before the "
        "session, where missing (needs internet and a data dir; off by default)", default="false",
        action="store_const", const="true")
    # Baselines (memclaims.baselines / memclaims.compare).
    group.addoption("--update-baselines", action="store_true", default=False,
                    help="store the Records of the cases that ran as their baselines, instead of comparing")
    add("strict", "fail when a metric is better than its baseline beyond tolerance (stale baseline)",
        default="false", action="store_const", const="true")
    add("accept-regressions", "with --update-baselines: store a Record even where it is worse than its "
        "baseline (otherwise the case fails and nothing is stored)", default="false",
        action="store_const", const="true")
    add("summary", "end-of-run baseline table: 'problems' (what is not ok, worst first; the default) or "
        "'all' (every metric; also with -v)", default="problems", choices=("problems", "all"))
    add("time-threshold", "fail when the step time grows by more than PCT percent over its baseline "
        "(default: step time is only reported)", default="", metavar="PCT")
    add("summary-json", "write the end-of-run baseline comparison table as JSON to PATH", default="",
        metavar="PATH")
    add("baselines-dir", "the baseline folder (default: baselines/ in the rootdir)", default="", metavar="DIR")
    # Diagnosis of memory failures (memclaims.diagnosis).
    add("artifacts", "where a case that fails on memory saves its breakdown JSON and CUDA snapshot "
        "(default: memclaims-results/ in the rootdir)", default="", metavar="DIR")
    add("memory-history", "CUDA allocator events recorded per case for the snapshot saved on a memory "
        "failure; 0 turns recording off", default="100000", metavar="N")
    add("snapshot-max-mb", "largest CUDA snapshot file kept per case, in decimal MB (oldest events, then "
        "stack frames, are dropped to fit)", default="50", metavar="MB")
