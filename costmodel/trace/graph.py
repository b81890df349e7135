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
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from costmodel.errors import SpecError, install_hint
from costmodel.trace.nodes import (
    LOSS,
    ROOT,
    ROOT_OUT,
    Layer,
    OpNode,
)
from costmodel.trace.recorder import (
    _autocast_ops,
    _cast,
    _grouped_mm_like,
    _meta,
    _output_sum,
    _Recorder,
    _runs,
    _swapped,
    _truncated,
)
from costmodel.trace.trace_ops import (
    TRACING,
    dropout,
    fused_sdpa,
    rms_norm,
)
from costmodel.units import GIB

__all__ = ["LayerGraph"]


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
                # costmodel.formulas.memory counts beside them), not an activation.
                funcs, lowering = _autocast_ops(
                    autocast, lambda t: rec.param_storages.add(t.untyped_storage()._cdata))
                replacements.update({f: lowering(fused.get(f, f)) for f in funcs})
                names_too = _swapped(torch, replacements)
            tracing = TRACING.set(True)
            with _reset(TRACING, tracing), tracker, names_too, _swapped(F, replacements), \
                    Fused(), Mode(rec), \
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
def _reset(var: Any, token: Any) -> Iterator[None]:
    """Reset the context variable ``var`` to what ``token`` set it from on leaving."""
    try:
        yield
    finally:
        var.reset(token)


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
