"""The fused-linear-ce technique (issue #27: torch's chunked ``linear_cross_entropy``) on GPT-2 (``hf:gpt2``): at
smoke scale on the cpu tier and at its configured scale on the simulated GPU, each run visibly at work and
against its stored baseline; the same loss as the reference; workloads without a plain vocabulary projection
refused with the reason; a torch without the op skipped with it; and a head that silently stays in the
forward (the logits materialized after all) named by recipe, metric and phase.

The claim from torch's docstring is suite/cases/test_claims.py's (``fused-linear-ce-logits-never-whole``).
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

from memclaims.baselines.compare import compare
from memclaims.core.errors import UsageError
from memclaims.core.machine import linear_cross_entropy_problem
from memclaims.core.record import Record
from memclaims.measure import active
from memclaims.pytest.records import RecordCache
from memclaims.recipes import requirements
from memclaims.recipes.recipe import resolve
from memclaims.sim import simulate
from memclaims.techniques import fused_linear_ce as fused_loss
from memclaims.workloads import hf

FUSED = ("fused-linear-ce",)
GPT2 = "hf:gpt2"


def _get(record_cache: RecordCache, tier: str, techniques: tuple[str, ...]) -> Record:
    return record_cache.get(tier, resolve(GPT2, "smoke" if tier == "cpu" else "article", techniques))


@pytest.mark.cpu
@pytest.mark.parametrize(("workload", "why"), [
    ("vit", "technique 'fused-linear-ce' does not run on workload 'vit'"),
    ("hf:gpt2(head=classification)", "does not run on workload 'hf:gpt2(head=classification)'"),
    ("hf:gemma2", "does not run on workload 'hf:gemma2'"),  # tanh soft-capping of the logits
])
def test_workloads_without_a_plain_vocabulary_projection_are_refused(workload: str, why: str) -> None:
    with pytest.raises(UsageError, match=f"{re.escape(why)}: .*causal LM's vocabulary projection"):
        resolve(workload, "smoke", FUSED)


@pytest.mark.requires(torch_features="linear_cross_entropy")
@pytest.mark.parametrize("tier", [pytest.param("cpu", marks=pytest.mark.cpu), pytest.param("sim", marks=pytest.mark.sim)])
def test_fused_loss_is_active_and_matches_its_baseline(tier, record_cache, baseline_check, record_property) -> None:
    recipe = resolve(GPT2, "smoke" if tier == "cpu" else "article", FUSED)
    record = _get(record_cache, tier, FUSED)
    assert active.problems(recipe, record) == []
    # One call per micro-batch of the measured steps, every token of the batch, chunked, never falling back.
    seen = record.by_technique["fused-linear-ce"]
    assert seen["fused_loss_calls"] == record.memory_steps * recipe.accumulation_steps
    assert seen["fused_loss_rows"] == recipe.batch_size * hf.SEQ[recipe.scale.name]
    assert seen["fused_loss_fallbacks"] == 0
    baseline_check.check(f"{tier}:{record.recipe}", record, record_property)


@pytest.mark.cpu
@pytest.mark.slow  # trains GPT-2 smoke without the fused loss too (4 s on 2 cores); the nightly checks it
@pytest.mark.requires(torch_features="linear_cross_entropy")
def test_the_fused_loss_is_the_reference_loss(record_cache) -> None:
    """The same model, data and seed: the chunked op's losses are cross_entropy's to float32 rounding."""
    plain, fused = _get(record_cache, "cpu", ("fabric",)), _get(record_cache, "cpu", FUSED)
    assert plain.memory_losses and len(fused.memory_losses) == len(plain.memory_losses)
    assert fused.memory_losses == pytest.approx(plain.memory_losses, rel=1e-5)
    assert fused.peak_allocated_bytes < plain.peak_allocated_bytes


@pytest.mark.cpu
def test_eval_mode_computes_the_logits() -> None:
    """The accuracy phase reads logits: the bypassed head computes them when the model is in eval mode."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 10))
    fused_loss.apply(model, lambda m: m[1])
    hidden = torch.randn(3, 4)
    assert model.train()(hidden).shape == (3, 4)
    assert model.eval()(hidden).shape == (3, 10)
    assert fused_loss.bypassed_head(model) is model[1].head


@pytest.mark.cpu
def test_a_torch_without_the_op_skips_with_the_reason(monkeypatch) -> None:
    """Faked here where torch has the op; under a torch without it (2.9 ... 2.13) the real reason."""
    monkeypatch.delattr(F, "linear_cross_entropy", raising=False)
    reason = linear_cross_entropy_problem()
    assert reason is not None and "torch.nn.functional.linear_cross_entropy" in reason and "upgrade torch" in reason
    for tier in ("cpu", "sim", "gpu"):  # the sim replays the op on fake tensors: it needs it too
        assert requirements.for_techniques(FUSED, tier).torch_features == {"linear_cross_entropy"}


@pytest.mark.cpu
@pytest.mark.requires(torch_features="linear_cross_entropy")
def test_an_op_that_falls_back_is_caught() -> None:
    """linear_cross_entropy ignoring its options (label smoothing, here) warns; the Record counts it."""
    loss = fused_loss.FusedLoss(torch.float32)
    model = torch.nn.Sequential(torch.nn.Linear(4, 16))
    fused_loss.apply(model, lambda m: m[0])
    loss.run = lambda hidden, weight, targets, bias, options: F.linear_cross_entropy(  # type: ignore[method-assign]
        hidden, weight, targets, linear_bias=bias, options=options, label_smoothing=0.1)
    loss(model, model(torch.randn(8, 4)), torch.randint(0, 16, (8,)))
    assert loss.measured_fields()["by_technique"]["fused-linear-ce"]["fused_loss_fallbacks"] == 1


def inject_head_not_bypassed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The head bypass that leaves the model as it was: the forward computes the logits, and the engines'
    loss falls back to cross_entropy over them (a workload whose head the bypass does not find)."""
    import memclaims.techniques.fused_linear_ce

    # The technique's hooks (memclaims.techniques.fused_linear_ce) call it on every engine, the sim's included.
    monkeypatch.setattr(memclaims.techniques.fused_linear_ce, "apply", lambda model, head_of: model)


@pytest.mark.sim
@pytest.mark.requires(torch_features="linear_cross_entropy")
def test_sim_head_left_in_the_forward_is_caught(record_cache, monkeypatch) -> None:
    clean = _get(record_cache, "sim", FUSED)
    inject_head_not_bypassed(monkeypatch)
    recipe = resolve(GPT2, "article", FUSED)
    injected = simulate(recipe)
    comparison = compare(injected, clean, case_id=f"sim:{injected.recipe}")
    message = "\n".join(([comparison.message()] if comparison.failures else []) + active.problems(recipe, injected))
    for named in ("hf:gpt2-article/fused-linear-ce", "fused-linear-ce is not active", "fused_loss_calls is 0",
                  "phase train", "peak_allocated_bytes", "phases.forward"):
        assert named in message, message
    assert "peak_allocated_bytes" in {r.metric for r in comparison.failures}, message


@pytest.mark.cpu
@pytest.mark.slow  # trains GPT-2 smoke once more (about 4 s on 2 cores); the nightly checks it
@pytest.mark.requires(torch_features="linear_cross_entropy")
def test_cpu_head_left_in_the_forward_is_caught(monkeypatch) -> None:
    from memclaims.measure.runner import run
    from memclaims.recipes.run_options import RunOptions

    inject_head_not_bypassed(monkeypatch)
    recipe = resolve(GPT2, "smoke", FUSED)
    problems = active.problems(recipe, run(recipe, RunOptions(device="cpu", evaluate=False)))
    assert any(line.startswith("hf:gpt2-smoke/fused-linear-ce: fused-linear-ce is not active: fused_loss_calls is 0 "
                               "after phase train") for line in problems), problems


@pytest.mark.cpu
@pytest.mark.requires(torch_features="linear_cross_entropy")
@pytest.mark.parametrize(("dtype", "buffers"), [
    (torch.float32, {((8, 1024), torch.float32), ((8,), torch.float32)}),
    (torch.bfloat16, {((8, 1024), torch.float32), ((8, 16), torch.float32), ((8, 1024), torch.bfloat16)}),
])
def test_the_sim_adds_the_ops_cuda_scratch(dtype, buffers, monkeypatch) -> None:
    """What the op's registered fake leaves out: the chunk's logits buffer (fp32 under CUDA's compact policy),
    and for bf16 the fp32 input chunk and the bf16 downcast of the logits; the chunk as CUDA sizes it. On fake
    tensors, as the sim runs it: there only the fake's outputs and the sim's own scratch are made."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memclaims.techniques.fused_linear_ce import SimulatedFusedLoss

    made: set[tuple[tuple[int, ...], torch.dtype]] = set()
    real_empty = torch.empty

    def empty(*shape, dtype=torch.float32, **kwargs):
        size = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], tuple) else tuple(shape)
        made.add((size, dtype))
        return real_empty(*shape, dtype=dtype, **kwargs)

    loss = SimulatedFusedLoss(dtype)
    with FakeTensorMode():
        hidden, weight = torch.randn(512, 16, dtype=dtype), torch.randn(1024, 16, dtype=dtype)
        targets = torch.randint(0, 1024, (512,))
        options = loss.options(hidden, 1024)
        assert options.batch_chunk_size == 8  # next_pow2(512 / ceil(1024 / 16)), under the compact cap
        monkeypatch.setattr(torch, "empty", empty)
        loss.run(hidden, weight, targets, None, options)
    assert buffers <= made, made
