"""Recording a module's ops as it runs on the meta device: a torch function mode and saved-tensor
hooks note each aten op, its inputs, outputs and what it saves for backward (``_Recorder``);
the helpers that cast, swap and group what the trace meets.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Callable, Iterator
from typing import Any

from costmodel.trace.nodes import (
    _FAMILY_OF,
    _PER_ELEMENT,
    LOSS,
    TensorRef,
)
from costmodel.trace.sharding import op_loops, view_groups, view_map, view_spans
from costmodel.trace.trace_ops import (
    ATTENTION_WINDOW,
    IN_FUSED_FORWARD,
    fused_attention_causal,
    fused_attention_flops,
    is_fused_attention,
    window_keys,
)


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
    shape and dtype, and what a submodule says sets its computation apart beyond them (a
    ``trace_key`` attribute: the reference transformer's attention gives its window)."""
    params = tuple((n, tuple(p.shape), str(p.dtype)) for n, p in mod.named_parameters())
    bufs = tuple((n, tuple(b.shape), str(b.dtype)) for n, b in mod.named_buffers())
    keys = tuple((n, m.trace_key) for n, m in mod.named_modules()
                 if getattr(m, "trace_key", None) is not None)
    return (type(mod), params, bufs, keys)


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
        # A local attention's window (ATTENTION_WINDOW) and the share of the full kernel's
        # work it does, by its autograd node's sequence number (its backward runs that node).
        self.windows: dict[int, tuple[int, float]] = {}

    def module_path(self) -> str:
        if self.in_loss:
            return LOSS
        parents = [p for p in self.tracker.parents if p != "Global"]
        if not parents:
            return ""
        deepest = max(parents, key=lambda p: (p.count("."), len(p)))
        return deepest[len(self.prefix):].lstrip(".") if deepest.startswith(self.prefix) \
            else deepest

    def _window(self, backward: bool, args: Any) -> tuple[int, float]:
        """(window, share of the causal kernel's work) of a fused attention op run by
        ``local_attention`` (``ATTENTION_WINDOW``; its backward: its forward's), else (0, 1):
        a query's keys, ``window_keys``, over the causal mask's half of the sequence, the
        model FLOPs counted as the whole ``s x s`` counts them."""
        import torch

        if backward:
            node = torch._C._current_autograd_node()
            return self.windows.get(node._sequence_nr(), (0, 1.0)) if node is not None \
                else (0, 1.0)
        spec = ATTENTION_WINDOW.get()
        if spec is None or not spec[0]:
            return 0, 1.0
        window, chunked = spec
        seq = int(args[0].shape[-2])
        share = window_keys(seq, window, chunked) / (seq / 2)
        self.windows[torch._C._autograd._get_sequence_nr() - 1] = (window, share)
        return window, share

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
        window = 0
        if is_fused_attention(name):
            model_flops = fused_attention_flops(name, args)
            # The kernel skips the masked half of a causal attention (Dao 2023, Sec. 3).
            causal = fused_attention_causal(name, args)
            window, share = self._window(backward, args)
            model_flops *= share
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
            extra = dict(inputs=refs, grad=grad, causal=causal, window=window,
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
