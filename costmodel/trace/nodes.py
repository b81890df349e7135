"""The nodes of a traced graph: each aten op (``OpNode``) with its tensors (``TensorRef``), its
family (what kind of kernel it is: matmul, attention, elementwise, ...) and the layer
(``Layer``, a module or a run of identical blocks) it belongs to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from costmodel.formulas.shardcosts import aten_name
from costmodel.trace.sharding import Loop

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
    backward covers it, grad mode off there), their ``loops`` (``costmodel.trace.sharding``: the
    splitting rules) and,
    for views, ``view_map`` (the input dim of each output dim), ``view_spans`` (the input
    dims each output dim runs along) and, for a reshape, ``view_groups`` (its input and
    output dims grouped by equal products); a fused attention, whether
    it is ``causal`` and the ``window`` of keys a query sees (0: all; ``local_attention``).
    ``reads_input``: a forward op that reads one of the model's own
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
    window: int = 0
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
        if len(shape) < 2 or shape[-2] <= 0:
            return None
        return float(min(shape[-2], self.window) if self.window else shape[-2])

    @property
    def attention_head_dim(self) -> float | None:
        """The query-key head dimension of a fused attention op (its query input is
        ``[..., queries, head dim]``); ``None`` for other ops."""
        if self.family != "attention" or not self.inputs:
            return None
        shape = self.inputs[0].shape
        return float(shape[-1]) if len(shape) >= 2 and shape[-1] > 0 else None


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
