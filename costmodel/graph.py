"""A layer graph extracted from a torch model: op-level nodes with their FLOPs, bytes and
parameters, grouped into layers by module path, identical blocks traced once.

``LayerGraph.from_module(module, example_inputs)`` runs the module's forward and backward on
the meta device (``torch.nn.utils.stateless.functional_call`` with meta copies of the
parameters, so nothing the size of the model is allocated and the user's module is left as
it was) under a ``TorchDispatchMode`` that records every aten op:

- its family (``FAMILIES``: matmul, attention, conv, embedding, norm, softmax, loss,
  reduction, elementwise, pool, routing, index, view), the module path it ran in
  (``torch.utils.module_tracker.ModuleTracker``) and whether it ran in the backward pass;
- FLOPs: ``torch.utils.flop_counter``'s formulas for matmuls, convolutions and fused attention
  (``model`` FLOPs, 2 per multiply-add), one per output element for elementwise, norm,
  softmax, reduction and pooling ops (``other`` FLOPs), none for views and data movement;
- the bytes of its output (none for a view or an in-place op: they alias an input) and the
  parameters it reads;
- the bytes saved for backward (``torch.autograd.graph.saved_tensors_hooks``; each
  storage counted once, parameters not counted), on an op of the layer whose module saved
  them, with the op that produced each. Attention, RMS norm and dropout run as the fused
  kernels a GPU runs (flash attention saves Q, K, V, O and the log-sum-exp, not the
  s x s scores; RMS norm its input and 1/rms; dropout a 1-byte mask), where the meta
  device would take the eager decompositions;
- which dims of its output can be split without communication inside the op
  (``shardable_dims``; the full splitting rules build on it).

Edges follow the tensors from producer to consumer. An op the families do not know is
recorded in ``LayerGraph.unsupported`` with its module path, counted as one FLOP per output
element and marked replicated (``shardable_dims`` empty): conservative, never a silent zero.

Layers: a run of identical children of a ``ModuleList`` / ``ModuleDict`` / ``Sequential``
(same class, same parameter names, shapes and dtypes) is traced once and kept as one
``Layer`` with ``repeat`` = the run length, so a 126-layer Llama traces one block. Every other
op belongs to the top-level child of the module it ran in, or to the child of a container
there (``layers.3``, not ``layers``); ``(root)`` for the module's own ``forward`` (``(root,
output side)`` for its ops after the repeated blocks, such as a tied LM head) and
``(loss)`` for turning the output into the loss.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from costmodel.errors import SpecError, install_hint
from costmodel.sharding import Loop, aten_name, op_loops, view_groups, view_map, view_spans
from costmodel.trace_ops import (
    FUSED_ATTENTION,
    IN_FUSED_FORWARD,
    dropout,
    fused_attention_flops,
    fused_sdpa,
    rms_norm,
)
from costmodel.units import GIB

__all__ = ["FAMILIES", "Layer", "LayerGraph", "OpNode", "TensorRef", "training_loss"]

#: Op families by aten op name (the overload packet, without ``aten.``).
FAMILIES: dict[str, tuple[str, ...]] = {
    "matmul": ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm", "addbmm",
               "dot", "mv", "_grouped_mm"),
    "attention": ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                  "_scaled_dot_product_cudnn_attention", "_flash_attention_forward",
                  "_efficient_attention_forward", "_scaled_dot_product_flash_attention_backward",
                  "_scaled_dot_product_efficient_attention_backward",
                  "_scaled_dot_product_cudnn_attention_backward", "_flash_attention_backward",
                  "_efficient_attention_backward", "_scaled_dot_product_attention_math",
                  "_scaled_dot_product_flash_attention_for_cpu",
                  "_scaled_dot_product_flash_attention_for_cpu_backward",
                  "scaled_dot_product_attention"),
    "conv": ("convolution", "_convolution", "convolution_backward", "cudnn_convolution",
             "_slow_conv2d_forward", "_slow_conv2d_backward", "convolution_overrideable"),
    "embedding": ("embedding", "embedding_dense_backward", "embedding_backward"),
    "norm": ("native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm",
             "_fused_rms_norm_backward", "native_batch_norm", "native_batch_norm_backward",
             "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
             "_native_batch_norm_legit_no_training", "native_group_norm",
             "native_group_norm_backward", "batch_norm_backward", "cudnn_batch_norm",
             "cudnn_batch_norm_backward", "rms_norm"),
    "softmax": ("_softmax", "_safe_softmax", "_softmax_backward_data", "_log_softmax",
                "_log_softmax_backward_data", "softmax", "log_softmax"),
    "loss": ("nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward",
             "nll_loss2d_backward", "mse_loss", "mse_loss_backward",
             "binary_cross_entropy_with_logits", "cross_entropy_loss"),
    "reduction": ("sum", "mean", "amax", "amin", "max", "min", "var", "std", "var_mean",
                  "norm", "linalg_vector_norm", "prod", "argmax", "argmin", "cumsum",
                  "logsumexp", "any", "all"),
    "pool": ("max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d",
             "avg_pool2d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
             "adaptive_avg_pool2d", "max_pool1d", "avg_pool1d"),
    "routing": ("topk", "sort", "argsort", "index_add", "index_add_", "scatter", "scatter_",
                "scatter_add", "scatter_add_", "histc", "bincount", "one_hot", "nonzero",
                "masked_scatter", "index_put", "index_put_", "_index_put_impl_", "unique_dim",
                "_unique2", "searchsorted", "repeat_interleave"),
    "index": ("index", "index_select", "gather", "cat", "stack", "repeat", "pad",
              "constant_pad_nd", "roll", "flip", "tril", "triu", "masked_select",
              "select_backward", "slice_backward", "index_select_backward", "gather_backward",
              "as_strided_backward", "unfold_backward", "expand_backward", "permute_backward",
              "index_backward", "diagonal_backward", "unfold", "diagonal"),
    "view": ("view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand",
             "unsqueeze", "squeeze", "slice", "select", "split", "split_with_sizes", "chunk",
             "alias", "detach", "as_strided", "unbind", "narrow", "flatten", "unflatten",
             "view_as", "expand_as", "movedim", "lift_fresh", "_reshape_alias", "contiguous",
             "clone", "_to_copy", "copy_", "copy", "lift_fresh_copy", "resolve_conj",
             "resolve_neg", "_local_scalar_dense", "empty", "empty_like", "empty_strided",
             "new_empty", "new_empty_strided", "zeros", "zeros_like", "ones", "ones_like",
             "full", "full_like", "new_zeros", "new_ones", "new_full", "scalar_tensor",
             "arange", "fill_", "zero_", "fill", "_unsafe_index", "view_as_real",
             "view_as_complex"),
    "elementwise": (
        "add", "add_", "sub", "sub_", "mul", "mul_", "div", "div_", "pow", "neg", "exp", "exp2",
        "log", "log2", "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "sigmoid", "silu",
        "gelu", "relu", "relu_", "leaky_relu", "elu", "hardtanh", "hardswish", "softplus",
        "mish", "threshold_backward", "silu_backward", "gelu_backward", "sigmoid_backward",
        "tanh_backward", "leaky_relu_backward", "elu_backward", "hardtanh_backward",
        "hardswish_backward", "softplus_backward", "mish_backward", "where", "clamp",
        "clamp_min", "clamp_max", "masked_fill", "masked_fill_", "native_dropout",
        "native_dropout_backward", "bernoulli", "bernoulli_", "rand", "randn", "rand_like",
        "randn_like", "addcmul", "addcmul_", "addcdiv", "addcdiv_", "lerp", "lerp_", "maximum",
        "minimum", "eq", "ne", "lt", "gt", "le", "ge", "logical_and", "logical_or",
        "logical_not", "bitwise_and", "bitwise_or", "bitwise_not", "abs", "sign", "erf",
        "erfinv", "reciprocal", "square", "exp_", "sqrt_", "rsub", "floor", "ceil", "round",
        "trunc", "frac", "fmod", "remainder", "floor_divide", "isnan", "isinf", "nan_to_num",
        "polar", "_conj", "conj_physical", "sgn", "_foreach_add",
        "sin_", "cos_", "neg_", "div_", "pow_", "clamp_", "mul_", "add_"),
}
_FAMILY_OF = {name: fam for fam, names in FAMILIES.items() for name in names}
#: The layer of the ops that turn the output into the loss the backward starts from.
LOSS = "(loss)"
#: The layers of the root module's own ops: before (or without) repeated blocks, and after.
ROOT = "(root)"
ROOT_OUT = "(root, output side)"
#: Families whose FLOPs are one per output element.
_PER_ELEMENT = ("elementwise", "norm", "softmax", "reduction", "pool", "loss")


@dataclass(frozen=True)
class TensorRef:
    """A tensor input of an op: ``source`` the node that produced it (-1: a model input, a
    parameter or a constant), ``param`` the parameter's name (``""`` if it is not one),
    ``shape``, ``nbytes`` and whether it needs a gradient."""

    source: int
    param: str
    shape: tuple[int, ...]
    nbytes: float
    grad: bool

    @property
    def numel(self) -> float:
        """Elements of the tensor."""
        return float(math.prod(self.shape))


@dataclass(frozen=True)
class OpNode:
    """One aten op of the traced forward or backward pass.

    ``op``: the aten op (``aten.mm.default``); ``family``: its family in ``FAMILIES`` (or
    ``unknown``); ``module``: the module path it ran in (``""`` for the root's own forward);
    ``layer``: the ``Layer`` it belongs to; ``backward``: whether it ran in the backward pass.
    ``model_flops``: FLOPs of matmuls, convolutions and attention (2 per multiply-add);
    ``other_flops``: one per output element of elementwise, norm, softmax, reduction,
    pooling and loss ops. ``output_bytes``: bytes of the tensors it creates (0 for views and
    in-place ops); ``saved_bytes``: bytes saved for backward that are given to it (new
    storages its layer saves: its own output, or the layer's input for its first reader;
    parameters excluded), ``saved_from`` the same as (the node that produced the tensor, -1
    for a model input or unknown; bytes); ``params``: the parameters it reads (module path
    names); ``shape``: its (first) output's shape; ``shardable_dims``: dims of that output
    it can produce split across devices without communication inside the op. Forward ops
    also keep their tensor ``inputs`` (``TensorRef``), whether their output needs a
    gradient (``grad``; ``fused_grad``: it runs inside a fused kernel's forward whose
    backward covers it, grad mode off there), their ``loops`` (``costmodel.sharding``: the
    splitting rules) and,
    for views, ``view_map`` (the input dim of each output dim), ``view_spans`` (the input
    dims each output dim runs along) and, for a reshape, ``view_groups`` (its input and
    output dims grouped by equal products); a fused attention, whether
    it is ``causal``. ``reads_input``: a forward op that reads one of the model's own
    input tensors (what only the first stage of torch's pipelining is given).
    """

    id: int
    op: str
    family: str
    module: str
    layer: str
    backward: bool
    model_flops: float
    other_flops: float
    output_bytes: float
    saved_bytes: float
    saved_from: tuple[tuple[int, float], ...]
    params: tuple[str, ...]
    shape: tuple[int, ...]
    shardable_dims: tuple[int, ...]
    inputs: tuple[TensorRef, ...] = ()
    grad: bool = False
    fused_grad: bool = False
    reads_input: bool = False
    causal: bool = False
    loops: tuple[Loop, ...] = ()
    view_map: tuple[int | None, ...] | None = None
    view_spans: tuple[tuple[int, ...], ...] | None = None
    view_groups: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] | None = None

    @property
    def aten(self) -> str:
        """The aten op's name without its namespace and overload (``aten_name``)."""
        return aten_name(self.op)

    @property
    def attention_keys(self) -> float | None:
        """Key tokens per query of a fused attention op (its key input is ``[..., keys,
        head dim]``: SDPA and the flash and cuDNN kernels take query, key, value first);
        ``None`` for other ops."""
        if self.family != "attention" or len(self.inputs) < 2:
            return None
        shape = self.inputs[1].shape
        return float(shape[-2]) if len(shape) >= 2 and shape[-2] > 0 else None


@dataclass
class Layer:
    """A group of op nodes: one top-level component of the model, or one block of a run of
    identical blocks (``repeat`` of them). The figures are per instance: ``params`` (count)
    and ``param_bytes``; forward and backward ``model`` and ``other`` FLOPs; ``saved_bytes``
    (activations saved for backward); ``output_bytes`` (the tensor it hands to the next
    layer, the pipeline send size); ``nodes`` the ids of its op nodes."""

    name: str
    module_type: str
    repeat: int = 1
    params: int = 0
    param_bytes: float = 0.0
    forward_flops: float = 0.0
    backward_flops: float = 0.0
    forward_other_flops: float = 0.0
    backward_other_flops: float = 0.0
    saved_bytes: float = 0.0
    output_bytes: float = 0.0
    nodes: list[int] = field(default_factory=list)


@dataclass
class LayerGraph:
    """Op-level DiGraph (node id -> ``OpNode`` attributes in ``graph.nodes[i]["node"]``) and
    its layers in execution order. ``inputs``: the shapes traced; ``unsupported``: (op,
    module path) of each op whose family is unknown; ``multihead_attention``: the module
    paths of the model's ``nn.MultiheadAttention``s (what ``planner.runtime.attention``
    splits by heads)."""

    name: str
    graph: nx.DiGraph
    layers: list[Layer]
    inputs: tuple[tuple[int, ...], ...] = ()
    unsupported: list[tuple[str, str]] = field(default_factory=list)
    multihead_attention: tuple[str, ...] = ()

    def node(self, i: int) -> OpNode:
        """The ``OpNode`` of node id ``i``."""
        return self.graph.nodes[i]["node"]

    def layer(self, name: str) -> Layer:
        """The layer called ``name``."""
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise SpecError(f"no layer {name!r}; layers: {', '.join(x.name for x in self.layers)}")

    def _total(self, attr: str) -> float:
        return float(sum(getattr(x, attr) * x.repeat for x in self.layers))

    def num_params(self) -> int:
        """Parameters of the whole model (repeated blocks counted ``repeat`` times)."""
        return int(self._total("params"))

    def param_bytes(self) -> float:
        """Bytes of the parameters of the whole model."""
        return self._total("param_bytes")

    def model_flops(self) -> float:
        """Matmul, convolution and attention FLOPs of one forward + backward pass."""
        return self._total("forward_flops") + self._total("backward_flops")

    def forward_model_flops(self) -> float:
        """Matmul, convolution and attention FLOPs of the forward pass."""
        return self._total("forward_flops")

    def saved_bytes(self) -> float:
        """Bytes saved for backward by one forward pass (parameters excluded)."""
        return self._total("saved_bytes")

    def summary(self) -> str:
        """A table of the layers: repeat, parameters, forward GFLOPs, saved MiB."""
        lines = [f"{'layer':<28s} {'x':>4s} {'params':>12s} {'fwd GFLOP':>10s} "
                 f"{'bwd GFLOP':>10s} {'saved MiB':>10s}"]
        for x in self.layers:
            lines.append(f"{x.name:<28s} {x.repeat:>4d} {x.params:>12,d} "
                         f"{x.forward_flops / 1e9:>10.3f} {x.backward_flops / 1e9:>10.3f} "
                         f"{x.saved_bytes / 2**20:>10.2f}")
        lines.append(f"total: {self.num_params():,} parameters, "
                     f"{self.model_flops() / 1e12:.4f} TFLOP per step, "
                     f"{self.saved_bytes() / GIB:.3f} GiB saved for backward")
        if self.unsupported:
            ops = sorted({f"{op} in {mod or '(root)'}" for op, mod in self.unsupported})
            lines.append("unsupported ops (counted as replicated, one FLOP per element): "
                         + "; ".join(ops))
        return "\n".join(lines)

    @classmethod
    def from_module(cls, module: Any, example_inputs: Any, *,
                    loss_fn: Callable[[Any], Any] | None = None, backward: bool = True,
                    repeat_blocks: bool = True, name: str | None = None,
                    dtype: Any = None, autocast: Any = None) -> LayerGraph:
        """Trace ``module`` on ``example_inputs`` (a tensor, a tuple of positional inputs, or
        a dict of keyword inputs; any device, they are traced on the meta device).
        ``dtype`` (a floating ``torch.dtype``): trace with floating parameters, buffers and
        inputs in it (the training precision; default: as they are). ``autocast`` (a
        floating ``torch.dtype``): trace as ``torch.autocast(dtype=autocast)`` runs the
        module (which does not act on meta tensors): matmuls, convolutions and attention
        cast their floating inputs to it, a parameter once per forward pass
        (``_autocast_ops``), and everything else runs in the dtype it is given.

        ``loss_fn(output) -> scalar`` makes the loss the backward starts from (default: the
        sum of the floating outputs); ``backward=False`` traces the forward only;
        ``repeat_blocks=False`` traces every block. Raises ``SpecError`` when torch is not
        installed or the module cannot run on the meta device.
        """
        try:
            import torch
        except ImportError:
            raise SpecError("LayerGraph.from_module traces with torch, which is not "
                            f"installed: {install_hint('torch')}") from None
        for arg, value in (("dtype", dtype), ("autocast", autocast)):
            if value is not None and not (isinstance(value, torch.dtype)
                                          and value.is_floating_point):
                raise SpecError(f"{arg} must be a floating torch.dtype (torch.bfloat16, "
                                f"torch.float32, ...) or None, got {value!r}")
        # The module's own prints go to standard error: standard output stays the
        # planner's (a --json report parses whatever forward prints).
        with contextlib.redirect_stdout(sys.stderr):
            return _trace(module, example_inputs, loss_fn, backward, repeat_blocks, name,
                          dtype, autocast)


# ---- tracing -------------------------------------------------------------------------------

def _grouped_mm_like(a: Any, b: Any, offs: Any = None, *_: Any, **kw: Any) -> Any:
    """An empty tensor of ``torch._grouped_mm(a, b, offs)``'s shape and dtype: its meta
    function takes bf16 operands alone (its CUDA kernel's), where its CPU kernel runs fp32
    too; a module traced in fp32 (an fp32 job) gets its output so."""
    shape: tuple[int, ...]
    if a.dim() == 2 and b.dim() == 3:
        shape = (a.shape[0], b.shape[2])
    elif a.dim() == 3 and b.dim() == 2:
        shape = (a.shape[0], a.shape[1], b.shape[1])
    elif a.dim() == 2 and b.dim() == 2:  # the weights' gradient: one matrix a group
        shape = (offs.shape[0], a.shape[0], b.shape[1])
    else:
        shape = (a.shape[0], a.shape[1], b.shape[2])
    return a.new_empty(shape, dtype=kw.get("out_dtype") or a.dtype)


def grouped_mm_flops(a: tuple[int, ...], b: tuple[int, ...]) -> float:
    """FLOPs of ``torch._grouped_mm(a, b, offs=...)`` (a MoE layer's experts as one kernel,
    torchtitan's ``GroupedExperts``): each row of ``a`` multiplied by the matrix of its group,
    2 x (elements of ``a``) x (the columns of ``b``), whatever the groups' sizes; so too its
    backward's (the weight gradient's groups run along the contracted rows).
    ``torch.utils.flop_counter`` has no formula for it."""
    return 2.0 * math.prod(a) * (b[-1] if b else 1)


def training_loss(output: Any) -> Any:
    """The loss ``planner run`` trains a traced module with (``planner.runtime.apply``'s
    ``cross_entropy``, torchtitan's): the mean cross entropy of a floating output of two or
    more dims over its last dim (a language model's logits, a classifier's scores), in fp32,
    against labels of the other dims; any other output (a module that returns its own loss,
    a tuple): the sum of its floating tensors, ``LayerGraph.from_module``'s default."""
    import torch
    from torch.nn import functional as F

    if isinstance(output, torch.Tensor) and output.is_floating_point() and output.dim() >= 2:
        flat = output.flatten(0, -2).float()
        labels = torch.zeros(flat.shape[0], dtype=torch.long, device=flat.device)
        return F.cross_entropy(flat, labels)
    return _output_sum(output)


def _output_sum(output: Any) -> Any:
    """The sum of ``output``'s floating tensors, in fp32 (``from_module``'s default loss)."""
    import torch
    from torch.utils._pytree import tree_flatten

    return sum(t.float().sum() for t in tree_flatten(output)[0]
               if isinstance(t, torch.Tensor) and t.is_floating_point())


def _signature(mod: Any) -> tuple[Any, ...]:
    """What makes two blocks identical: class and every parameter's and buffer's name,
    shape and dtype."""
    params = tuple((n, tuple(p.shape), str(p.dtype)) for n, p in mod.named_parameters())
    bufs = tuple((n, tuple(b.shape), str(b.dtype)) for n, b in mod.named_buffers())
    return (type(mod), params, bufs)


def _runs(module: Any) -> dict[str, tuple[str, list[str]]]:
    """Runs of identical consecutive children in containers: container path -> (name of the
    block traced, names of the blocks it stands for), for runs of two or more; the
    outermost only (a block's own repeated parts, such as a MoE layer's shared experts,
    are traced as part of it)."""
    from torch import nn

    out: dict[str, tuple[str, list[str]]] = {}
    inside: list[str] = []  # the blocks of the runs found, whose contents are theirs
    for path, mod in module.named_modules():
        if not isinstance(mod, nn.ModuleList | nn.ModuleDict | nn.Sequential) or any(
                path.startswith(b + ".") for b in inside):
            continue
        names = list(mod._modules)
        i = 0
        while i < len(names):
            j = i + 1
            sig = _signature(mod._modules[names[i]])
            while j < len(names) and _signature(mod._modules[names[j]]) == sig:
                j += 1
            if j - i >= 2 and sig[1]:  # parameterless runs (activations) are not blocks
                out[f"{path}.{names[i]}" if path else names[i]] = (path, names[i:j])
                inside += [f"{path}.{n}" if path else n for n in names[i:j]]
            i = j
    return out


@contextlib.contextmanager
def _truncated(module: Any, runs: dict[str, tuple[str, list[str]]]) -> Iterator[None]:
    """Each run of identical blocks cut to its first block for the duration."""
    saved = []
    try:
        for _first, (path, names) in runs.items():
            container = module.get_submodule(path) if path else module
            saved.append((container, dict(container._modules)))
            drop = set(names[1:])
            container._modules = type(container._modules)(
                (k, v) for k, v in container._modules.items() if k not in drop)
        yield
    finally:
        for container, modules in reversed(saved):
            container._modules = type(container._modules)(modules.items())


def _cast(t: Any, dtype: Any) -> Any:
    """``dtype`` for a floating tensor when one is asked for, else the tensor's own."""
    return dtype if dtype is not None and t.is_floating_point() else t.dtype


def _meta(x: Any, dtype: Any = None) -> Any:
    import torch
    from torch.utils._pytree import tree_map

    return tree_map(lambda t: t.to("meta", dtype=_cast(t, dtype))
                    if isinstance(t, torch.Tensor) else t, x)


def _shardable(family: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Output dims an op of ``family`` produces split with no communication inside it,
    given its inputs split the same way (the batch-like and feature dims it does not
    reduce over)."""
    n = len(shape)
    if family in ("elementwise", "embedding", "matmul", "attention"):
        return tuple(range(n))  # matmul: rows from the left operand, columns from the right
    if family in ("view", "index", "loss", "routing", "norm", "softmax"):
        return tuple(range(n - 1))  # not the last (reshaped, normalized) dim
    if family == "conv":
        return tuple(d for d in range(n) if d != 2 and d != 3)  # batch, channels; not spatial
    if family in ("reduction", "pool"):
        return (0,) if n else ()
    return ()


class _Recorder:
    """The dispatch mode's state: nodes, edges, saved storages, and the producer of each
    tensor (kept alive until the trace ends, so ids stay unique)."""

    def __init__(self, tracker: Any, param_names: dict[int, str], param_storages: set[int]
                 ) -> None:
        self.tracker = tracker
        self.param_names = param_names
        self.param_storages = param_storages
        self.nodes: list[dict[str, Any]] = []
        self.edges: list[tuple[int, int]] = []
        self.producer: dict[int, int] = {}
        self.alive: list[Any] = []
        self.saved_storages: set[int] = set()
        #: ids of the model's own input tensors (set before the forward runs).
        self.model_inputs: set[int] = set()
        # (last node recorded, producer, bytes, module path) of each saved storage
        self.saved_log: list[tuple[int, int, float, str]] = []
        self.unsupported: list[tuple[str, str]] = []
        self.prefix = ""
        self.in_loss = False
        #: The nodes recorded before the backward started (all, when it does not run).
        self.forward_end = sys.maxsize
        # The module path of the forward op during which each autograd node was made, by
        # the node's sequence number: a backward op runs the node of its forward op.
        self.forward_path: dict[int, str] = {}

    def module_path(self) -> str:
        if self.in_loss:
            return LOSS
        parents = [p for p in self.tracker.parents if p != "Global"]
        if not parents:
            return ""
        deepest = max(parents, key=lambda p: (p.count("."), len(p)))
        return deepest[len(self.prefix):].lstrip(".") if deepest.startswith(self.prefix) \
            else deepest

    def record(self, func: Any, args: Any, kwargs: Any, out: Any) -> None:
        import torch
        from torch.utils._pytree import tree_flatten
        from torch.utils.flop_counter import flop_registry

        name = func._overloadpacket.__name__
        family = _FAMILY_OF.get(name, "unknown")
        path = self.module_path()
        backward = bool(self.tracker.is_bw)
        if not backward:
            # Autograd made this op's node (if any) just before dispatching to it, taking the
            # thread's sequence number and counting it up.
            self.forward_path.setdefault(torch._C._autograd._get_sequence_nr() - 1, path)
        else:
            # The module tracker's backward stack is only as exact as its gradient hooks
            # (an encoder's output read by every decoder block leaves the decoder's module
            # on it while the encoder's backward runs); the node being run names its
            # forward op.
            node = torch._C._current_autograd_node()
            if node is not None:
                path = self.forward_path.get(node._sequence_nr(), path)
        nid = len(self.nodes)
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        params = []
        for t in ins:
            if id(t) in self.param_names:
                params.append(self.param_names[id(t)])
            src = self.producer.get(id(t))
            if src is not None:
                self.edges.append((src, nid))
        formula = flop_registry.get(func._overloadpacket)
        model_flops = other = 0.0
        causal = False
        if name in FUSED_ATTENTION:
            model_flops = fused_attention_flops(name, args)
            # The kernel skips the masked half of a causal attention (Dao 2023, Sec. 3).
            causal = name == FUSED_ATTENTION[0] and len(args) > 4 and args[4] is True
        elif formula is not None:
            model_flops = float(formula(*args, **kwargs, out_val=out))
        elif name == "_grouped_mm" and len(ins) >= 2:
            model_flops = grouped_mm_flops(ins[0].shape, ins[1].shape)
        elif family in _PER_ELEMENT or family == "unknown":
            other = float(sum(t.numel() for t in outs))
        if family == "unknown":
            self.unsupported.append((str(func), path))
        aliases = any(r.alias_info is not None for r in func._schema.returns)
        out_bytes = 0.0 if aliases else float(sum(t.numel() * t.element_size() for t in outs))
        for t in outs:
            self.producer[id(t)] = nid
            self.alive.append(t)
        shape = tuple(outs[0].shape) if outs else ()
        extra: dict[str, Any] = {}
        if not backward:
            refs = tuple(TensorRef(self.producer.get(id(t), -1), self.param_names.get(id(t), ""),
                                   tuple(t.shape), float(t.numel() * t.element_size()),
                                   bool(t.requires_grad)) for t in ins)
            plain = [a for a in args if not any(isinstance(x, torch.Tensor)
                                                for x in tree_flatten(a)[0])]
            shapes = [r.shape for r in refs]
            # Autograd marks an op's output as needing a gradient only after the op returns
            # (below it, in this mode, it does not yet): an output needs one when an input does.
            grad = bool(outs) and (outs[0].is_floating_point() or outs[0].is_complex()) \
                and any(r.grad for r in refs)
            extra = dict(inputs=refs, grad=grad, causal=causal,
                         fused_grad=IN_FUSED_FORWARD.get(),
                         reads_input=any(id(t) in self.model_inputs for t in ins))
            if family == "view" and refs:
                extra["view_map"] = view_map(name, plain, shapes[0], shape)
                extra["view_spans"] = view_spans(name, plain, shapes[0], shape)
                extra["view_groups"] = view_groups(name, plain, shapes[0], shape)
            else:
                extra["loops"] = op_loops(name, family, plain, shapes, shape)
        self.nodes.append(dict(
            id=nid, op=str(func), family=family, module=path,
            backward=backward, model_flops=model_flops, other_flops=other,
            output_bytes=out_bytes, saved_bytes=0.0, saved_from=(), params=tuple(params),
            shape=shape,
            shardable_dims=() if family == "unknown" else _shardable(family, shape), **extra))

    def saved(self, t: Any) -> Any:
        """``saved_tensors_hooks`` pack: log each new non-parameter storage once, with the
        last node recorded, the node that produced the tensor and the module saving it
        (``_attribute_saved`` gives it to a node)."""
        try:
            key = t.untyped_storage()._cdata
            nbytes = float(t.untyped_storage().nbytes())
        except (RuntimeError, NotImplementedError):
            key, nbytes = id(t), float(t.numel() * t.element_size())
        if key not in self.saved_storages and key not in self.param_storages and self.nodes:
            self.saved_storages.add(key)
            self.saved_log.append((len(self.nodes) - 1, self.producer.get(id(t), -1), nbytes,
                                   self.module_path()))
        self.alive.append(t)
        return t


@contextlib.contextmanager
def _swapped(namespace: Any, replacements: dict[Any, Any]) -> Iterator[None]:
    """Rebind each attribute of ``namespace`` that is a key of ``replacements`` to its
    value for the duration, and back."""
    by_id = {id(k): fused for k, fused in replacements.items()}
    saved = {k: v for k, v in vars(namespace).items() if id(v) in by_id}
    try:
        for k, v in saved.items():
            setattr(namespace, k, by_id[id(v)])
        yield
    finally:
        for k, v in saved.items():
            setattr(namespace, k, v)


def _autocast_ops(low: Any, param_cast: Callable[[Any], None]
                  ) -> tuple[tuple[Any, ...], Callable[[Callable[..., Any]], Callable[..., Any]]]:
    """(the functions torch.autocast runs in ``low`` precision: its CUDA policy's
    lower-precision list, aten/src/ATen/autocast_mode.cpp, matmuls, convolutions and
    attention; a wrapper making a function cast its floating inputs to ``low`` first, as
    autocast's ``cached_cast`` does: a parameter, a leaf needing a gradient, once per
    forward pass, reused by every later reader, and handed to ``param_cast``). ``einsum``
    is not on the list but the matmuls it runs are; ``torch._grouped_mm`` is not either,
    and a MoE layer casts its operands itself (torchtitan's ``GroupedExperts``), as
    autocast would."""
    import torch
    from torch.nn import functional as F
    from torch.utils._pytree import tree_map

    cache: dict[int, Any] = {}

    def lower(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dtype == low \
                or t.dtype == torch.float64:
            return t
        if t.is_leaf and t.requires_grad:
            if id(t) not in cache:
                cache[id(t)] = t.to(low)
                param_cast(cache[id(t)])
            return cache[id(t)]
        return t.to(low)

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        def run(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = tree_map(lower, (args, kwargs))
            return f(*args, **kwargs)
        return run

    T = torch.Tensor
    funcs = (F.linear, F.bilinear, F.conv1d, F.conv2d, F.conv3d, F.conv_transpose1d,
             F.conv_transpose2d, F.conv_transpose3d, F.scaled_dot_product_attention,
             torch.matmul, torch.mm, torch.bmm, torch.baddbmm, torch.addmm, torch.addbmm,
             torch.mv, torch.einsum, torch._grouped_mm, T.matmul, T.__matmul__,
             T.__rmatmul__, T.mm, T.bmm, T.baddbmm, T.addmm, T.mv)
    return funcs, wrap


def _trace(module: Any, example_inputs: Any, loss_fn: Callable[[Any], Any] | None,
           backward: bool, repeat_blocks: bool, name: str | None, dtype: Any,
           autocast: Any = None) -> LayerGraph:
    import torch
    from torch.func import functional_call
    from torch.nn import functional as F
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.module_tracker import ModuleTracker

    if not isinstance(module, torch.nn.Module):
        raise SpecError(f"LayerGraph.from_module takes a torch nn.Module, got "
                        f"{type(module).__name__}")
    runs = _runs(module) if repeat_blocks else {}

    # The mode sees the calls of the model's own code; torch's composites (e.g.
    # F.multi_head_attention_forward, which nn.MultiheadAttention and the nn.Transformer
    # layers run) call these by their name in torch.nn.functional while the mode is off
    # (inside its handler), so the names there are swapped for the trace too.
    fused: dict[Any, Callable[..., Any]] = {
        F.scaled_dot_product_attention: fused_sdpa, F.rms_norm: rms_norm, F.dropout: dropout}
    replacements: dict[Any, Callable[..., Any]] = dict(fused)

    class Fused(TorchFunctionMode):
        """Runs attention, RMS norm and dropout as the fused kernels a GPU runs."""

        def __torch_function__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            fused = replacements.get(func)
            return (fused or func)(*args, **kwargs)

    class Mode(TorchDispatchMode):
        def __init__(self, rec: _Recorder) -> None:
            super().__init__()
            self.rec = rec

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            if func is torch.ops.aten._grouped_mm.default and args[0].dtype != torch.bfloat16:
                out = _grouped_mm_like(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
            self.rec.record(func, args, kwargs, out)
            return out

    def attempt(cut: dict[str, tuple[str, list[str]]]) -> tuple[_Recorder, Any]:
        with _truncated(module, cut):
            # One meta tensor per distinct parameter; functional_call ties the other names
            # of a tied parameter (e.g. an LM head sharing the embedding) to it.
            state = {k: torch.empty_like(v, device="meta", dtype=_cast(v, dtype)) for k, v in
                     {**dict(module.named_parameters()), **dict(module.named_buffers())}.items()}
            params = dict(module.named_parameters())
            for k in params:
                state[k].requires_grad_(params[k].requires_grad)
            names = {id(state[k]): k for k in params}
            storages = {state[k].untyped_storage()._cdata for k in params}
            tracker = ModuleTracker()
            rec = _Recorder(tracker, names, storages)
            rec.prefix = type(module).__name__
            inputs = _meta(example_inputs, dtype)
            rec.model_inputs = {id(t) for t in tree_flatten(inputs)[0]
                                if isinstance(t, torch.Tensor)}
            hooks = [module.get_submodule(first).register_forward_hook(_same_shape)
                     for first in cut]
            names_too: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
            if autocast is not None:
                # Autocast's casts come first (its dispatch key is above autograd's), then
                # the fused kernels; torch's composites call the torch-level matmuls by
                # name too. A parameter's cast is a copy of the weights (what
                # costmodel.memory counts beside them), not an activation.
                funcs, lowering = _autocast_ops(
                    autocast, lambda t: rec.param_storages.add(t.untyped_storage()._cdata))
                replacements.update({f: lowering(fused.get(f, f)) for f in funcs})
                names_too = _swapped(torch, replacements)
            with tracker, names_too, _swapped(F, replacements), Fused(), Mode(rec), \
                    torch.autograd.graph.saved_tensors_hooks(
                    rec.saved, lambda t: t), _removing(hooks):
                if isinstance(inputs, dict):
                    out = functional_call(module, state, (), inputs)
                else:
                    out = functional_call(module, state, inputs if isinstance(inputs, tuple)
                                          else (inputs,))
                if backward:
                    rec.in_loss = True
                    loss = loss_fn(out) if loss_fn is not None else _output_sum(out)
                    rec.in_loss = False
                    if isinstance(loss, torch.Tensor) and loss.requires_grad:
                        rec.forward_end = len(rec.nodes)
                        loss.backward()
            return rec, params

    try:
        rec, params = attempt(runs)
    except Exception as first:  # the model may not tolerate a cut: trace it all
        if not runs:
            raise SpecError(f"could not trace {type(module).__name__} on the meta device: "
                            f"{type(first).__name__}: {first}") from None
        runs = {}
        try:
            rec, params = attempt(runs)
        except Exception as e:  # anything the model raises, as one clear line
            raise SpecError(f"could not trace {type(module).__name__} on the meta device: "
                            f"{type(e).__name__}: {e}") from None
    _unreached(rec.nodes[:rec.forward_end])
    return _assemble(module, rec, params, runs, example_inputs, name)


def _unreached(nodes: list[dict[str, Any]]) -> None:
    """Clear ``grad`` of the forward ops (``nodes``: those recorded before the backward
    started) whose gradient never reaches the loss, autograd running no backward for them:
    every reader of their floating outputs either reads none that needs a gradient or is
    one of them (a MoE router's top-k, whose scores a module discards for the indices, and
    the bias added before it). An op no other op reads (the loss) is reached, and so is one
    that an op outside this pass reads, and every op of a fused kernel's forward
    (``fused_grad``: the kernel's backward covers them)."""
    readers: dict[int, list[int]] = {}
    read: set[int] = set()
    for u, n in enumerate(nodes):
        if n["backward"]:
            continue
        for ref in n.get("inputs", ()):
            if ref.source >= 0:
                read.add(ref.source)
                if ref.grad:
                    readers.setdefault(ref.source, []).append(u)
    cleared: set[int] = set()
    for s in range(len(nodes) - 1, -1, -1):
        n = nodes[s]
        if n["backward"] or not n.get("grad") or n.get("fused_grad"):
            continue
        if s in read and all(u in cleared for u in readers.get(s, ())):
            n["grad"] = False
            cleared.add(s)


class _ShapeChange(RuntimeError):
    """A block traced for a run of identical blocks changed its input's shape, so it cannot
    stand for the blocks after it."""


def _same_shape(mod: Any, args: Any, out: Any) -> None:
    """Forward hook on the block traced for a run: it must hand on what it was given."""
    if not args:
        return
    first = args[0]
    if hasattr(first, "shape") and hasattr(out, "shape") and first.shape != out.shape:
        raise _ShapeChange(f"{type(mod).__name__} maps {tuple(first.shape)} to "
                           f"{tuple(out.shape)}")


@contextlib.contextmanager
def _removing(handles: list[Any]) -> Iterator[None]:
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _layer_of(path: str, runs: dict[str, tuple[str, list[str]]], containers: set[str]) -> str:
    """The layer of module ``path``: the block a run stands for, else the top-level child,
    going one level deeper through containers (``layers.3``, not ``layers``)."""
    for first in runs:
        if path == first or path.startswith(first + "."):
            return first
    if not path:
        return ROOT
    if path == LOSS:
        return LOSS
    parts = path.split(".")
    i = 1
    while i < len(parts) and ".".join(parts[:i]) in containers:
        i += 1
    return ".".join(parts[:i])


def _attribute_saved(rec: _Recorder, runs: dict[str, tuple[str, list[str]]],
                     containers: set[str]) -> None:
    """Give each saved tensor (``rec.saved_log``) to a node of the layer whose module saved
    it: to its producer when that is in the layer (the op's own output, or an earlier op's),
    else to the layer's first op reading it (the layer's input, in the layout that op reads
    it in), else to the last node recorded. Autograd packs an op's inputs before the op
    runs, so the last node recorded may be the op before it."""
    def origin(i: int) -> int:
        """The op a tensor made by node ``i`` comes from, through views."""
        while i >= 0 and rec.nodes[i]["family"] == "view" and rec.nodes[i].get("inputs"):
            i = rec.nodes[i]["inputs"][0].source
        return i

    readers: dict[tuple[str, int], int] = {}
    for n in rec.nodes:
        if not n["backward"] and n["family"] != "view":
            for ref in n.get("inputs", ()):
                readers.setdefault((n["layer"], origin(ref.source)), n["id"])
    for last, producer, nbytes, path in rec.saved_log:
        layer = rec.nodes[last]["layer"] if path == LOSS else _layer_of(path, runs, containers)
        if layer == ROOT and rec.nodes[last]["layer"] == ROOT_OUT:
            layer = ROOT_OUT
        real = origin(producer)
        if real >= 0 and rec.nodes[real]["layer"] == layer:
            at = real
        else:
            at = readers.get((layer, real), last)
        rec.nodes[at]["saved_bytes"] += nbytes
        rec.nodes[at]["saved_from"] += ((producer, nbytes),)


def _containers(module: Any) -> set[str]:
    from torch import nn

    return {p for p, m in module.named_modules()
            if p and isinstance(m, nn.ModuleList | nn.ModuleDict | nn.Sequential)}


def _assemble(module: Any, rec: _Recorder, params: dict[str, Any],
              runs: dict[str, tuple[str, list[str]]], example_inputs: Any,
              name: str | None) -> LayerGraph:
    import torch
    from torch.utils._pytree import tree_flatten

    graph = nx.DiGraph()
    layers: dict[str, Layer] = {}
    containers = _containers(module)
    names = [_layer_of(n["module"], runs, containers) for n in rec.nodes]
    in_run = [i for i, lname in enumerate(names) if lname in runs]
    # The root's own ops on the output side of the blocks (a tied LM head) are a layer of
    # their own: after the last block in forward, before the first in backward. Its ops
    # between two runs of blocks (an encoder-decoder's causal mask) stay the root's.
    last_forward = max((i for i in in_run if not rec.nodes[i]["backward"]), default=None)
    first_backward = min((i for i in in_run if rec.nodes[i]["backward"]), default=None)
    for i, (n, lname) in enumerate(zip(rec.nodes, names, strict=True)):
        if lname == ROOT and last_forward is not None and (
                (not n["backward"] and i > last_forward)
                or (n["backward"] and (first_backward is None or i < first_backward))):
            lname = ROOT_OUT
        n["layer"] = lname
    _attribute_saved(rec, runs, containers)
    for n in rec.nodes:
        lname = n["layer"]
        node = OpNode(**n)
        graph.add_node(node.id, node=node)
        if lname not in layers:
            sub = module.get_submodule(lname) if lname not in (ROOT, ROOT_OUT, LOSS) \
                else module
            layers[lname] = Layer(name=lname,
                                  module_type="loss" if lname == LOSS else type(sub).__name__,
                                  repeat=len(runs[lname][1]) if lname in runs else 1)
        layer = layers[lname]
        layer.nodes.append(node.id)
        if node.backward:
            layer.backward_flops += node.model_flops
            layer.backward_other_flops += node.other_flops
        else:
            layer.forward_flops += node.model_flops
            layer.forward_other_flops += node.other_flops
            layer.saved_bytes += node.saved_bytes
            if node.output_bytes:
                layer.output_bytes = node.output_bytes
    graph.add_edges_from(rec.edges)
    # Parameters by the layer of their module path (exact, whether or not an op read them).
    for pname, p in params.items():
        lname = _layer_of(pname.rsplit(".", 1)[0] if "." in pname else "", runs, containers)
        if lname not in layers:
            layers[lname] = Layer(name=lname, module_type="Parameter")
        layers[lname].params += p.numel()
        layers[lname].param_bytes += float(p.numel() * p.element_size())
    shapes = tuple(tuple(t.shape) for t in tree_flatten(example_inputs)[0]
                   if isinstance(t, torch.Tensor))
    attention = tuple(path for path, sub in module.named_modules()
                      if isinstance(sub, torch.nn.MultiheadAttention))
    return LayerGraph(name=name or type(module).__name__, graph=graph,
                      layers=list(layers.values()), inputs=shapes,
                      unsupported=rec.unsupported, multihead_attention=attention)
