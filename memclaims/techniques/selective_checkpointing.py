"""selective-checkpointing: each transformer block checkpointed with torch's selective activation checkpointing
(SAC: ``torch.utils.checkpoint.create_selective_checkpoint_contexts`` with a policy), which saves the outputs of
the compute-intensive ops in the forward pass and recomputes the rest in backward (issue #43).

The policy is torchtitan's op-level one (``torchtitan/distributed/activation_checkpoint.py``, ``_apply_op_sac``,
with the save list of ``torchtitan/models/llama3``'s parallelize: ``_op_sac_save_list``): save the outputs of the
matmuls, the scaled-dot-product-attention kernels, ``max`` and the reduce-scatters, except every second matmul of
a block, and recompute everything else. Two additions for the models memclaims trains, which torchtitan's Llama
does not have: ``addmm`` (a linear layer with a bias) counts as a matmul beside ``mm``, and the CPU's flash
attention kernel (``_scaled_dot_product_flash_attention_for_cpu``, which the sim's fake tensors also run) is
saved like its CUDA siblings.

The blocks are wrapped as ``activation-checkpointing`` wraps them (``memclaims.techniques.impl.block_checkpointing``:
a transformers model through its own switch, anything else by ``checkpoint_wrapper`` around each block of the
workload's block class), non-reentrant, with SAC's ``context_fn``; the sim wraps its fake model the same way.

What shows it (``check``): the policy's decisions in the forward pass and the ops that really ran again in
backward, counted below SAC's own recompute mode (an op SAC serves from its cache never reaches the counter):
some ops ran again, no op ran again more often than the policy marked it for recomputation, and the forward pass
keeps less than the same recipe without checkpointing. The Record's ``by_technique["selective-checkpointing"]``:
``saved_ops`` and ``recompute_ops`` (the policy's decisions by op, over the measured steps), ``recomputed_ops``
(the ops that ran again in backward, by op).
"""

from __future__ import annotations

import weakref
from collections import Counter
from typing import TYPE_CHECKING, Any

from memclaims.core.torch_ops import MATMULS
from memclaims.techniques.activation_checkpointing import forward_keeps_less
from memclaims.techniques.base import Hooks, Observed, Say, Technique, nothing_observed, observations
from memclaims.techniques.shared_conflicts import STRATEGY

if TYPE_CHECKING:
    import torch
    from torch import nn

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.techniques.engine_protocols import PhaseProbe, RealRun, SimSession

NAME = "selective-checkpointing"
# torchtitan's save list (its Llama's ``_op_sac_save_list``), by name: ops a torch release lacks are left out.
TORCHTITAN_SAVE = ("aten.mm.default", "aten._scaled_dot_product_efficient_attention.default",
                   "aten._scaled_dot_product_flash_attention.default",
                   "aten._scaled_dot_product_cudnn_attention.default",
                   "aten._scaled_dot_product_attention_math.default",
                   "aten._scaled_dot_product_fused_attention_overrideable.default",
                   "_c10d_functional.reduce_scatter_tensor.default", "aten.max.default")
# memclaims' additions: a linear layer with a bias runs addmm; the CPU (and the sim's fake tensors) run its own
# flash kernel.
ADDED_SAVE = ("aten.addmm.default", "aten._scaled_dot_product_flash_attention_for_cpu.default")


def save_list() -> frozenset[object]:
    """The policy's ops to save (OpOverloads of the installed torch)."""
    import torch

    found = []
    for name in (*TORCHTITAN_SAVE, *ADDED_SAVE):
        namespace, op, overload = name.split(".")
        packet = getattr(getattr(torch.ops, namespace), op, None)
        if packet is not None and hasattr(packet, overload):
            found.append(getattr(packet, overload))
    return frozenset(found)


def sac_ignored_ops() -> frozenset[object]:
    """The ops SAC neither asks the policy about nor caches (``torch.utils.checkpoint.SAC_IGNORED_OPS``: the
    detaches checkpointing adds, metadata queries): they run again in every recompute, whatever the policy."""
    import torch
    import torch.utils.checkpoint as checkpoint

    return frozenset(getattr(checkpoint, "SAC_IGNORED_OPS", {torch.ops.aten.detach.default}))


class SacWatch:
    """One model's SAC: its ``context_fn`` (a fresh pair of SAC modes per checkpointed call, as torchtitan's) and
    what the policy decided and the backward recomputed, by op name, over every checkpointed call."""

    def __init__(self) -> None:
        self.saved: Counter[str] = Counter()  # outputs the policy saved in the forward pass
        self.recompute: Counter[str] = Counter()  # ops the policy left to recompute
        self.recomputed: Counter[str] = Counter()  # ops that really ran again in backward
        self.save = save_list()

    def policy(self) -> Any:
        """torchtitan's op-level policy for one checkpointed call (its ``_get_custom_policy``): save the save
        list's outputs but every second matmul's. Called in the forward pass only (torch >= 2.10: the recompute
        reads SAC's cache by index)."""
        from torch.utils.checkpoint import CheckpointPolicy

        matmuls = [0]

        def decide(ctx: object, func: object, *args: object, **kwargs: object) -> object:
            name = str(func)
            if name in MATMULS:
                matmuls[0] += 1
            save = func in self.save and not (name in MATMULS and matmuls[0] % 2 == 0)
            (self.saved if save else self.recompute)[name] += 1
            return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

        return decide

    def context_fn(self) -> tuple[object, object]:
        """``checkpoint``'s ``context_fn``: SAC's two modes, with a counter of what runs again below SAC's
        recompute mode (written by hand: torch counts nothing of what SAC recomputes)."""
        from contextlib import ExitStack

        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        caching, cached = create_selective_checkpoint_contexts(self.policy())
        recomputed, ignored = self.recomputed, sac_ignored_ops()

        class Counting(TorchDispatchMode):
            def __torch_dispatch__(self, func: torch._ops.OpOverload, types: tuple[type, ...], args: tuple[object, ...] = (),
                               kwargs: dict[str, object] | None = None) -> object:
                if func not in ignored:
                    recomputed[str(func)] += 1
                return func(*args, **(kwargs or {}))

        class Recompute:
            """The counter first, SAC's recompute mode above it: SAC's cached outputs never reach the counter."""

            def __enter__(self) -> None:
                self.stack = ExitStack()
                self.stack.enter_context(Counting())  # type: ignore[no-untyped-call]
                self.stack.enter_context(cached)

            def __exit__(self, *exc: object) -> None:
                self.stack.close()

        return caching, Recompute()

    def fields(self) -> Observed:
        return observations(NAME, policy="torchtitan op-level SAC (every second matmul recomputed)",
                            saved_ops=dict(sorted(self.saved.items())),
                            recompute_ops=dict(sorted(self.recompute.items())),
                            recomputed_ops=dict(sorted(self.recomputed.items())))


# Each wrapped model's observations, found again from the model the observe hooks get (Fabric's wrapper holds
# the model as a submodule). Weak: a model's entry goes with it. Kept here because the sim wraps its model in
# the load phase (``sim_after_load``), before its training loop exists to hold a helper.
_OBSERVED: weakref.WeakKeyDictionary[object, SacWatch] = weakref.WeakKeyDictionary()


def wrap(model: nn.Module, workload: Any) -> str:
    """Checkpoint each block of ``model`` with SAC; returns how, for the Record's notes."""
    from memclaims.techniques.impl import block_checkpointing as checkpointing

    observed = SacWatch()
    how = checkpointing.enable(model, workload, context_fn=observed.context_fn)
    _OBSERVED[model] = observed
    return f"selective {how}, context_fn=create_selective_checkpoint_contexts(torchtitan's op-level policy)"


def observed_fields(model: nn.Module) -> Observed:
    """The Record's observation of the model's SAC (empty where none of its modules was wrapped here)."""
    for module in model.modules():
        observed = _OBSERVED.get(module)
        if observed is not None:
            return observed.fields()
    return nothing_observed()


class SelectiveCheckpointing(Hooks):
    convert_order = 0  # the blocks as built, as activation-checkpointing

    def convert_module(self, model: nn.Module, engine: RealRun) -> nn.Module:
        engine.notes.append(wrap(model, engine.recipe.workload))
        return model

    def observe(self, engine: RealRun, model: nn.Module, optimizer: torch.optim.Optimizer,
                probe: PhaseProbe) -> Observed:
        return observed_fields(model)

    def sim_after_load(self, model: nn.Module, recipe: Recipe, notes: list[str]) -> None:
        notes.append(wrap(model, recipe.workload))  # as the real engine's: the wrap allocates nothing

    def sim_observe(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                    session: SimSession) -> Observed:
        return observed_fields(model)

    def compare_without(self) -> bool:
        return True

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        seen = record.by_technique.get(NAME)
        if not seen:
            say(f"by_technique has no {NAME!r} observation after phase train: no block ran under SAC")
            return
        saved, marked, rerun = seen["saved_ops"], seen["recompute_ops"], seen["recomputed_ops"]
        if not saved:
            say(f"by_technique.{NAME}.saved_ops is empty after phase forward: the policy saved no op's output, "
                "so the backward recomputes everything (full checkpointing)")
        if not rerun:
            say(f"by_technique.{NAME}.recomputed_ops is empty after phase backward: no op ran again, nothing was "
                "recomputed")
        over = {op: (n, marked.get(op, 0)) for op, n in rerun.items() if n > marked.get(op, 0)}
        if over:
            say(f"by_technique.{NAME}.recomputed_ops ran ops again in phase backward more often than the policy "
                "marked them for recomputation (op: ran again, marked): "
                + ", ".join(f"{op}: {n}, {m}" for op, (n, m) in sorted(over.items()))
                + ": outputs it saved were recomputed")
        forward_keeps_less(record, without, say)


# memclaims applies SAC in the one-device engines; the strategies checkpoint the blocks by their own policy (FSDP's)
# or run a rank's blocks without it.
_ONE_DEVICE = "memclaims applies selective checkpointing in the one-device engines only (sim included)"
CONFLICTS: tuple[tuple[str, str], ...] = (
    ("activation-checkpointing", "both checkpoint the same blocks: full checkpointing recomputes every op, the "
                                 "selective one only what its policy does not save"),
    ("activation-offload", "SAC's saved outputs bypass save_on_cpu's saved-tensor hooks (torch warns: 'Tensors that "
                           "SAC saves currently bypass these hooks'), so only part of what the forward keeps would "
                           "move to the host"),
    (STRATEGY, _ONE_DEVICE),
)

# Not in the default selection (the nightly): one more fp32 ViT-L/16 case would pass the nightly's 30 GPU-minutes
# (memclaims.techniques.base.Technique.in_default); its own cases (suite/cases/techniques/test_selective_checkpointing.py)
# run on the cpu and sim tiers, and its pairs in the full matrix.
ENTRY = Technique(NAME, "selective activation checkpointing (torch's create_selective_checkpoint_contexts with "
                  "torchtitan's op-level policy): each block saves its matmul and attention outputs (every second "
                  "matmul recomputed) and recomputes the rest in backward",
                  "torch docs: create_selective_checkpoint_contexts", in_cover=False, in_default=False, conflicts=CONFLICTS,
                  hooks=SelectiveCheckpointing(), aliases=("checkpointing",))
