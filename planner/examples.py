"""Small torch models to plan from their traced layer graph (``planner plan --model
planner.examples:ViT --input-shape 8x3x32x32``), and what the graph tests and benchmarks trace.

Importing this module imports torch; ``import planner`` does not.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ViT"]


class ViT(nn.Module):
    """A vision transformer (Dosovitskiy et al. 2021, Sec. 3.1): a ``patch`` x ``patch``
    convolution embedding ``image`` x ``image`` RGB inputs, a class token, learned positions,
    ``depth`` pre-norm encoder blocks of width ``dim`` with ``heads`` heads and a 4 x ``dim``
    MLP (no dropout), and a linear classifier over ``classes`` on the class token."""

    def __init__(self, dim: int = 64, depth: int = 3, heads: int = 4, patch: int = 8,
                 image: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        n = (image // patch) ** 2
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, n + 1, dim))
        self.blocks = nn.ModuleList([
            nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                       norm_first=True) for _ in range(depth)])
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, classes]`` of images ``[batch, 3, image, image]``."""
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(x[:, 0])
