"""Every workload by name: the built-in ones, ``hf:<model_type>`` and those a user registered."""

from __future__ import annotations

from memclaims.core.errors import UsageError
from memclaims.core.names import GPU_SMOKE, HF_PREFIX
from memclaims.workloads.text import text_workloads
from memclaims.workloads.types import Workload
from memclaims.workloads.vit import VIT, VIT_H14_WORKLOAD

WORKLOADS: dict[str, Workload] = {VIT.name: VIT, VIT_H14_WORKLOAD.name: VIT_H14_WORKLOAD, **text_workloads()}


def gpu_tier_scale(workload_name: str, requested: str) -> str:
    """The scale the gpu tier runs ``workload_name`` at when asked for ``requested`` (smoke or
    article): its ``gpusmoke`` scale for smoke where it has one, else the scale asked for."""
    if requested == "smoke" and GPU_SMOKE in workload(workload_name).scales:
        return GPU_SMOKE
    return requested


def workload(name: str) -> Workload:
    """A built-in workload, an ``hf:<model_type>[(key=value,...)]`` one, or one a user registered."""
    if name.startswith(HF_PREFIX):
        from memclaims.workloads import hf

        return hf.workload(name)
    if name in WORKLOADS:
        return WORKLOADS[name]
    from memclaims.workloads import user as user_workloads

    found = user_workloads.find(name)
    if found is not None:
        return found
    valid = [*WORKLOADS, *user_workloads.names(), f"{HF_PREFIX}<model_type>"]
    raise UsageError(f"unknown workload {name!r}" + _suggestion(name, valid)) from None


def _suggestion(name: str, valid: list[str]) -> str:
    """The closest built-in or user workload, else a transformers model type as ``hf:<type>`` (``llama`` ->
    ``hf:llama``), else the short list of valid workloads (never the hundreds of model types)."""
    from memclaims.core.suggest import close, did_you_mean

    where = f"valid workloads: {', '.join(valid)}"
    if close(name, valid[:-1]):
        return did_you_mean(name, valid[:-1], where)
    from memclaims.workloads import hf

    types = hf.model_types()
    return did_you_mean(name, [name] if name in types else types, where, HF_PREFIX)
