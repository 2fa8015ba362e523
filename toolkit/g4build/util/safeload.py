"""Reading a file g4build did not write (a checkpoint's config.json, a recipe, pins.yaml) without trusting it.

``read_regular`` opens the file once, without waiting (a FIFO would block a plain ``open``), makes sure what it
opened is a regular file outside the kernel's pseudo file systems (a link into ``/proc`` or ``/dev``), and reads
no more than its limit, so a 1 GiB (or sparse, or endless) file costs a few MB at most. ``loads_json`` parses JSON
with bounded depth and numbers: an integer of more than ``MAX_NUMBER_CHARS`` characters, ``NaN``/``Infinity`` and
a decimal that overflows to infinity are refused, so no later arithmetic meets a 4,000-digit or non-finite value.
A UTF-8 byte order mark (Windows Notepad writes one) is dropped. Every failure is a ``ConfigError`` (or the class
the caller names) saying which file and what to do.
"""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from g4build.errors import ConfigError, G4BuildError

MAX_NUMBER_CHARS = 32  # the longest number text a data file or config may hold (ints and decimals alike)
MAX_JSON_DEPTH = 64  # a model config nests 3 or 4 levels deep
# Kernel-made trees: their "regular" files are generated on read (endless, blocking, or secret), never data.
PSEUDO_ROOTS = ("/proc", "/sys", "/dev")


MAX_PATCH_BYTES = 32 << 20  # the series' largest patch is tens of KB; a vLLM-wide refactor stays far below this


def pseudo_root_of(real: str) -> str | None:
    """The pseudo file system ``real`` (an absolute, resolved path) lies in, or None. Compared by whole path
    parts: ``/system``, ``/sysroot`` and ``/devel`` are ordinary folders."""
    for root in PSEUDO_ROOTS:
        if real == root or real.startswith(root + "/"):
            return root
    return None


def _under_pseudo(path: Path) -> str | None:
    real = os.path.realpath(path)
    return real if pseudo_root_of(real) is not None else None


def read_regular(path: Path, limit: int, what: str, *, error: type[G4BuildError] = ConfigError) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes; else ``error`` naming ``what`` it is."""
    pseudo = _under_pseudo(path)
    if pseudo is not None:
        raise error(f"{path}: expected {what} (a regular file), found a path into the system's {pseudo}",
                    hint="point it at the real file")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise error(f"{path}: expected {what}, found no such file", hint="check the path") from None
    except OSError as exc:
        raise error(f"{path}: expected {what}, could not open it: {exc.strerror or exc}",
                    hint="check the path and its permissions") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = ("a folder" if stat.S_ISDIR(info.st_mode) else "a named pipe (FIFO)" if stat.S_ISFIFO(info.st_mode)
                    else "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "a socket"
                    if stat.S_ISSOCK(info.st_mode) else "not a regular file")
            raise error(f"{path}: expected {what} (a regular file), found {kind}", hint="point it at the real file")
        if info.st_size > limit:
            raise error(f"{path}: {info.st_size} bytes, more than the {limit} {what} may hold",
                        hint="check that this is the right file")
        data = read_bounded(fd, limit)
    except OSError as exc:
        raise error(f"{path}: expected {what}, could not read it: {exc.strerror or exc}",
                    hint="check the file and the disk it is on") from None
    finally:
        os.close(fd)
    if data is None:  # grew while read, or st_size lied
        raise error(f"{path}: more than the {limit} bytes {what} may hold", hint="check that this is the right file")
    return data


def read_bounded(fd: int, limit: int) -> bytes | None:
    """All of ``fd`` up to its end, or None when it holds more than ``limit`` bytes: one byte past the limit is
    read so that a file exactly at the limit and one over it are told apart (never cut to the limit)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return None if size > limit else b"".join(chunks)


def _depth_problem(value: Any, limit: int) -> str | None:
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return f"nested deeper than {limit} levels"
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, list):
            stack.extend((child, depth + 1) for child in item)
    return None


class _NumberRefused(ValueError):
    pass


def _int(text: str) -> int:
    if len(text) > MAX_NUMBER_CHARS:
        raise _NumberRefused(f"the integer {text[:20]}... has {len(text)} digits, more than {MAX_NUMBER_CHARS}")
    return int(text)


def _float(text: str) -> float:
    value = float(text) if len(text) <= MAX_NUMBER_CHARS else math.inf
    if not math.isfinite(value):
        raise _NumberRefused(f"the number {text[:20]}{'...' if len(text) > 20 else ''} ({len(text)} characters) is "
                             f"not a finite number of at most {MAX_NUMBER_CHARS} characters")
    return value


def _constant(text: str) -> Any:
    raise _NumberRefused(f"{text} is not a number JSON allows")


def loads_json(raw: bytes, where: str, *, error: type[G4BuildError] = ConfigError,
               max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``raw`` as JSON (UTF-8), bounded in depth and in the size of its numbers; ``where`` names it in errors."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start})",
                    hint="is this the right file?") from None
    try:
        data = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except _NumberRefused as exc:
        raise error(f"{where}: {exc}", hint="a config's numbers are counts and sizes; check the file") from None
    except RecursionError:
        raise error(f"{where}: nested too deeply to read (JSON data files nest a few levels)",
                    hint="check that this is the right file") from None
    except ValueError as exc:
        raise error(f"{where}: not valid JSON: {str(exc)[:200]}", hint="check the file for a mistake") from None
    problem = _depth_problem(data, max_depth)
    if problem is not None:
        raise error(f"{where}: {problem}", hint="check that this is the right file")
    return data


def read_json(path: Path, limit: int, what: str, *, error: type[G4BuildError] = ConfigError) -> Any:
    """``path`` as JSON: ``read_regular`` then ``loads_json``."""
    return loads_json(read_regular(path, limit, what, error=error), str(path), error=error)


def read_patch(path: Path, *, error: type[G4BuildError] = ConfigError) -> bytes:
    """A patch file's bytes, refused (by its size, unread) past ``MAX_PATCH_BYTES``, or when it is a FIFO, a
    device or a link into /proc, /sys or /dev."""
    return read_regular(path, MAX_PATCH_BYTES, "a patch file", error=error)
