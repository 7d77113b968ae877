#!/usr/bin/env python
"""Judge the mutants that ``mutmut run`` cannot: those of code that runs when memclaims is imported.

mutmut forks each mutant's worker from a process that has already imported memclaims, so a mutant
of a function that runs only at import (the claim-check factories ``claims._course``, ``_accuracy``
and ``_no_nan``, the catalogue's ``_build``, ``Ratio.recipes``) never takes effect there and reads as
"survived". This script finds those functions (the trampolines hit while the mutated modules are
imported), then runs each of their mutants in a fresh fork of a process that has torch and pytest
loaded but not memclaims, so that the import itself runs the mutant. Run it after ``mutmut run``
(it reads ``mutants/``), from the repository root:

    python scripts/mutation-import-time.py [--tests TEST ...] [--only FUNCTION ...]

It prints killed / survived per function, and each survivor, and writes mutants/import-time.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "mutants"
# The claims' source modules (memclaims/claims/sources/*.py: one per source file) are mutated as the catalogue is.
SOURCES = tuple(f"memclaims.claims.sources.{p.stem}" for p in sorted((ROOT / "memclaims/claims/sources").glob("*.py"))
                if p.stem != "__init__")
TARGETS = ("memclaims.claims.catalogue", "memclaims.claims.ratio", *SOURCES, "memclaims.baselines.compare",
           "memclaims.baselines.store", "memclaims.techniques.technique_registry")
# What every child would import anyway, loaded once: the training stack (the plugin's preflight imports
# all of it) and pytest's plugins. Not memclaims: its import is what runs the mutant.
PRELOAD = ("torch", "torchvision", "lightning", "torchmetrics", "transformers", "bitsandbytes", "numpy", "pytest",
           "_pytest.pytester", "hypothesis", "pytest_benchmark.plugin", "xdist.plugin")


def import_time_functions() -> list[str]:
    """The mutated functions whose trampolines run while the target modules are imported."""
    code = ("import sys; sys.path.insert(0, '.'); import mutmut.mutation.trampoline as t; hits = set(); "
            "t.record_trampoline_hit = lambda name, caller=None: hits.add(name); "
            f"[__import__(m) for m in {TARGETS!r}]; print('\\n'.join(sorted(hits)))")
    env = {**os.environ, "MUTANT_UNDER_TEST": "stats"}
    env.pop("PYTHONPATH", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=MUTANTS, env=env, capture_output=True, text=True,
                         check=True).stdout
    return [name for name in out.split() if name.rpartition(".")[0] in TARGETS]


def mutants_of(function: str) -> list[str]:
    module, _, name = function.rpartition(".")
    source = (MUTANTS / (module.replace(".", "/") + ".py")).read_text(encoding="utf-8")
    numbers = sorted({int(n) for n in re.findall(rf"^\s*def {re.escape(name)}__mutmut_(\d+)\(", source, re.M)})
    return [f"{module}.{name}__mutmut_{n}" for n in numbers]


def run_one(mutant: str, tests: list[str], timeout: float) -> str:
    pid = os.fork()
    if pid == 0:  # the child: import memclaims with the mutant chosen, run the tests, exit with pytest's code
        try:
            os.environ["MUTANT_UNDER_TEST"] = mutant
            import pytest

            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            code = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *tests]))
        except BaseException:
            code = 99
        os._exit(code)
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            return "survived" if code == 0 else "no tests" if code == 5 else "killed"
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return "timeout"
        time.sleep(0.05)


def main() -> int:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mutmut"]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests", nargs="+", default=config["pytest_add_cli_args_test_selection"],
                        help="pytest arguments selecting the tests (default: [tool.mutmut]'s selection)")
    parser.add_argument("--only", nargs="+", help="these functions (e.g. memclaims.claims.sources.course.x__course)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant")
    args = parser.parse_args()
    if not MUTANTS.is_dir():
        print("no mutants/ folder: run `mutmut run --max-children 1` first", file=sys.stderr)
        return 2
    functions = args.only or import_time_functions()
    os.chdir(MUTANTS)
    sys.path[:] = [str(MUTANTS)] + [p for p in sys.path if Path(p or ".").resolve() not in (ROOT, MUTANTS)]
    for module in PRELOAD:
        try:
            __import__(module)
        except ImportError:
            pass
    results: dict[str, str] = {}
    started = time.monotonic()
    for function in functions:
        names = mutants_of(function)
        for name in names:
            results[name] = run_one(name, args.tests, args.timeout)
        counts = {v: sum(results[n] == v for n in names) for v in ("killed", "survived", "timeout", "no tests")}
        print(f"{function}: {len(names)} mutants, " + ", ".join(f"{v} {c}" for v, c in counts.items() if c), flush=True)
    survivors = sorted(n for n, v in results.items() if v != "killed")
    print(f"{sum(v == 'killed' for v in results.values())} / {len(results)} killed in "
          f"{time.monotonic() - started:.0f} s; not killed: {', '.join(survivors) or 'none'}")
    (MUTANTS / "import-time.json").write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
