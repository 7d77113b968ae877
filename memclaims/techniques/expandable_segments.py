"""expandable-segments: the CUDA caching allocator's ``expandable_segments:True`` (one segment per stream and
pool that grows by mapping pages, instead of a segment per large request).

A setting of the CUDA caching allocator: the CPU has none (``refusal``), a CUDA run switches it for the run
(``memclaims.techniques.impl.cuda_allocator_setting``), the sim replays it in its allocator model. What shows it: bytes
mapped in expandable segments after the measured steps (the Record's ``expandable_segment_bytes``).
"""

from __future__ import annotations

import dataclasses
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from memclaims.techniques.base import AllocatorSetting, Hooks, Observed, Say, Technique, nothing_observed, observations

if TYPE_CHECKING:
    import torch
    from torch import nn

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.recipes.run_options import RunOptions
    from memclaims.techniques.engine_protocols import PhaseProbe, RealRun, SimSession

NAME = "expandable-segments"  # the technique's registry name, and its part of the Record (``by_technique``)


class ExpandableSegments(Hooks):
    def refusal(self, recipe: Recipe, options: RunOptions) -> str | None:
        if options.device != "cpu":
            return None
        return (f"{recipe.id}: expandable-segments is a setting of the CUDA caching allocator, which the CPU has "
                "none of; run it with --device cuda, or --device sim for the allocator model's prediction")

    def run_context(self, recipe: Recipe, options: RunOptions,
                    cuda: object) -> AbstractContextManager[object] | None:
        if options.device != "cuda":
            return None
        from memclaims.techniques.impl.cuda_allocator_setting import expandable_segments

        return expandable_segments(True, cuda)

    def observe(self, engine: RealRun, model: nn.Module, optimizer: torch.optim.Optimizer,
                probe: PhaseProbe) -> Observed:
        from memclaims.techniques.impl import cuda_allocator_setting as allocator_setting

        cuda = getattr(probe, "cuda", None)  # a CUDA probe's (real or injected) torch.cuda; the CPU's has none
        if cuda is None:
            return nothing_observed()
        return observations(NAME, expandable_segment_bytes=allocator_setting.expandable_segment_bytes(cuda))

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        # The setting applies to segments created after it: a run whose segments all came from the
        # default allocator shows none mapped in expandable segments.
        mapped = record.observed(NAME, "expandable_segment_bytes")
        if not mapped:
            say(f"expandable_segment_bytes is {mapped} B after phase train: no segment of the run was expandable "
                "(the allocator made a segment per request as by default)")

    def sim_allocator(self, allocator: AllocatorSetting) -> AllocatorSetting:
        return dataclasses.replace(allocator, expandable_segments=True)

    def sim_observe_run(self, session: SimSession) -> Observed:
        return observations(NAME, expandable_segment_bytes=session.allocator.expandable_bytes)


# A setting of the CUDA caching allocator: there is no caching allocator on the CPU; the sim
# replays it (memclaims.sim.allocator).
ENTRY = Technique(NAME, "the CUDA caching allocator's expandable_segments:True: one segment per "
                  "stream and pool that grows by mapping pages, instead of a segment per large request",
                  "torch docs: CUDA semantics, expandable_segments", in_cover=False,
                  requires=frozenset({"cuda"}), computes_as="fabric", hooks=ExpandableSegments())
