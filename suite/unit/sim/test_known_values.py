"""Values the sim knows on fake tensors (memclaims.sim.known_values): what constants compute, what they do not
change (the allocator model's bytes), what stays unknown, and the one line naming a value read from data."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import DataDependentOutputException

from memclaims.core.errors import UsageError
from memclaims.sim import known_values
from memclaims.sim.allocator import CachingAllocator
from memclaims.sim.profiles import PROFILES
from memclaims.sim.tracker import DeviceMemory, tracked_fake_mode

pytestmark = pytest.mark.sim


@contextmanager
def tracked(knowing: bool = True) -> Iterator[Any]:
    """A sim session's fake mode, knowing values as the training phase does (or not, as the load does)."""
    memory = DeviceMemory(CachingAllocator(PROFILES["cpu-kernels"].allocator), PROFILES["cpu-kernels"])
    mode = tracked_fake_mode(memory)
    with mode, mode.knowing_values(knowing):
        yield mode


def _causal_check(size: int) -> bool:
    """What nn.TransformerDecoder asks of a tgt_mask (torch.nn.modules.transformer._detect_is_causal_mask)."""
    mask = torch.triu(torch.ones(size, size), diagonal=1)
    mask = mask.float().masked_fill(mask == 1, float("-inf")).masked_fill(mask == 0, 0.0)  # the demo's mask
    return nn.modules.transformer._detect_is_causal_mask(mask, None, size)


def test_a_mask_made_from_constants_is_known_in_the_training_phase() -> None:
    with tracked():
        assert _causal_check(35) is True
        assert torch.arange(6).sum().item() == 15 and float(torch.full((2, 2), 0.5).mean()) == 0.5
        positions = torch.zeros(10, 4)
        positions[:, 0::2] = torch.sin(torch.arange(10.0).unsqueeze(1))  # written into through a view
        assert positions[3, 0].item() == pytest.approx(torch.sin(torch.tensor(3.0)).item())


def test_without_the_training_phase_nothing_more_is_known() -> None:
    """The load (and the batches) keep FakeTensorMode's own rule: a factory's values are unknown."""
    with tracked(knowing=False), pytest.raises(DataDependentOutputException):
        _causal_check(35)


@pytest.mark.parametrize("unknown", [
    lambda: torch.empty(3, 3).sum(),  # empty: undefined values, never a constant
    lambda: torch.ones(4097, 4097).sum(),  # past KNOWN_NUMEL_LIMIT
    lambda: (torch.ones(3) + torch.empty(3)).sum(),  # an input without a value
    lambda: torch.ones(3).add_(torch.empty(3)).sum(),  # a write of an unknown value into a known tensor
    lambda: torch.ones(3).normal_().sum(),  # random values
])
def test_what_depends_on_no_value_stays_unknown(unknown: Any) -> None:
    with tracked(), pytest.raises(DataDependentOutputException):
        unknown().item()


def test_knowing_values_leaves_the_counted_bytes_unchanged() -> None:
    """A constant's fake tensor is the tensor the fake kernel makes: same storages, same bytes, same peak."""
    counted = []
    for knowing in (False, True):
        with tracked(knowing) as mode:
            mask = torch.triu(torch.full((64, 64), float("-inf")), diagonal=1)
            x = torch.empty(8, 64, 64)
            y = (x + mask).softmax(-1)
            del mask
            counted.append((mode.memory.tensor_bytes, mode.memory.peak_tensor_bytes, tuple(y.stride())))
    assert counted[0] == counted[1] and counted[0][1] == 4 * (64 * 64 + 3 * 8 * 64 * 64)


def _ops_of_an_lstm_step(knowing: bool) -> list[str]:
    """The device's ops of an LSTM's forward and backward (its zero initial state: a constant when knowing)."""
    with tracked(knowing) as mode:
        lstm = nn.LSTM(8, 8, batch_first=True)
        ran: list[str] = []
        count = mode.memory.dispatch

        def recorded(func: Any, args: Any, kwargs: Any, run: Any) -> Any:
            ran.append(str(func))
            return count(func, args, kwargs, run)

        mode.memory.dispatch = recorded
        out, _ = lstm(torch.empty(2, 5, 8))
        out.sum().backward()
    return ran


def test_knowing_values_changes_no_op_the_device_runs() -> None:
    """An input carrying a constant makes FakeTensorMode run the fake kernel without its dispatch cache (as on an
    op's first call, before the cache holds it); the LSTM backward's meta kernel then gives both bias gradients
    as one tensor, which autograd would copy (``new_empty_strided`` + ``copy_``: kernels the real CPU kernel,
    which returns two tensors, never makes autograd launch) unless the tracker makes them two."""
    known, unknown = _ops_of_an_lstm_step(knowing=True), _ops_of_an_lstm_step(knowing=False)
    assert known == unknown and "aten.mkldnn_rnn_layer_backward.default" in known
    assert "aten.copy_.default" not in known


def test_a_batch_is_data_whatever_it_was_filled_with() -> None:
    """A mask of ones read as "no padding" would be a guess about the data: the session's batches know no values."""
    from memclaims.sim.replay import Session

    session = Session(PROFILES["cpu-kernels"])
    with session.active(), session.fake.knowing_values():
        inputs, _ = session.data(lambda scale, batch: ({"attention_mask": torch.ones(batch, 4)}, torch.zeros(batch)))(
            None, 2)
        assert torch.ones(2, 4).all().item() is True  # made in the training phase: known
        with pytest.raises(DataDependentOutputException):
            inputs["attention_mask"].all().item()


class Gate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # a value of the data
            x = -x
        out: torch.Tensor = self.fc(x)
        return out


def test_a_value_read_from_data_is_named_in_one_line() -> None:
    with tracked(), pytest.raises(UsageError) as refused:
        model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(Gate()))
        with known_values.reading_values("gated", model):
            model(torch.empty(2, 4))
    message = str(refused.value)
    assert "\n" not in message and message.startswith("the sim cannot replay workload 'gated': module 1.0 (")
    assert "test_known_values.Gate) at " in message and "test_known_values.py:" in message
    assert "aten._local_scalar_dense.default" in message and "--device cpu or cuda" in message
