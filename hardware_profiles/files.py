"""Reading a user's file without a traceback: every failure becomes one ``SpecError`` line
naming the file and what is wrong with it (missing, unreadable, binary, too long a name, not
the JSON or TOML object expected)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from hardware_profiles.errors import SpecError

__all__ = ["is_file", "read_json_object", "read_text", "read_toml", "write_text"]


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
