"""How far off a step-time estimate is likely to be: the band ``planner calibrate`` derives
from its leave-one-source-out errors on published runs of the same class (GPU architecture,
trainer, scale), stored in ``[bands]`` of ``hardware_profiles/calibrated/transfer.toml``."""

from __future__ import annotations

import functools
from typing import Any

import hardware_profiles
from hardware_profiles.files import is_file

__all__ = ["band_for", "band_key", "scale_class"]


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


def band_for(architecture: str, trainer: str, num_gpus: int, num_params: float | None = None
             ) -> tuple[float, str, bool] | None:
    """(relative band, what it rests on, whether it is extrapolated) for an estimate of this
    class; None when no fit with bands is installed.

    The band is the RMS leave-one-source-out error of the published runs of its own
    (GPU generation, trainer) cell, of its scale class where that has enough runs. A cell
    with fewer than ``MIN_CELL_RUNS`` runs (a B200 under torchtitan, any AMD GPU, a CPU
    profile) is extrapolated: it takes the trainer's band over every generation, widened by
    how far one generation's fitted in-training matmul ratio strays from the pooled one
    (``_spread``: Blackwell's 0.61 against the pooled 0.79 in the shipped fit), added in
    quadrature. Tiny models (``num_params`` under half the smallest published run's) are
    extrapolated as well, their band unchanged."""
    path = hardware_profiles.transfer_path()
    if not is_file(path):
        return None
    table, spread = _bands(str(path), path.stat().st_mtime_ns)
    keys = band_key(architecture, trainer, num_gpus)
    own = [k for k in keys[:2] if k in table and table[k][1] >= MIN_CELL_RUNS]
    key = own[0] if own else next((k for k in keys[2:] if k in table), None)
    if key is None:
        return None
    band, runs, sources = table[key]
    what = key.replace("*/", "").replace("/", ", ") if key != "*" else "all"
    basis = (f"RMS error of {runs} published runs ({what}; {sources} sources) "
             "predicted with their source left out of the fit")
    reasons = []
    if not own:
        cell = table.get(keys[1], (0.0, 0, 0))[1]
        have = (f"only {cell} published run{'s' if cell != 1 else ''}" if cell
                else "no published run")
        reasons.append(f"{have} on {architecture or 'this GPU'} with {trainer}, fewer than "
                       f"{MIN_CELL_RUNS}; widened by the {100 * spread:.0f}% spread of the "
                       "generations' fitted matmul ratios")
        band = (band ** 2 + spread ** 2) ** 0.5
    if num_params is not None and num_params < SMALLEST_PUBLISHED_PARAMS / 2:
        reasons.append("a model smaller than any published run's")
    if reasons:
        basis += f"; extrapolated ({' and '.join(reasons)})"
    return band, basis, bool(reasons)


@functools.lru_cache(maxsize=8)
def _bands(path: str, mtime_ns: int) -> tuple[dict[str, tuple[float, int, int]], float]:
    """The ``[bands]`` table of a fit file as (band, runs, sources) per class, and the
    largest relative distance of a generation's fitted matmul ratio from the pooled one
    (``[transfer.architecture]`` against ``[transfer] gemm``); parsed once per file
    version: every estimate looks its band up."""
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
    return bands, spread
