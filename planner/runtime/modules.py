"""Running the plan of a traced module whose layers are not a ``layers`` list: its layers
are the module paths of the blocks ``LayerCosts`` found between its input and output sides
(``layer_paths``), and its pipeline stages are cut by ``torch.distributed.pipelining``'s
tracer (``pipeline`` with a split point at the first layer of each stage), which threads
every tensor a later stage reads (an encoder's output to each decoder stage) through the
stages between.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch
from torch import nn

from costmodel.config import Job
from costmodel.errors import SpecError
from costmodel.formulas.layercosts import LayerCosts

__all__ = ["layer_paths", "module_batch", "module_blocks", "output_size", "pipeline_stages",
           "set_module"]


def layer_paths(costs: LayerCosts, module: nn.Module) -> list[str]:
    """The module path of each layer of ``costs`` (``LayerCosts.layer_names``), checked
    against ``module``: ``SpecError`` when it has no such submodule (not the module the plan
    was traced from)."""
    names = {name for name, _ in module.named_modules()}
    out = costs.layer_names()
    missing = [p for p in out if p not in names]
    if missing:
        raise SpecError(f"the plan's layers {', '.join(missing[:3])} are not modules of this "
                        f"{type(module).__name__}; apply the plan to the module it was traced "
                        "from")
    return out


def module_blocks(part: nn.Module, paths: list[str]) -> list[tuple[str, nn.Module]]:
    """The layers of ``paths`` that ``part`` (a module or one pipeline stage of it) holds."""
    have = dict(part.named_modules())
    return [(p, have[p]) for p in paths if p in have]


def set_module(part: nn.Module, path: str, new: nn.Module) -> None:
    """Replace the submodule at ``path`` of ``part`` (e.g. by its checkpoint wrapper)."""
    parent, _, name = path.rpartition(".")
    setattr(part.get_submodule(parent) if parent else part, name, new)


def pipeline_stages(module: nn.Module, paths: list[str], ranges: list[tuple[int, int]],
                    stage_ids: list[int], example: Any
                    ) -> tuple[list[nn.Module], list[dict[int, list[str]]]]:
    """The pipeline chunks ``stage_ids`` of ``module``: layer ``ranges`` (chunk order) cut by
    ``torch.distributed.pipelining.pipeline`` at the first layer of each chunk, traced with
    ``example`` (one micro-batch of the module's inputs); and the weights used in more than
    one place (a tied word embedding), which torch's pipelining copies into each: per
    weight, chunk -> the paths of its copies there (``planner.runtime.apply`` keeps the
    copies equal). ``SpecError`` where a later chunk reads the model's own input."""
    from torch.distributed.pipelining import SplitPoint, pipeline

    cuts = {paths[lo]: SplitPoint.BEGINNING for lo, _ in ranges[1:]}
    args = example if isinstance(example, tuple) else (example,)
    try:
        pipe = pipeline(module, mb_args=args, split_spec=cuts)
    except Exception as e:  # the tracer's own errors, as one line
        raise SpecError(f"torch.distributed.pipelining could not cut "
                        f"{type(module).__name__} at {', '.join(cuts)}: "
                        f"{type(e).__name__}: {str(e)[:300]}") from None
    if pipe.num_stages != len(ranges):
        raise SpecError(f"torch.distributed.pipelining cut {type(module).__name__} into "
                        f"{pipe.num_stages} stages, not {len(ranges)}")
    inputs = set(inspect.signature(module.forward).parameters)
    for s in range(1, pipe.num_stages):
        stage = pipe.get_stage_module(s)
        assert isinstance(stage, torch.fx.GraphModule)  # what pipeline() cuts
        read = sorted(n.name for n in stage.graph.nodes
                      if n.op == "placeholder" and n.name in inputs)
        if read:
            raise SpecError(f"pipeline stage {s} of {type(module).__name__}, cut at "
                            f"{paths[ranges[s][0]]}, reads the model's own input "
                            f"{', '.join(read)}, which torch's pipelining does not pass on; "
                            "cut it elsewhere (stage_layers) or plan it with pp=1")
    # torch's pipelining copies a weight into each chunk that uses it, under its path (and
    # under 'module@k' where a chunk calls its module again, not always as the same
    # parameter): one parameter per chunk, and the chunks' copies of one weight.
    holders: dict[str, dict[int, str]] = {}
    for s in range(pipe.num_stages):
        stage = pipe.get_stage_module(s)
        for name, _ in list(stage.named_parameters()):
            original = re.sub(r"@\d+(?=\.|$)", "", name)
            first = holders.setdefault(original, {}).setdefault(s, name)
            if first != name:
                path, _, attr = name.rpartition(".")
                setattr(stage.get_submodule(path) if path else stage, attr,
                        stage.get_parameter(first))
    parts = [_contiguous_outputs(pipe.get_stage_module(s)) for s in stage_ids]
    return parts, [{s: [n] for s, n in h.items()} for h in holders.values() if len(h) > 1]


def _contiguous_outputs(stage: nn.Module) -> nn.Module:
    """A stage (a ``torch.fx.GraphModule``) whose outputs are made contiguous: the
    pipeline's sends take contiguous tensors only (a transposed activation is not)."""
    import torch.fx

    assert isinstance(stage, torch.fx.GraphModule)  # what pipeline() cuts
    graph = stage.graph
    out = next(n for n in graph.nodes if n.op == "output")
    with graph.inserting_before(out):
        out.args = (torch.fx.map_arg(out.args[0],
                                     lambda a: graph.call_method("contiguous", (a,))),)
    stage.recompile()
    return stage


def module_batch(example: torch.Tensor, classes: int, batch: int, step: int, seed: int
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """A synthetic global batch of ``batch`` samples shaped like ``example`` and its labels,
    the same on every rank for one seed: for token ids, ``synthetic_batch``'s random walks
    over ``classes`` tokens labelled with the next token; otherwise standard normal inputs
    labelled with one of ``classes`` classes by a fixed function of the input."""
    from costmodel.config import Job


    if not example.is_floating_point():
        job = Job(global_batch_size=batch, seq_len=int(example.shape[1]))
        return synthetic_batch(job, classes, step, seed)
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn((batch, *example.shape[1:]), generator=g)
    # The class is the largest of a fixed random projection of the input: a function a
    # model can learn, so a broken parallel run shows in the loss curve.
    w = torch.randn((x[0].numel(), classes), generator=torch.Generator().manual_seed(seed))
    return x, (x.flatten(1) @ w).argmax(dim=-1)


def output_size(module: nn.Module, example: torch.Tensor) -> int:
    """The last dimension of ``module``'s output on ``example`` (its classes or vocabulary),
    found on the meta device."""
    from torch.func import functional_call

    state = {k: torch.empty_like(v, device="meta")
             for k, v in {**dict(module.named_parameters()),
                          **dict(module.named_buffers())}.items()}
    with torch.no_grad():
        out = functional_call(module, state, (example.to("meta"),))
    return int(out.shape[-1])


def synthetic_batch(job: Job, vocab_size: int, step: int, seed: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of step ``step``: token ids ``[global_batch_size, seq_len]`` and the
    next-token labels, the same on every rank for one seed.

    Each sequence is a random walk over the vocabulary: a random first token, then steps of
    +1, +2 or +3 (mod vocabulary), so a model can learn it (the loss falls from ln(vocab)
    towards ln 3) and a broken parallel run shows in the loss curve.
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    b, s = job.global_batch_size, job.seq_len + 1
    start = torch.randint(0, vocab_size, (b, 1), generator=g)
    steps = torch.randint(1, 4, (b, s - 1), generator=g)
    tokens = torch.cat([start, start + steps.cumsum(dim=1)], dim=1) % vocab_size
    return tokens[:, :-1], tokens[:, 1:]
