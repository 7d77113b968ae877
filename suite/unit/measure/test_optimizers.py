"""Optimizer construction and exact optimizer-state sizes at article scale (distilbert-cased).

Optimizer state does not depend on the batch, so these build the article-scale model once, and
take one optimizer step per optimizer on a tiny batch (2 x 16 tokens): a full article batch
(12 x 512) costs minutes on two CPU cores and would not change a byte of the state.
"""

from __future__ import annotations

import sys
import types
import warnings
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from memclaims.core import machine, optim_state
from memclaims.core.errors import UsageError
from memclaims.measure import optimizers
from memclaims.measure.tensors import optimizer_state_tensors, storage_bytes
from memclaims.recipes import requirements
from memclaims.techniques import technique_registry as techniques
from memclaims.workloads.registry import workload

PARAMS, TENSORS = 65_783_042, 104  # the course's distilbert-base-cased with a 2-label head
ADAMW_ELEMENTS, ADAMW_BYTES = 131_566_188, 526_264_752
ADAM8BIT_MEASURED = 134_082_160  # bitsandbytes 0.50.2, CPU, every tensor in optimizer.state
MIB = 2**20


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    # Other test processes share the two cores; one intra-op thread avoids OpenMP spin contention.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def article_model() -> nn.Module:
    work = workload("distilbert-cased")
    torch.manual_seed(123)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers' notes on random init
        model, _ = work.build_model(work.scale("article"))
    return model


_STATES: dict[str, tuple[int, int]] = {}  # optimizer -> (every tensor, distinct storages), per module


def state_after_one_step(model: nn.Module, name: str) -> tuple[int, int]:
    if name not in _STATES:
        optimizer, _ = optimizers.build(name, model, 5e-5, 1)
        ids = torch.randint(1000, 2000, (2, 16), generator=torch.Generator().manual_seed(0))
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        optimizer.zero_grad()
        F.cross_entropy(logits, torch.tensor([0, 1])).backward()
        optimizer.step()
        _STATES[name] = (optim_state.count_every_tensor(optimizer),
                         storage_bytes(optimizer_state_tensors(optimizer)))
        model.zero_grad(set_to_none=True)
        del optimizer
    return _STATES[name]


@pytest.mark.cpu
def test_registry_order_and_requirements() -> None:
    names = [t.name for t in techniques.TECHNIQUES]
    i = names.index("sgd")
    assert names[i + 1:i + 6] == ["adamw", "adam8bit", "adamw8bit", "paged-adamw8bit", "adafactor"]
    for name in ("adamw", "adam8bit", "adamw8bit", "paged-adamw8bit", "adafactor"):
        t = techniques.BY_NAME[name]
        assert t.group == "optimizer" and t.optimizer == name.replace("-", "_")
        assert t.requires == (frozenset({"bitsandbytes"}) if "8bit" in name else frozenset())
    with pytest.raises(UsageError, match="at most one optimizer"):
        techniques.canonical(["adamw", "adam8bit"])
    assert techniques.canonical(["grad-accum", "adam8bit", "bf16-true", "init-module"]) == (
        "bf16-true", "grad-accum", "adam8bit", "init-module")


@pytest.mark.cpu
def test_course_parameter_groups(article_model: nn.Module) -> None:
    decay, no_decay = optimizers.parameter_groups(article_model)
    assert decay["weight_decay"] == optimizers.WEIGHT_DECAY and no_decay["weight_decay"] == 0.0
    layer_norms = [m for m in article_model.modules() if isinstance(m, nn.LayerNorm)]
    no_decay_ids = {id(p) for p in no_decay["params"]}
    assert all(id(p) in no_decay_ids for m in layer_norms for p in m.parameters())
    assert all(id(p) in no_decay_ids for n, p in article_model.named_parameters() if n.endswith("bias"))
    assert all(p.dim() >= 2 for p in decay["params"])  # weights of Linear and Embedding only
    assert len(decay["params"]) + len(no_decay["params"]) == TENSORS
    assert optimizers.training_arguments_defaults() == {"adam_beta1": 0.9, "adam_beta2": 0.999,
                                                        "adam_epsilon": 1e-8}


@pytest.mark.cpu
def test_adamw_state_exact(article_model: nn.Module) -> None:
    params = list(article_model.parameters())
    assert (sum(p.numel() for p in params), len(params)) == (PARAMS, TENSORS)
    every, distinct = state_after_one_step(article_model, "adamw")
    assert optim_state.adamw_elements(params) == ADAMW_ELEMENTS
    assert every == distinct == optim_state.adamw_bytes(params) == ADAMW_BYTES


@pytest.mark.cpu
@pytest.mark.requires(bitsandbytes="cpu")
@pytest.mark.parametrize("name", ["adam8bit", "adamw8bit"])
def test_eight_bit_state_exact(article_model: nn.Module, name: str) -> None:
    params = list(article_model.parameters())
    every, distinct = state_after_one_step(article_model, name)
    assert every == optim_state.adam8bit_bytes(params)
    assert distinct == optim_state.adam8bit_bytes(params, every_tensor=False)
    import bitsandbytes

    if bitsandbytes.__version__ == "0.50.2":
        assert every == ADAM8BIT_MEASURED
    estimate = optim_state.course_estimate_bytes(PARAMS)  # 2 B/param = 125.5 MiB
    assert abs(every - estimate) / estimate <= 0.03
    adamw_every, _ = state_after_one_step(article_model, "adamw")
    assert every <= 0.26 * adamw_every  # the slides' "1/4"; measured 0.255


@pytest.mark.cpu
@pytest.mark.requires(bitsandbytes="cpu")
def test_layout_read_from_library() -> None:
    import inspect

    import bitsandbytes as bnb

    layout = optim_state.eight_bit_layout()
    default = inspect.signature(bnb.optim.Adam8bit.__init__).parameters["min_8bit_size"].default
    assert layout.min_8bit_size == default
    assert layout.blocksize == 256 and layout.qmap_bytes == (1024, 1024) and layout.state_itemsize == 1
    # Below the threshold: two float32 states; at it: 2 x uint8 + absmax per block + the two maps.
    assert layout.parameter_bytes(default - 1) == 8 * (default - 1)
    assert layout.parameter_bytes(default) == 2 * default + 2 * 4 * (default // 256) + 2048


@pytest.mark.cpu
def test_adafactor_state(article_model: nn.Module) -> None:
    params = list(article_model.parameters())
    every, _ = state_after_one_step(article_model, "adafactor")
    assert every == optim_state.adafactor_bytes(params)
    assert every < 0.01 * ADAMW_BYTES  # factored second moment only: ~0.7 MB vs 526 MB


@pytest.fixture
def fresh_check() -> Iterator[None]:
    """bitsandbytes' check is cached per process: each of these tests sees its own answer, and
    the tests after them the real one."""
    machine.bitsandbytes_problem.cache_clear()
    yield
    machine.bitsandbytes_problem.cache_clear()


@pytest.mark.cpu
def test_bitsandbytes_that_does_not_import_is_a_requirement_not_a_crash(
        monkeypatch: pytest.MonkeyPatch, fresh_check: None) -> None:
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # makes `import bitsandbytes` raise ImportError
    reason = requirements.reason(requirements.needs(bitsandbytes="cpu"))
    assert reason is not None and "bitsandbytes does not import" in reason and "pip install" in reason, reason
    with pytest.raises(UsageError, match="needs bitsandbytes"):
        optimizers.build("adam8bit", nn.Linear(2, 2), 1e-3, 1)


class _NoBackend(torch.optim.Optimizer):
    """What bitsandbytes without a CPU backend does: it builds, and fails at the first step."""

    def __init__(self, params: object, lr: float = 1e-3, **kwargs: object) -> None:
        super().__init__(params, {"lr": lr})  # type: ignore[arg-type]

    def step(self, closure: object = None) -> None:  # type: ignore[override]
        raise NotImplementedError("no CPU implementation of optimizer_update_8bit_blockwise")


def installed_without_a_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """An importable bitsandbytes whose 8-bit optimizers fail at the first step, whether or not
    the real one is installed here (so this runs on every machine)."""
    fake = types.ModuleType("bitsandbytes")
    fake.__version__ = "0.0-no-backend"  # type: ignore[attr-defined]
    fake.optim = types.SimpleNamespace(Adam8bit=_NoBackend, AdamW8bit=_NoBackend)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "bitsandbytes", fake)


@pytest.mark.cpu
def test_bitsandbytes_without_a_backend_is_unmet_not_failing(monkeypatch: pytest.MonkeyPatch,
                                                              fresh_check: None) -> None:
    installed_without_a_backend(monkeypatch)
    problem = machine.bitsandbytes_problem("cpu")
    assert problem is not None and "no working CPU backend" in problem and "0.0-no-backend" in problem
    reason = requirements.reason(requirements.needs(bitsandbytes="cpu"))
    assert reason is not None and reason.startswith("needs bitsandbytes' 8-bit optimizers on the CPU: ")
    assert "no working CPU backend" in reason
    # The case that would have run it skips (the requirement) instead of failing at build.
    with pytest.raises(UsageError, match="no working CPU backend"):
        optimizers.build("adam8bit", nn.Linear(64, 64), 1e-3, 1)


def test_bitsandbytes_hub_kernel_warning_is_silenced() -> None:
    """bitsandbytes >= 0.50 warns at import, on AVX512-BF16 CPUs, that it cannot fetch a 4-bit kernel
    from the Hub; memclaims (imported above) keeps that logger below WARNING on every CPU."""
    import logging

    assert not logging.getLogger("bitsandbytes.backends.cpu.ops").isEnabledFor(logging.WARNING)


def test_sgd_steps_under_a_cosine_decay_over_the_whole_run() -> None:
    """Claim sgd-needs-cosine: memclaims' sgd is the article's 06, SGD lr 0.01 without momentum under
    CosineAnnealingLR(T_max = every batch of the run); Adam (01-05) has no schedule."""
    model = nn.Linear(4, 2)
    optimizer, scheduler = optimizers.build("sgd", model, 0.01, total_steps=703)
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["momentum"] == 0
    assert isinstance(scheduler, torch.optim.lr_scheduler.CosineAnnealingLR) and scheduler.T_max == 703
    for _ in range(703):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] < 1e-9  # decayed to zero at the end of the run
    assert optimizers.build("adam", model, 5e-5, total_steps=703)[1] is None


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd"])
def test_the_implementation_reaches_torch_as_asked(name: str) -> None:
    """build passes each implementation's foreach=/fused= to Adam, AdamW and SGD (memclaims.techniques.optimizer_impl);
    without one the optimizer keeps torch's default (None, None: chosen by device, as before the choice existed)."""
    from memclaims.techniques.optimizer_impl import IMPLEMENTATIONS, torch_flags

    model = nn.Linear(4, 4)
    for implementation in (*IMPLEMENTATIONS, None):
        optimizer, _ = optimizers.build(name, model, 0.1, 10, implementation=implementation)
        flags = [{key: group[key] for key in ("foreach", "fused")} for group in optimizer.param_groups]
        assert flags == [torch_flags(implementation) or {"foreach": None, "fused": None}] * len(flags), implementation


@pytest.mark.parametrize("name", ["adafactor", "adam8bit"])
def test_an_optimizer_torch_does_not_implement_three_ways_refuses_an_implementation(name: str) -> None:
    with pytest.raises(UsageError, match=f"optimizer '{name}' has no fused implementation to choose; torch's foreach= "
                                         "and fused= are those of adam, adamw, sgd"):
        optimizers.build(name, nn.Linear(4, 4), 0.1, 10, implementation="fused")
