"""ao-adamw8bit, ao-adamw4bit, ao-adamw-fp8 (issue #43: torchao's low-bit AdamW) on the ViT: at smoke scale on the
cpu tier, eagerly, each visibly at work (torchao's state subclasses, their codes' dtype and bytes) and against its
stored baseline; the sim's replay on fake tensors byte for byte the cpu tier's state at smoke scale, and at article
scale against its baseline (nightly); a machine without torchao, or a CPU without float8 casts for the FP8 one,
skipped with the reason; and torchao's state silently left in float32 named by recipe, metric and phase.

The claims from torchao's README are suite/cases/test_claims.py's (``torchao-low-bit-state-bytes``,
``torchao-low-bit-peak-falls-by-state``).
"""

from __future__ import annotations

import pytest
import torch

from memclaims.baselines.compare import compare
from memclaims.core.errors import UsageError
from memclaims.core.machine import Machine
from memclaims.measure import active
from memclaims.measure.runner import run
from memclaims.recipes import requirements
from memclaims.recipes.recipe import resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.run import needs
from memclaims.sim import known_values, simulate
from memclaims.techniques import torchao_adamw

# One worker measures the Records its tests and its claims (suite/cases/test_claims.py) share.
pytestmark = pytest.mark.xdist_group("torchao-adamw")

# technique -> (its state subclass, the codes' dtype, their bytes per element, the block)
LOW_BIT = {"ao-adamw8bit": ("OptimState8bit", "uint8", 1.0, 256), "ao-adamw4bit": ("OptimState4bit", "uint8", 0.5, 128),
           "ao-adamw-fp8": ("OptimStateFp8", "float8_e4m3fn", 1.0, 256)}


def _cases(tier: str, scale: str, *marks: pytest.MarkDecorator, nightly: tuple[str, ...] = ()) -> list[object]:
    """Each technique as a case on ``tier``, skipped at collection with what the machine lacks (torchao; for FP8
    on the CPU, float8 casts); those named in ``nightly`` marked slow."""
    return [pytest.param(name, marks=[getattr(pytest.mark, tier), *marks,
                                      *([pytest.mark.slow] if name in nightly else []),
                                      pytest.mark.requires(needs(resolve("vit", scale, (name,)), tier))], id=name)
            for name in LOW_BIT]


@pytest.mark.parametrize("name", _cases("cpu", "smoke"))
def test_low_bit_state_is_active_and_matches_its_baseline(name, record_cache, baseline_check,
                                                           record_property) -> None:
    recipe = resolve("vit", "smoke", (name,))
    record = record_cache.get("cpu", recipe)
    assert active.problems(recipe, record) == []
    subclass, dtype, per_element, block = LOW_BIT[name]
    seen = record.by_technique[name]
    assert seen["eager"] and seen["block_size"] == block and seen["min_quantized_numel"] == recipe.scale.min_8bit_size
    held = seen["state_subclasses"][subclass]
    # Both states of every smoke-ViT weight of 1,024 elements or more (each a multiple of the block): the
    # q/k/v, output and MLP projections of both layers and the patch embedding.
    assert held["elements"] == 2 * 17_920 and held["codes_bytes"] == held["elements"] * per_element
    assert held["codes_dtype"] == dtype and held["scale_bytes"] == held["elements"] // block * 4
    # The record's bytes by dtype see the codes for what they are (the subclass's inner tensors).
    assert record.optimizer_state_by_dtype[dtype] == held["codes_bytes"]
    assert record.accuracy is not None and record.accuracy > 1.5 / recipe.workload.num_classes
    assert any(note.startswith(f"{name}: torchao ") and "eagerly" in note for note in record.notes)
    baseline_check.check(f"cpu:{record.recipe}", record, record_property)


@pytest.mark.parametrize("name", _cases("sim", "smoke"))
def test_the_sim_replays_the_cpu_tiers_state_byte_for_byte(name, record_cache, monkeypatch) -> None:
    """torchao's own optimizer on fake tensors (its quantization maps made outside the fake mode), stepped eagerly:
    the same state subclasses, codes, scales and maps as the cpu tier's real run at smoke scale; and no state made
    with real values (torchao makes its codes with torch.zeros: as known constants every op of its quantization ran
    for real on the host, 13.9 GB of RSS for the ViT-L/16 replay, 1.0 GB without)."""
    made: list[int] = []
    factory = known_values.known_factory

    def counted(*args: object) -> torch.Tensor | None:
        constant = factory(*args)
        made.extend([constant.numel()] if constant is not None else [])
        return constant

    monkeypatch.setattr(known_values, "known_factory", counted)
    recipe = resolve("vit", "smoke", (name,))
    real, replayed = record_cache.get("cpu", recipe), simulate(recipe)
    assert replayed.optimizer_state_bytes == real.optimizer_state_bytes > 0
    assert replayed.by_technique[name] == real.by_technique[name]
    assert active.problems(recipe, replayed) == []
    assert [numel for numel in made if numel >= (recipe.scale.min_8bit_size or 0)] == [], sorted(made)[-5:]


@pytest.mark.slow  # ViT-L/16 at article scale: torchao's eager step on fake tensors, about 10 s of CPU each
@pytest.mark.parametrize("name", _cases("sim", "article"))
def test_sim_replay_at_article_scale_matches_its_baseline(name, record_cache, baseline_check, record_property) -> None:
    recipe = resolve("vit", "article", (name,))
    record = record_cache.get("sim", recipe)
    assert active.problems(recipe, record) == []
    assert record.by_technique[name]["min_quantized_numel"] == torchao_adamw.TORCHAO_MIN_NUMEL  # torchao's own rule
    assert record.by_technique[name]["plain_states"]["quantizable"] == 0
    baseline_check.check(f"sim:{record.recipe}", record, record_property)


def inject_state_left_in_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchao's low-bit state constructor that silently returns a plain tensor of the parameter's dtype (a release
    whose subclass path stops being taken): AdamW's float32 states under a low-bit optimizer's name."""
    import torchao.optim as optim

    for cls in (optim.AdamW8bit, optim.AdamW4bit, optim.AdamWFp8):
        monkeypatch.setattr(cls, "_subclass_zeros", staticmethod(lambda p, signed, block_size: torch.zeros_like(p)))


# CI injects into 8-bit (about 2 s of CPU a run); 4-bit's and FP8's, the same fault through the same constructor,
# run in the nightly (CI's budget for issue #43's item 3: 25 s).
@pytest.mark.parametrize("name", _cases("cpu", "smoke", nightly=("ao-adamw4bit", "ao-adamw-fp8")))
def test_state_left_in_float32_is_caught(name, record_cache, monkeypatch) -> None:
    recipe = resolve("vit", "smoke", (name,))
    clean = record_cache.memory("cpu", recipe)
    inject_state_left_in_float32(monkeypatch)
    injected = run(recipe, RunOptions(device="cpu", evaluate=False))
    comparison = compare(injected, clean, case_id=f"cpu:{injected.recipe}")
    problems = active.problems(recipe, injected)
    message = "\n".join(([comparison.message()] if comparison.failures else []) + problems)
    assert problems == [f"vit-smoke/{name}: {name} is not active: by_technique.{name}.state_subclasses has no "
                        f"{LOW_BIT[name][0]} after phase optimizer_step (states: none, plain 157,008 B): every state "
                        "stayed a plain tensor of the parameters' dtype"], message
    failing = {r.metric for r in comparison.failures}
    assert "optimizer_state_bytes" in failing, message
    assert "phases.optimizer_step.above_start_bytes got worse" in message  # derived: named as the explanation


@pytest.mark.cpu
def test_a_machine_without_torchao_skips_with_the_reason(monkeypatch) -> None:
    """The cpu tier needs the package (the registry's ``requires``), the sim refuses with torchao's import error."""
    for name in LOW_BIT:
        assert requirements.for_techniques((name,), "cpu").packages == frozenset({"torchao"})

    class NoTorchao(Machine):
        def package(self, name: str) -> str | None:
            return "ModuleNotFoundError: No module named 'torchao'" if name == "torchao" else None

    reasons = requirements.unmet(requirements.Needs(packages=frozenset({"torchao"})), NoTorchao())
    assert reasons == ["needs torchao: ModuleNotFoundError: No module named 'torchao' (pip install 'torchao>=0.11')"]
    monkeypatch.setattr(torchao_adamw, "torchao_problem", lambda: "torchao's low-bit optimizers do not import: "
                                                                   "ModuleNotFoundError: No module named 'torchao'")
    from memclaims import sim

    with pytest.raises(UsageError, match="the sim device cannot run vit-article/ao-adamw8bit: torchao's low-bit "
                                         "optimizers do not import"):
        sim.check(resolve("vit", "article", ("ao-adamw8bit",)))


@pytest.mark.cpu
def test_fp8_on_a_cpu_without_float8_casts_is_unsupported_with_the_reason(monkeypatch) -> None:
    import torchao.optim as optim

    def refuse(self, closure=None):
        raise RuntimeError('"copy_" not implemented for \'Float8_e4m3fn\'')

    monkeypatch.setattr(optim.AdamWFp8, "step", refuse)
    reason = torchao_adamw.fp8_cpu_problem.__wrapped__()
    assert reason == ("torchao's AdamWFp8 does not step on this CPU: RuntimeError: \"copy_\" not implemented for "
                      "'Float8_e4m3fn'")
    monkeypatch.setattr(torchao_adamw, "fp8_cpu_problem", lambda: reason)
    assert requirements.for_techniques(("ao-adamw-fp8",), "cpu").unsupported == (reason,)
    assert requirements.for_techniques(("ao-adamw8bit",), "cpu").unsupported == ()
