"""How the layer-graph trace runs a model on the meta device as a GPU would: the functional
ops it swaps in for torch's meta-device decompositions (fused scaled-dot-product attention,
fused RMS norm, native dropout), so that the graph records what the GPU kernels save for
backward, and the model FLOPs of the fused attention kernel.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

__all__ = ["ATTENTION_WINDOW", "FUSED_ATTENTION", "FUSED_ATTENTION_V", "IN_FUSED_FORWARD",
           "TRACING", "dropout", "fused_attention_causal", "fused_attention_flops",
           "fused_sdpa", "is_fused_attention", "local_attention", "rms_norm", "window_keys"]

#: True while the ops of a fused kernel's forward run (the fused RMS norm's, inside an
#: autograd function, where grad mode is off) and its inputs need a gradient: their backward
#: runs as the kernel's (``OpNode.fused_grad``).
IN_FUSED_FORWARD: ContextVar[bool] = ContextVar("IN_FUSED_FORWARD", default=False)


#: The fused attention the trace runs ``F.scaled_dot_product_attention`` as (forward, backward).
FUSED_ATTENTION = ("_scaled_dot_product_flash_attention_for_cpu",
                   "_scaled_dot_product_flash_attention_for_cpu_backward")
#: The same where the values are narrower than the queries and keys (multi-head latent
#: attention), which the CPU flash kernel refuses: the memory-efficient kernel's ops, whose
#: meta shapes follow each operand (as cuDNN's and FlashAttention-3's kernels run it).
FUSED_ATTENTION_V = ("_scaled_dot_product_efficient_attention",
                     "_scaled_dot_product_efficient_attention_backward")
#: Where each forward op's ``is_causal`` argument sits.
_CAUSAL_ARG = {FUSED_ATTENTION[0]: 4, FUSED_ATTENTION_V[0]: 6}


def is_fused_attention(name: str) -> bool:
    """Whether op ``name`` is the trace's fused attention (``fused_sdpa``), forward or
    backward."""
    return name in FUSED_ATTENTION or name in FUSED_ATTENTION_V


def fused_attention_causal(name: str, args: Any) -> bool:
    """Whether a fused attention forward op runs causal (its backward: False)."""
    i = _CAUSAL_ARG.get(name)
    return i is not None and len(args) > i and args[i] is True


def fused_attention_flops(name: str, args: Any) -> float:
    """Model FLOPs of the fused attention kernel: ``QK^T`` and ``PV`` forward, twice that
    backward (the FLOPs of the computation, PaLM App. B; the kernel also recomputes ``QK^T``,
    Dao 2023, which is hardware, not model, work)."""
    from torch.utils.flop_counter import sdpa_flop_count

    forward_op = name in _CAUSAL_ARG
    q, k, v = (args[0], args[1], args[2]) if forward_op else (args[1], args[2], args[3])
    forward = float(sdpa_flop_count(tuple(q.shape), tuple(k.shape), tuple(v.shape)))
    return forward if forward_op else 2.0 * forward


#: True while a module is traced (``LayerGraph.from_module``): ``local_attention`` then runs
#: as the fused kernel, its window (and whether it is chunked) in ``ATTENTION_WINDOW`` for the
#: recorder to scale the kernel's work by.
TRACING: ContextVar[bool] = ContextVar("TRACING", default=False)
ATTENTION_WINDOW: ContextVar[tuple[int, bool] | None] = ContextVar("ATTENTION_WINDOW",
                                                                   default=None)


def window_keys(seq_len: int, window: int, chunked: bool) -> float:
    """Keys a query attends to on average under a causal mask limited to the last
    ``window`` keys (``chunked``: to its own chunk of ``window``): ``ModelSpec.
    attended_keys`` of a local layer."""
    s, w = float(seq_len), float(window)
    if not window or s <= w:
        return s / 2
    return w / 2 if chunked else w - w * w / (2 * s)


def local_attention(query: Any, key: Any, value: Any, window: int = 0, chunked: bool = False,
                    sinks: Any = None) -> Any:
    """Causal attention of ``query`` ``[batch, heads, seq, dim]`` over ``key`` and
    ``value`` (fewer heads: grouped), each query seeing the last ``window`` keys (0: all;
    ``chunked``: the keys of its own chunk of ``window``, Llama 4), with a learned logit per
    head in each softmax's denominator (``sinks`` ``[heads]``, GPT-OSS; Xiao et al. 2024).
    Run as softmax attention written out; traced (``TRACING``), as the fused kernel over the
    keys each query sees, what FlashAttention's sliding-window and sink support runs."""
    import torch
    import torch.nn.functional as F

    if TRACING.get():
        token = ATTENTION_WINDOW.set((window, chunked))
        try:
            return F.scaled_dot_product_attention(query, key, value, is_causal=True,
                                                  enable_gqa=key.shape[1] != query.shape[1])
        finally:
            ATTENTION_WINDOW.reset(token)
    heads, s = query.shape[1], query.shape[2]
    if key.shape[1] != heads:
        key = key.repeat_interleave(heads // key.shape[1], dim=1)
        value = value.repeat_interleave(heads // value.shape[1], dim=1)
    scores = query @ key.transpose(-1, -2) / query.shape[-1] ** 0.5
    i = torch.arange(s, device=query.device)[:, None]
    j = torch.arange(s, device=query.device)[None, :]
    allowed = j <= i
    if window:
        allowed = allowed & ((i // window == j // window) if chunked else (i - j < window))
    scores = scores.masked_fill(~allowed, float("-inf")).float()
    if sinks is not None:
        sink = sinks.float().view(1, heads, 1, 1).expand(*scores.shape[:3], 1)
        scores = torch.cat([scores, sink], dim=-1)
    p = torch.softmax(scores, dim=-1)
    if sinks is not None:
        p = p[..., :-1]
    return p.to(value.dtype) @ value


def fused_sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None,
                dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                enable_gqa: bool = False) -> Any:
    """``F.scaled_dot_product_attention`` as one fused kernel (what a GPU runs: FlashAttention
    saves Q, K, V, the output and the log-sum-exp, not the s x s scores). On the meta device
    torch would otherwise take the unfused math path. Grouped-query K and V keep their own
    head count (``enable_gqa``), as the fused kernels read them."""
    import torch

    if value.shape[-1] != query.shape[-1]:  # narrower values (MLA): FUSED_ATTENTION_V
        out = torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, True, dropout_p, is_causal, scale=scale)[0]
        return out
    out, _lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
    return out


def _fused_rms_norm() -> Any:
    """An autograd function for ``F.rms_norm`` as the fused kernel runs it (torch's CUDA
    ``_fused_rms_norm``, Megatron's and Apex's): it saves its input and the per-row
    reciprocal RMS, where the eager decomposition also saves the normalized tensor."""
    import torch

    class FusedRMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Any, weight: Any, dims: tuple[int, ...], eps: float) -> Any:
            token = IN_FUSED_FORWARD.set(bool(x.requires_grad or (
                weight is not None and weight.requires_grad)))
            try:
                rstd = torch.rsqrt(x.float().pow(2).mean(dims, keepdim=True) + eps)
                ctx.save_for_backward(x, weight, rstd)
                ctx.dims = dims
                out = (x * rstd).to(x.dtype)
                return out * weight if weight is not None else out
            finally:
                IN_FUSED_FORWARD.reset(token)

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            # d/dx of x r w with r = (mean x^2 + eps)^-1/2: r (g w - xhat mean(g w xhat)).
            x, weight, rstd = ctx.saved_tensors
            xhat = x * rstd
            gw = grad * weight if weight is not None else grad
            gx = rstd * (gw - xhat * (gw * xhat).mean(ctx.dims, keepdim=True))
            gweight = None
            if weight is not None and ctx.needs_input_grad[1]:
                lead = tuple(range(grad.dim() - weight.dim()))
                gweight = (grad * xhat).sum(lead)
            return gx.to(x.dtype), gweight, None, None

    return FusedRMSNorm


def rms_norm(x: Any, normalized_shape: Any, weight: Any = None, eps: float | None = None
              ) -> Any:
    import torch

    dims = tuple(range(x.dim() - len(normalized_shape), x.dim()))
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    return _fused_rms_norm().apply(x, weight, dims, eps)


def dropout(x: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    """``F.dropout`` as ``native_dropout`` (what CUDA runs: a 1-byte mask is saved; the meta
    decomposition would save a mask of the input's dtype)."""
    import torch

    if not training or p == 0.0:
        return x
    return torch.ops.aten.native_dropout(x, p, True)[0]
