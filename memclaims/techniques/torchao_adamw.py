"""ao-adamw8bit, ao-adamw4bit, ao-adamw-fp8: torchao's low-bit AdamW (``torchao.optim.AdamW8bit``, ``AdamW4bit``,
``AdamWFp8``), whose two Adam states are tensor subclasses holding block-wise quantized codes (issue #43).

What torchao keeps per state of a parameter it quantizes (``_AdamBase._new_buffer``: a tensor of 4,096 elements or
more whose size the block size divides): ``OptimState8bit`` (uint8 codes, 1 B an element, one scale per block of
256, its own 256-entry float32 quantization map), ``OptimState4bit`` (two 4-bit codes packed in a uint8, one scale
per block of 128, a 16-entry map), ``OptimStateFp8`` (float8_e4m3fn codes, one scale per block of 256); any other
parameter keeps plain states of its own dtype, and every parameter a float32 ``step``.

The optimizer is the recipe's core field (``optimizer="ao_adamw8bit"``, ...), built by
``memclaims.measure.optimizers`` through :func:`build`, as the course's AdamW is: the same two parameter groups
(decay on all but LayerNorm weights and biases), learning rate, betas and epsilon. Two things memclaims sets:

- eager on the CPU: torchao compiles each parameter's step (``torch.compile(single_param_adam)`` inside
  ``step``); on the CPU (and on the sim's fake CPU tensors) the step runs under
  ``torch.compiler.set_stance("force_eager")``, torch's own switch for running compiled functions eagerly (no
  inductor, no C++ compiler, seconds less per case); on CUDA torchao compiles as it ships;
- the smoke scale's threshold: none of the smoke ViT's tensors reaches torchao's 4,096 elements, so where the
  scale sets one (``Scale.min_8bit_size``, bitsandbytes' ``min_8bit_size`` at smoke scale) a state of that many
  elements or more, divisible by the block, is quantized as torchao quantizes the large ones (its own
  ``_subclass_zeros``); every other parameter is left to torchao's rule.

What shows it (``check``): the states' tensor subclasses and their codes, observed after the measured steps
(``by_technique[name]``): some state is torchao's low-bit subclass, its codes in the optimizer's dtype at its
bytes per element, and no quantized-size parameter left with a float32 state. The sim builds the same optimizer
on fake tensors (``_disable_current_modes`` around torchao's cached quantization maps, which read values) and
steps it eagerly: state bytes as the cpu tier's at smoke scale.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

from memclaims.techniques.base import Hooks, Observed, Say, Technique, observations

if TYPE_CHECKING:
    import torch
    from torch import nn

    from memclaims.core.record import Record
    from memclaims.recipes.recipe import Recipe
    from memclaims.techniques.engine_protocols import PhaseProbe, RealRun, SimSession

# The recipe's optimizer (its core field) -> torchao.optim's class.
CLASSES = {"ao_adamw8bit": "AdamW8bit", "ao_adamw4bit": "AdamW4bit", "ao_adamw_fp8": "AdamWFp8"}
OPTIMIZERS = tuple(CLASSES)
# Each optimizer's state subclass, the dtype of its codes and their bytes per element of the parameter (torchao's
# docstrings: 8-bit codes "stored as uint8"; 4-bit "two 4-bit values packed into one uint8"; FP8 e4m3).
STATES = {"ao_adamw8bit": ("OptimState8bit", "uint8", 1.0), "ao_adamw4bit": ("OptimState4bit", "uint8", 0.5),
          "ao_adamw_fp8": ("OptimStateFp8", "float8_e4m3fn", 1.0)}
# torchao quantizes a state only from this many elements (``_AdamBase._new_buffer``: "follow bitsandbytes, only
# quantize tensors >= 4096 values"), and only where the block size divides them.
TORCHAO_MIN_NUMEL = 4096


def technique_of(optimizer: str) -> str:
    return "ao-" + optimizer.removeprefix("ao_").replace("_", "-")


def torchao_problem() -> str | None:
    """Why torchao's low-bit optimizers cannot be built here (the sim's refusal), or None."""
    try:
        import torchao.optim  # noqa: F401
    except Exception as error:  # ImportError, or a torchao whose extension fails with this torch
        return f"torchao's low-bit optimizers do not import: {type(error).__name__}: {error} (pip install torchao)"
    return None


@cache
def fp8_cpu_problem() -> str | None:
    """Why AdamWFp8 cannot step on this CPU (float8_e4m3fn casts), or None: one tiny eager step, once per process."""
    if torchao_problem():
        return None  # the package's own requirement says why
    import torch
    from torchao.optim import AdamWFp8

    param = torch.nn.Parameter(torch.ones(4096))
    param.grad = torch.ones(4096)
    try:
        with torch.compiler.set_stance("force_eager"):
            AdamWFp8([param]).step()
    except Exception as error:
        return f"torchao's AdamWFp8 does not step on this CPU: {type(error).__name__}: {error}"
    return None


def _warm_quantization_maps() -> None:
    """torchao's 8-bit and 4-bit maps are ``lru_cache``d lists computed with ``.tolist()``: made on real tensors
    (outside the sim's fake mode, which has no values), each state then builds its map from the cached list."""
    from torch.utils._python_dispatch import _disable_current_modes
    from torchao.optim import subclass_4bit, subclass_8bit

    with _disable_current_modes():
        for module in (subclass_8bit, subclass_4bit):
            module.get_qmap_signed()
            module.get_qmap_unsigned()


@cache
def optimizer_class(name: str, min_numel: int | None, eager: bool) -> type:
    """torchao's class for ``name``, stepping eagerly where ``eager`` and quantizing from ``min_numel`` elements
    where given (else torchao's own rule)."""
    import torch
    import torchao.optim
    from torch.distributed.tensor import DTensor

    base: Any = getattr(torchao.optim, CLASSES[name])

    class Configured(base):  # type: ignore[misc]
        smallest_quantized = TORCHAO_MIN_NUMEL if min_numel is None else min(min_numel, TORCHAO_MIN_NUMEL)
        steps_eagerly = eager

        def _new_buffer(self, p: torch.Tensor, signed: bool) -> torch.Tensor:
            numel = p.numel()
            if (min_numel is not None and not isinstance(p, DTensor) and numel >= min_numel
                    and numel % self.block_size == 0):
                zeros: torch.Tensor = self._subclass_zeros(p, signed, self.block_size)
                return zeros
            buffer: torch.Tensor = super()._new_buffer(p, signed)
            return buffer

        def step(self, closure: object = None) -> object:
            if not eager:
                return super().step(closure)
            with torch.compiler.set_stance("force_eager"):
                return super().step(closure)

    Configured.__name__ = Configured.__qualname__ = base.__name__
    return Configured


def build(name: str, groups: list[dict[str, object]], learning_rate: float, betas: tuple[float, float], eps: float,
          min_numel: int | None, device: str) -> Any:
    """torchao's optimizer ``name`` over the course's parameter groups (``memclaims.measure.optimizers``)."""
    _warm_quantization_maps()
    return optimizer_class(name, min_numel, device == "cpu")(groups, lr=learning_rate, betas=betas, eps=eps)


def state_fields(optimizer: Any, technique: str) -> Observed:
    """What the optimizer holds after the measured steps (the Record's ``by_technique[technique]``): per state
    subclass its tensors, elements and the bytes and dtype of its codes, scales and maps; the plain states
    (parameters left unquantized), and how many of them had a size the optimizer quantizes; the steps' bytes."""
    import torch
    import torchao
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    block, smallest = int(optimizer.block_size), int(getattr(optimizer, "smallest_quantized", TORCHAO_MIN_NUMEL))
    subclasses: dict[str, dict[str, object]] = {}
    plain = {"tensors": 0, "elements": 0, "bytes": 0, "quantizable": 0}
    steps = 0
    for state in optimizer.state.values():
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                continue
            if key == "step":
                steps += value.numel() * value.element_size()
            elif is_traceable_wrapper_subclass(value):
                entry = subclasses.setdefault(type(value).__name__, {"tensors": 0, "elements": 0})
                entry["tensors"] += 1
                entry["elements"] += value.numel()
                names, _ = value.__tensor_flatten__()
                for attr in names:
                    part = getattr(value, attr)
                    entry[f"{attr}_bytes"] = entry.get(f"{attr}_bytes", 0) + part.numel() * part.element_size()
                    entry[f"{attr}_dtype"] = str(part.dtype).removeprefix("torch.")
            else:
                numel = value.numel()
                plain["tensors"] += 1
                plain["elements"] += numel
                plain["bytes"] += numel * value.element_size()
                plain["quantizable"] += numel >= smallest and numel % block == 0
    return observations(technique, optimizer=type(optimizer).__name__, torchao=torchao.__version__, block_size=block,
                        min_quantized_numel=smallest, eager=bool(getattr(optimizer, "steps_eagerly", False)),
                        state_subclasses=subclasses, plain_states=plain, step_bytes=steps)


class LowBitAdamW(Hooks):
    """The hooks of one of the three; ``optimizer`` names which (the recipe's core field)."""

    def __init__(self, optimizer: str) -> None:
        self.optimizer = optimizer
        self.name = technique_of(optimizer)

    def build_optimizer(self, groups: list[dict[str, object]], learning_rate: float, betas: tuple[float, float],
                        eps: float, min_8bit_size: int | None, device: str) -> object:
        """torchao's optimizer (``BuildsOptimizer``), quantizing from ``min_8bit_size`` where given."""
        return build(self.optimizer, groups, learning_rate, betas, eps, min_8bit_size, device)

    def observe(self, engine: RealRun, model: nn.Module, optimizer: torch.optim.Optimizer,
                probe: PhaseProbe) -> Observed:
        inner = getattr(optimizer, "optimizer", optimizer)  # Fabric's wrapper holds torchao's
        fields = state_fields(inner, self.name)
        seen = fields["by_technique"][self.name]
        how = ('eagerly (torch.compiler.set_stance("force_eager"))' if seen["eager"]
               else "compiled (torch.compile, as torchao ships it)")
        engine.notes.append(f"{self.name}: torchao {seen['torchao']} {seen['optimizer']} stepped {how}; states of "
                            f"{seen['min_quantized_numel']:,} elements or more quantized, in blocks of {seen['block_size']}")
        return fields

    def sim_after_load(self, model: nn.Module, recipe: Recipe, notes: list[str]) -> None:
        notes.append(f"{self.name}: torchao's {CLASSES[self.optimizer]} on fake tensors, stepped eagerly (on CUDA "
                     "torchao compiles each parameter's step, without the eager step's float32 temporaries: a few "
                     "of the largest parameter at most)")

    def sim_observe(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                    session: SimSession) -> Observed:
        return state_fields(optimizer, self.name)

    def sim_refusal(self, recipe: Recipe) -> str | None:
        return torchao_problem()

    def unsupported_on(self, device: str) -> str | None:
        if self.optimizer != "ao_adamw_fp8":
            return None
        if device == "cpu":
            return fp8_cpu_problem()
        if device == "cuda":
            import torch

            if torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 9):
                return (f"torchao's FP8 optimizers need CUDA compute capability 8.9 or more (its README); this GPU "
                        f"has {'.'.join(map(str, torch.cuda.get_device_capability()))}")
        return None

    def check(self, recipe: Recipe, record: Record, without: Record | None, say: Say) -> None:
        subclass, codes_dtype, per_element = STATES[self.optimizer]
        seen = record.by_technique.get(self.name)
        if not seen:
            say(f"by_technique has no {self.name!r} observation after phase optimizer_step: torchao's optimizer "
                "did not run")
            return
        held = seen["state_subclasses"].get(subclass)
        if not held or not held.get("elements"):
            say(f"by_technique.{self.name}.state_subclasses has no {subclass} after phase optimizer_step (states: "
                f"{seen['state_subclasses'] or 'none'}, plain {seen['plain_states']['bytes']:,} B): every state "
                "stayed a plain tensor of the parameters' dtype")
            return
        codes = held.get("codes_bytes", 0)
        if held.get("codes_dtype") != codes_dtype or codes != held["elements"] * per_element:
            say(f"by_technique.{self.name}.state_subclasses.{subclass} holds {codes:,} B of {held.get('codes_dtype')} "
                f"codes for {held['elements']:,} elements after phase optimizer_step, not {per_element:g} B of "
                f"{codes_dtype} each")
        plain = seen["plain_states"]
        if plain["quantizable"]:
            say(f"by_technique.{self.name}.plain_states has {plain['quantizable']} plain state(s) of "
                f"{seen['min_quantized_numel']:,} elements or more, divisible by the block of {seen['block_size']}, "
                "after phase optimizer_step: parameters torchao quantizes kept full-precision states")


# Not in the default selection (the nightly): three more fp32 ViT-L/16 cases would pass the nightly's 30 GPU-minutes
# (memclaims.techniques.base.Technique.in_default), and each sim replay at article scale steps torchao eagerly on
# fake tensors (about 10 s of CPU). Their own cases (suite/cases/techniques/test_torchao_adamw.py) run on the cpu
# tier and the sim at smoke scale in CI, the sim at article scale in the nightly; their pairs in the full matrix.
ENTRIES: tuple[Technique, ...] = tuple(
    Technique(technique_of(optimizer), summary, "torchao docs: low-bit optimizers (torchao/optim/README.md)",
              group="optimizer", optimizer=optimizer, requires=frozenset({"torchao"}), in_cover=False,
              in_default=False, hooks=LowBitAdamW(optimizer))
    for optimizer, summary in (
        ("ao_adamw8bit", "torchao AdamW8bit: both AdamW states in 8 bits (uint8 codes through a dynamic "
                         "quantization map, one scale per block of 256)"),
        ("ao_adamw4bit", "torchao AdamW4bit: both AdamW states in 4 bits (two codes a byte, one scale per block "
                         "of 128)"),
        ("ao_adamw_fp8", "torchao AdamWFp8: both AdamW states in float8_e4m3fn, one scale per block of 256"),
    ))
