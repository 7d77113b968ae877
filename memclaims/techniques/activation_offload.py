"""activation-offload: the tensors saved for backward moved to host memory during the forward pass
(``torch.autograd.graph.save_on_cpu``, pinned where CUDA is), copied back in backward (issue #27).

The loop enters the helper's hooks around each forward pass and counts what the first measured one packed
(``offloaded_activation_bytes`` in the technique's part of the Record, ``by_technique``): ``memclaims.techniques.impl.saved_tensor_offload`` on a real device,
``memclaims.techniques.impl.saved_tensor_offload_fake`` on the sim's fake tensors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memclaims.techniques.base import Hooks, Say, Technique
from memclaims.techniques.shared_conflicts import STRATEGY

if TYPE_CHECKING:

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.techniques.engine_protocols import RealRun, SimLoop, SimSession

NAME = "activation-offload"  # the technique's registry name, and its part of the Record (``by_technique``)


class ActivationOffload(Hooks):
    def attach(self, engine: RealRun) -> None:
        from memclaims.techniques.impl.saved_tensor_offload import ActivationOffload as Offload

        engine.helpers.append(Offload(engine.options.device, NAME))

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        # On the cpu tier the saved tensors are on the host already (save_on_cpu copies nothing): what
        # went through its pack hook is all there is to see. Elsewhere the bytes left the device.
        moved = record.observed(NAME, "offloaded_activation_bytes")
        if not moved:
            say(f"offloaded_activation_bytes is {moved} B: no tensor saved for backward in phase forward went "
                "through save_on_cpu's pack hook to host memory")

    def sim_attach(self, loop: SimLoop, session: SimSession) -> None:
        from memclaims.techniques.impl.saved_tensor_offload_fake import SimulatedOffload

        loop.helpers.append(SimulatedOffload(session.memory, NAME))


# A memclaims limitation, not torch's: the ranks' engines (memclaims.measure.distributed,
# memclaims.sim.sharded, memclaims.sim.replays.zero) run their own forward passes without save_on_cpu.
_RANKS_DO_NOT_OFFLOAD = "the multi-rank engines of memclaims do not wrap their forward pass in save_on_cpu"

# torch.autograd.graph.save_on_cpu around the forward pass (pinned host memory where CUDA is).
ENTRY = Technique(NAME, "tensors saved for backward moved to host memory during the forward pass "
                  "(torch.autograd.graph.save_on_cpu), copied back in backward", "torch docs: save_on_cpu",
                  in_cover=False, conflicts=((STRATEGY, _RANKS_DO_NOT_OFFLOAD),),
                  hooks=ActivationOffload())
