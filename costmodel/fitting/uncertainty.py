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


def band_for(architecture: str, trainer: str, num_gpus: int, num_params: float | None = None
             ) -> tuple[float, str, bool] | None:
    """(relative band, what it rests on, whether it is extrapolated) for an estimate of this
    class: the RMS leave-one-source-out error of the most specific class with enough
    published runs; None when no fit with bands is installed. Extrapolated: no published run
    was on this GPU architecture (the band is borrowed from others: a CPU profile, an AMD
    GPU), or the model (``num_params``) is smaller than any published run's."""
    path = hardware_profiles.transfer_path()
    if not is_file(path):
        return None
    table = _bands(str(path), path.stat().st_mtime_ns)
    for key in band_key(architecture, trainer, num_gpus):
        if key in table:
            band, runs, sources = table[key]
            what = key.replace("*/", "").replace("/", ", ") if key != "*" else "all"
            basis = (f"RMS error of {runs} published runs ({what}; {sources} sources) "
                     "predicted with their source left out of the fit")
            reasons = []
            if key.startswith("*"):
                reasons.append(f"no published run on {architecture or 'this GPU'}")
            if num_params is not None and num_params < SMALLEST_PUBLISHED_PARAMS / 2:
                reasons.append("a model smaller than any published run's")
            if reasons:
                basis += f"; extrapolated ({' and '.join(reasons)})"
            return band, basis, bool(reasons)
    return None


@functools.lru_cache(maxsize=8)
def _bands(path: str, mtime_ns: int) -> dict[str, tuple[float, int, int]]:
    """The ``[bands]`` table of a fit file as (band, runs, sources) per class, parsed once
    per file version: every estimate looks its band up."""
    table: Any = hardware_profiles.load_file(path).get("bands")
    if not isinstance(table, dict):
        return {}
    return {str(k): (float(b["band"]), int(b.get("runs", 0)), int(b.get("sources", 0)))
            for k, b in table.items() if isinstance(b, dict) and "band" in b}
