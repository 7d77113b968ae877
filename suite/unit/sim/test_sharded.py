"""FSDP1's per-rank allocations as memclaims.sim.sharded replays them, on a toy model of identical
blocks: shard sizes (ceil division), the 2023 nightly's missing rate limiter, offload's device-side
``_saved_grad_shard`` and its flatten-on-the-device init. Exact bytes, no article-scale model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from memclaims.sim import PROFILES
from memclaims.sim import sharded as sh
from memclaims.sim.allocator import CachingAllocator
from memclaims.sim.tracker import DeviceMemory

pytestmark = pytest.mark.sim

WIDTH, BLOCKS, WORLD = 40, 3, 4
F32 = torch.float32


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)  # 1,640 parameters: 410 per rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(*(Block() for _ in range(BLOCKS)))
        self.head = nn.Linear(WIDTH, 3)  # the root unit: 123 parameters, padded to 124

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.head(self.blocks(x))
        return out


@contextmanager
def device() -> Iterator[DeviceMemory]:
    memory = DeviceMemory(CachingAllocator(PROFILES["article"].allocator), PROFILES["article"])
    with FakeTensorMode(), memory:
        yield memory


def host_model(memory: DeviceMemory) -> Toy:
    memory.counting = False
    try:
        return Toy()
    finally:
        memory.counting = True


def wrapped(memory: DeviceMemory, *, offload: bool = False, limit: bool = True) -> sh.ShardedModel:
    return sh.wrap(host_model(memory), Block, memory, world=WORLD, shard_dtype=F32, param_dtype=F32,
                   reduce_dtype=F32, offload=offload, checkpointing=False, auto_wrap=True, moved=False,
                   limit_gathers=limit)


def unit_bytes(numel: int) -> int:
    return -(-numel // WORLD) * WORLD * 4


def test_flat_parameter_shards_are_the_ceil_division() -> None:
    with device() as memory:
        model = wrapped(memory)
        block_numel = WIDTH * WIDTH + WIDTH
        root_numel = WIDTH * 3 + 3
        assert [u.numel for u in model.units] == [block_numel] * BLOCKS + [root_numel]
        assert [u.padded for u in model.units] == [-(-n // WORLD) * WORLD for n in (block_numel,) * BLOCKS + (root_numel,)]
        # What rank 0 keeps on the device: padded / W elements of each unit, in the shard dtype.
        per_rank = [memory.device_bytes([s]) for s in model.shards()]
        assert per_rank == [-(-block_numel // WORLD) * 4] * BLOCKS + [-(-root_numel // WORLD) * 4]
        assert sum(per_rank) == sum(-(-u.numel // WORLD) for u in model.units) * 4


def run_forward_backward(memory: DeviceMemory, model: sh.ShardedModel,
                         at_end_of_backward: list[int] | None = None) -> dict[str, int]:
    """One step's forward and backward as sharded.train orders them; what the unshard stream held."""
    x = torch.empty(8, WIDTH)
    model.root.unshard()
    out = model.model(x)
    for later, earlier in zip(model.order[1:], model.order[:-1]):
        later.next_in_backward = earlier
    gathered_after_forward = sum(u.full_bytes() for u in model.units if u.full is not None)
    pending_after_forward = sum(t.untyped_storage().nbytes() for t in model.run_ahead.pending)
    out.sum().backward()
    if at_end_of_backward is not None:  # before the final callback
        at_end_of_backward.append(memory.device_bytes(u.saved_grad_shard for u in model.units
                                                      if u.saved_grad_shard is not None))
    model.end_backward()
    model.root.reshard()
    return {"gathered": gathered_after_forward, "pending": pending_after_forward,
            "pending_after_backward": len(model.run_ahead.pending)}


def test_without_the_rate_limiter_every_forward_all_gather_stays_taken() -> None:
    with device() as memory:
        model = wrapped(memory, limit=False)
        seen = run_forward_backward(memory, model)
    # 2023-06 nightly (limit_all_gathers=False): each block's unsharded flat parameter is still
    # taken (record_stream) when the forward ends: BLOCKS x the padded unit, in the unshard pool.
    assert seen["pending"] == BLOCKS * unit_bytes(WIDTH * WIDTH + WIDTH)
    assert seen["gathered"] == unit_bytes(WIDTH * 3 + 3)  # only the root stays unsharded as such
    assert seen["pending_after_backward"] == 0


def test_with_the_rate_limiter_each_block_is_freed_after_its_forward() -> None:
    with device() as memory:
        model = wrapped(memory, limit=True)
        seen = run_forward_backward(memory, model)
    assert seen["pending"] == 0 and seen["gathered"] == unit_bytes(WIDTH * 3 + 3)


def test_unshard_pool_grows_by_the_blocks_kept_without_the_limiter() -> None:
    reserved = {}
    for limit in (True, False):
        with device() as memory:
            model = wrapped(memory, limit=limit)
            run_forward_backward(memory, model)
            reserved[limit] = memory.allocator.stats.peak_allocated
    # Rate-limited: one block gathered at a time in the forward (then two in the backward, with the
    # prefetch); without: all BLOCKS at once at the end of the forward, plus the first pre-backward's
    # fresh pair. The blocks are under 1 MiB: each request is rounded to 512 B.
    block = -(-unit_bytes(WIDTH * WIDTH + WIDTH) // 512) * 512
    assert reserved[False] - reserved[True] >= (BLOCKS - 2) * block


def test_offload_keeps_every_sharded_gradient_on_the_device_until_the_end_of_backward() -> None:
    seen: list[int] = []
    with device() as memory:
        model = wrapped(memory, offload=True)
        run_forward_backward(memory, model, at_end_of_backward=seen)
        after = memory.device_bytes(u.saved_grad_shard for u in model.units if u.saved_grad_shard is not None)
        shards_on_device = memory.device_bytes(model.shards())
    # _saved_grad_shard: one padded/W gradient per unit that ran its backward, deleted by
    # prepare_gradient_for_optim in the final callback; the shards themselves are on the host.
    assert seen == [sum(-(-u.numel // WORLD) * 4 for u in model.units)]
    assert after == 0 and shards_on_device == 0


def test_offload_flattens_each_unit_on_the_device_before_its_shard_goes_to_the_host() -> None:
    with device() as memory:
        model = wrapped(memory, offload=True)
        peak = memory.allocator.stats.peak_allocated
        assert memory.allocator.stats.allocated == 0 and memory.device_bytes(model.shards()) == 0

    def rounded(n: int) -> int:
        return -(-n // 512) * 512

    # The largest unit at its init: its parameters moved by _move_module_to_device, the cat, then the
    # shard's clone (the originals are freed once flattened; the clone is made before the cat goes).
    block = WIDTH * WIDTH + WIDTH
    moved = rounded(WIDTH * WIDTH * 4) + rounded(WIDTH * 4)
    assert peak == max(moved + rounded(unit_bytes(block)), rounded(unit_bytes(block)) + rounded(-(-block // WORLD) * 4))


def test_limit_all_gathers_follows_the_profiles_torch() -> None:
    assert not sh.limit_all_gathers(PROFILES["article"].optimizer_era)  # 2023-06-23 nightly
    assert sh.limit_all_gathers(PROFILES["torch-2.1"].optimizer_era)  # PR #104900 is in 2.1


def test_checkpointed_blocks_recompute_under_the_emulated_cuda_autocast() -> None:
    """16-mixed + checkpointing: the recompute runs the same CUDA autocast policy as the forward
    (torch's checkpoint restores autocast state; the emulated policy is re-entered), else the
    recomputed layer norms come out in half precision and checkpoint refuses them."""
    from memclaims.recipes.recipe import resolve
    from memclaims.sim import simulate

    record = simulate(resolve("vit", "smoke", ("16-mixed", "fsdp", "activation-checkpointing")))
    assert record.peak_reserved_total_bytes and record.devices == WORLD


def test_a_sharded_replays_phases_are_every_engines_entries() -> None:
    """Rank 0's Record comes from the one Record builder: the probes' entries per phase (allocated,
    above its start, reserved) and the sim's live bytes, as a one-device replay's load and train."""
    from memclaims.recipes.recipe import resolve
    from memclaims.sim import simulate

    record = simulate(resolve("vit", "smoke", ("fsdp",)), memory_steps=1)
    one_device = simulate(resolve("vit", "smoke", ("fabric",)), memory_steps=1)
    assert set(record.phases) == {"load", "train"} and record.devices == WORLD
    for name in ("load", "train"):
        assert set(record.phases[name]) == set(one_device.phases[name]) == {
            "allocated_bytes", "above_start_bytes", "reserved_bytes", "live_bytes"}
    load, train = record.phases["load"], record.phases["train"]
    assert load["above_start_bytes"] == load["allocated_bytes"] == record.load_peak_bytes  # nothing before the load
    assert train["allocated_bytes"] == record.peak_allocated_bytes and 0 < train["above_start_bytes"] < train["allocated_bytes"]


def test_a_view_of_a_storage_the_device_does_not_hold_allocates_nothing() -> None:
    """The blocks' parameters are host fakes (the device holds their shards); the forward's views of them
    (``weight.t()`` for addmm, ``detach``) are no allocation. Counting them kept a whole unsharded model
    on the simulated device for good."""
    with device() as memory:
        model = wrapped(memory)
        weight = model.units[0].params[0]
        before = memory.tensor_bytes
        views = [weight.t(), weight.detach(), weight.view(-1)]
        assert memory.tensor_bytes == before and len(views) == 3
        copy = weight.clone()  # a new storage is counted
        assert memory.tensor_bytes == before + copy.untyped_storage().nbytes()


def test_no_step_of_a_sharded_replay_counts_the_host_parameters() -> None:
    """After a whole forward and backward the device holds the shards (and the root's gradient shard) only."""
    with device() as memory:
        model = wrapped(memory)
        shards = memory.device_bytes(model.shards())
        run_forward_backward(memory, model)
        grads = memory.device_bytes(s.grad for s in model.shards() if s.grad is not None)
        assert memory.tensor_bytes == shards + grads


def test_lightning_2023_all_gathers_mixed_precision_in_fp32() -> None:
    """Lightning PR #17670 (2023-05-23) to PR #21361 (2025-11-21): "16-mixed" FSDP kept fp32 parameters
    (autocast casts per op); the installed Lightning all-gathers in fp16. The article's profile replays 2023."""
    assert sh.mixed_precision_dtypes("16-mixed", "2023") == (torch.float32, torch.float16)
    assert sh.mixed_precision_dtypes("bf16-mixed", "2023") == (torch.float32, torch.bfloat16)
    assert sh.mixed_precision_dtypes("bf16-true", "2023") == (torch.bfloat16, torch.bfloat16)
    assert sh.mixed_precision_dtypes("32-true", "2023") == (torch.float32, torch.float32)
    assert PROFILES["article"].lightning_era == PROFILES["torch-2.1"].lightning_era == "2023"
    assert PROFILES["current"].lightning_era == "installed"
    with pytest.raises(Exception, match="unknown Lightning era '2019'; valid: installed, 2023"):
        sh.mixed_precision_dtypes("16-mixed", "2019")


class ToyWithAnUnusedHead(Toy):
    def __init__(self) -> None:
        super().__init__()
        self.pooler = nn.Linear(WIDTH, WIDTH)  # in the root unit, never in the forward (BigBird's pooler)


def test_a_unit_reduce_scatters_once_per_backward_with_parameters_left_out() -> None:
    """FSDP1's post-backward hook fires when the flat parameter's gradient is complete: a parameter the
    loss never reaches does not hold the unit's reduce-scatter over into the next backward."""
    with device() as memory:
        memory.counting = False
        model = ToyWithAnUnusedHead()
        memory.counting = True
        sharded = sh.wrap(model, Block, memory, world=WORLD, shard_dtype=F32, param_dtype=F32, reduce_dtype=F32,
                          offload=False, checkpointing=False, auto_wrap=True, moved=False)
        sharded.root.unshard()
        loss = sharded.model(torch.empty(8, WIDTH)).sum()
        sharded.expect_gradients(loss)
        assert sharded.root.expected_grads == len(sharded.root.params) - 2
        loss.backward()
        assert sharded.root.shard is not None and sharded.root.shard.grad is not None
        assert all(p.grad is None for p in sharded.root.params)  # gathered into the flat gradient


# --- sharding strategies (issue #27): what rank 0 keeps under each ------------------------------

def strategy_wrapped(memory: DeviceMemory, sharding: str) -> sh.ShardedModel:
    return sh.wrap(host_model(memory), Block, memory, world=WORLD, shard_dtype=F32, param_dtype=F32,
                   reduce_dtype=F32, offload=False, checkpointing=False, auto_wrap=True, moved=False,
                   sharding=sharding)


BLOCK_NUMEL, ROOT_NUMEL = WIDTH * WIDTH + WIDTH, WIDTH * 3 + 3
MODEL_NUMEL = BLOCKS * BLOCK_NUMEL + ROOT_NUMEL


def shard_elements(group: int) -> int:
    """Rank 0's elements of every unit's flat parameter sharded over ``group`` ranks."""
    return BLOCKS * -(-BLOCK_NUMEL // group) + -(-ROOT_NUMEL // group)


@pytest.mark.parametrize("sharding, group", [("FULL_SHARD", WORLD), ("SHARD_GRAD_OP", WORLD), ("NO_SHARD", 1),
                                             ("HYBRID_SHARD", WORLD // 2)])
def test_each_strategy_keeps_its_share_of_parameters_and_gradients(sharding, group) -> None:
    """FULL_SHARD and SHARD_GRAD_OP shard over all ranks, HYBRID_SHARD over one of its two simulated
    nodes, NO_SHARD not at all (its flat parameter is the whole unit)."""
    with device() as memory:
        model = strategy_wrapped(memory, sharding)
        assert memory.device_bytes(model.shards()) == shard_elements(group) * 4
        run_forward_backward(memory, model)
        grads = memory.device_bytes(s.grad for s in model.shards() if s.grad is not None)
    assert grads == shard_elements(group) * 4


def test_shard_grad_op_keeps_every_unit_gathered_from_forward_through_backward() -> None:
    seen = {}
    for sharding in ("FULL_SHARD", "SHARD_GRAD_OP"):
        with device() as memory:
            model = strategy_wrapped(memory, sharding)
            model.root.unshard()
            out = model.model(torch.empty(8, WIDTH))
            seen[sharding] = model.unsharded_params()
            out.sum().backward()
            model.end_backward()
            model.root.reshard()
            assert model.unsharded_params() == 0  # the post-backward reshards either way
    # FULL_SHARD: the root only (FSDP1 keeps it for the backward); SHARD_GRAD_OP: every unit, padded.
    assert seen == {"FULL_SHARD": -(-ROOT_NUMEL // WORLD) * WORLD,
                    "SHARD_GRAD_OP": BLOCKS * -(-BLOCK_NUMEL // WORLD) * WORLD + -(-ROOT_NUMEL // WORLD) * WORLD}


def test_no_shard_gathers_nothing_and_holds_the_whole_model() -> None:
    with device() as memory:
        model = strategy_wrapped(memory, "NO_SHARD")
        assert memory.device_bytes(model.shards()) == MODEL_NUMEL * 4
        before = memory.allocator.stats.allocated
        model.root.unshard()
        assert memory.allocator.stats.allocated == before and model.unsharded_params() == 0


def test_strategy_names_are_checked() -> None:
    from memclaims.core.errors import UsageError

    with device() as memory, pytest.raises(UsageError, match="unknown sharding strategy 'ZERO3'"):
        strategy_wrapped(memory, "ZERO3")
    with pytest.raises(UsageError, match="HYBRID_SHARD over 2 simulated nodes needs a number of ranks divisible by 2"):
        sh.shard_group_size("HYBRID_SHARD", 3)
