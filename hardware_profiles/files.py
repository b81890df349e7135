"""Reading a user's file without a traceback: every failure becomes one ``SpecError`` line
naming the file and what is wrong with it (missing, unreadable, binary, too long a name, not
the JSON or TOML object expected)."""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hardware_profiles.errors import SpecError

__all__ = ["is_file", "read_json_object", "read_text", "read_toml", "to_toml", "write_text"]


def is_file(path: str | Path) -> bool:
    """Whether ``path`` names a regular file; ``False`` for a name the system refuses (too
    long, an embedded NUL) instead of an exception."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of the file ``path`` (``what`` names it in errors, e.g. "runs file")."""
    name = str(path)[:200]
    if not is_file(path):
        raise SpecError(f"{what} {name!r} does not exist (or is not a file)")
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{what} {name!r} is not a text file (not UTF-8); give the JSON or "
                        "TOML file itself") from None
    except OSError as e:
        raise SpecError(f"cannot read {what} {name!r}: {e.strerror}") from None


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """The JSON object (a dict) the file ``path`` holds."""
    try:
        data = json.loads(read_text(path, what))
    except json.JSONDecodeError as e:
        raise SpecError(f"{what} {str(path)[:200]!r} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{what} {str(path)[:200]!r} holds a JSON {type(data).__name__}, not "
                        "the JSON object ({...}) expected")
    return data


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The TOML table the file ``path`` holds."""
    try:
        return tomllib.loads(read_text(path, what))
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{what} {str(path)[:200]!r} is not valid TOML: {e}") from None


def write_text(path: str | Path, text: str, what: str) -> None:
    """Write ``text`` to ``path``, creating its missing parent directories; a path that
    cannot be written becomes one ``SpecError`` line."""
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise SpecError(f"cannot write {what} {str(path)[:200]!r}: {why}") from None


# ---- writing TOML: the one writer of every file the project generates ---------------------

def _toml_value(v: Any) -> str:
    """One TOML value: booleans, integers, finite floats (shortest repr), strings, inline
    tables and arrays (an array of tables one per line)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | np.integer):
        return str(int(v))
    if isinstance(v, float | np.floating):
        if not math.isfinite(v):
            raise SpecError(f"cannot write the non-finite number {v!r} to a TOML file")
        return repr(float(v))
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a TOML basic string
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list | tuple):
        if v and all(isinstance(x, dict) for x in v):
            return "[\n" + "".join(f"  {_toml_value(x)},\n" for x in v) + "]"
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise SpecError(f"cannot write {type(v).__name__} {v!r} to a TOML file")


def _toml_key(k: str) -> str:
    """A bare key where TOML allows one, else a quoted one."""
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def _comment(text: str) -> list[str]:
    return [f"# {line}".rstrip() for line in text.splitlines()]


def to_toml(table: Mapping[str, Any], header: str = "", notes: Mapping[str, str] | None = None,
            inline: Collection[str] = ()) -> str:
    """A nested mapping as TOML text: in each table its scalars and arrays first, then each
    sub-mapping as a ``[table]`` (dotted name) of its own.

    ``header``: comment lines at the top. ``notes``: comment lines written under a table's
    header line, keyed by its dotted name as written (``"bands"``, ``"transfer.architecture"``).
    ``inline``: names of tables whose sub-mappings are written as inline tables, one per line,
    instead of tables of their own (e.g. one line per run). A dotted table name is written by
    nesting: ``{"a": {"b": {...}}}`` is ``[a.b]``."""
    notes = notes or {}
    lines = _comment(header)

    def emit(prefix: str, t: Mapping[str, Any]) -> None:
        for k, v in t.items():
            if not isinstance(v, Mapping) or prefix in inline:
                value = dict(v) if isinstance(v, Mapping) else v
                lines.append(f"{_toml_key(k)} = {_toml_value(value)}")
        if prefix in inline:
            return
        for k, v in t.items():
            if isinstance(v, Mapping):
                name = f"{prefix}.{_toml_key(k)}" if prefix else _toml_key(k)
                # A table holding only tables needs no header line of its own.
                bare = v and name not in inline and name not in notes and \
                    all(isinstance(x, Mapping) for x in v.values())
                if not bare:
                    lines.extend(["", f"[{name}]", *_comment(notes.get(name, ""))])
                emit(name, v)

    emit("", table)
    return "\n".join(lines).lstrip("\n") + "\n"
