"""Hardware data: GPUs, links, cluster presets and software constants, as TOML files.

Every number in these files carries its source in the file's ``[source]`` table. This module
only finds and parses them; converting human units (GB/s, TFLOP/s, GiB) to SI is the job of
``costmodel.hardware``. It imports nothing else of the project.
"""

from __future__ import annotations

import copy
import difflib
import functools
import os
import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hardware_profiles.errors import SpecError
from hardware_profiles.files import is_file, not_a_file, read_toml
from hardware_profiles.numbers import real

__all__ = [
    "SpecError",
    "calibrated_path",
    "check_efficiency",
    "fit_note",
    "is_path",
    "load",
    "load_file",
    "load_software",
    "names",
    "preset_key",
    "transfer_efficiency",
    "unknown_name",
    "user_calibrated_path",
    "user_fit",
]

KINDS = ("gpus", "links", "clusters")


def _folder(kind: str) -> Path:
    if kind not in KINDS:
        raise SpecError(f"unknown profile kind {kind!r}; expected one of {', '.join(KINDS)}")
    return Path(str(resources.files("hardware_profiles").joinpath(kind)))


def unknown_name(what: str, name: str, known: list[str]) -> SpecError:
    """The error for a name that is not among ``known``: close matches first, then them all."""
    text = str(name)
    close = difflib.get_close_matches(text.strip().lower(), known, n=3, cutoff=0.5) \
        if len(text) < 200 else []
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    shown = repr(text) if len(text) <= 80 else f"{text[:60]!r}... ({len(text):,} characters)"
    return SpecError(f"unknown {what} {shown}.{hint} Known {what}s: {', '.join(sorted(known))}")


#: What a preset name is: lower-case letters, digits, ``.``, ``_`` and ``-``, starting with a
#: letter or digit (``h100-sxm``, ``dgx-a100``, ``ib-ndr``). Anything else is not looked up
#: in the preset folders, so a name can never reach a file outside them.
PRESET_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,99}")


def is_path(text: str) -> bool:
    """Whether ``text`` (a ``--gpu`` / ``--cluster`` value, a ``gpu`` field) names a file
    rather than a preset: it ends in ``.toml`` or holds a path separator."""
    return text.endswith(".toml") or "/" in text or os.sep in text


def preset_key(kind: str, name: object) -> str:
    """``name`` as the key of a shipped preset of ``kind`` (trimmed, lower-case), or a
    ``SpecError`` when it is not a preset name (``PRESET_NAME``): a path, ``..``, a
    control character."""
    key = str(name).strip().lower()
    if not PRESET_NAME.fullmatch(key):
        shown = repr(str(name)) if len(str(name)) <= 80 else repr(str(name)[:60]) + "..."
        file_hint = " (a file: give its path, ending in .toml)" if kind != "links" else ""
        raise SpecError(f"{shown} is not a {kind[:-1]} preset name: names are letters, "
                        f"digits, '.', '_' and '-'{file_hint}. Known {kind[:-1]}s: "
                        f"{', '.join(names(kind)) if kind in KINDS else ''}")
    return key


def names(kind: str) -> list[str]:
    """Sorted names of the shipped profiles of one kind (``gpus``, ``links``, ``clusters``)."""
    return sorted(p.stem for p in _folder(kind).glob("*.toml"))


def load_file(path: str | Path) -> dict[str, Any]:
    """Parse one profile TOML file (shipped or user-written); a clear error if it is not TOML.

    Returns a fresh copy; parsed files are memoized by path and modification time, because
    the cost model reads the same few files for every chunk of a search.
    """
    p = Path(path)
    if not is_file(p):
        raise not_a_file(p, "profile file")
    return copy.deepcopy(_parse(str(p.resolve()), p.stat().st_mtime_ns))


@functools.lru_cache(maxsize=256)
def _parse(path: str, mtime_ns: int) -> dict[str, Any]:
    return read_toml(path, "profile file")


def calibrated_path(gpu: str) -> Path:
    """The shipped fitted efficiencies of GPU profile ``gpu`` (``calibrated/`` of the
    package, written by the project's own ``planner calibrate -o``)."""
    return (Path(str(resources.files("hardware_profiles").joinpath("calibrated")))
            / f"{_fit_key(gpu)}.toml")


def _fit_key(gpu: str) -> str:
    """A fit's name (a GPU profile's, or ``transfer``) checked as a preset name."""
    return preset_key("gpus", gpu)


def user_calibrated_path(gpu: str) -> Path:
    """Where ``planner calibrate`` writes a user's fit of GPU profile ``gpu`` by default:
    ``$PLANNER_CONFIG_DIR/calibrated`` (default ``$XDG_CONFIG_HOME/autoparallel-planner``,
    else ``~/.config/autoparallel-planner``); it takes precedence over the shipped fit."""
    base = os.environ.get("PLANNER_CONFIG_DIR")
    if not base:
        xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
        base = str(Path(xdg) / "autoparallel-planner")
    return Path(base) / "calibrated" / f"{_fit_key(gpu)}.toml"


def user_fit(gpu: str) -> Path | None:
    """The user's own fit (``planner calibrate`` without ``-o``) that GPU profile ``gpu``
    takes, its own or the all-GPU ``transfer``; None when it takes the shipped fit."""
    for key in (gpu, "transfer"):
        try:
            path = user_calibrated_path(key)
        except SpecError:  # a GPU read from a file, under a name that is no preset name
            continue
        if is_file(path):
            return path
    return None


def fit_note(gpu: str) -> str | None:
    """Which fit an estimate on GPU ``gpu`` uses when it is not the shipped one (the user's
    own, from ``planner calibrate`` without ``-o``, which changes every later estimate), in
    words for a report's header; None with the shipped fit."""
    path = user_fit(gpu)
    if path is None:
        return None
    return (f"your own calibration {path} (planner calibrate), not the shipped fit; "
            "'planner calibrate --reset' goes back to the shipped one")


def _own_fit(gpu: str) -> Path:
    """The fit a GPU profile takes: the user's (``user_calibrated_path``), else the shipped."""
    mine = user_calibrated_path(gpu)
    return mine if is_file(mine) else calibrated_path(gpu)


def load(kind: str, name: str, *, calibrated: bool = True) -> dict[str, Any]:
    """The parsed profile ``name`` of ``kind``; a typo gets a SpecError listing what exists.

    With ``calibrated`` (the default), a GPU profile's ``[efficiency]`` table is adjusted by
    what ``planner calibrate`` wrote in ``calibrated/``: a GPU with its own fitted file
    (``planner calibrate --gpu``) takes its values; any other GPU has its microbenchmark
    fractions scaled by the ratios fitted on published runs for its architecture
    (``transfer_efficiency``, ``calibrated/transfer.toml``) and takes the fitted per-kernel
    overhead. The ``source`` says which.
    """
    key = preset_key(kind, name)
    path = _folder(kind) / f"{key}.toml"
    if not path.is_file():
        raise unknown_name(kind[:-1], name, names(kind))
    read = [path]
    if kind == "gpus" and calibrated:
        read += [user_calibrated_path(key), calibrated_path(key),
                 user_calibrated_path("transfer"), calibrated_path("transfer")]
    return copy.deepcopy(_load(kind, key, calibrated, _stamps(read)))


def _stamps(paths: list[Path]) -> tuple[tuple[str, int, int] | tuple[str], ...]:
    """Each path with its modification time and size (just the path where there is no such
    file): what a memoized profile depends on, so that a fit written or removed between two
    reads (``planner calibrate``, ``--reset``) is seen by the next one."""
    out: list[tuple[str, int, int] | tuple[str]] = []
    for p in paths:
        try:
            st = p.stat()
        except OSError:
            out.append((str(p),))
            continue
        out.append((str(p), st.st_mtime_ns, st.st_size))
    return tuple(out)


@functools.lru_cache(maxsize=512)
def _load(kind: str, key: str, calibrated: bool, stamps: tuple[object, ...]) -> dict[str, Any]:
    """``load``'s profile, computed once per state of the files in ``stamps`` (a search
    builds a cluster, and so reads its GPU's profile and fits, for every chunk it costs)."""
    path = _folder(kind) / f"{key}.toml"
    data = load_file(path)
    data.setdefault("name", key)
    if kind == "gpus" and "efficiency" in data:
        try:
            data["efficiency"] = check_efficiency(data["efficiency"])
        except SpecError as e:
            raise SpecError(f"profile file {str(path)!r}: {e}") from None
        if calibrated:
            data["efficiency"] = _calibrated_efficiency(key, data["efficiency"],
                                                        str(data.get("architecture", "")))
    return data


def _calibrated_efficiency(gpu: str, eff: dict[str, Any], architecture: str
                           ) -> dict[str, Any]:
    own = _own_fit(gpu)
    if own.is_file():
        try:
            cal = load_file(own)
            fitted = cal.get("efficiency", {})
            if not isinstance(fitted, dict):
                raise SpecError("its efficiency is not a table")
            eff.update(check_efficiency(fitted))
        except (SpecError, KeyError, TypeError, ValueError) as e:
            raise _broken_fit(own, e) from None
        eff["source"] = f"{cal.get('provenance', str(own))}; before fitting: {eff.get('source')}"
        return eff
    return transfer_efficiency(eff, architecture=architecture)


def _broken_fit(path: Path, e: Exception) -> SpecError:
    """The error for a fit file that cannot be applied: how to go back to the shipped fit
    (the user's own) or that the installation is damaged (a shipped one)."""
    why = f"it lacks the key {e.args[0]!r}" if isinstance(e, KeyError) else str(e)
    if path.parent == calibrated_path("transfer").parent:
        return SpecError(f"the shipped fit {str(path)!r} is damaged ({why}); reinstall "
                         "autoparallel-planner")
    return SpecError(f"your fit {str(path)!r} cannot be used ({why}); 'planner calibrate "
                     "--reset' removes it (back to the shipped fit), 'planner calibrate' "
                     "writes a new one")


#: The fractions of an ``[efficiency]`` table: shares of a datasheet figure, in (0, 1].
#: The fused-attention fractions, (forward, backward) per kernel: FlashAttention-2's, the
#: vendor's own (``_cudnn``) and AOTriton's (costmodel.config.ATTENTION_KERNELS).
ATTENTION_FRACTIONS = ("attention", "attention_backward", "attention_cudnn",
                       "attention_cudnn_backward", "attention_aotriton",
                       "attention_aotriton_backward")
FRACTIONS = ("gemm", "gemm_fp8", "gemm_fp4", "gemm_unaligned", "memory", *ATTENTION_FRACTIONS)


#: The largest fixed cost per kernel a profile may give (microseconds). A GPU's is a few
#: microseconds (a launch); ``planner profile --device cpu`` fits a loaded CPU's at a few
#: milliseconds. Far above both, so that a unit slip (seconds written as microseconds,
#: 5e6) is an error, not a plan.
MAX_KERNEL_OVERHEAD_US = 1e5


def check_efficiency(eff: Mapping[str, Any]) -> dict[str, Any]:
    """``eff`` (an ``[efficiency]`` table) with each number it holds checked: a fraction in
    (0, 1] (a profile's ``gemm = 2.0`` is an error, not a value clamped to 1 after scaling),
    ``comm_slowdown`` in [0, 1], ``kernel_overhead_us`` in [0, ``MAX_KERNEL_OVERHEAD_US``]
    (checked even where the fit replaces it)."""
    out = dict(eff)
    for k in FRACTIONS:
        if k in out:
            out[k] = real(out[k], f"efficiency.{k}", lo=0.0, lo_open=True, hi=1.0)
    if "comm_slowdown" in out:
        out["comm_slowdown"] = real(out["comm_slowdown"], "efficiency.comm_slowdown", lo=0.0,
                                    hi=1.0)
    if "kernel_overhead_us" in out:
        out["kernel_overhead_us"] = real(out["kernel_overhead_us"],
                                         "efficiency.kernel_overhead_us", lo=0.0,
                                         hi=MAX_KERNEL_OVERHEAD_US)
    return out


def provenance(name: str) -> dict[str, Any]:
    """What backs the GPU profile ``name``: each efficiency it gives as ``measured`` (on this
    GPU) or ``assumed`` (from another GPU or a paper; its ``[efficiency] assumed`` list; the
    NVFP4 matmul of a GPU with an NVFP4 peak but no ``gemm_fp4``, which takes fp8's),
    its default scale-up link and whether that link's efficiency is measured
    (``efficiency_assumed``), and how many published runs of its architecture the fit in
    ``transfer_path()`` holds (its ``[cells]``), and how many of them it was fitted on (cells
    with two sources or more)."""
    data = load("gpus", name, calibrated=False)
    eff = data["efficiency"]
    assumed = set(eff.get("assumed", ()))
    link = data.get("intra_node_link", "pcie5")
    link_data = link if isinstance(link, dict) else load("links", str(link))
    arch = str(data.get("architecture", ""))
    fit = load_file(transfer_path()) if transfer_path().is_file() else {}
    cells = [c for k, c in (fit.get("cells") or {}).items()
             if isinstance(c, dict) and k.split("/")[0] == arch]
    runs = sum(int(c.get("runs", 0)) for c in cells)
    fitted = sum(int(c.get("runs", 0)) for c in cells if int(c.get("sources", 0)) >= 2)
    shown = {k: ("assumed" if k in assumed else "measured")
             for k in ("gemm", "gemm_fp8", "gemm_fp4", "memory", *ATTENTION_FRACTIONS[::2])
             if k in eff}
    peaks = data.get("peak_tflops") or {}
    if ("nvfp4" in peaks or "mxfp4" in peaks) and "gemm_fp4" not in eff:
        shown["gemm_fp4"] = "assumed"  # FP4 runs at the fp8 fraction (KernelEfficiency.gemm_for)
    return {
        "name": name, "architecture": arch,
        "efficiency": shown,
        "link": str(link_data.get("name", link)),
        "link_efficiency": ("assumed" if link_data.get("efficiency_assumed", True)
                            else "measured"),
        "runs": runs,
        "fitted_runs": fitted,
    }


def transfer_path() -> Path:
    """The fitted in-training/microbenchmark ratios every GPU profile takes: the user's own
    (``planner calibrate`` without ``-o``: ``user_calibrated_path("transfer")``), else the
    shipped ``calibrated/transfer.toml``."""
    return _own_fit("transfer")


def transfer_efficiency(eff: dict[str, Any], *, overhead: bool = True,
                        architecture: str = "") -> dict[str, Any]:
    """An ``[efficiency]`` table of microbenchmark fractions turned into in-training ones.

    The matmul fractions are scaled by the ratio ``planner calibrate`` fitted for the GPU's
    ``architecture`` on published runs (``[transfer.architecture]`` of ``transfer_path()``;
    the pooled ``[transfer] gemm`` for an architecture without runs), the fused-attention
    fractions alike by ``[transfer.attention_architecture]`` (pooled: ``[transfer]
    attention``), the memory fraction by ``[transfer] memory``; with
    ``overhead``, the per-kernel overhead becomes the fitted one (a measured profile keeps
    its own: ``overhead=False``), and the slowdown of compute by concurrent communication
    the fitted ``comm_slowdown``. Unchanged when nothing is fitted. ``eff`` is a table
    ``check_efficiency`` passed (``load`` and ``GPU.from_file`` check it as they read it), so
    an error here is the fit's.
    """
    ref = transfer_path()
    if not is_file(ref):
        return dict(eff)
    try:
        cal = load_file(ref)
        t = cal.get("transfer")
        if not isinstance(t, dict):
            raise SpecError("it has no [transfer] table")
        eff, ratio = apply_transfer(eff, t, architecture=architecture, overhead=overhead)
    except (SpecError, KeyError, TypeError, ValueError) as e:
        raise _broken_fit(ref, e) from None
    arch = t.get("architecture")
    per_arch = arch if isinstance(arch, dict) else {}
    which = f"{architecture} ratio {ratio:.4f}" if architecture in per_arch \
        else f"pooled ratio {ratio:.4f}"
    eff["source"] = (f"microbenchmark fractions scaled by the in-training/microbenchmark "
                     f"{which} ({cal.get('provenance', str(ref))}); microbenchmarks: "
                     f"{eff.get('source')}")
    return eff


def apply_transfer(eff: Mapping[str, Any], t: Mapping[str, Any], *, architecture: str = "",
                   overhead: bool = True) -> tuple[dict[str, Any], float]:
    """``eff`` (an ``[efficiency]`` table) with a ``[transfer]`` table ``t`` applied as
    ``transfer_efficiency`` describes, and the matmul ratio used; what ``planner calibrate``
    fits is applied by this same function (``eff`` checked, as ``transfer_efficiency``
    says)."""
    eff = dict(eff)

    def ratio_of(value: Any, what: str) -> float:
        # A fitted in-training/microbenchmark ratio: above 1 where training beats the
        # microbenchmark (the product is capped at 1 below), never 0 or 10x.
        return real(value, f"[transfer] {what}", lo=0.0, lo_open=True, hi=10.0)

    arch = t.get("architecture")
    per_arch = arch if isinstance(arch, Mapping) else {}
    ratio = ratio_of(per_arch.get(architecture, t["gemm"]), f"gemm ratio of {architecture!r}")
    for k in ("gemm", "gemm_fp8", "gemm_fp4", "gemm_unaligned"):
        if k in eff:
            eff[k] = min(1.0, eff[k] * ratio)
    attn_arch = t.get("attention_architecture")
    attn_ratio = ratio_of((attn_arch if isinstance(attn_arch, Mapping) else {}).get(
        architecture, t.get("attention", ratio)), f"attention ratio of {architecture!r}")
    for k in ATTENTION_FRACTIONS:
        if k in eff:
            eff[k] = min(1.0, eff[k] * attn_ratio)
    if "memory" in eff:
        eff["memory"] = min(1.0, eff["memory"] * ratio_of(t.get("memory", 1.0), "memory"))
    if overhead:
        eff["kernel_overhead_us"] = real(t["kernel_overhead_us"], "[transfer] kernel_overhead_us",
                                         lo=0.0, hi=MAX_KERNEL_OVERHEAD_US)
    if "comm_slowdown" in t:
        eff["comm_slowdown"] = real(t["comm_slowdown"], "[transfer] comm_slowdown", lo=0.0,
                                    hi=1.0)
    return eff, ratio


def load_software() -> Mapping[str, Any]:
    """Framework and runtime constants (bucket sizes, CUDA context, ...) with their sources.

    Read-only (nested mappings and tuples): the cost model reads it for every chunk of a
    search, so it is shared rather than copied; ``dict(...)`` a table to change it.
    """
    p = _software_path()
    try:
        mtime = os.stat(p).st_mtime_ns
    except FileNotFoundError:
        raise SpecError(f"profile file {p!r} does not exist") from None
    return _frozen(p, mtime)


@functools.cache
def _software_path() -> str:
    # A string, not a Path: the cost model asks for the constants hundreds of thousands of
    # times in a search, and os.stat on a string is the cheap part of each ask.
    return str(Path(str(resources.files("hardware_profiles").joinpath("software.toml")))
               .resolve())


def _freeze(x: Any) -> Any:
    if isinstance(x, dict):
        return MappingProxyType({k: _freeze(v) for k, v in x.items()})
    if isinstance(x, list):
        return tuple(_freeze(v) for v in x)
    return x


@functools.lru_cache(maxsize=4)
def _frozen(path: str, mtime_ns: int) -> Mapping[str, Any]:
    return _freeze(_parse(path, mtime_ns))
