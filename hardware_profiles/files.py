"""Reading a user's file without a traceback, and writing one without losing it.

Every read failure becomes one ``SpecError`` line naming the file and what is wrong with it
(missing, unreadable, binary, too long a name, not the JSON or TOML object expected). Every
file the project writes goes through ``write_text``: a temporary file in the same folder,
flushed to disk, then renamed over the target, so a full disk or a kill mid-write leaves the
old file whole. Text from users (names, paths, command lines) goes into the comments of
generated files through ``printable``, so it cannot start a line of its own.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import sys
import tempfile
import tomllib
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from hardware_profiles.errors import SpecError

__all__ = ["is_file", "loads_json", "not_a_file", "printable", "read_json_object", "read_text",
           "read_toml", "to_toml", "write_bytes", "write_text"]

#: Nesting that a JSON or TOML file the project reads may have: deeper is refused by name
#: (deeper than Python's stack is caught from the parser; the rest is measured after).
MAX_NESTING = 64


def printable(text: object) -> str:
    """``text`` with each character that is not printable written as its Python escape
    (``\\n``, ``\\x00``, ``\\u2028``, ``\\u202e``, a lone surrogate ``\\udc80``): control
    characters, line and paragraph separators, format characters such as bidirectional
    overrides. The result is one line of inert text in every format the project writes (a
    shell or TOML comment, a terminal line), whatever a user's name or path held."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in str(text))


def is_file(path: str | Path) -> bool:
    """Whether ``path`` names a regular file; ``False`` for a name the system refuses (too
    long, an embedded NUL) instead of an exception."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def not_a_file(path: str | Path, what: str) -> SpecError:
    """The error for ``path`` that is not a regular file: it does not exist, is a folder, or
    is a FIFO, socket or device (which the planner does not read: it could block)."""
    name = printable(str(path)[:200])
    try:
        p = Path(path)
        why = ("is a folder, not a file" if p.is_dir() else
               "is not a regular file (a FIFO, socket or device)" if p.exists() else
               "does not exist")
    except (OSError, ValueError):
        why = "cannot be opened (the name is too long or holds a NUL)"
    return SpecError(f"{what} {name!r} {why}")


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of the file ``path`` (``what`` names it in errors, e.g. "runs file")."""
    name = str(path)[:200]
    if not is_file(path):
        raise not_a_file(path, what)
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise SpecError(f"{what} {name!r} is not a text file (not UTF-8); give the JSON or "
                        "TOML file itself") from None
    except OSError as e:
        raise SpecError(f"cannot read {what} {name!r}: {e.strerror}") from None


def _depth(value: Any) -> int:
    """How deeply ``value`` nests lists and dicts (a scalar is 0), without recursion."""
    most, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        if isinstance(v, dict | list):
            most = max(most, d)
            todo.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return most - 1 if most else 0


def _shallow(value: Any, where: str) -> Any:
    """``value`` if it nests at most ``MAX_NESTING`` levels, else a ``SpecError`` naming
    ``where`` it came from."""
    if _depth(value) > MAX_NESTING:
        raise SpecError(f"{where} nests more than {MAX_NESTING} levels of arrays and tables; "
                        "no file the planner reads is that deep")
    return value


def loads_json(text: str, path: str | Path | None, what: str) -> Any:
    """The JSON value of ``text`` (the file ``path``; None for text given as such), one
    ``SpecError`` line for anything that is not plain JSON: bad syntax, nesting deeper than
    ``MAX_NESTING``, an integer too long to convert, ``NaN`` / ``Infinity`` (not JSON), or
    a number too large for a float."""
    where = what if path is None else f"{what} {str(path)[:200]!r}"

    def constant(word: str) -> float:
        raise SpecError(f"{where} holds {word}, which is not a JSON number; give a "
                        "finite number")

    def floating(word: str) -> float:
        value = float(word)
        if not math.isfinite(value):
            raise SpecError(f"{where} holds the number {word[:40]}, too large for a "
                            "float; give a finite number")
        return value

    try:
        value = json.loads(text, parse_constant=constant, parse_float=floating)
    except json.JSONDecodeError as e:
        raise SpecError(f"{where} is not valid JSON: {e}") from None
    except RecursionError:
        raise SpecError(f"{where} nests too deeply to read") from None
    except SpecError:
        raise
    except ValueError:  # an integer of more digits than int() converts
        raise SpecError(f"{where} holds an integer of more than "
                        f"{sys.get_int_max_str_digits():,} digits; give a number of physical "
                        "size") from None
    return _shallow(value, where)


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """The JSON object (a dict) the file ``path`` holds."""
    data = loads_json(read_text(path, what), path, what)
    if not isinstance(data, dict):
        raise SpecError(f"{what} {str(path)[:200]!r} holds a JSON {type(data).__name__}, not "
                        "the JSON object ({...}) expected")
    return data


def read_toml(path: str | Path, what: str) -> dict[str, Any]:
    """The TOML table the file ``path`` holds."""
    text = read_text(path, what)
    try:
        return _shallow(tomllib.loads(text), f"{what} {str(path)[:200]!r}")
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{what} {str(path)[:200]!r} is not valid TOML: {e}") from None
    except RecursionError:
        raise SpecError(f"{what} {str(path)[:200]!r} nests too deeply to read") from None


def write_text(path: str | Path, text: str, what: str) -> None:
    """Write ``text`` as UTF-8 to ``path`` with ``write_bytes``."""
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:  # a lone surrogate: an undecodable byte of a file name
        raise SpecError(f"cannot write {what} {str(path)[:200]!r}: {e.reason}") from None
    write_bytes(path, data, what)


def write_bytes(path: str | Path, data: bytes, what: str) -> None:
    """Write ``data`` to ``path`` (creating missing parent folders) so that it is whole or
    not there: the bytes go to a temporary file in the same folder, is flushed to disk
    (``fsync``), then renamed over ``path`` (``os.replace``, atomic on POSIX), so a full
    disk, an error or a kill mid-write leaves an existing file as it was.

    Refused with one ``SpecError`` line: a ``path`` that is a symbolic link to a file (the
    link would be replaced, not the file it points to: give the file's own path) or a
    folder. A device or FIFO (``/dev/stdout``, a pipe) is written directly: there is no file
    to lose. (The command line also refuses an output that is one of its own inputs.)"""
    p = Path(path)
    name = str(path)[:200]
    try:
        special = _special(p, name, what)
        if special:
            with open(p, "wb") as f:
                f.write(data)
            return
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise SpecError(f"cannot write {what} {name!r}: a folder on its path is a file") \
                from None
        _replace(p, data)
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise SpecError(f"cannot write {what} {name!r}: {why}") from None


def _special(p: Path, name: str, what: str) -> bool:
    """Whether ``p`` is a device or FIFO (written in place); a ``SpecError`` for what
    ``write_text`` refuses."""
    if p.is_symlink():
        target = os.readlink(p)
        if not p.exists() or p.is_file() or p.is_dir():
            raise SpecError(f"{what} {name!r} is a symbolic link (to {target[:200]!r}); "
                            "writing would replace the link, not that file: give the path "
                            "of the file itself")
    if not p.exists():
        return False
    if p.is_dir():
        raise SpecError(f"cannot write {what} {name!r}: it is a folder; give a file name")
    return not stat.S_ISREG(p.stat().st_mode)


def _replace(p: Path, data: bytes) -> None:
    """``data`` into a temporary file beside ``p``, synced, then renamed over ``p``; the
    new file keeps an existing file's permissions, else the umask's."""
    try:
        mode = stat.S_IMODE(p.stat().st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name[:100]}.", suffix=".tmp")
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fchmod(fd, mode)
        os.fsync(fd)
        os.close(fd)
        fd = -1
        os.replace(tmp, p)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself reaches the disk with the folder
        folder = os.open(p.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


def _umask() -> int:
    """The process's file-creation mask (read by setting it and setting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


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
        return _toml_string(v)
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list | tuple):
        if v and all(isinstance(x, dict) for x in v):
            return "[\n" + "".join(f"  {_toml_value(x)},\n" for x in v) + "]"
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise SpecError(f"cannot write {type(v).__name__} {v!r} to a TOML file")


def _toml_string(text: str) -> str:
    """``text`` as a TOML basic string: quote and backslash escaped, every character that is
    not printable (control characters, which TOML forbids raw, separators, format
    characters) as ``\\uXXXX`` or ``\\UXXXXXXXX``; a lone surrogate (an undecodable byte of
    a file name), which no TOML string can hold, as its escape's text (``\\\\udc80``)."""
    out = []
    for c in text:
        if c in '"\\':
            out.append("\\" + c)
        elif 0xD800 <= ord(c) <= 0xDFFF:
            out.append(f"\\\\u{ord(c):04x}")
        elif not c.isprintable():
            out.append(f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _toml_key(k: str) -> str:
    """A bare key where TOML allows one, else a quoted one."""
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_value(str(k))


def _comment(text: str) -> list[str]:
    """``text`` as TOML comment lines: one per line of it (``\\n``), each made
    ``printable``."""
    return [f"# {printable(line)}".rstrip() for line in text.split("\n")]


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
