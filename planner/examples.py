"""Small torch models to plan from their traced layer graph (``planner plan --model
planner.examples:ViT --input-shape 8x3x32x32``), and what the graph tests and benchmarks trace.

Importing this module imports torch; ``import planner`` does not.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from costmodel.model import ModelSpec
from planner.runtime.model import Transformer

__all__ = ["EncoderDecoder", "LatentMoE", "MLPMixer", "ViT"]


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


class EncoderDecoder(nn.Module):
    """A T5-style encoder-decoder (Raffel et al. 2020, Sec. 2.1): one token embedding shared
    by both stacks (and, with ``tied``, by the output layer, as the original T5 ties them),
    ``encoder_layers`` pre-norm self-attention blocks and a final norm, then
    ``decoder_layers`` pre-norm blocks of causal self-attention, attention over the
    encoder's output and an MLP (width ``dim``, ``heads`` heads, a 4 x ``dim`` MLP, no
    dropout), a final norm and the vocabulary projection. It reads one tensor of
    ``[batch, seq]`` token ids as the encoder's input and the decoder's (a denoising
    objective's corrupted and clean sequence are as long)."""

    def __init__(self, vocab: int = 256, dim: int = 64, heads: int = 4,
                 encoder_layers: int = 2, decoder_layers: int = 2, tied: bool = False
                 ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.encoder = nn.ModuleList([
            nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                       norm_first=True) for _ in range(encoder_layers)])
        self.encoder_norm = nn.LayerNorm(dim)
        self.decoder = nn.ModuleList([
            nn.TransformerDecoderLayer(dim, heads, 4 * dim, dropout=0.0, batch_first=True,
                                       norm_first=True) for _ in range(decoder_layers)])
        self.norm = nn.LayerNorm(dim)
        self.head = None if tied else nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]`` of token ids ``[batch, seq]``."""
        x = self.embed(tokens)
        for block in self.encoder:
            x = block(x)
        memory = self.encoder_norm(x)
        s = tokens.shape[1]
        causal = torch.full((s, s), float("-inf"), device=tokens.device).triu(1)
        y = self.embed(tokens)
        for block in self.decoder:
            y = block(y, memory, tgt_mask=causal, tgt_is_causal=True)
        if self.head is None:  # the output layer is the token embedding
            return F.linear(self.norm(y), self.embed.weight)
        return self.head(self.norm(y))


class _MixerBlock(nn.Module):
    """One Mixer layer: a token-mixing MLP across the ``tokens`` patches, then a
    channel-mixing MLP across the ``dim`` channels, each pre-norm and residual."""

    def __init__(self, tokens: int, dim: int, token_hidden: int, channel_hidden: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, token_hidden), nn.GELU(),
                                       nn.Linear(token_hidden, tokens))
        self.norm2 = nn.LayerNorm(dim)
        self.channel_mlp = nn.Sequential(nn.Linear(dim, channel_hidden), nn.GELU(),
                                         nn.Linear(channel_hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channel_mlp(self.norm2(x))


class MLPMixer(nn.Module):
    """MLP-Mixer (Tolstikhin et al. 2021, Sec. 2): a ``patch`` x ``patch`` convolution
    embedding ``image`` x ``image`` RGB inputs into ``dim`` channels, ``depth`` Mixer layers
    (token-mixing MLP of ``dim // 2``, channel-mixing of 4 x ``dim``), a norm, global average
    pooling over the patches and a linear classifier over ``classes``."""

    def __init__(self, dim: int = 64, depth: int = 4, patch: int = 8, image: int = 32,
                 classes: int = 10) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, patch, stride=patch)
        tokens = (image // patch) ** 2
        self.blocks = nn.ModuleList([_MixerBlock(tokens, dim, dim // 2, 4 * dim)
                                     for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``[batch, classes]`` of images ``[batch, 3, image, image]``."""
        x = self.patch(x).flatten(2).transpose(1, 2)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x).mean(dim=1))


def latent_moe_spec(layers: int = 4, dim: int = 1024, heads: int = 16, experts: int = 16,
                    top_k: int = 4, vocab: int = 32000) -> ModelSpec:
    """The ``ModelSpec`` of ``LatentMoE`` with these sizes."""
    return ModelSpec(name="latent-moe", num_layers=layers, hidden_size=dim, num_heads=heads,
                     head_dim=96, v_head_dim=64, qk_rope_head_dim=32, q_lora_rank=dim // 2,
                     kv_lora_rank=dim // 4, ffn_hidden_size=4 * dim, moe_ffn_hidden_size=dim // 2,
                     num_experts=experts, top_k=top_k, num_shared_experts=1,
                     first_dense_layers=1, vocab_size=vocab, gated_mlp=True)


class LatentMoE(Transformer):
    """A DeepSeek-V3-shaped language model at a small size (DeepSeek-AI 2024, "DeepSeek-V3
    Technical Report", Sec. 2.1): multi-head latent attention (a query latent of ``dim / 2``,
    a key-value latent of ``dim / 4`` with a 32-wide rotary key, heads of 96 for queries and
    keys and 64 for values), the first layer's MLP dense, then ``experts`` fine-grained
    experts of ``dim / 2`` with ``top_k`` routed and one shared; the project's reference
    transformer (``planner.runtime.model``) of ``latent_moe_spec``. It takes token ids
    ``[batch, seq]`` (``planner plan --model planner.examples:LatentMoE --input-shape 1x512
    --input-dtype int64``)."""

    def __init__(self, layers: int = 4, dim: int = 1024, heads: int = 16, experts: int = 16,
                 top_k: int = 4, vocab: int = 32000) -> None:
        super().__init__(latent_moe_spec(layers, dim, heads, experts, top_k, vocab))

