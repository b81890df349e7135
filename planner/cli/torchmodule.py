"""The flags and inputs of a command that traces a torch ``nn.Module`` (``planner plan``
and ``planner graph``): ``--input-shape`` and ``--input-dtype``, or token ids of
``--seq-len`` for a module whose first layer is an embedding.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from costmodel import Job, SpecError
from costmodel.errors import install_hint

__all__ = ["add_module_args", "input_shapes", "module_inputs"]


def add_module_args(p: argparse.ArgumentParser, title: str) -> None:
    """The ``--input-shape`` and ``--input-dtype`` flags, in a group named after ``title``."""
    tm = p.add_argument_group(f"torch module ({title})")
    tm.add_argument("--input-shape", metavar="DIMS",
                    help="the inputs the module is traced with, batch first: dimensions joined "
                    "by x, inputs by commas, e.g. 8x3x224x224 (the costs are scaled to each "
                    "micro-batch the search tries; default for a module whose first layer is "
                    "an nn.Embedding: one sequence of --seq-len token ids)")
    tm.add_argument("--input-dtype", choices=("int64", "float"),
                    help="element type of --input-shape tensors (default: int64 token ids "
                    "when the first layer is an nn.Embedding, else float in --precision)")


def input_shapes(text: str) -> list[tuple[int, ...]]:
    """``--input-shape``: tensors separated by commas, dimensions by ``x``."""
    shapes = []
    for part in text.split(","):
        try:
            dims = tuple(int(d) for d in part.strip().lower().split("x"))
        except ValueError:
            raise SpecError(f"--input-shape {text!r}: write each input's dimensions joined by "
                            "x, inputs separated by commas, e.g. 8x3x224x224 or "
                            "4x2048,4x2048") from None
        if not dims or any(d < 1 for d in dims) or len(dims) > 8:
            raise SpecError(f"--input-shape {part.strip()!r}: give 1 to 8 positive "
                            "dimensions, the micro-batch first")
        if math.prod(dims) > 2**36:
            raise SpecError(f"--input-shape {part.strip()!r}: {math.prod(dims):,} elements "
                            "in one micro-batch is absurd; check the dimensions")
        shapes.append(dims)
    return shapes


def module_inputs(args: argparse.Namespace, module: Any, job: Job, batch: int = 1) -> Any:
    """The inputs ``module`` is traced with: ``--input-shape`` tensors, else ``batch``
    sequences of token ids when its first layer is an embedding."""
    try:
        import torch
    except ImportError:
        raise SpecError(f"planning a torch module needs torch: {install_hint('torch')}") from None
    first = next((m for m in module.modules() if not list(m.children())
                  and any(True for _ in m.parameters(recurse=False))), None)
    tokens = isinstance(first, torch.nn.Embedding)
    dtype = {"int64": torch.int64, "float": torch.float32}.get(
        args.input_dtype, torch.int64 if tokens else torch.float32)
    if args.input_shape:
        shapes = input_shapes(args.input_shape)
        return tuple(torch.empty(s, dtype=dtype, device="meta") for s in shapes)
    if not tokens:
        raise SpecError(f"--model {args.model}: its first layer is a "
                        f"{type(first).__name__ if first is not None else 'module without weights'}"
                        ", not an nn.Embedding, so its input cannot be guessed; give "
                        "--input-shape, e.g. --input-shape 8x3x224x224 (micro-batch first)")

    return torch.zeros((batch, job.seq_len), dtype=dtype, device="meta")
