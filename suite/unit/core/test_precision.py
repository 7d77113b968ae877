"""``core.precision.Precision``'s description of Fabric's precision plugins (the input cast, autocast,
the output cast), which the CPU ranks and the sim play instead of running the plugin, against the
installed Lightning's own plugins."""

from __future__ import annotations

import lightning.fabric.plugins.precision as plugins  # a dependency: nothing to skip
import pytest
import torch

from memclaims.core.precision import PRECISIONS


@pytest.mark.parametrize("name", list(PRECISIONS))
def test_the_description_is_what_fabrics_plugins_do(name: str) -> None:
    spec = PRECISIONS[name]
    one_device = (plugins.HalfPrecision(name) if spec.true_half  # type: ignore[arg-type]
                  else plugins.MixedPrecision(name, device="cpu") if spec.mixed  # type: ignore[arg-type]
                  else plugins.Precision())
    batch, tokens = torch.zeros(2), torch.zeros(2, dtype=torch.long)
    for plugin, fsdp in ((one_device, False), (plugins.FSDPPrecision(name), True)):  # type: ignore[arg-type]
        assert plugin.convert_input(batch).dtype == (spec.input_dtype(fsdp=fsdp) or torch.float32), (plugin, fsdp)
        assert plugin.convert_input(tokens).dtype == torch.long
    half_logits = torch.zeros(2, dtype=torch.float16)
    assert (one_device.convert_output(half_logits).dtype == torch.float32) == spec.casts_output
    assert (spec.autocast_dtype is not None) == spec.mixed
