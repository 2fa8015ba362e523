"""Writing a new pin into patches/pins.yaml: the entry rendered in the shape of the hand-written ones, inserted in
version order with everything else byte for byte, and the file replaced atomically once it reads back right."""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

from g4build.errors import ConfigError, UsageError
from g4build.pins.index import cache_lock, cache_root
from g4build.pins.model import Pin, PinSet, load_pins
from g4build.util.yamlsafe import load_text


def scalar(value: str, *, quote: bool = False) -> str:
    """``value`` as YAML text that reads back as this very string (quoted where plain text would not)."""
    if not quote and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+/:@-]*", value):
        try:
            if load_text(value, "a value") == value:  # e.g. a commit of digits only would read as a number
                return value
        except ConfigError:  # one YAML 1.1 reads another way (yes, 0o17): quoted
            pass
    return json.dumps(value)  # a JSON string is a YAML double-quoted scalar


def render_entry(pin: Pin, indent: str = "  ") -> str:
    """The pin as a pins.yaml block, in the shape of the hand-written entries (``indent`` is the pins' own)."""
    i1, i2, i3, i4 = indent, indent * 2, indent * 3, indent * 4
    lines = [
        f"{i1}{pin.name}:",
        f"{i2}version: {scalar(pin.version, quote=True)}",
        f"{i2}upstream:",
        f"{i3}remote: {scalar(pin.upstream.remote)}",
        f"{i3}commit: {scalar(pin.upstream.commit)}",
        f"{i2}sdist:",
        f"{i3}file: {scalar(pin.sdist.file)}",
        f"{i3}sha256: {scalar(pin.sdist.sha256)}",
        f"{i2}torch: {scalar(pin.torch, quote=True)}",
        f"{i2}cuda: {scalar(pin.cuda, quote=True)}",
        f"{i2}flashinfer: {scalar(pin.flashinfer, quote=True)}",
    ]
    if pin.transformers:
        lines.append(f"{i2}transformers: {scalar(pin.transformers, quote=True)}")
    if pin.wheels:
        lines.append(f"{i2}wheels:")
        for key, ref in pin.wheels.items():
            lines += [f"{i3}{key}:", f"{i4}file: {scalar(ref.file)}", f"{i4}sha256: {scalar(ref.sha256)}"]
    else:
        lines.append(f"{i2}wheels: {{}}")
    lines.append(f"{i2}bases: {{}}")
    return "\n".join(lines) + "\n"


def insert_entry(text: str, pin: Pin, pinset: PinSet) -> str:
    """``text`` of pins.yaml with ``pin``'s block added among the pins, in version order; the rest untouched."""
    lines = text.splitlines(keepends=True)
    where = str(pinset.source)
    start = next((n for n, line in enumerate(lines) if re.match(r"^pins:\s*(#.*)?$", line)), None)
    if start is None:
        raise ConfigError(f"{where}: expected a block 'pins:' line at the top level, found none (a flow mapping?)",
                          hint="write the pins as a block mapping, as the shipped pins.yaml does, then run again")
    end = len(lines)  # the pins block runs to the next top-level key
    for n in range(start + 1, len(lines)):
        if lines[n].strip() and not lines[n].startswith((" ", "\t", "#")):
            end = n
            break
    keys: list[tuple[int, str]] = []
    indent: str | None = None
    for n in range(start + 1, end):
        m = re.match(r"^( +)([^\s#][^:]*):\s*(#.*)?$", lines[n])
        if m and (indent is None or m.group(1) == indent):
            indent = m.group(1)
            keys.append((n, m.group(2).strip().strip("'\"")))
    if indent is None or [k for _, k in keys] != list(pinset.pins):
        raise ConfigError(f"{where}: could not find each pin's key line under 'pins:'",
                          hint="keep one 'name:' line per pin at one indentation, as the shipped pins.yaml does")
    newline = "\r\n" if lines[start].endswith("\r\n") else "\n"  # a file saved on Windows keeps its line ends
    block = render_entry(pin, indent).replace("\n", newline)
    after = [(n, k) for n, k in keys if pinset.pins[k].parsed_version > pin.parsed_version]
    if after:
        at = after[0][0]
        while at - 1 > start and lines[at - 1].startswith(indent + "#"):  # a comment belongs to the pin below it
            at -= 1
        new = [*lines[:at], block, newline, *lines[at:]]
    else:
        last = end
        while last - 1 > start and not lines[last - 1].strip():
            last -= 1
        tail = lines[last - 1]
        sep = "" if tail.endswith("\n") else newline
        new = [*lines[:last - 1], tail + sep, newline, block, *lines[last:]]
    return "".join(new)


def write_pin(pin: Pin, pinset: PinSet) -> Path:
    """Add ``pin`` to ``pinset``'s file atomically; the result is loaded and checked before it replaces the file.

    The file is read again under a lock: a pin another run added since ``pinset`` was loaded is kept, and the
    same name added meanwhile is refused.
    """
    path = pinset.source
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:24]
    with cache_lock(cache_root() / "locks" / f"pins-{key}"):  # the lock file stays out of the user's project
        current = load_pins(path)
        if pin.name in current.pins:
            raise UsageError(f"pin '{pin.name}' was added to {path} meanwhile; nothing was written",
                             hint=f"see it with `g4build pins show {pin.name}`, or pass another --name")
        text = path.read_bytes().decode("utf-8")  # not read_text: it would turn CRLF line ends into LF
        new_text = insert_entry(text, pin, current)
        fd, tmp_name = tempfile.mkstemp(prefix=".pins-", suffix=".yaml.tmp", dir=path.parent)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
                fh.write(new_text)
            check = load_pins(tmp)
            want = {n: p.to_dict() for n, p in current.pins.items()} | {pin.name: pin.to_dict()}
            got = {n: p.to_dict() for n, p in check.pins.items()}
            if got != want or check.default != current.default:
                raise ConfigError(f"{path}: the file with the new pin does not read back as the pins plus "
                                  f"{pin.name}; nothing was written",
                                  hint="report this; add the entry by hand meanwhile")
            os.chmod(tmp, path.stat().st_mode & 0o7777)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    return path
