"""Tensor parallelism as memclaims applies it (the ``tensor-parallel`` technique, ``memclaims.techniques.tensor_parallel``):
which ``nn.Linear`` layers of a workload's model its ranks split column-wise or row-wise (``layout``), torch's
``parallelize_module`` of that layout over the device mesh's tensor-parallel dimension (``TensorParallelize``,
Lightning's ``ModelParallelStrategy``'s ``parallelize_fn``), and what a rank's model shows of it (``observed``).
The sim (``memclaims.sim.replays.tensor_parallel``) splits the same layout on fake tensors.

Where a layout comes from:

- an ``hf:`` model whose config carries transformers' own tensor-parallel plan (``base_model_tp_plan``: llama,
  mistral, qwen2, gemma, olmo, ...): that plan, when every style in it is ``"colwise"`` or ``"rowwise"`` (torch's
  ``ColwiseParallel`` / ``RowwiseParallel``, the styles of Lightning's tensor-parallel guide). A family whose plan
  uses another style (phi3's ``colwise_gather_output``, gpt_neox's ``embedding_rowwise``, mixtral's experts) or
  that has none (gpt2: its attention is one fused ``Conv1D``) is refused with the reason;
- the built-in workloads, by their block class, Megatron-LM's split as torchtitan and Lightning's guide apply it:
  DistilBERT's attention ``q_lin``/``k_lin``/``v_lin`` column-wise and ``out_lin`` row-wise, its FFN ``lin1``
  column-wise and ``lin2`` row-wise; BigBird's ``query``/``key``/``value`` column-wise, the attention output's
  ``dense`` row-wise, ``intermediate`` column-wise and ``output`` row-wise (its block-sparse attention reads its
  head count from ``num_attention_heads``: divided by the TP size on each rank, as torchtitan divides its
  ``n_heads``); torchvision's ViT ``EncoderBlock``: its MLP only (``mlp.0`` column-wise, ``mlp.3`` row-wise). The
  ViT's attention is ``nn.MultiheadAttention``, whose q/k/v projection is one fused ``in_proj_weight`` parameter
  that ``F.multi_head_attention_forward`` checks against ``embed_dim`` and ``num_heads``: no ``nn.Linear`` to
  split, so it stays whole on every rank (``Layout.whole`` says so in the Record's notes).

The models of transformers (and DistilBERT's, BigBird's full attention) reshape their projections with
``view(..., -1, head_dim)``, so a rank's column-wise shards are its own heads (``num_heads / N``) without a change.
Everything outside the layout (embeddings, norms, the vocabulary or classification head, the row-wise layers'
biases) is replicated on every rank.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatch
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

import torch
from torch import nn

from memclaims.core.errors import UsageError

COLWISE, ROWWISE = "colwise", "rowwise"
STYLES = (COLWISE, ROWWISE)
# The dimension of an nn.Linear's weight (out_features, in_features) each style splits: torch's ColwiseParallel
# shards the weight and bias on dim 0 (Shard(0)), RowwiseParallel the weight on dim 1 (Shard(1)), bias replicated.
SPLIT_DIM = {COLWISE: 0, ROWWISE: 1}
# The device mesh's dimensions as Lightning's ModelParallelStrategy names them.
DP_DIM, TP_DIM = "data_parallel", "tensor_parallel"

_VIT_ATTENTION = ("self_attention (nn.MultiheadAttention: its q/k/v projection is one fused in_proj_weight that "
                  "F.multi_head_attention_forward checks against embed_dim and num_heads, no nn.Linear to split)")


@dataclass(frozen=True)
class BlockLayout:
    """The split of one block class: (path in the block, style) of each linear; the attributes (path in the block)
    holding a head count the rank divides; what of the block stays whole and why."""

    linears: tuple[tuple[str, str], ...]
    heads: tuple[str, ...] = ()
    whole: str = ""


# By the block class's module and name (a user's class of the same name is not one of these).
BLOCK_LAYOUTS: dict[str, BlockLayout] = {
    "torchvision.models.vision_transformer.EncoderBlock": BlockLayout(
        (("mlp.0", COLWISE), ("mlp.3", ROWWISE)), whole=_VIT_ATTENTION),
    "transformers.models.distilbert.modeling_distilbert.TransformerBlock": BlockLayout(
        (("attention.q_lin", COLWISE), ("attention.k_lin", COLWISE), ("attention.v_lin", COLWISE),
         ("attention.out_lin", ROWWISE), ("ffn.lin1", COLWISE), ("ffn.lin2", ROWWISE))),
    "transformers.models.big_bird.modeling_big_bird.BigBirdLayer": BlockLayout(
        (("attention.self.query", COLWISE), ("attention.self.key", COLWISE), ("attention.self.value", COLWISE),
         ("attention.output.dense", ROWWISE), ("intermediate.dense", COLWISE), ("output.dense", ROWWISE)),
        heads=("attention.self.num_attention_heads",)),
}


def class_key(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class Layout:
    """What a model's ranks split: every split ``nn.Linear`` by its name in the model, with its style; the head
    counts each rank divides ((module name, attribute)); where the layout comes from and what stays whole."""

    linears: tuple[tuple[str, str], ...]
    heads: tuple[tuple[str, str], ...] = ()
    source: str = ""
    whole: str = ""
    # Config attributes holding head counts (transformers' plans: num_attention_heads, num_key_value_heads).
    config_heads: tuple[tuple[str, int], ...] = field(default=())

    def note(self) -> str:
        """The Record's note of the layout."""
        colwise = sum(style == COLWISE for _, style in self.linears)
        text = (f"tensor-parallel layout from {self.source}: {colwise} column-wise and {len(self.linears) - colwise} "
                "row-wise nn.Linear layers split over the ranks; embeddings, norms, the head and the row-wise biases "
                "whole on every rank")
        return f"{text}; whole too: {self.whole}" if self.whole else text


def layout(model: nn.Module, block: type[nn.Module] | None, plan: Mapping[str, str] | None = None) -> Layout:
    """The layout of ``model`` (``block``: the workload's block class; ``plan``: the workload's own tensor-parallel
    plan, ``Workload.tensor_parallel_plan``), or UsageError with the reason there is none."""
    if plan:
        return _own_layout(model, plan)
    config = getattr(model, "config", None)
    plan = getattr(config, "base_model_tp_plan", None)
    if plan:
        return _transformers_layout(model, config, plan)
    key = class_key(block) if block is not None else None
    if key in BLOCK_LAYOUTS:
        return _block_layout(model, block, BLOCK_LAYOUTS[key])  # type: ignore[arg-type]  # key: block is set
    model_type = getattr(config, "model_type", None)
    if model_type is not None:
        raise UsageError(f"tensor-parallel does not cover transformers' {model_type!r}: its config has no tensor-parallel "
                         "plan (base_model_tp_plan) and memclaims has no layout of its block; covered: hf: models whose "
                         "plan splits nn.Linear layers colwise/rowwise (llama, mistral, qwen2, gemma, olmo, ...), "
                         "distilbert, bigbird, vit")
    raise UsageError(f"tensor-parallel does not cover this model ({type(model).__name__}, block "
                     f"{block.__name__ if block is not None else None}): memclaims has no layout of its linear layers; "
                     "covered: vit, vit-h14, distilbert, bigbird, hf: models with transformers' tensor-parallel plan "
                     "and workloads that give one (memclaims.workloads.user.define's tensor_parallel_plan)")


def _own_layout(model: nn.Module, plan: Mapping[str, str]) -> Layout:
    """The workload's own plan (transformers' ``base_model_tp_plan`` format, names relative to the model): every
    pattern must name at least one module, each an ``nn.Linear``."""
    modules = [(name, module) for name, module in model.named_modules() if name]
    linears: list[tuple[str, str]] = []
    for pattern, style in plan.items():
        matched = [(name, module) for name, module in modules if fnmatch(name, pattern)]
        if not matched:
            names = [name for name, module in modules if isinstance(module, nn.Linear)]
            shown = ", ".join(names[:12]) + (f" (and {len(names) - 12} more)" if len(names) > 12 else "")
            raise UsageError(f"tensor-parallel: the workload's tensor_parallel_plan names {pattern}, which matches no "
                             f"module of the model; its nn.Linear layers: {shown or 'none'}")
        for name, module in matched:
            if style not in STYLES or not isinstance(module, nn.Linear):
                raise UsageError(f"tensor-parallel: the workload's tensor_parallel_plan splits {name} "
                                 f"({type(module).__name__}) as {style!r}; memclaims splits nn.Linear layers "
                                 "'colwise' or 'rowwise' only")
            linears.append((name, style))
    return Layout(tuple(linears), source="the workload's tensor_parallel_plan")


def _transformers_layout(model: nn.Module, config: object, plan: dict[str, str]) -> Layout:
    base = getattr(model, "base_model", model)
    prefix = next((name for name, module in model.named_modules() if module is base), "")
    model_type = getattr(config, "model_type", type(model).__name__)
    linears: list[tuple[str, str]] = []
    for pattern, style in plan.items():
        if style not in STYLES:
            raise UsageError(f"tensor-parallel does not cover transformers' {model_type!r}: its tensor-parallel plan "
                             f"splits {pattern} as {style!r}; memclaims applies 'colwise' and 'rowwise' only (torch's "
                             "ColwiseParallel and RowwiseParallel)")
        for name, module in base.named_modules():
            if name and fnmatch(name, pattern):
                if not isinstance(module, nn.Linear):
                    raise UsageError(f"tensor-parallel: transformers' plan for {model_type!r} splits {name} "
                                     f"({type(module).__name__}) {style}; memclaims splits nn.Linear layers only")
                linears.append((f"{prefix}.{name}" if prefix else name, style))
    heads = tuple((key, int(getattr(config, key))) for key in ("num_attention_heads", "num_key_value_heads")
                  if isinstance(getattr(config, key, None), int))
    return Layout(tuple(linears), source=f"transformers' base_model_tp_plan of {model_type!r}", config_heads=heads)


def _block_layout(model: nn.Module, block: type[nn.Module], spec: BlockLayout) -> Layout:
    linears: list[tuple[str, str]] = []
    heads: list[tuple[str, str]] = []
    for name, module in model.named_modules():
        if isinstance(module, block):
            at = f"{name}." if name else ""
            linears.extend((f"{at}{path}", style) for path, style in spec.linears)
            for path in spec.heads:
                owner, _, attribute = path.rpartition(".")
                heads.append((f"{at}{owner}", attribute))
    return Layout(tuple(linears), tuple(heads), source=f"memclaims' layout of {block.__name__}", whole=spec.whole)


def refusal(model: nn.Module, block: type[nn.Module] | None, size: int,
            plan: Mapping[str, str] | None = None) -> str | None:
    """Why ``model``'s layout cannot split over ``size`` ranks (a UsageError's text), or None."""
    try:
        found = layout(model, block, plan)
    except UsageError as error:
        return str(error)
    if not found.linears:
        return f"tensor-parallel: {found.source} names no nn.Linear of this model"
    for name, linear, style in planned_linears(model, found):
        features = linear.out_features if style == COLWISE else linear.in_features
        if features % size:
            side = "output" if style == COLWISE else "input"
            return (f"tensor-parallel over {size} ranks: {name} ({style}) has {features} {side} features, not divisible "
                    f"by {size}; choose --devices that divides it")
    counts = [(f"{owner}.{attribute}", int(getattr(model.get_submodule(owner), attribute)))
              for owner, attribute in found.heads]
    for name, count in [*counts, *found.config_heads]:
        if count % size:
            return (f"tensor-parallel over {size} ranks: {name} is {count} heads, not divisible by {size} (each rank "
                    "computes whole heads); choose --devices that divides it")
    return None


def planned_linears(model: nn.Module, found: Layout) -> Iterator[tuple[str, nn.Linear, str]]:
    """(name, module, style) of each split linear of ``model``."""
    for name, style in found.linears:
        module = model.get_submodule(name)
        assert isinstance(module, nn.Linear), name  # layout() checked it
        yield name, module, style


def divide_heads(model: nn.Module, found: Layout, size: int) -> None:
    """Each rank computes ``1/size`` of every layer's heads (the attributes the layout names)."""
    for owner, attribute in found.heads:
        module = model.get_submodule(owner)
        setattr(module, attribute, getattr(module, attribute) // size)


def parallelize(model: nn.Module, mesh: DeviceMesh, found: Layout) -> nn.Module:
    """torch's ``parallelize_module`` of the layout over ``mesh`` (1-D: the tensor-parallel dimension)."""
    from torch.distributed.tensor import parallel

    styles = {COLWISE: parallel.ColwiseParallel, ROWWISE: parallel.RowwiseParallel}
    parallel.parallelize_module(model, mesh, {name: styles[style]() for name, style in found.linears})
    divide_heads(model, found, mesh.size())
    return model


# --- what a rank shows -----------------------------------------------------------------------------


def _local(tensor: torch.Tensor) -> torch.Tensor:
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def _split(tensor: torch.Tensor, style: str) -> bool:
    """Whether a weight is a DTensor sharded on its style's dimension over the mesh's tensor-parallel dimension (the
    last one: Lightning's mesh is (data_parallel, tensor_parallel), FSDP2 adds its shard on the first)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(tensor, DTensor):
        return False
    names = tensor.device_mesh.mesh_dim_names or ()
    index = names.index(TP_DIM) if TP_DIM in names else len(tensor.placements) - 1
    return bool(tensor.placements[index].is_shard(SPLIT_DIM[style]))


@dataclass
class ForwardWatch:
    """What the first training forward showed of the split layers (hooks on them, before the plan's own): a
    column-wise layer's output held ``out_features / N`` features on the rank, a row-wise layer's was a partial sum
    (a DTensor with a Partial placement) before the plan's all-reduce."""

    colwise_local: int = 0
    rowwise_partial: int = 0
    seen: bool = False
    handles: list[Any] = field(default_factory=list)

    def install(self, model: nn.Module, found: Layout, size: int) -> None:
        for _, linear, style in planned_linears(model, found):
            self.handles.append(linear.register_forward_hook(self._hook(style, linear.out_features, size)))

    def _hook(self, style: str, out_features: int, size: int) -> Any:
        def hook(module: nn.Module, args: object, output: object) -> None:
            if self.seen or not module.training or not isinstance(output, torch.Tensor):
                return
            if style == COLWISE and _local(output).shape[-1] * size == out_features:
                self.colwise_local += 1
            placements = getattr(output, "placements", ())
            if style == ROWWISE and any(p.is_partial() for p in placements):
                self.rowwise_partial += 1
        return hook

    def end_forward(self) -> None:
        self.seen = True
        for handle in self.handles:
            handle.remove()
        self.handles.clear()


def observed(model: nn.Module, found: Layout, size: int, data_parallel: int, watch: ForwardWatch | None) -> dict[str, Any]:
    """A rank's observation of the layout (the Record's ``by_technique["tensor-parallel"]``): how many of the
    layout's linears hold a 1/N shard of their weight, their elements whole and on this rank, their gradients'
    elements on this rank, and what the first forward showed."""
    linears = list(planned_linears(model, found))
    split = [linear for _, linear, style in linears if _split(linear.weight, style)]
    grads = [_local(linear.weight.grad) for _, linear, _ in linears if linear.weight.grad is not None]
    return {
        "tensor_parallel_size": size,
        "data_parallel_size": data_parallel,
        "split_linears": len(linears),
        "sharded_linears": len(split),
        "split_weight_elements": sum(linear.weight.numel() for _, linear, _ in linears),
        "local_split_weight_elements": sum(_local(linear.weight).numel() for _, linear, _ in linears),
        "local_split_grad_elements": sum(g.numel() for g in grads),
        "colwise_linears": sum(style == COLWISE for _, _, style in linears),
        "forward_colwise_local_outputs": watch.colwise_local if watch else None,
        "forward_rowwise_partial_outputs": watch.rowwise_partial if watch else None,
    }


# --- Lightning's parallelize_fn ---------------------------------------------------------------------


@dataclass(frozen=True)
class TensorParallelize:
    """``ModelParallelStrategy``'s ``parallelize_fn`` for a tensor-parallel recipe: the layout split over the device
    mesh's ``tensor_parallel`` dimension (``parallelize``), the rest of the model moved to the mesh's device (the
    strategy's ``module_to_device`` moves nothing); then activation checkpointing of each block (the model's own
    switch, as on one device: ``block_checkpointing``) or, with FSDP2 (``fsdp2_reshard`` set), ``fully_shard`` of
    each block and the root over the ``data_parallel`` dimension, checkpointing inside each (torchtitan's order:
    tensor parallelism, checkpointing, FSDP2)."""

    workload: Any  # memclaims.workloads.types.Workload
    checkpointing: bool
    fsdp2_reshard: bool | None = None  # FSDP2's reshard_after_forward on each block; None: no FSDP2
    auto_wrap: bool = True

    def __call__(self, model: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        tp_mesh = device_mesh[TP_DIM]
        block = self.workload.block_class()
        parallelize(model, tp_mesh, layout(model, block, self.workload.tensor_parallel_plan))
        model.to(tp_mesh.device_type)  # the replicated rest; DTensor shards are already there
        if self.fsdp2_reshard is not None:
            from memclaims.techniques.impl.fully_shard import fully_shard_blocks

            mesh = device_mesh[DP_DIM]
            return fully_shard_blocks(model, block, checkpointing=self.checkpointing, auto_wrap=self.auto_wrap,
                                      workload=self.workload.name,
                                      block_options={"mesh": mesh, "reshard_after_forward": self.fsdp2_reshard},
                                      root_options={"mesh": mesh})
        if self.checkpointing:
            from memclaims.techniques.impl import block_checkpointing

            block_checkpointing.enable(model, self.workload)
        return model
