"""Modules the runtime tests plan from their trace besides ``planner.examples``'s."""

from __future__ import annotations

import torch
from torch import nn


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, need_weights: bool) -> None:
        super().__init__()
        self.need_weights = need_weights
        self.norm1 = nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, need_weights=self.need_weights)[0]
        return x + self.mlp(self.norm2(x))


class AttentionLM(nn.Module):
    """A language model of pre-norm blocks built from ``nn.MultiheadAttention`` and an MLP
    module (no positions): each module's input is a module boundary, so the sharding ILP's
    sequence-parallel layout runs (its norms split along the sequence, the attention split
    by heads gathering the sequence, the MLP's input all-gathered). ``need_weights``: its
    attention also returns its weights (``nn.MultiheadAttention`` then runs it unfused)."""

    def __init__(self, vocab: int = 64, dim: int = 32, heads: int = 4, layers: int = 2,
                 need_weights: bool = False) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(_Block(dim, heads, need_weights) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]`` of token ids ``[batch, seq]``."""
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
