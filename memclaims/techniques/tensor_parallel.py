"""tensor-parallel (issue #43): each transformer block's linear layers split over the ranks, column-wise (q, k, v;
an MLP's up and gate projections) and row-wise (the attention output; the MLP's down projection), Megatron-LM's
split as Lightning's tensor-parallel guide and torchtitan apply it (the layouts: ``impl/tensor_parallel_plan.py``).

The ranks run Lightning's ``ModelParallelStrategy`` with a ``parallelize_fn`` (``TensorParallelize``: torch's
``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel`` over the device mesh's ``tensor_parallel``
dimension), through Fabric on CPU ranks over gloo (Lightning 2.6 runs the strategy there) as on CUDA ranks over
NCCL. Every rank of a tensor-parallel group sees the same batch (the strategy's sampler splits the data over its
``data_parallel`` dimension only). With ``fsdp2`` (or ``fsdp2-no-reshard``) the recipe is 2-D: tensor parallelism
within pairs of ranks, FSDP2's ``fully_shard`` across them (mesh ``(N / TP_WITH_FSDP2, TP_WITH_FSDP2)``), as
Lightning's 2-D guide runs it; FSDP1, DDP and DeepSpeed are refused with the reason.

What shows it (``observe``, ``check``): the layout's linear weights are DTensor shards of ``1/N`` of their columns or
rows on each rank, their gradients too, and the first forward ran sharded (column-wise outputs of ``1/N`` of the
features, row-wise outputs partial sums before their all-reduce). The sim replays a rank (``sim_replay``:
``memclaims.sim.replays.tensor_parallel``): its shards, the activations of its heads and features, the all-reduce outputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

from memclaims.techniques.base import (
    FSDP2_API,
    ON_CPU_RANKS,
    ON_SIM,
    TRUE_HALF_PRECISIONS,
    LoopHelper,
    Observed,
    Removal,
    Say,
    Strategy,
    StrategyPlan,
    Technique,
    observations,
)
from memclaims.techniques.fsdp import FSDP_SHARE_SLACK, Fsdp, reshard_after_forward

if TYPE_CHECKING:
    import torch
    from lightning.fabric.strategies import Strategy as FabricStrategy
    from torch import nn

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.techniques.engine_protocols import PhaseProbe, RealRun

NAME = "tensor-parallel"
# With fsdp2: tensor parallelism within pairs of ranks (the fast links of a node, in practice), FSDP2 across the
# pairs: Lightning's ModelParallelStrategy(data_parallel_size=N / 2, tensor_parallel_size=2).
TP_WITH_FSDP2 = 2


def mesh_sizes(plan: StrategyPlan) -> tuple[int, int]:
    """(data-parallel, tensor-parallel) sizes of a tensor-parallel plan's device mesh."""
    return plan.mesh_size("data_parallel"), plan.mesh_size("tensor_parallel")


def _fsdp2(recipe: Recipe) -> Fsdp | None:
    """The recipe's FSDP2 technique (fsdp2, fsdp2-no-reshard), which makes a tensor-parallel recipe 2-D."""
    return next((hooks for hooks in recipe.hooks if isinstance(hooks, Fsdp) and hooks.api == FSDP2_API), None)


def meta_model(recipe: Recipe) -> nn.Module:
    """The recipe's model on the meta device (no memory, no values): what its layout and refusals read."""
    import torch

    work = recipe.workload
    with torch.device("meta"):
        if work.architecture is not None:
            return work.architecture(recipe.scale, work.num_classes)
        model, _ = work.build_model(recipe.scale)
    return model


def _world(engine: RealRun) -> int:
    """The ranks of a tensor-parallel run (its engine runs on ranks only: their count is always given)."""
    assert engine.options.devices is not None, "a tensor-parallel rank runs among a known number of ranks"
    return engine.options.devices


class _Watching(LoopHelper):
    """The rank's model and layout, and the hooks that watch its first training forward (``ForwardWatch``)."""

    def __init__(self) -> None:
        self.model: Any = None
        self.layout: Any = None
        self.watch: Any = None

    @contextmanager
    def _after_first_forward(self) -> Iterator[None]:
        yield
        if self.watch is not None:
            self.watch.end_forward()

    def forward_context(self) -> AbstractContextManager[object] | None:
        return self._after_first_forward()


class TensorParallel(Strategy):
    lightning_devices = ("cuda", "cpu")  # ModelParallelStrategy runs on both (gloo on the CPU)
    sim_replay = "memclaims.sim.replays.tensor_parallel:TensorParallelReplay"
    shards_parameters = True
    block_policies = True  # checkpointing goes on after the split (TensorParallelize), not before it
    replaces_parameters = True  # parallelize_module swaps each split weight for a DTensor parameter

    # --- the plan ---------------------------------------------------------------------------------

    def plan(self, recipe: Recipe, world: int) -> StrategyPlan:
        fsdp = _fsdp2(recipe)
        tp = TP_WITH_FSDP2 if fsdp is not None else world
        dp = max(1, world // tp)
        sizes = f"tensor parallel {tp} x data parallel {dp}"
        plan = StrategyPlan(world=world, mesh_shape=(dp, tp), mesh_dim_names=("data_parallel", "tensor_parallel"),
                            data_parallel=dp, setup_moves_model=False)  # ModelParallelStrategy's module_to_device moves nothing
        if fsdp is not None:
            from dataclasses import replace

            plan = replace(plan, fsdp_api=FSDP2_API, sharding_strategy=fsdp.sharding_strategy,
                           reshard_after_forward=reshard_after_forward(fsdp.sharding_strategy),
                           wrap_blocks=recipe.workload.fsdp_auto_wrap)
            sizes += (f", FSDP2 fully_shard over the data-parallel dimension (reshard_after_forward="
                      f"{plan.reshard_after_forward})")
        return plan.noted(ON_CPU_RANKS, f"{sizes}: every rank of a tensor-parallel group trains on the same batch").noted(
            ON_SIM, f"tensor-parallel rank 0 of {world} ({sizes}) by per-rank accounting (memclaims.sim.replays.tensor_parallel): "
                    "its 1/N shards of the split linears, the activations of its heads and features, the all-reduce "
                    "outputs (forward: row-wise layers; backward: column-wise layers' input gradients); not modelled: "
                    "NCCL's own buffers (outside the caching allocator)")

    def rank_refusal(self, recipe: Recipe, device: str, world: int) -> str | None:
        if world < 2:
            return f"{recipe.id}: tensor parallelism over {world} rank splits nothing; give --devices 2 or more"
        if _fsdp2(recipe) is not None and (world % TP_WITH_FSDP2 or world < 2 * TP_WITH_FSDP2):
            return (f"{recipe.id}: tensor-parallel with FSDP2 runs tensor parallelism within pairs of ranks and FSDP2 "
                    f"across them: needs an even number of ranks, at least {2 * TP_WITH_FSDP2} (got {world})")
        from memclaims.techniques.impl import tensor_parallel_plan as layouts

        _, tp = mesh_sizes(self.plan(recipe, world))
        refused = layouts.refusal(meta_model(recipe), recipe.workload.block_class(), tp,
                                  recipe.workload.tensor_parallel_plan)
        return f"{recipe.id}: {refused}" if refused else None

    def lightning_strategy(self, plan: StrategyPlan, recipe: Recipe, device: str) -> str | FabricStrategy:
        """``ModelParallelStrategy(parallelize_fn=TensorParallelize(...), data_parallel_size, tensor_parallel_size)``."""
        from lightning.fabric.strategies.model_parallel import ModelParallelStrategy

        from memclaims.techniques.impl.tensor_parallel_plan import TensorParallelize

        dp, tp = mesh_sizes(plan)
        parallelize = TensorParallelize(recipe.workload, checkpointing=plan.checkpoint_blocks,
                                        fsdp2_reshard=plan.reshard_after_forward if plan.fsdp_api else None,
                                        auto_wrap=plan.wrap_blocks)
        return ModelParallelStrategy(parallelize_fn=parallelize, data_parallel_size=dp, tensor_parallel_size=tp)

    def rank_notes(self, plan: StrategyPlan, rank: int, device: str) -> list[str]:
        dp, tp = mesh_sizes(plan)
        fsdp = (f"; FSDP2 fully_shard over data_parallel, reshard_after_forward={plan.reshard_after_forward}"
                if plan.fsdp_api else "")
        backend = "gloo on the CPU" if device == "cpu" else "NCCL"
        return [f"rank {rank} of {plan.world}: Lightning ModelParallelStrategy (data_parallel {dp} x tensor_parallel "
                f"{tp}{fsdp}) over {backend}"]

    # --- the real run -------------------------------------------------------------------------------

    def attach(self, engine: RealRun) -> None:
        engine.helpers.append(_Watching())

    def before_setup(self, engine: RealRun, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """The layout of the model as built, and hooks on its split linears for the first training forward
        (registered before the plan's own, so they see each layer's output before its redistribution)."""
        from memclaims.techniques.impl import tensor_parallel_plan as layouts

        helper = next(h for h in engine.helpers if isinstance(h, _Watching))
        plan = engine.recipe.strategy_plan(_world(engine))
        _, tp = mesh_sizes(plan)
        helper.model, helper.layout = model, layouts.layout(model, engine.recipe.workload.block_class(),
                                                              engine.recipe.workload.tensor_parallel_plan)
        helper.watch = layouts.ForwardWatch()
        helper.watch.install(model, helper.layout, tp)
        engine.notes.append(helper.layout.note())

    def observe(self, engine: RealRun, model: nn.Module, optimizer: torch.optim.Optimizer,
                probe: PhaseProbe) -> Observed:
        from memclaims.techniques.impl import tensor_parallel_plan as layouts

        helper = next(h for h in engine.helpers if isinstance(h, _Watching))
        dp, tp = mesh_sizes(engine.recipe.strategy_plan(_world(engine)))
        return observations(NAME, **layouts.observed(helper.model, helper.layout, tp, dp, helper.watch))

    # --- the active check ----------------------------------------------------------------------------

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        """The rank holds 1/N of each split linear's weight (and its gradient) as a DTensor shard, whatever else it
        holds whole, and its first forward ran sharded; its parameters are below the whole model's."""
        seen = record.by_technique.get(NAME)
        if not seen:
            say(f"rank {record.rank}: the Record has no observation of the split (by_technique[{NAME!r}])")
            return
        dp, tp = mesh_sizes(recipe.strategy_plan(record.devices))
        where = f"rank {record.rank} of {record.devices}"
        if seen["tensor_parallel_size"] != tp:
            say(f"{where} split over {seen['tensor_parallel_size']} ranks, not the plan's {tp}")
        split, sharded = seen["split_linears"], seen["sharded_linears"]
        if not split or sharded != split:
            say(f"{where} holds {sharded} of the layout's {split} linear layers as DTensor shards after phase load "
                f"(sharded_linears): the plan was not applied, the rank holds them whole")
        full, local = seen["split_weight_elements"], seen["local_split_weight_elements"]
        shares = tp * (dp if record.fsdp_api == FSDP2_API else 1)
        exact = shares == tp  # tensor parallelism alone splits evenly (refusal: dimensions divisible by N)
        held = local * shares
        if not (held == full if exact else full <= held * FSDP_SHARE_SLACK and held <= full * FSDP_SHARE_SLACK):
            say(f"{where} holds local_split_weight_elements {local:,} of the split layers' {full:,} after phase load, "
                f"not 1/{shares} of them")
        grads = seen["local_split_grad_elements"]
        if grads != local:
            say(f"{where} holds local_split_grad_elements {grads:,} after phase backward, not its {local:,} weight "
                "elements' shard")
        colwise, rowwise = seen["colwise_linears"], split - seen["colwise_linears"]
        outputs = (seen["forward_colwise_local_outputs"], seen["forward_rowwise_partial_outputs"])
        if outputs != (colwise, rowwise):
            say(f"{where}: in phase forward {outputs[0]} of {colwise} column-wise layers gave 1/{tp} of their features "
                f"and {outputs[1]} of {rowwise} row-wise layers a partial sum (forward_colwise_local_outputs, "
                "forward_rowwise_partial_outputs): the forward did not run sharded")
        whole = record.param_count * (2 if record.precision in TRUE_HALF_PRECISIONS else 4)
        if record.param_bytes >= whole:
            say(f"{where} holds param_bytes {record.param_bytes:,} B after phase load, not below the whole model's "
                f"{whole:,} B")

    # --- what reports read ---------------------------------------------------------------------------

    def removes(self, after: Record) -> Removal | None:
        split = after.observed(NAME, "split_weight_elements")
        if not split:
            return Removal(no_verdict="the split layers' share of the model was not observed")
        share = split / max(1, after.param_count)
        tp = after.observed(NAME, "tensor_parallel_size")
        return Removal(state=1 - share * (1 - 1 / tp), why=f"{share:.0%} of the parameters split over {tp} ranks")

    # --- the sim ---------------------------------------------------------------------------------------

    def sim_refusal(self, recipe: Recipe) -> str | None:
        """What no TP size can mend: a model without a layout (the ranks' own refusals come with --devices)."""
        from memclaims.core.errors import UsageError
        from memclaims.techniques.impl import tensor_parallel_plan as layouts

        try:
            layouts.layout(meta_model(recipe), recipe.workload.block_class(), recipe.workload.tensor_parallel_plan)
        except UsageError as error:
            return str(error)
        return None


# Lightning's own (its connector): ModelParallelStrategy refuses this precision.
_MODEL_PARALLEL_16_MIXED = ("16-mixed", "Lightning's ModelParallelStrategy refuses precision 16-mixed; it takes "
                                        "32-true, bf16-mixed, bf16-true and 16-true")
_FSDP1 = ("Lightning's ModelParallelStrategy combines tensor parallelism with FSDP2 only (fully_shard over its "
          "data_parallel dimension); FSDP1's FSDPStrategy takes no tensor-parallel plan: use fsdp2 or fsdp2-no-reshard")
_CONFLICTS: tuple[tuple[str, str], ...] = (
    _MODEL_PARALLEL_16_MIXED,
    # Named before fsdp, which they need: the reason is theirs.
    ("cpu-offload", "FSDP1's CPUOffload (it needs fsdp): " + _FSDP1),
    ("delayed-init", "FSDPStrategy's init_module(empty_init=False) (it needs fsdp): " + _FSDP1),
    *((name, _FSDP1) for name in ("fsdp", "fsdp-shard-grad-op", "fsdp-no-shard", "fsdp-hybrid")),
    ("ddp", "Lightning's DDPStrategy replicates the whole model on every rank and takes no tensor-parallel plan; data "
            "parallelism beside tensor parallelism is ModelParallelStrategy's data_parallel dimension (add fsdp2)"),
    ("deepspeed-zero2", "Lightning's DeepSpeedStrategy runs DeepSpeed's engine, which takes no torch tensor-parallel "
                        "plan"),
    ("init-module", "ModelParallelStrategy's init_module builds the model on the host (or on the meta device with "
                    "empty_init), never on the GPU: there is no build in place to compare with 07_01's load"),
    *((name, "peft's LoRA replaces the projections the tensor-parallel layout splits with its own lora.Linear "
             "wrappers; memclaims applies the adapters on one device only") for name in ("lora", "qlora")),
)

ENTRY = Technique(NAME, "tensor parallelism (Megatron-LM's split): each block's q/k/v and MLP up/gate projections "
                  "split by columns, its attention output and MLP down projection by rows over the ranks, through "
                  "Lightning's ModelParallelStrategy (with fsdp2: 2-D, FSDP2 across pairs of tensor-parallel ranks)",
                  "article: section 'data and tensor parallelism'; Lightning's tensor-parallel guide",
                  in_cover=False, in_default=False, conflicts=_CONFLICTS, hooks=TensorParallel())

