"""Lightning's FSDP configuration where Lightning does not run FSDP: read from its objects, executed by the CPU ranks.

On CUDA ranks Lightning's ``FSDPStrategy`` wraps the model itself (``setup_module``: ``FullyShardedDataParallel(module,
cpu_offload=..., mixed_precision=self.mixed_precision_config, sharding_strategy=..., device_id=..., **_fsdp_kwargs)``,
then ``_setup_activation_checkpointing``). On the CPU it cannot: Fabric's connector refuses it ("FSDP is only available
on GPU"), and torch 2.14's FSDP1 refuses Lightning's own call there too (``device_id=root_device.index`` is None for a
CPU device, and FSDP1 then asks for an accelerator: "FSDP needs a non-CPU accelerator device"; it runs on CPU ranks
over gloo only with ``device_id=torch.device("cpu")``, which Lightning never passes, and without ``CPUOffload``, whose
pinned host memory needs CUDA). So ``read`` builds nothing but the objects: the ``FSDPStrategy`` the CUDA ranks would
get and the ``FSDPPrecision`` Fabric's connector pairs with it (``_check_and_init_precision``), and reads what
``setup_module`` would pass to FSDP: the strategy's ``mixed_precision_config`` (its own ``mixed_precision``, else the
plugin's), ``cpu_offload``, ``sharding_strategy``, ``_fsdp_kwargs`` (the auto-wrap policy Lightning built, e.g. a
``ModuleWrapPolicy`` from a set of classes; ``use_orig_params``; ``device_mesh``) and ``_activation_checkpointing_kwargs``.
A keyword no engine here executes fails loudly (``UnexecutedSetting``), so a Lightning release that starts passing one
cannot pass unseen.

``shard`` executes that configuration on one of the CPU ranks with FSDP2's ``fully_shard`` (per-parameter sharding:
``use_orig_params=True``'s view of the parameters): the units Lightning's auto-wrap policy selects (evaluated by the
policy itself, ``_Policy._run_policy``), Lightning's own ``_setup_activation_checkpointing`` with its keywords (before
``fully_shard``, so each unit's checkpoint wrapper sits inside its FSDP group, as FSDP1's does), and the
MixedPrecision's dtypes as FSDP2's ``MixedPrecisionPolicy`` (``param_dtype``, ``reduce_dtype``, the input casts; FSDP2
has no ``buffer_dtype``: the floating buffers are cast to it once, as FSDP1's lazy init does). The sim's FSDP1 replay
reads the same plan (``policy_targets``, ``checkpoint_targets``). Written here because no library maps FSDP1's
configuration onto FSDP2.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

import torch
from torch import nn

from memclaims.core.errors import MemclaimsError, UsageError

# The FSDP keywords of ``FSDPStrategy._fsdp_kwargs`` the engines here execute: the auto-wrap policy (its units),
# ``use_orig_params=True`` (FSDP2 keeps the original parameters, sharded per parameter) and HYBRID_SHARD's
# ``device_mesh`` (the plan's mesh).
EXECUTED_KEYWORDS = ("auto_wrap_policy", "use_orig_params", "device_mesh")


class UnexecutedSetting(MemclaimsError):
    """Lightning's FSDPStrategy configures something the CPU ranks and the sim do not execute."""


@dataclass(frozen=True)
class LightningFsdp:
    """What ``FSDPStrategy.setup_module`` would pass to FSDP, by the plan's field names (``StrategyPlan``)."""

    sharding_strategy: str
    device_mesh: tuple[int, ...] | None
    offload_params: bool
    param_dtype: str | None
    reduce_dtype: str | None
    buffer_dtype: str | None
    cast_forward_inputs: bool
    cast_root_forward_inputs: bool
    wrap_policy: object
    checkpoint_options: tuple[tuple[str, object], ...]
    configured_by: str


def _dtype_name(dtype: torch.dtype | None) -> str | None:
    return None if dtype is None else str(dtype).removeprefix("torch.")


def dtype(name: str | None) -> torch.dtype | None:
    """The torch dtype of a plan's dtype name (None: none)."""
    if name is None:
        return None
    found = getattr(torch, name, None)
    if not isinstance(found, torch.dtype):
        raise UsageError(f"unknown torch dtype {name!r} in an FSDP plan")
    return found


def read(strategy: Any, precision: str) -> LightningFsdp:
    """What Lightning's ``FSDPStrategy`` ``strategy``, paired with ``FSDPPrecision(precision)`` as Fabric's connector
    pairs them, would pass to FSDP in ``setup_module``; neither is launched (no process group, no device)."""
    import lightning
    from lightning.fabric.plugins.precision.fsdp import FSDPPrecision

    with warnings.catch_warnings():
        # FSDPPrecision warns of "true" half precisions that FSDP keeps a full-precision copy (it is what it
        # configures), and its 16-mixed ShardedGradScaler that it has no CUDA (nothing here scales a loss).
        warnings.filterwarnings("ignore", message="FSDP with")
        warnings.filterwarnings("ignore", message=".*GradScaler is enabled, but CUDA is not available")
        strategy.precision = FSDPPrecision(precision)  # type: ignore[arg-type]
        config = strategy.mixed_precision_config
    keywords = dict(strategy._fsdp_kwargs)
    wrap_policy = keywords.pop("auto_wrap_policy", None)
    mesh = keywords.pop("device_mesh", None)
    original = keywords.pop("use_orig_params", True)
    configured_by = f"Lightning {lightning.__version__} FSDPStrategy + FSDPPrecision({precision!r})"
    unexecuted = [f"{key}={value!r}" for key, value in keywords.items()]
    if original is not True:
        unexecuted.append(f"use_orig_params={original!r} (FSDP2 keeps the original parameters)")
    if config is not None and config.keep_low_precision_grads:
        unexecuted.append("MixedPrecision(keep_low_precision_grads=True) (FSDP2 keeps sharded gradients in the "
                          "parameters' dtype)")
    if mesh is not None and not isinstance(mesh, tuple):
        unexecuted.append(f"device_mesh={mesh!r} (a mesh object: the engines here build theirs from a shape)")
    if unexecuted:
        raise UnexecutedSetting(f"{configured_by} passes {', '.join(unexecuted)} to FullyShardedDataParallel: neither "
                                "the CPU ranks' fully_shard nor the sim's FSDP1 replay executes it "
                                "(memclaims.techniques.impl.lightning_fsdp_plan.EXECUTED_KEYWORDS)")
    return LightningFsdp(
        sharding_strategy=strategy.sharding_strategy.name, device_mesh=mesh,
        offload_params=bool(strategy.cpu_offload.offload_params),
        param_dtype=_dtype_name(config.param_dtype) if config else None,
        reduce_dtype=_dtype_name(config.reduce_dtype) if config else None,
        buffer_dtype=_dtype_name(config.buffer_dtype) if config else None,
        # FSDP1's defaults without a MixedPrecision: nothing to cast to.
        cast_forward_inputs=bool(config.cast_forward_inputs) if config else False,
        cast_root_forward_inputs=bool(config.cast_root_forward_inputs) if config else True,
        wrap_policy=wrap_policy, checkpoint_options=tuple(sorted(strategy._activation_checkpointing_kwargs.items())),
        configured_by=configured_by)


def describe_policy(policy: object) -> str:
    """A policy in words that stay the same from run to run (torch's repr carries the object's address)."""
    classes = getattr(policy, "_module_classes", None)
    if classes is not None:
        return f"{type(policy).__name__}({{{', '.join(sorted(c.__name__ for c in classes))}}})"
    return type(policy).__name__


def describe(plan: Any) -> str:
    """What Lightning configured, for a rank's Record (``plan``: a configured ``StrategyPlan``)."""
    precision = ("no MixedPrecision" if plan.param_dtype is None and plan.reduce_dtype is None else
                 f"MixedPrecision(param_dtype={plan.param_dtype}, reduce_dtype={plan.reduce_dtype}, "
                 f"buffer_dtype={plan.buffer_dtype})")
    wrap = (f"auto_wrap_policy={describe_policy(plan.wrap_policy)}" if plan.wrap_policy is not None else
            "no auto-wrap policy (the root alone)")
    options = dict(plan.checkpoint_options)
    checkpointing = ("no activation checkpointing" if not options else "activation checkpointing " + ", ".join(
        f"{key}={describe_policy(value) if key == 'auto_wrap_policy' else key}" for key, value in sorted(options.items())))
    return (f"as {plan.configured_by} configure it: {precision}; {wrap}; {checkpointing}; "
            f"CPUOffload(offload_params={plan.offload_params}); {plan.sharding_strategy}")


def policy_targets(policy: object, model: nn.Module) -> list[nn.Module]:
    """The modules below the root that an FSDP auto-wrap policy selects in ``model``, in ``model.modules()`` order,
    by the policy's own rule (``_Policy._run_policy``, as FSDP1's auto-wrap and torch's checkpointing call it)."""
    if policy is None:
        return []
    from torch.distributed.fsdp.wrap import _Policy

    if not isinstance(policy, _Policy):
        raise UnexecutedSetting(f"auto_wrap_policy {describe_policy(policy)} is no torch.distributed.fsdp.wrap._Policy: "
                                "the engines here evaluate policy objects only (Lightning builds a ModuleWrapPolicy "
                                "from a set of classes)")
    return [module for module in policy._run_policy(model, set(), {}) if module is not model]


def checkpoint_targets(options: tuple[tuple[str, Any], ...], model: nn.Module) -> list[nn.Module]:
    """The modules Lightning's activation checkpointing wraps (``apply_activation_checkpointing``'s
    ``auto_wrap_policy``, else its ``check_fn``)."""
    chosen = dict(options)
    if "auto_wrap_policy" in chosen:
        return policy_targets(chosen["auto_wrap_policy"], model)
    check = chosen.get("check_fn")
    return [] if check is None else [m for m in model.modules() if m is not model and check(m)]


def _post_order(module: nn.Module) -> Iterator[nn.Module]:
    for child in module.children():
        yield from _post_order(child)
    yield module


def _cast_buffers(model: nn.Module, name: str | None) -> None:
    """FSDP1 keeps the floating buffers in ``buffer_dtype`` (its lazy init casts them); FSDP2 has no such setting."""
    wanted = dtype(name)
    if wanted is None:
        return
    for module in model.modules():
        for key, buffer in module._buffers.items():
            if buffer is not None and buffer.is_floating_point() and buffer.dtype != wanted:
                module._buffers[key] = buffer.to(wanted)


def shard(model: nn.Module, plan: Any, mesh: DeviceMesh | None, workload: str) -> nn.Module:
    """One CPU rank's model under the configured ``plan`` (a ``StrategyPlan`` from ``Strategy.configured``): FSDP2's
    ``fully_shard`` on each unit Lightning's auto-wrap policy selects (its checkpoint wrapper when Lightning's
    checkpointing wrapped it), children before parents, with the plan's ``reshard_after_forward``, then on the root
    (FSDP1 wraps the root whatever the policy); every group under the MixedPrecision as a ``MixedPrecisionPolicy``."""
    from lightning.fabric.strategies.fsdp import _setup_activation_checkpointing
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    units = policy_targets(plan.wrap_policy, model)
    if plan.wrap_policy is not None and not units:
        raise UsageError(f"{workload}: Lightning's auto-wrap policy {describe_policy(plan.wrap_policy)} selects no "
                         "module to shard")
    position = {id(m): index for index, m in enumerate(_post_order(model))}
    units.sort(key=lambda m: position[id(m)])
    _setup_activation_checkpointing(model, dict(plan.checkpoint_options))
    _cast_buffers(model, plan.buffer_dtype)
    wrappers = {id(m._checkpoint_wrapped_module): m for m in model.modules() if hasattr(m, "_checkpoint_wrapped_module")}
    on_mesh: Mapping[str, Any] = {} if mesh is None else {"mesh": mesh}
    # A MixedPrecision in the parameters' own dtype is FSDP's no-op (32-true's float32, bf16-true's bfloat16 on a
    # model Lightning converted): FSDP2 clamps it per parameter itself; clamped here too, the root does not re-cast
    # inputs already in that dtype, and the Records are those of FSDP2 without a policy.
    param_dtype, reduce_dtype = dtype(plan.param_dtype), dtype(plan.reduce_dtype)
    if {p.dtype for p in model.parameters() if p.is_floating_point()} == {param_dtype}:
        param_dtype = None
        reduce_dtype = None if reduce_dtype == dtype(plan.param_dtype) else reduce_dtype

    def precision(cast: bool) -> MixedPrecisionPolicy:
        return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype, cast_forward_inputs=cast)

    for unit in units:
        fully_shard(wrappers.get(id(unit), unit), reshard_after_forward=plan.reshard_after_forward,
                    mp_policy=precision(plan.cast_forward_inputs), **on_mesh)
    # FSDP1's root casts its inputs when either flag asks (cast_root_forward_inputs is the root's own).
    fully_shard(model, mp_policy=precision(plan.cast_root_forward_inputs or plan.cast_forward_inputs), **on_mesh)
    return model
