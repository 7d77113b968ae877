"""Reliable numbers: determinism, order independence, out-of-memory, NaN, and fuzzed bad input."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memclaims.core.errors import MemclaimsError, OutOfMemory
from memclaims.measure.probes import CpuProbe
from memclaims.measure.runner import out_of_memory_request, run
from memclaims.recipes.recipe import parse_id, resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.techniques import technique_registry as registry

# Fields that legitimately differ between two runs of the same recipe: wall time, and the process's
# resident set (allocator arenas and what earlier work left mapped), per step phase too.
NONDETERMINISTIC_FIELDS = ("step_time_s", "host_peak_bytes", "host_steps")
QUICK = RunOptions(device="cpu", memory_steps=2, evaluate=False)


def _exact(record: Any) -> dict[str, Any]:
    data = record.to_dict()
    for key in NONDETERMINISTIC_FIELDS:
        data.pop(key)
    return data


@pytest.mark.cpu
@pytest.mark.slow  # nightly only (pytest -n 2): keeps CI under 15 minutes on 2 cores
def test_same_recipe_five_times_gives_identical_bytes() -> None:
    recipe = resolve("vit", "smoke", ["bf16-true", "grad-accum"])
    records = [_exact(run(recipe, QUICK)) for _ in range(5)]
    assert all(r == records[0] for r in records[1:])


_RUN_IN_ORDER = textwrap.dedent("""
    import json, sys
    from memclaims.recipes.recipe import parse_id
    from memclaims.recipes.run_options import RunOptions
    from memclaims.measure.runner import run
    records = {}
    for recipe_id in sys.argv[1:]:
        record = run(parse_id(recipe_id), RunOptions(device="cpu", memory_steps=2, evaluate=False)).to_dict()
        record.pop("step_time_s"), record.pop("host_peak_bytes"), record.pop("host_steps")
        records[recipe_id] = record
    print(json.dumps(records, sort_keys=True))
""")


@pytest.mark.slow  # test_same_recipe_five_times_gives_identical_bytes keeps the quick guard
@pytest.mark.cpu
def test_order_of_cases_does_not_change_any_record() -> None:
    """Each order in a fresh process, so once-per-process work (library warm-up) cannot hide."""
    import json

    order = ["vit-smoke/adamw8bit", "vit-smoke/sgd", "vit-smoke/16-true+init-module",
             "vit-smoke/small-batch+grad-accum"]

    def records(ids: list[str]) -> dict[str, Any]:
        result = subprocess.run([sys.executable, "-c", _RUN_IN_ORDER, *ids], capture_output=True,
                                text=True, timeout=300, check=False)
        assert result.returncode == 0, result.stderr[-2000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    assert records(order) == records(list(reversed(order)))


@pytest.mark.cpu
def test_a_run_restores_the_global_torch_settings_it_changes() -> None:
    before = (torch.get_float32_matmul_precision(), torch.get_num_threads())
    run(resolve("vit", "smoke", ["bf16-true"]), QUICK)
    assert (torch.get_float32_matmul_precision(), torch.get_num_threads()) == before


# --- NaN ------------------------------------------------------------------------------------


@pytest.mark.cpu
def test_nan_loss_is_recorded_at_the_step_it_happens(record_cache) -> None:
    # The session's Records (the technique matrix's cpu cases of 16-true and bf16-true train the same recipes with
    # the same options): measured once, not again here.
    record = record_cache.get("cpu", resolve("vit", "smoke", ["16-true"]))
    # float16 Adam at the smoke learning rate diverges (eps=1e-8 underflows to 0 in float16).
    assert record.nan_loss and record.nan_step is not None
    assert record.memory_losses[0] == pytest.approx(2.3, abs=0.1), "step 0 is finite"
    finite = resolve("vit", "smoke", ["bf16-true"])
    assert not record_cache.memory("cpu", finite).nan_loss


# --- out of memory -------------------------------------------------------------------------


class _ExhaustedProbe(CpuProbe):
    """A probe whose training phase meets an allocator that is out of memory (a faked CUDA OOM)."""

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name == "train":
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB")
        with super().phase(name):
            yield


@pytest.mark.cpu
def test_faked_allocator_oom_is_reported_with_phase_and_size() -> None:
    with pytest.raises(OutOfMemory) as caught:
        run(resolve("vit", "smoke", []), QUICK, probe=_ExhaustedProbe())
    error = caught.value
    assert (error.phase, error.requested_bytes) == ("train", 2 * 2**30)
    assert "vit-smoke/fabric ran out of memory on cpu in the train phase while allocating 2147483648 B" in str(error)


@pytest.mark.parametrize("message, expected", [
    ("CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total capacity)", 20 * 2**20),
    ("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not enough memory: "
     "you tried to allocate 1228800000 bytes.", 1228800000),
    ("DefaultCPUAllocator: can't allocate memory", 0),
    ("mat1 and mat2 shapes cannot be multiplied", None),
])
def test_out_of_memory_messages_are_parsed(message: str, expected: int | None) -> None:
    assert out_of_memory_request(RuntimeError(message)) == expected


@pytest.mark.cpu
@pytest.mark.slow
def test_a_real_out_of_memory_under_a_cap_fails_the_run_cleanly() -> None:
    """Cap the address space of a run that needs 1.2 GB for ViT-L/16: the CPU allocator fails."""
    script = textwrap.dedent("""
        import resource, sys
        from memclaims.cli import main
        import lightning.fabric, torchvision.models  # imported before the cap: they map large libraries
        with open("/proc/self/status") as status:
            vm_kb = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
        cap = (vm_kb + 600 * 1024) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
        sys.exit(main(["run", "vit", "--scale", "article", "--steps", "1", "--no-eval"]))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "vit-article/fabric ran out of memory on cpu in the load phase" in result.stderr
    assert "Traceback" not in result.stderr


# --- fuzzed bad input -------------------------------------------------------------------------

_names = st.sampled_from([t.name for t in registry.TECHNIQUES]) | st.text(max_size=12)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_any_recipe_id_parses_or_gives_a_clear_error(text: str) -> None:
    try:
        recipe = parse_id(text)
    except MemclaimsError as error:
        assert str(error) and "\n" not in str(error)
    else:
        assert parse_id(recipe.id) == recipe


@settings(max_examples=300, deadline=None)
@given(st.lists(_names, max_size=6), st.sampled_from(["smoke", "article", "huge", ""]))
def test_any_technique_list_resolves_or_gives_a_clear_error(names: list[str], scale: str) -> None:
    try:
        recipe = resolve("vit", scale, names)
    except MemclaimsError as error:
        assert str(error) and "\n" not in str(error)
    else:
        assert registry.violation([registry.BY_NAME[n] for n in recipe.techniques]) is None
        assert dataclasses.replace(recipe) == recipe
