"""Which bytes an overlay copies, and why they may be copied under a new RECORD.

A source wheel's members are copied raw, so a tampered member would come out laundered, relabelled g4. Before
anything is published, either the whole file's sha256 as read is the pin's (``sources.Streamed``: the pin vouches
for every byte, RECORD's rows are the release's) or every member was inflated from a ``sources.Snapshot`` and held
against its RECORD row (across cores). Both also get validate's checks that need no inflating.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import TypeAlias

from g4build.pins.model import FileRef, Pin
from g4build.wheelfile.safety import (
    check_limits,
    hash_members,
    inside,
    member_problems,
    record_duplicates,
    record_problems,
    refuse,
    stored_twice,
    wheel_file_problems,
)
from g4build.wheelfile.sources import Snapshot, SourceChanged, Streamed
from g4build.wheelfile.wheelfile import RecordRow, WheelName, parse_record

WheelSource: TypeAlias = Snapshot | Streamed


def source_problems(
    name: str, zf: zipfile.ZipFile, wheel: WheelName, dist_info: str, rows: list[RecordRow],
) -> list[str]:
    """What validate refuses that the zip's directory and dist-info files show, without inflating members:
    unsafe paths, duplicates, links and mangled names, the WHEEL file, RECORD's own rows."""
    names = [i.filename for i in zf.infolist() if not i.is_dir()]
    wheel_raw = zf.read(f"{dist_info}/WHEEL") if f"{dist_info}/WHEEL" in names else None
    return [*(f"unsafe path (an installer would write outside site-packages): {n}"
              for n in sorted({*names, *(r.path for r in rows)}) if not inside(n)),
            *(f"stored twice (one copy shadows the other): {n}" for n in stored_twice(names)),
            *member_problems(zf.infolist()), *wheel_file_problems(wheel_raw, wheel, dist_info),
            *record_duplicates(rows)]


def verify_source(
    name: str, source: WheelSource, zf: zipfile.ZipFile, wheel: WheelName, dist_info: str,
) -> list[RecordRow]:
    """Refuse a source wheel that fails validate's own checks, before anything is written: its members are
    copied raw and get a new RECORD, so a tampered member would come out laundered, relabelled g4. A snapshot
    (a wheel the pin does not vouch for) has every member inflated and held against RECORD, across cores; a
    streamed source is the pin's wheel only if its sha256 as read says so, checked before anything is
    published. Returns RECORD's rows. A zip bomb is refused before anything is inflated."""
    check_limits(zf.infolist(), name)
    rows = parse_record(zf.read(f"{dist_info}/RECORD"), name)
    problems = source_problems(name, zf, wheel, dist_info, rows)
    if not problems and isinstance(source, Snapshot):
        infos = [i for i in zf.infolist() if not i.is_dir()]
        problems = record_problems(hash_members(source.data, infos, workers()), rows, dist_info)
    refuse(name, "refused to overlay a wheel that fails its own checks (nothing was written)", problems,
           hint="overlay the wheel as its release published it (`g4build validate WHEEL` lists every problem)")
    return rows


def workers() -> int:
    """Threads that inflate and hash members: one per core, at most 32."""
    return max(2, min(32, os.cpu_count() or 2))


class NotPinned(Exception):
    """The streamed wheel's sha256 is not the one the pin records (internal: the overlay falls back)."""


def pin_ref(pin: Pin, source: Path) -> FileRef | None:
    """The pin's wheel of this file name, if any: which wheel's sha256 the file is held against. The name only
    chooses the attempt; the sha256 of the bytes read decides."""
    return next((ref for ref in pin.wheels.values() if ref.file == source.name), None)


def sha256_as_read(streamed: Streamed) -> str | None:
    """The whole file's sha256 as the pass reads it; None when its bytes changed while it was read."""
    try:
        return streamed.finish()
    except (SourceChanged, OSError):
        return None
