"""Hardware data: GPUs, links, cluster presets and software constants, as TOML files.

Every number in these files carries its source in the file's ``[source]`` table. This module
only finds and parses them; converting human units (GB/s, TFLOP/s, GiB) to SI is the job of
``costmodel.hardware``. It imports nothing else of the project.
"""

from __future__ import annotations

import difflib
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from hardware_profiles.errors import SpecError

__all__ = ["SpecError", "load", "load_file", "load_software", "names", "unknown_name"]

KINDS = ("gpus", "links", "clusters")


def _folder(kind: str) -> Path:
    if kind not in KINDS:
        raise SpecError(f"unknown profile kind {kind!r}; expected one of {', '.join(KINDS)}")
    return Path(str(resources.files("hardware_profiles").joinpath(kind)))


def unknown_name(what: str, name: str, known: list[str]) -> SpecError:
    """The error for a name that is not among ``known``: close matches first, then them all."""
    close = difflib.get_close_matches(str(name).strip().lower(), known, n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return SpecError(f"unknown {what} {name!r}.{hint} Known {what}s: {', '.join(sorted(known))}")


def names(kind: str) -> list[str]:
    """Sorted names of the shipped profiles of one kind (``gpus``, ``links``, ``clusters``)."""
    return sorted(p.stem for p in _folder(kind).glob("*.toml"))


def load_file(path: str | Path) -> dict[str, Any]:
    """Parse one profile TOML file (shipped or user-written); a clear error if it is not TOML."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"profile file {str(p)!r} does not exist")
    try:
        with p.open("rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"profile file {str(p)!r} is not valid TOML: {e}") from None


def load(kind: str, name: str) -> dict[str, Any]:
    """The parsed profile ``name`` of ``kind``; a typo gets a SpecError listing what exists."""
    key = str(name).strip().lower()
    path = _folder(kind) / f"{key}.toml"
    if not path.is_file():
        raise unknown_name(kind[:-1], name, names(kind))
    data = load_file(path)
    data.setdefault("name", key)
    return data


def load_software() -> dict[str, Any]:
    """Framework and runtime constants (bucket sizes, CUDA context, ...) with their sources."""
    return load_file(Path(str(resources.files("hardware_profiles").joinpath("software.toml"))))
