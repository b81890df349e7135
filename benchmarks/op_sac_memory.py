"""What a torchtitan-style Llama block keeps for backward, and what its loss holds, on one GPU.

Measures, for Llama 3 8B's layer shape (Dubey et al. 2024, Table 3: 4096 wide, 14336 FFN,
32 query and 8 key/value heads; 8192 tokens), the bytes one layer keeps from its forward pass
to its backward pass under each recompute mode torchtitan offers (none, full, and per-op
selective: its ``_save_list`` policy, pytorch/torchtitan@9dec370
torchtitan/parallelisms/parallelize_llama.py), eager and with each block compiled as
torchtitan does (``torch.compile(block, fullgraph=True)``); the peak of forward plus backward
above the kept bytes (what recompute re-materializes); the time of one layer's forward and
backward; and the bytes per logit and the time of the loss, eager
(``F.cross_entropy(pred.float())``, as torchtitan's 2024 benchmarks ran it) and compiled
(``build_cross_entropy_loss`` compiles it with the model from pytorch/torchtitan@bbb1b616e
on). The block is written here after torchtitan's Llama (RMSNorm, rotary q and k, SDPA causal
flash attention, SwiGLU), weights in bf16 as FSDP2's ``param_dtype`` gives them, no autocast.

    python benchmarks/op_sac_memory.py --save op_sac.json        # on a GPU, about 3 minutes
    python benchmarks/op_sac_memory.py --rows benchmarks/data/op-sac-h200-2026-11-27.json
    python benchmarks/op_sac_memory.py --float8 tensorwise --save f8.json   # needs torchao
    python benchmarks/op_sac_memory.py --profile-layer --save prof.json     # kernel times

``--rows`` prints saved measurements next to the cost model's figures, no GPU needed (with
``--gpu PROFILE.toml`` against a measured profile). ``--float8`` compares bf16 with torchao's
float8 linears (the policy's view of their matmuls is recorded per row); ``--loss-only``
measures the loss alone; ``--tiny`` runs a small shape (on a CPU it checks the script,
without memory figures).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

LLAMA3_8B = {"hidden": 4096, "ffn": 14336, "heads": 32, "kv_heads": 8, "seq": 8192,
             "vocab": 128256}
TINY = {"hidden": 256, "ffn": 768, "heads": 4, "kv_heads": 2, "seq": 128, "vocab": 1000}


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in fp32 and cast back (torchtitan's ``RMSNorm``)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) \
            * self.weight


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs of channels of ``x`` [b, s, heads, d] by the position's angle, in fp32."""
    xf = x.float().unflatten(-1, (-1, 2))
    a, b = xf[..., 0], xf[..., 1]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2).type_as(x)


class Block(nn.Module):
    """One Llama decoder layer: x + attn(norm(x)), then h + w2(silu(w1 n) * w3 n)."""

    def __init__(self, d: dict[str, int]) -> None:
        super().__init__()
        h, self.nh, self.nkv = d["hidden"], d["heads"], d["kv_heads"]
        self.hd = h // self.nh
        self.attn_norm, self.ffn_norm = RMSNorm(h), RMSNorm(h)
        self.wq = nn.Linear(h, h, bias=False)
        self.wk = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.wv = nn.Linear(h, self.nkv * self.hd, bias=False)
        self.wo = nn.Linear(h, h, bias=False)
        self.w1 = nn.Linear(h, d["ffn"], bias=False)
        self.w3 = nn.Linear(h, d["ffn"], bias=False)
        self.w2 = nn.Linear(d["ffn"], h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        n = self.attn_norm(x)
        q = rotary(self.wq(n).view(b, s, self.nh, self.hd), cos, sin)
        k = rotary(self.wk(n).view(b, s, self.nkv, self.hd), cos, sin)
        v = self.wv(n).view(b, s, self.nkv, self.hd)
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True)
        x = x + self.wo(o.transpose(1, 2).reshape(b, s, -1))
        n = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(n)) * self.w3(n))


#: The matmul-like ops the per-op policy was asked about, with counts (what it sees of a
#: float8 linear: aten.mm on torchao's tensor subclass, or the _scaled_mm inside it).
POLICY_SAW: dict[str, int] = defaultdict(int)


def _op_sac_context() -> Any:
    """torchtitan's per-op selective AC: keep the outputs of the ops on its save list (the
    matmul, the fused attention kernels, reduce-scatter, abs and max), except every second
    matmul of the block in call order; recompute everything else."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    aten = torch.ops.aten
    save = {aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
            aten._scaled_dot_product_flash_attention.default,
            torch.ops._c10d_functional.reduce_scatter_tensor.default,
            aten.abs.default, aten.max.default}
    count: dict[str, int] = defaultdict(int)

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        key = "recompute" if ctx.is_recompute else "forward"
        if "mm" in str(func):
            POLICY_SAW[str(func)] += 1
        if func == aten.mm.default:
            count[key] += 1
        keep = func in save and not (func == aten.mm.default and count[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


class Wrapped(nn.Module):
    """A block under a recompute mode: none, full, or op (torchtitan's per-op SAC)."""

    def __init__(self, block: Block, mode: str) -> None:
        super().__init__()
        self.block, self.mode = block, mode

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        from torch.utils.checkpoint import checkpoint
        if self.mode == "none":
            return self.block(x, cos, sin)
        kw = {"context_fn": _op_sac_context} if self.mode == "op" else {}
        return checkpoint(self.block, x, cos, sin, use_reentrant=False,
                          preserve_rng_state=False, **kw)


def _rope(d: dict[str, int], device: str) -> tuple[torch.Tensor, torch.Tensor]:
    hd = d["hidden"] // d["heads"]
    inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device=device).float() / hd))
    ang = torch.outer(torch.arange(d["seq"], device=device).float(), inv)
    return ang.cos(), ang.sin()


def _alloc(device: str) -> int:
    return torch.cuda.memory_allocated() if device == "cuda" else 0


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _block(d: dict[str, int], device: str, float8: str | None) -> Block:
    """A bf16 block; with ``float8`` its linears are torchao Float8Linears of that recipe
    (``tensorwise``, ``rowwise``), as torchtitan's float8 converter makes them."""
    block = Block(d).to(device=device, dtype=torch.bfloat16)
    if float8:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        convert_to_float8_training(block, config=Float8LinearConfig.from_recipe_name(float8))
    return block


def measure_layers(d: dict[str, int], mode: str, compiled: bool, mbs: int, device: str,
                   iters: int, float8: str | None = None) -> dict[str, float]:
    """Kept bytes per layer (forward of 3 layers less forward of 1, halved), the peak of a
    3-layer forward plus backward above the input, and the median time of one layer's
    forward plus backward."""
    torch.manual_seed(0)
    dt = torch.bfloat16
    blocks = [Wrapped(_block(d, device, float8), mode) for _ in range(3)]
    if compiled:
        blocks = [torch.compile(b, fullgraph=True) for b in blocks]
    cos, sin = _rope(d, device)
    x0 = torch.randn(mbs, d["seq"], d["hidden"], device=device, dtype=dt, requires_grad=True)

    def run(n: int) -> tuple[int, int, float]:
        _sync(device)
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        m0 = _alloc(device)
        t0 = time.perf_counter()
        y = x0
        for b in blocks[:n]:
            y = b(y, cos, sin)
        _sync(device)
        kept = _alloc(device) - m0
        y.backward(torch.ones_like(y))
        _sync(device)
        took = time.perf_counter() - t0
        peak = (torch.cuda.max_memory_allocated() - m0) if device == "cuda" else 0
        for b in blocks:
            for p in b.parameters():
                p.grad = None
        x0.grad = None
        del y
        return kept, peak, took

    for _ in range(2):  # warm-up (and compilation)
        run(3)
        run(1)
    kept1, _, _ = run(1)
    kept3, peak3, _ = run(3)
    times = [run(1)[2] for _ in range(iters)]
    out = {"kept_per_layer_bytes": (kept3 - kept1) / 2, "kept_1_layer_bytes": kept1,
           "peak_3_layers_bytes": peak3, "layer_fwd_bwd_s": statistics.median(times)}
    return out


def measure_loss(d: dict[str, int], compiled: bool, mbs: int, device: str) -> dict[str, float]:
    """Bytes per logit the loss holds: after the output projection and loss forward (kept),
    and at the peak of the backward through them, above the final hidden state; the output
    weight's gradient is taken off."""
    torch.manual_seed(0)
    dt = torch.bfloat16
    out = nn.Linear(d["hidden"], d["vocab"], bias=False).to(device=device, dtype=dt)

    def ce(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    loss_fn = torch.compile(ce) if compiled else ce
    h = torch.randn(mbs, d["seq"], d["hidden"], device=device, dtype=dt, requires_grad=True)
    labels = torch.randint(0, d["vocab"], (mbs, d["seq"]), device=device)
    res = {}
    for _ in range(3):  # the last pass is measured; the first compiles
        _sync(device)
        if device == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        m0 = _alloc(device)
        pred = out(h)
        loss = loss_fn(pred, labels)
        del pred
        _sync(device)
        kept = _alloc(device) - m0
        loss.backward()
        _sync(device)
        peak = (torch.cuda.max_memory_allocated() - m0) if device == "cuda" else 0
        wgrad = out.weight.numel() * out.weight.element_size()
        logits = mbs * d["seq"] * d["vocab"]
        res = {"kept_bytes_per_logit": kept / logits,
               "peak_bytes_per_logit": (peak - wgrad) / logits}
        out.weight.grad = None
        h.grad = None
        del loss
    # The loss alone, forward and backward, on logits that are a leaf: its time.
    pred = torch.randn(mbs, d["seq"], d["vocab"], device=device, dtype=dt, requires_grad=True)
    times = []
    for i in range(8):
        _sync(device)
        t0 = time.perf_counter()
        loss_fn(pred, labels).backward()
        _sync(device)
        if i >= 3:
            times.append(time.perf_counter() - t0)
        pred.grad = None
    res["loss_fwd_bwd_s"] = statistics.median(times)
    return res


CASES = [("none", False, 1), ("full", False, 1), ("op", False, 1), ("op", False, 2),
         ("op", True, 1), ("op", True, 2), ("full", True, 1), ("none", True, 1)]


#: The cases of a float8 run (``--float8``): bf16 and float8 side by side.
FLOAT8_CASES = [("op", True, 1, None), ("op", True, 1, "f8"), ("op", False, 1, "f8"),
                ("none", True, 1, "f8"), ("full", True, 1, "f8")]


def profile_layer(d: dict[str, int], mode: str, compiled: bool, device: str) -> dict[str, Any]:
    """Kernel times of one layer's forward and backward (torch.profiler, 5 passes after
    warm-up), summed by kind: matmul, attention, the rest; and the 30 longest kernels."""
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    block: Any = Wrapped(_block(d, device, None), mode)
    if compiled:
        block = torch.compile(block, fullgraph=True)
    cos, sin = _rope(d, device)
    x = torch.randn(1, d["seq"], d["hidden"], device=device, dtype=torch.bfloat16,
                    requires_grad=True)
    for _ in range(3):
        block(x, cos, sin).sum().backward()
    _sync(device)
    cuda = device == "cuda"
    with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            block(x, cos, sin).sum().backward()
        _sync(device)
    kernels: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type.name == ("CUDA" if cuda else "CPU"):
            k = kernels[ev.name]
            # microseconds over 5 passes -> seconds per pass
            k[0] += (ev.device_time if cuda else ev.self_cpu_time_total) / 5e6
            k[1] += 1
    kinds: dict[str, float] = defaultdict(float)
    for name, (secs, _) in kernels.items():
        low = name.lower()
        kind = ("attention" if "flash" in low or "fmha" in low or "attention" in low
                else "matmul" if any(t in low for t in ("gemm", "xmma", "cutlass", "nvjet",
                                                          "sm90", "wgmma"))
                else "other")
        kinds[kind] += secs
    top = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:30]
    return {"mode": mode, "compiled": compiled, "by_kind_s": dict(kinds),
            "top": [{"name": n[:160], "s_per_pass": v[0], "calls": v[1] / 5} for n, v in top]}


def measure_all(tiny: bool, device: str, iters: int, loss_only: bool = False,
                float8: str | None = None) -> dict[str, Any]:
    d = TINY if tiny else LLAMA3_8B
    layers: list[dict[str, Any]] = []
    losses = []
    if float8:
        # (run on 2026-11-27 without the flash-only context: SDPA picked cuDNN's attention,
        # which is not on torchtitan's save list, so O was recomputed: 368 MiB per layer
        # for bf16 and float8 alike.)
        for mode, compiled, mbs, f8 in FLOAT8_CASES:
            recipe = float8 if f8 else None
            POLICY_SAW.clear()
            try:
                r = measure_layers(d, mode, compiled, mbs, device, iters, recipe)
            except Exception as e:
                print(f"layer {mode} compiled={compiled} float8={recipe}: {e!r}",
                      file=sys.stderr)
                continue
            row = {"mode": mode, "compiled": compiled, "mbs": mbs, "float8": recipe, **r,
                   "policy_saw": dict(POLICY_SAW)}
            print(json.dumps(row), file=sys.stderr)
            layers.append(row)
        return {"shape": d, "layers": layers, "loss": []}
    if device == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        ctx: Any = sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    else:
        import contextlib
        ctx = contextlib.nullcontext()
    with ctx:
        for mode, compiled, mbs in [] if loss_only else CASES:
            try:
                r = measure_layers(d, mode, compiled, mbs, device, iters)
            except Exception as e:
                print(f"layer {mode} compiled={compiled} mbs={mbs}: {e!r}", file=sys.stderr)
                continue
            row = {"mode": mode, "compiled": compiled, "mbs": mbs, **r}
            print(json.dumps(row), file=sys.stderr)
            layers.append(row)
        for compiled in (False, True):
            for mbs in (1, 2):
                try:
                    r = measure_loss(d, compiled, mbs, device)
                except Exception as e:
                    print(f"loss compiled={compiled} mbs={mbs}: {e!r}", file=sys.stderr)
                    continue
                row = {"compiled": compiled, "mbs": mbs, **r}
                print(json.dumps(row), file=sys.stderr)
                losses.append(row)
    return {"shape": d, "layers": layers, "loss": losses}


def _predicted(shape: dict[str, int], mode: str, mbs: int, compiled: bool, gpu_name: str,
               precision: str = "bf16") -> tuple[float, float]:
    """The cost model's bytes kept per layer and forward+backward seconds of one layer, for a
    torchtitan job of ``shape`` on one GPU."""
    from costmodel import Job, ParallelConfig
    from costmodel.formulas.activations import layer_activations
    from costmodel.formulas.arrays import ConfigArrays
    from costmodel.formulas.compute import layer_compute
    from costmodel.frameworks import framework
    from costmodel.hardware import GPU
    from costmodel.model import ModelSpec
    base = ModelSpec.preset("llama-3-8b")
    model = ModelSpec(**{**base.to_dict(), "hidden_size": shape["hidden"],
                         "ffn_hidden_size": shape["ffn"], "num_heads": shape["heads"],
                         "num_kv_heads": shape["kv_heads"], "vocab_size": shape["vocab"]})
    gpu = GPU.from_file(gpu_name) if gpu_name.endswith(".toml") else GPU.preset(gpu_name)
    recompute = {"op": "selective"}.get(mode, mode)
    job = Job(global_batch_size=mbs, seq_len=shape["seq"], precision=precision,
              optimizer="adamw", framework="torchtitan", compile=compiled)
    cfg = ParallelConfig(dp=1, micro_batch_size=mbs, recompute=recompute, zero_stage=3)
    a = ConfigArrays.from_configs(model, [cfg])
    kept = float(layer_activations(model, job, framework("torchtitan"), a, False)[recompute][0])
    lc = layer_compute(model, gpu, job, a.tp, a.cp, a.mbs, a.sp, False)
    extra = {"none": 0.0, "full": lc.forward, "selective": lc.selective}[recompute]
    return kept, float((lc.forward + lc.backward + extra)[0])


def _predicted_loss(shape: dict[str, int], mbs: int, compiled: bool, gpu_name: str) -> float:
    """The cost model's seconds of the cross entropy's forward and backward (the head's
    memory-bound part without its matmul and final norm)."""
    import numpy as np

    from costmodel.config import Job
    from costmodel.formulas.headcompute import lm_head_compute
    from costmodel.hardware import GPU
    from costmodel.model import ModelSpec
    base = ModelSpec.preset("llama-3-8b")
    model = ModelSpec(**{**base.to_dict(), "vocab_size": shape["vocab"]})
    gpu = GPU.from_file(gpu_name) if gpu_name.endswith(".toml") else GPU.preset(gpu_name)
    one = np.ones(1, dtype=np.int64)

    def head(vocab: int) -> float:
        m = ModelSpec(**{**model.to_dict(), "vocab_size": vocab})
        job = Job(global_batch_size=mbs, seq_len=shape["seq"], framework="torchtitan",
                  compile=compiled)
        _, h = lm_head_compute(m, gpu, job, one, one, one * mbs, 0 * one)
        return float((h.forward + h.backward)[0])
    # The head less the same head with a vocabulary of 8 (its matmul and norm barely change
    # the difference): what the logits' memory-bound passes cost.
    from costmodel.formulas.roofline import gemm_time
    tokens = np.array([mbs * shape["seq"]], dtype=float)
    matmul = 3 * (gemm_time(gpu, "bf16", tokens, np.array([float(shape["vocab"])]),
                            float(shape["hidden"]), bytes_per_element=2.0)
                  - gemm_time(gpu, "bf16", tokens, np.array([8.0]), float(shape["hidden"]),
                              bytes_per_element=2.0))
    return head(shape["vocab"]) - head(8) - float(matmul[0])


def report(saved: dict[str, Any], gpu_name: str) -> None:
    """Print the measured rows next to the cost model's."""
    shape = saved["shape"]
    print(f"{saved.get('device', '?')}, torch {saved.get('torch', '?')}, {saved.get('date', '')}")
    print(f"{'layer':<22s} {'kept MiB':>9s} {'model':>9s} {'err':>7s} {'peak MiB':>9s} "
          f"{'ms':>7s} {'model':>7s} {'err':>7s}")
    for r in saved["layers"]:
        kept, secs = _predicted(shape, r["mode"], r["mbs"], r["compiled"], gpu_name,
                                "fp8" if r.get("float8") else "bf16")
        name = f"{r['mode']} {'compiled' if r['compiled'] else 'eager'} mbs={r['mbs']}"
        if r.get("float8"):
            name += f" {r['float8']}"
        k = r["kept_per_layer_bytes"]
        print(f"{name:<22s} {k / 2**20:9.1f} {kept / 2**20:9.1f} {100 * (kept / k - 1):+6.1f}% "
              f"{r['peak_3_layers_bytes'] / 2**20:9.1f} {1e3 * r['layer_fwd_bwd_s']:7.2f} "
              f"{1e3 * secs:7.2f} {100 * (secs / r['layer_fwd_bwd_s'] - 1):+6.1f}%")
    for r in saved["loss"]:
        took = ""
        if "loss_fwd_bwd_s" in r:
            secs = _predicted_loss(shape, r["mbs"], r["compiled"], gpu_name)
            took = (f"; {1e3 * r['loss_fwd_bwd_s']:.2f} ms (model {1e3 * secs:.2f}, "
                    f"{100 * (secs / r['loss_fwd_bwd_s'] - 1):+.1f}%)")
        print(f"loss {'compiled' if r['compiled'] else 'eager':<8s} mbs={r['mbs']}: kept "
              f"{r['kept_bytes_per_logit']:.2f} B/logit, peak {r['peak_bytes_per_logit']:.2f} "
              f"B/logit{took}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tiny", action="store_true", help="a small shape (checks the script)")
    p.add_argument("--iters", type=int, default=5, help="timed passes per case")
    p.add_argument("--loss-only", action="store_true", help="measure the loss alone")
    p.add_argument("--profile-layer", action="store_true",
                   help="kernel times of one per-op-SAC layer, compiled and eager")
    p.add_argument("--float8", choices=("tensorwise", "rowwise"),
                   help="compare bf16 with torchao float8 linears of this recipe instead")
    p.add_argument("--save", help="write the measurements to this JSON file")
    p.add_argument("--rows", help="print measurements saved with --save")
    p.add_argument("--gpu", default="h200", help="GPU profile of the model's figures: a "
                   "shipped name or a profile TOML from 'planner profile'")
    args = p.parse_args()
    if args.rows:
        with open(args.rows) as f:
            report(json.load(f), args.gpu)
        return 0
    if args.profile_layer:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        out = []
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            for compiled in (True, False):
                r = profile_layer(TINY if args.tiny else LLAMA3_8B, "op", compiled,
                                  args.device)
                print(json.dumps(r, indent=1))
                out.append(r)
        if args.save:
            with open(args.save, "w") as f:
                json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                           "date": datetime.date.today().isoformat(), "profiles": out}, f,
                          indent=1)
        return 0
    saved = measure_all(args.tiny, args.device, args.iters, args.loss_only, args.float8)
    saved.update({"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
                  "torch": torch.__version__, "date": datetime.date.today().isoformat()})
    if args.save:
        with open(args.save, "w") as f:
            json.dump(saved, f, indent=1)
    if args.device == "cuda":
        report(saved, args.gpu)
    return 0


if __name__ == "__main__":
    sys.exit(main())
