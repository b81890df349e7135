"""How far off a step-time estimate is likely to be: the band ``planner calibrate`` derives
from its leave-one-source-out errors on published runs of the same class (GPU architecture,
trainer, scale), stored in ``[bands]`` of ``hardware_profiles/calibrated/transfer.toml``."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import hardware_profiles
from hardware_profiles.files import is_file

__all__ = ["MOE_BAND", "band_for", "band_key", "model_key", "moe_band", "own_bands", "scale_class"]


def scale_class(num_gpus: int) -> str:
    """The scale class of a run or plan: one node, up to 512 GPUs, or more."""
    if num_gpus <= 8:
        return "1-8"
    return "9-512" if num_gpus <= 512 else ">512"


def band_key(architecture: str, trainer: str, num_gpus: int) -> tuple[str, ...]:
    """The classes a band is looked up by, most specific first, broadest (``*``) last."""
    return (f"{architecture}/{trainer}/{scale_class(num_gpus)}", f"{architecture}/{trainer}",
            f"*/{trainer}", "*")


#: Parameters of the smallest model among the published runs the bands rest on (GPT-3
#: 125M, Brown et al. 2020, Table 2.1, in costmodel/data/published_runs.json); a model of
#: less than half of it is of another scale, its band extrapolated (tests/test_hostile.py
#: checks the figure against the shipped runs).
SMALLEST_PUBLISHED_PARAMS = 125_311_488


#: Published runs a (generation, trainer) cell needs before its own residuals make its band;
#: a thinner cell is extrapolated (issue 58: "a cell with fewer than 3 runs says
#: extrapolated").
MIN_CELL_RUNS = 3

#: The narrowest band an extrapolated estimate prints (issue 58: "a B200 plan with no
#: Blackwell runs behind its trainer prints extrapolated and a band of at least +-25 %"): the
#: published runs of generations before the fit held them were off by 17-83 % on average
#: (planner validate --summary, docs/step-time.md#calibration), so a cell no run backs never
#: claims the precision of one that has them, however narrow the borrowed trainer band is.
EXTRAPOLATED_MIN_BAND = 0.25


#: The ``[bands]`` key of the mixture-of-experts runs' band (``calibration.bands``): an MoE
#: estimate's band is never narrower than it, whatever its cell's. The published MoE runs are
#: further off than the dense runs of the same cells (``planner validate --summary``, its
#: mixture-of-experts line; issue 60), so a cell's band, set mostly by dense runs, would
#: claim a precision no MoE estimate has shown.
MOE_BAND = "moe"


def model_key(model: Any) -> str | None:
    """The shape of a model's layers, which tells its published runs from other models'
    (widths, heads, experts; not the vocabulary, which trainers pad, nor the depth, which
    proxies cut and pipelines pad): ``"h2880 a64/8x64 f2880 e128k4x2880s0"``. None for a
    model without those fields (a traced module's layers)."""
    try:
        hidden, heads = int(model.hidden_size), int(model.num_heads)
    except (AttributeError, TypeError, ValueError):
        return None
    kv = int(getattr(model, "num_kv_heads", None) or heads)
    head_dim = int(getattr(model, "head_dim", None) or hidden // max(heads, 1))
    key = f"h{hidden} a{heads}/{kv}x{head_dim}"
    experts = int(getattr(model, "num_experts", 0) or 0)
    # A dense MLP's width, where the model has dense MLP layers.
    if not experts or int(getattr(model, "first_dense_layers", 0) or 0) > 0 \
            or int(getattr(model, "moe_every", 1) or 1) > 1:
        key += f" f{int(getattr(model, 'ffn_hidden_size', None) or 0)}"
    if experts:
        key += (f" e{experts}k{int(getattr(model, 'top_k', 0) or 0)}"
                f"x{int(getattr(model, 'moe_ffn_hidden_size', None) or 0)}"
                f"s{int(getattr(model, 'num_shared_experts', 0) or 0)}")
    if getattr(model, "kv_lora_rank", 0):
        key += f" mla{int(model.kv_lora_rank)}"
    # An encoder (BERT) or a vision transformer is not a decoder of the same widths.
    if getattr(model, "patch_size", 0):
        key += f" patch{int(model.patch_size)}"
    elif getattr(model, "causal", True) is False:
        key += " bidirectional"
    return key


@dataclass(frozen=True)
class _Bands:
    """What a fit file says about uncertainty. ``bands``: (band, runs, sources) per class
    (``band_key``) and ``"extrapolated"``; ``spread``: the largest relative distance of a
    generation's fitted matmul ratio from the pooled one; ``gpus``: published runs per GPU
    profile; ``cells``: (runs, sources) per (generation, trainer) cell, fitted or not;
    ``precedents``: per (``model_key``, cell), the relative error of the step time
    (predicted over measured, minus 1) and the source of each published run of that model
    shape in that cell, left out of the fit (with its source left out, or a frontier run's
    under the fit, which never saw it)."""

    bands: dict[str, tuple[float, int, int]]
    spread: float
    gpus: dict[str, int]
    cells: dict[str, tuple[int, int]]
    precedents: dict[tuple[str, str], tuple[tuple[float, str], ...]]


def band_for(architecture: str, trainer: str, num_gpus: int, num_params: float | None = None,
             gpu: str | None = None, assumed: tuple[str, ...] = (), moe: bool = False,
             model: str | None = None) -> tuple[float, str, bool] | None:
    """(relative band, what it rests on, whether it is extrapolated) for an estimate of this
    class; None when no fit with bands is installed.

    The band is the RMS leave-one-source-out error of the published runs of its own
    (GPU generation, trainer) cell, of its scale class where that has enough runs. A cell
    with fewer than ``MIN_CELL_RUNS`` runs, or without a band of its own (one source: a B200
    under torchtitan, an AMD GPU, a CPU profile), is extrapolated: it takes the trainer's
    band over every generation widened by the spread of the generations' fitted matmul
    ratios (in quadrature), or the fit's ``extrapolated`` band where that is wider: how far
    off the runs of cells the fit had no second source in were
    (``costmodel.fitting.calibration.bands``). A GPU (``gpu``) whose profile assumes some
    efficiencies (``assumed``) and that no published run behind the fit was on is widened by
    the spread too: its cell's runs ran on other parts. Either extrapolated band is at least
    ``EXTRAPOLATED_MIN_BAND``. A mixture-of-experts model (``moe``) takes the band of the
    published MoE runs (``MOE_BAND``) where that is wider. A model whose own shape
    (``model``: ``model_key``) has published runs in the cell takes their RMS error where
    that is wider still, and the basis says which way they missed (``_precedents``): a
    model the fit misses more than its cell's other runs is never given the cell's band.
    Tiny models (``num_params`` under half the smallest published run's) are extrapolated as
    well, their band unchanged."""
    fit = _installed()
    if fit is None:
        return None
    table = fit.bands
    keys = band_key(architecture, trainer, num_gpus)
    own = [k for k in keys[:2] if k in table and table[k][1] >= MIN_CELL_RUNS]
    key = own[0] if own else next((k for k in keys[2:] if k in table), None)
    if key is None:
        return None
    band, runs, sources = table[key]
    what = key.replace("*/", "").replace("/", ", ") if key != "*" else "all"
    basis = (f"RMS error of {runs} published runs ({what}; {sources} sources) "
             "predicted with their source left out of the fit")
    spread = (f"widened by the {100 * fit.spread:.0f}% spread of the generations' fitted "
              "matmul ratios")
    if not own:
        band = (band ** 2 + fit.spread ** 2) ** 0.5
        basis += f", {spread}"
        far = table.get("extrapolated")
        if far is not None and far[0] > band:
            band = far[0]
            basis = (f"RMS error of the {far[1]} published runs in generation/trainer cells "
                     f"the fit had no second source in ({far[2]} sources)")
        basis = f"extrapolated: {_cell_words(fit, architecture, trainer)}; the band is the {basis}"
    elif assumed and gpu is not None and fit.gpus and not fit.gpus.get(gpu):
        band = (band ** 2 + fit.spread ** 2) ** 0.5
        basis = (f"extrapolated: no published run on {gpu}, whose profile assumes its "
                 f"{', '.join(assumed)} efficienc{'ies' if len(assumed) > 1 else 'y'}; the "
                 f"band is the {basis} on other parts, {spread}")
    extrapolated = basis.startswith("extrapolated")
    if extrapolated and band < EXTRAPOLATED_MIN_BAND:
        band = EXTRAPOLATED_MIN_BAND
        basis += (f", and no narrower than {100 * EXTRAPOLATED_MIN_BAND:.0f}% for a cell no "
                  "run backs")
    if moe and MOE_BAND in table and table[MOE_BAND][0] > band:
        band, runs, sources = table[MOE_BAND]
        basis += (f"; widened to the RMS error of the {runs} published mixture-of-experts "
                  f"runs ({sources} sources), each predicted with its source left out of the "
                  "fit: MoE estimates have been further off than dense ones")
    own_runs = _precedents(fit, model, f"{architecture}/{trainer}", band)
    if own_runs is not None:
        band, words = own_runs
        basis += f"; {words}"
    if num_params is not None and num_params < SMALLEST_PUBLISHED_PARAMS / 2:
        basis += "; extrapolated (a model smaller than any published run's)"
        extrapolated = True
    return band, basis, extrapolated


def _precedents(fit: _Bands, model: str | None, cell: str, band: float
                ) -> tuple[float, str] | None:
    """(band, words) where the published runs of this model shape (``model``) in ``cell``
    were further off, left out of the fit, than ``band``: their RMS error, and which way
    they missed; None where there are none or they were within it."""
    found = fit.precedents.get((model or "", cell), ())
    if not found:
        return None
    errors = [e for e, _ in found]
    rms = math.expm1(math.sqrt(sum(math.log1p(e) ** 2 for e in errors) / len(errors)))
    if rms <= band:
        return None
    n, sources = len(errors), len({s for _, s in found})
    # As ratios of the measured step time to the predicted one: 1.81x slower than predicted.
    slow = sorted(1.0 / (1.0 + e) for e in errors)
    span = f"{slow[0]:.2f}x" + (f" to {slow[-1]:.2f}x" if n > 1 else "")
    every = "all" if n > 1 else "it"
    if slow[0] > 1:
        way = f"{every} ran {span} slower than predicted: expect a longer step"
    elif slow[-1] < 1:
        way = f"{every} ran {span} as long as predicted: expect a shorter step"
    else:
        way = f"they ran {span} as long as predicted"
    arch, trainer = cell.split("/", 1)
    runs = f"RMS error of the {n} published runs" if n > 1 else "error of the one published run"
    return rms, (f"widened to the {runs} of this model's shape on {arch} with {trainer} "
                 f"({sources} source{'s' if sources > 1 else ''}), left out of the fit ({way})")


def own_bands(num_gpus: int = 64) -> list[tuple[str, str, float, int, float]]:
    """(model shape, cell, band, runs, the band without them) of each model shape
    (``model_key``) whose own published runs in a (generation, trainer) cell widen the band
    an estimate of it on ``num_gpus`` GPUs of that cell carries (``band_for``), widest first;
    empty without an installed fit."""
    fit = _installed()
    if fit is None:
        return []
    out = []
    for (key, cell), found in fit.precedents.items():
        arch, trainer = cell.split("/", 1)
        moe = any(part.startswith("e") for part in key.split())
        base = band_for(arch, trainer, num_gpus, moe=moe)
        if base is None:
            continue
        # band_for widens by the model's own runs last: the same step on the band without them.
        own = _precedents(fit, key, cell, base[0])
        if own is not None:
            out.append((key, cell, own[0], len(found), base[0]))
    return sorted(out, key=lambda t: -t[2])


def moe_band() -> tuple[float, int, int] | None:
    """(band, runs, sources) of the published mixture-of-experts runs (``MOE_BAND``): the
    narrowest band an MoE estimate carries; None when the installed fit has none."""
    fit = _installed()
    return None if fit is None else fit.bands.get(MOE_BAND)


def _installed() -> _Bands | None:
    """The uncertainty tables of the installed fit file (``hardware_profiles.transfer_path``),
    None when there is none."""
    path = hardware_profiles.transfer_path()
    if not is_file(path):
        return None
    return _bands(str(path), path.stat().st_mtime_ns)


def _cell_words(fit: _Bands, architecture: str, trainer: str) -> str:
    """What backs a cell that has no band of its own, in words."""
    runs, sources = fit.cells.get(f"{architecture}/{trainer}", (0, 0))
    where = f"on {architecture or 'this GPU'} with {trainer}"
    if not runs:
        return f"no published run {where}"
    return (f"{runs} published run{'s' if runs != 1 else ''} {where}, from {sources} "
            f"source{'s' if sources != 1 else ''}: too few for a band of its own")


@functools.lru_cache(maxsize=8)
def _bands(path: str, mtime_ns: int) -> _Bands:
    """The uncertainty tables of a fit file (``_Bands``; a table a fit written before it
    lacks is empty), parsed once per file version: every estimate looks its band up."""
    data: Any = hardware_profiles.load_file(path)
    table = data.get("bands")
    bands = {} if not isinstance(table, dict) else {
        str(k): (float(b["band"]), int(b.get("runs", 0)), int(b.get("sources", 0)))
        for k, b in table.items() if isinstance(b, dict) and "band" in b}
    transfer = data.get("transfer") if isinstance(data.get("transfer"), dict) else {}
    pooled = transfer.get("gemm")
    ratios = transfer.get("architecture")
    spread = 0.0
    if isinstance(pooled, (int, float)) and pooled > 0 and isinstance(ratios, dict):
        spread = max((abs(float(r) / pooled - 1.0) for r in ratios.values()
                      if isinstance(r, (int, float))), default=0.0)
    table_gpus = data.get("gpus")
    gpus = ({str(k): int(v) for k, v in table_gpus.items() if isinstance(v, int)}
            if isinstance(table_gpus, dict) else {})
    table_cells = data.get("cells")
    cells = ({str(k): (int(v.get("runs", 0)), int(v.get("sources", 0)))
              for k, v in table_cells.items() if isinstance(v, dict)}
             if isinstance(table_cells, dict) else {})
    return _Bands(bands, spread, gpus, cells, _precedent_table(data.get("runs")))


def _precedent_table(runs: Any) -> dict[tuple[str, str], tuple[tuple[float, str], ...]]:
    """``_Bands.precedents`` from a fit file's ``[runs]`` (entries a fit written before the
    shapes were recorded, or without a left-out step-time error ``step``: a fit on one
    source, are skipped)."""
    out: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for v in (runs.values() if isinstance(runs, dict) else ()):
        if not isinstance(v, dict) or "model" not in v or "cell" not in v:
            continue
        err = v.get("step")
        if isinstance(err, (int, float)):
            out.setdefault((str(v["model"]), str(v["cell"])), []).append(
                (float(err), str(v.get("source", ""))))
    return {k: tuple(v) for k, v in out.items()}
