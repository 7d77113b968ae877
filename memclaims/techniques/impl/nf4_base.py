"""The qlora technique's 4-bit base: bitsandbytes' NF4 ``Linear4bit``, on real tensors and on the sim's fake ones.

A real run (``quantize``, in the load phase before the adapters go on): every ``nn.Linear`` of the base but the
trained head and the output embeddings (what transformers' bitsandbytes loader also leaves unquantized, its
``get_keys_to_not_convert``) becomes a ``bitsandbytes.nn.Linear4bit`` whose weight, in the recipe's parameter dtype,
is quantized as it moves to the device (``Params4bit.to``: bitsandbytes quantizes on ``.to(device)`` only,
FINDINGS.md Q5): packed 4-bit NF4 (two weights a uint8), one absmax per block of 64, in fp32, or with double
quantization (``compress_statistics=True``, bitsandbytes' default for ``Params4bit``) in uint8 with an fp32 absmax
per 256 of those blocks and a 256-entry code table. The layer computes in the recipe's compute dtype
(``compute_dtype``: bf16 under bf16-true and bf16-mixed, as QLoRA's recipes set ``bnb_4bit_compute_dtype``).

The sim (``quantize_fake``, ``place_on_device``, ``GemmScratch``): ``Params4bit`` cannot wrap a fake tensor
(``Tensor._make_subclass`` refuses a FakeTensor), so ``SimLinear4bit`` is a ``Linear4bit`` whose weight is a plain
frozen parameter carrying the same attributes. Everything else is bitsandbytes' own code: ``quantize_4bit`` and
the layer's forward and backward run unchanged, and bitsandbytes' registered fake kernels give the packed weight,
the absmax and the dequantized weights from shapes alone. What the dispatch cannot see is the inside of the
forward's ``bitsandbytes::gemm_4bit`` custom op, which dequantizes the whole weight into the compute dtype before
its matmul (CUDA's ``_dequant_linear_fallback``, the CPU's default kernel): ``GemmScratch`` adds it as the kernel's
scratch. The backward's dequantization (``dequantize_4bit`` into the dtype the weight was quantized from, then a
cast to the gradient's dtype) is ordinary dispatched ops, seen by both engines.

Hand-written here, as no library offers it: which layers a base quantizes (transformers does it inside
``from_pretrained`` only), the fake layer, the custom op's scratch, and the storage figures the Record reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from memclaims.core.errors import UsageError
from memclaims.techniques.base import LoopHelper

if TYPE_CHECKING:
    from bitsandbytes.functional import QuantState
    from torch.utils._python_dispatch import TorchDispatchMode

    from memclaims.workloads.types import Workload

BLOCKSIZE = 64  # bitsandbytes' default for 4-bit (the QLoRA paper's)
NESTED_BLOCKSIZE = 256  # double quantization's blocks of absmax values (bitsandbytes' quantize_4bit)
QUANT_TYPE = "nf4"
DYNAMIC_MAP_ENTRIES = 256  # bitsandbytes' 8-bit dynamic code, quantize_blockwise's default code
# bnb 0.50.2 backends/cuda/ops.py: past this many rows (tokens) CUDA's gemm_4bit always takes the dequantize +
# F.linear fallback; below it an arch heuristic may pick the fused kernel, which makes no copy.
CUDA_FUSED_MAX_ROWS = 1536


def _bnb() -> Any:
    import bitsandbytes as bnb

    return bnb


# --- which layers ---------------------------------------------------------------------------------


def base_layers(model: nn.Module, workload: Workload) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, layer) of each ``nn.Linear`` of the base the technique quantizes, in the order
    ``named_modules`` meets them: not the trained head (``modules_to_save``) and not the output embeddings
    (a causal LM's vocabulary projection, which transformers' loader keeps in the model's dtype)."""
    targets = workload.lora_targets
    head = targets.modules_to_save if targets is not None else ()
    kept: set[int] = set()
    output = getattr(model, "get_output_embeddings", None)
    embeddings = output() if callable(output) else None
    if isinstance(embeddings, nn.Module):
        kept = {id(m) for m in embeddings.modules()}
    found = []
    for name, module in model.named_modules():
        if any(name == h or name.endswith(f".{h}") or name.endswith(h) for h in head):
            continue
        for child_name, child in module.named_children():
            full = f"{name}.{child_name}" if name else child_name
            if type(child) is not nn.Linear or id(child) in kept or any(full.endswith(h) for h in head):
                continue
            found.append((module, child_name, child))
    return found


# --- real tensors -----------------------------------------------------------------------------------


def quantize(model: nn.Module, workload: Workload, device: str, *, compute_dtype: torch.dtype,
             weight_dtype: torch.dtype, double_quant: bool) -> nn.Module:
    """The base's linear layers replaced by bitsandbytes' ``Linear4bit`` (NF4, ``compute_dtype``), frozen, each
    weight quantized from ``weight_dtype`` as it moves to ``device``, with ``double_quant`` as bitsandbytes'
    ``compress_statistics``."""
    bnb = _bnb()
    for module, child_name, child in base_layers(model, workload):
        four_bit = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                     compute_dtype=compute_dtype, compress_statistics=double_quant,
                                     quant_type=QUANT_TYPE)
        four_bit.weight = bnb.nn.Params4bit(child.weight.data.to(weight_dtype), requires_grad=False,
                                            compress_statistics=double_quant, quant_type=QUANT_TYPE)
        if child.bias is not None:
            four_bit.bias = nn.Parameter(child.bias.data, requires_grad=False)
        setattr(module, child_name, four_bit.to(device))  # Params4bit quantizes as it moves
    return model


# --- the sim's fake tensors -------------------------------------------------------------------------


@contextmanager
def _dynamic_map(code: torch.Tensor) -> Iterator[None]:
    """bitsandbytes' cached 8-bit dynamic code (``functional.name2qmap["dynamic"]``, made from values, which a
    fake tensor has none of) replaced by ``code`` while a fake weight is quantized, and restored after: the cache
    is global, and a fake tensor left in it would break the next real run."""
    import bitsandbytes.functional as functional

    table = functional.name2qmap
    had, previous = "dynamic" in table, table.get("dynamic")
    table["dynamic"] = code
    try:
        yield
    finally:
        if had:
            table["dynamic"] = previous
        else:
            del table["dynamic"]


def _fake_quantize(weight: torch.Tensor, double_quant: bool, code: torch.Tensor) -> tuple[torch.Tensor, QuantState]:
    """bitsandbytes' ``quantize_4bit`` of a fake weight: its registered fake kernels shape the packed weight and
    the absmax; the double quantization's mean, subtraction and 8-bit quantization run as they do on a device."""
    functional = _bnb().functional
    with _dynamic_map(code), torch.no_grad():
        packed, state = functional.quantize_4bit(weight, blocksize=BLOCKSIZE, compress_statistics=double_quant,
                                                 quant_type=QUANT_TYPE, quant_storage=torch.uint8)
    # The NF4 code table is made by ``torch.tensor(list)``, which reaches the dispatch only as an alias of a
    # constant (``lift_fresh``), so the sim would not count it; on a device it is 16 floats of its own.
    state.code = state.code.clone()
    return packed, state


def sim_linear4bit() -> type[nn.Module]:
    """``SimLinear4bit``, the class (made on first use: bitsandbytes loads after the registry)."""
    return _sim_class()


_SIM_CLASS: list[type[nn.Module]] = []


def _sim_class() -> type[nn.Module]:
    if _SIM_CLASS:
        return _SIM_CLASS[0]
    base: Any = _bnb().nn.Linear4bit

    class SimLinear4bit(base):  # type: ignore[misc]
        """bitsandbytes' ``Linear4bit`` over fake tensors: the weight a frozen ``nn.Parameter`` with Params4bit's
        attributes (peft's 4-bit LoRA layer reads them), the forward and backward bitsandbytes' own."""

        def __init__(self, linear: nn.Linear, compute_dtype: torch.dtype, double_quant: bool,
                     code: torch.Tensor) -> None:
            nn.Module.__init__(self)
            self.in_features, self.out_features = linear.in_features, linear.out_features
            self.compute_dtype, self.compute_type_is_set = compute_dtype, True
            self.quant_storage = torch.uint8
            # A CPU with AVX512-BF16 repacks the weight for inference; a GPU does not.
            self.support_avx512bf16_for_cpu = False
            self.dynamic_map = code  # on the host: bitsandbytes keeps one per process, not per run
            self.source_dtype = linear.weight.dtype
            self.double_quant = double_quant
            packed, state = _fake_quantize(linear.weight, double_quant, code)
            self.weight = nn.Parameter(packed, requires_grad=False)
            self._set_state(state)
            self.bias = (nn.Parameter(linear.bias.data, requires_grad=False) if linear.bias is not None
                         else None)

        def _set_state(self, state: QuantState) -> None:
            weight: Any = self.weight
            weight.quant_state, weight.quant_type, weight.blocksize = state, QUANT_TYPE, BLOCKSIZE
            weight.compress_statistics, weight.quant_storage, weight.bnb_quantized = (self.double_quant,
                                                                                      torch.uint8, True)
            self.quant_state = state

        def quantize_on_device(self) -> None:
            """``Params4bit.to(device)`` on the device: the weight's copy there, quantized, then dropped; the
            bias moves with it (``Linear4bit.to`` moves the layer)."""
            copy = torch.empty(self.quant_state.shape, dtype=self.source_dtype)
            packed, state = _fake_quantize(copy, self.double_quant, self.dynamic_map)
            del copy
            self.weight.data = packed
            self._set_state(state)
            if self.bias is not None:
                self.bias.data = torch.empty_like(self.bias)

    _SIM_CLASS.append(SimLinear4bit)
    return SimLinear4bit


def quantize_fake(model: nn.Module, workload: Workload, *, compute_dtype: torch.dtype,
                  double_quant: bool) -> nn.Module:
    """``quantize`` on the sim's host: each base layer a ``SimLinear4bit`` quantized from its fake weight (the
    adapters go on over it as over the real one), the device's copies made later by ``place_on_device``."""
    layer = sim_linear4bit()
    layers = base_layers(model, workload)
    if layers:
        code = layers[0][2].weight.new_empty(DYNAMIC_MAP_ENTRIES, dtype=torch.float32)
        for module, child_name, child in layers:
            setattr(module, child_name, layer(child, compute_dtype, double_quant, code))
    return model


def upcast_adapters(model: nn.Module, dtype: torch.dtype, move: Callable[[nn.Module, torch.dtype | None], None]) -> None:
    """peft's ``cast_adapter_dtype`` on the sim (its ``Module.to`` cannot swap fake tensors): the trainable linear
    layers (the adapters, which peft put in a 4-bit layer's compute dtype) converted to ``dtype`` by ``move``."""
    for module in model.modules():
        params = list(module.parameters(recurse=False))
        if isinstance(module, nn.Linear) and params and all(p.requires_grad for p in params) and \
                any(p.dtype != dtype for p in params):
            move(module, dtype)


def place_on_device(model: nn.Module) -> None:
    """What ``quantize`` allocates on the device, layer by layer, before the setup moves the rest."""
    layer = sim_linear4bit()
    for module in model.modules():
        if isinstance(module, layer):
            module.quantize_on_device()  # type: ignore[operator]


# --- what the Record says ---------------------------------------------------------------------------


def four_bit_layers(model: nn.Module) -> list[Any]:  # Linear4bit, whose weight (a Params4bit) nn.Linear types a Parameter
    """The model's 4-bit layers (bitsandbytes' ``Linear4bit``, real or fake; not peft's layers over them, which
    show their base's weight), in module order."""
    four_bit = _bnb().nn.Linear4bit
    return [m for m in model.modules() if isinstance(m, four_bit)]


def _nbytes(tensors: Iterator[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a fake tensor's storage has no pointer: by identity,
    each kept until the sum is done so that no identity is reused)."""
    from torch._subclasses.fake_tensor import FakeTensor

    seen: dict[int, torch.UntypedStorage] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        seen.setdefault(id(storage) if isinstance(tensor, FakeTensor) else storage.data_ptr(), storage)
    return sum(storage.nbytes() for storage in seen.values())


def storage(model: nn.Module) -> dict[str, object]:
    """What the 4-bit layers store, from their tensors: the packed weights, the first-level absmax (fp32, or
    uint8 with double quantization), the second level (its fp32 absmax, code table and offset), the NF4 code
    tables; the elements they stand for, the dtypes they were quantized from and compute in."""
    layers = four_bit_layers(model)
    states: list[Any] = [m.weight.quant_state for m in layers]
    nested = [s for s in states if s.nested]
    biases: list[torch.Tensor] = [m.bias for m in layers if m.bias is not None]
    return {
        "layers": len(layers),
        # Linear4bit's forward casts its bias to the compute dtype in place: its own dtype after a step.
        "bias_elements": sum(b.numel() for b in biases),
        "bias_bytes": _nbytes(iter(biases)),
        "quant_type": sorted({s.quant_type for s in states}),
        "blocksize": sorted({s.blocksize for s in states}),
        "quantized_elements": sum(int(s.shape.numel()) for s in states),
        "packed_bytes": _nbytes(m.weight for m in layers),
        "packed_dtype": sorted({str(m.weight.dtype).removeprefix("torch.") for m in layers}),
        "absmax_bytes": _nbytes(s.absmax for s in states),
        "absmax_dtype": sorted({str(s.absmax.dtype).removeprefix("torch.") for s in states}),
        "nested_absmax_bytes": _nbytes(s.state2.absmax for s in nested),
        "nested_code_bytes": _nbytes(s.state2.code for s in nested),
        "offset_bytes": _nbytes(s.offset for s in nested),
        "code_bytes": _nbytes(s.code for s in states),
        "double_quant": sorted({bool(s.nested) for s in states}),
        "quantized_from": sorted({str(s.dtype).removeprefix("torch.") for s in states}),
        "compute_dtype": sorted({str(m.compute_dtype).removeprefix("torch.") for m in layers}),
    }


def quant_state_bytes(observed: Mapping[str, int]) -> int:
    """The bytes of the quantization state beside the packed weights (``storage``'s parts): what a device
    holds for the 4-bit layers besides their parameters."""
    return int(observed["absmax_bytes"] + observed["nested_absmax_bytes"] + observed["nested_code_bytes"]
               + observed["offset_bytes"] + observed["code_bytes"])


# --- the forward's GEMM: what ran, and (on the sim) its scratch -------------------------------------


def _argument(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], name: str) -> Any:
    for index, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            return args[index] if index < len(args) else kwargs.get(name)
    raise UsageError(f"{func} has no argument {name!r}: this bitsandbytes' gemm_4bit is not the one memclaims knows")


class GemmSeen:
    """What the 4-bit GEMMs of the first forward pass ran with (``watching``: while it runs): their count, the
    input (compute) dtype, and whether the absmax came in 8 bits (double quantization, ``absmax_8bit``)."""

    def __init__(self) -> None:
        self.watching = False
        self.calls = 0
        self.dtypes: set[str] = set()
        self.absmax_8bit: set[bool] = set()

    def saw(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not self.watching:
            return
        self.calls += 1
        self.dtypes.add(str(args[0].dtype).removeprefix("torch."))
        self.absmax_8bit.add(_argument(func, args, kwargs, "absmax_8bit") is not None)

    def fields(self) -> dict[str, object]:
        return {"gemm_calls": self.calls, "gemm_dtypes": sorted(self.dtypes),
                "gemm_absmax_8bit": sorted(self.absmax_8bit)}


def gemm_op() -> object:
    _bnb()  # registers bitsandbytes' ops
    return torch.ops.bitsandbytes.gemm_4bit.default


def gemm_scratch_bytes(rows: int, shape: tuple[int, int], dtype: torch.dtype, nested: bool, path: str) -> int:
    """What ``gemm_4bit`` holds inside itself, beside its output, for ``rows`` input rows and an (N, K) weight:
    the whole weight dequantized into ``dtype``, and with double quantization the absmax dequantized to fp32.
    ``path``: "cuda", bitsandbytes 0.50's ``_dequant_linear_fallback`` (the dequantized absmax and its sum with
    the offset both alive: two), "cpu" its default kernel (the sum only: the dequantized absmax is a
    temporary of the addition), or "cuda" with ``rows`` at most ``CUDA_FUSED_MAX_ROWS``, where an arch heuristic
    may choose the fused kernel instead: the copy is counted still, an upper bound."""
    if path not in ("cuda", "cpu"):
        raise UsageError(f"unknown gemm_4bit path {path!r}; valid paths: cuda, cpu")
    n, k = shape
    absmax = 4 * -(-n * k // BLOCKSIZE) if nested else 0
    return n * k * dtype.itemsize + absmax * (2 if path == "cuda" else 1)


class GemmScratch(GemmSeen):
    """The sim's model of ``gemm_4bit``'s insides (``memclaims.sim.tracker.DeviceMemory.op_scratch``): the
    bytes its kernel holds beside its output; and what the GEMMs ran with, as ``GemmSeen``."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path
        self.largest = 0

    def __call__(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        self.saw(func, args, kwargs)
        inputs, shape = args[0], tuple(_argument(func, args, kwargs, "shapeB"))
        rows = inputs.numel() // inputs.shape[-1]
        nested = _argument(func, args, kwargs, "absmax_8bit") is not None
        nbytes = gemm_scratch_bytes(rows, (int(shape[0]), int(shape[1])), inputs.dtype, nested, self.path)
        self.largest = max(self.largest, nbytes)
        return nbytes

    def fields(self) -> dict[str, object]:
        return {**super().fields(), "gemm_scratch_bytes": self.largest}


def _watch_dispatch(seen: GemmSeen) -> TorchDispatchMode:
    """A dispatch mode that tells ``seen`` of each ``gemm_4bit`` (the real engines' first forward pass)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    op = gemm_op()

    class WatchGemm(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]

        def __torch_dispatch__(self, func: torch._ops.OpOverload, types: tuple[type, ...], args: tuple[object, ...] = (),
                               kwargs: dict[str, object] | None = None) -> object:
            if func is op:
                seen.saw(func, args, kwargs or {})
            return func(*args, **(kwargs or {}))

    return WatchGemm()


class FourBitCompute(LoopHelper):
    """The first forward pass's compute dtypes as the 4-bit layers ran them: a ``Linear4bit`` casts its output
    back to its input's dtype, so the loop's output dtypes of ``nn.Linear`` say nothing of them. Over that pass
    this helper reads the other linear layers' outputs itself (a global module hook: the loop's helpers get no
    model) and adds the dtype each 4-bit GEMM computed in, which ``seen`` records: on a real run from a dispatch
    mode over the pass (``dispatch``), on the sim from ``GemmScratch``, which the sim's dispatch calls."""

    def __init__(self, seen: GemmSeen, dispatch: bool) -> None:
        self.seen, self.dispatch = seen, dispatch
        self.others: set[str] = set()
        self.done = False

    def _hook(self, module: nn.Module, args: tuple[object, ...], output: object) -> None:
        if isinstance(module, nn.Linear) and not isinstance(module, _bnb().nn.Linear4bit) and \
                isinstance(output, torch.Tensor):
            self.others.add(str(output.dtype).removeprefix("torch."))

    @contextmanager
    def _first_pass(self) -> Iterator[None]:
        from torch.nn.modules.module import register_module_forward_hook

        handle = register_module_forward_hook(self._hook)
        self.seen.watching = True
        try:
            if self.dispatch:
                with _watch_dispatch(self.seen):
                    yield
            else:
                yield
        finally:
            handle.remove()
            self.seen.watching = False
            self.done = True

    def forward_context(self) -> AbstractContextManager[object] | None:
        return None if self.done else self._first_pass()

    def compute_dtypes(self, seen: list[str]) -> list[str]:
        if not self.seen.calls:
            return seen
        return sorted(self.others | self.seen.dtypes)
