"""Which bytes an overlay copies, and why they may be copied under a new RECORD.

A source wheel's members are copied raw, so a tampered member would come out laundered, relabelled g4. Before
anything is published, either the whole file's sha256 as read is the pin's (``sources.Streamed``: the pin vouches
for every byte, RECORD's rows are the release's) or every member was inflated from a ``sources.Snapshot`` and held
against its RECORD row (across cores; ``Verification``: beside the writing of the new wheel into its staging
folder, whose RECORD waits for it). Both get validate's checks that need no inflating (``check_structure``).
"""

from __future__ import annotations

import os
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeAlias

from g4build.errors import ValidationError
from g4build.pins.model import FileRef, Pin
from g4build.wheelfile.safety import (
    check_limits,
    hash_members,
    inside,
    member_problems,
    read_small,
    record_duplicates,
    record_problems,
    refuse,
    stored_twice,
    wheel_file_problems,
)
from g4build.wheelfile.sources import Snapshot, SourceChanged, Streamed
from g4build.wheelfile.wheelfile import RecordRow, WheelName, parse_record

WheelSource: TypeAlias = Snapshot | Streamed


@dataclass(frozen=True, kw_only=True)
class DistInfo:
    """What the checks read of a source wheel besides its zip directory: RECORD's rows and the WHEEL file."""

    rows: list[RecordRow]
    wheel_file: bytes | None


def read_dist_info(name: str, zf: zipfile.ZipFile, dist_info: str) -> DistInfo:
    """RECORD and WHEEL, read once; a zip bomb is refused first, from the directory's sizes, before anything is
    inflated."""
    check_limits(zf.infolist(), name)
    rows = parse_record(read_small(zf, f"{dist_info}/RECORD", name), name)
    present = {i.filename for i in zf.infolist()}
    wheel_file = read_small(zf, f"{dist_info}/WHEEL", name) if f"{dist_info}/WHEEL" in present else None
    return DistInfo(rows=rows, wheel_file=wheel_file)


def check_structure(name: str, zf: zipfile.ZipFile, wheel: WheelName, dist_info: str, read: DistInfo) -> None:
    """Refuse what validate refuses that the zip's directory and dist-info files show, without inflating
    members: unsafe paths, duplicates, links and mangled names, the WHEEL file, RECORD's own rows."""
    names = [i.filename for i in zf.infolist() if not i.is_dir()]
    _refuse(name, [*(f"unsafe path (an installer would write outside site-packages): {n}"
                     for n in sorted({*names, *(r.path for r in read.rows)}) if not inside(n)),
                   *(f"stored twice (one copy shadows the other): {n}" for n in stored_twice(names)),
                   *member_problems(zf.infolist()), *wheel_file_problems(read.wheel_file, wheel, dist_info),
                   *record_duplicates(read.rows)])


def verify_members(name: str, source: Snapshot, zf: zipfile.ZipFile, dist_info: str, read: DistInfo) -> None:
    """Refuse a wheel the pin does not vouch for unless every member, inflated from the snapshot's bytes across
    cores, matches its RECORD row (and every row has its member)."""
    infos = [i for i in zf.infolist() if not i.is_dir()]
    source.hash_in_background()  # the whole file's sha256 (for the manifest) beside the members' own
    _refuse(name, record_problems(hash_members(source.data, infos, workers()), read.rows, dist_info))


class Verification:
    """``verify_members`` in a thread of its own, started now: the caller writes meanwhile, and asks ``wait``
    before it writes a RECORD row carried from the source (or publishes anything)."""

    def __init__(self, name: str, source: Snapshot, zf: zipfile.ZipFile, dist_info: str, read: DistInfo) -> None:
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="g4build-verify")
        self._done = pool.submit(verify_members, name, source, zf, dist_info, read)
        pool.shutdown(wait=False)  # the thread ends with the verification

    def wait(self) -> None:
        """Return once every member matched its RECORD row; raise the refusal (ValidationError) otherwise."""
        self._done.result()

    def refusal_before(self, failure: BaseException) -> None:
        """Something else failed meanwhile (a patch, a read, the writing): when the members fail their checks,
        that refusal is the error to report (a tampered member, not the patch it broke), else nothing."""
        try:
            self._done.result()
        except ValidationError as refused:
            if refused is not failure:
                raise refused from failure


def _refuse(name: str, problems: list[str]) -> None:
    refuse(name, "refused to overlay a wheel that fails its own checks (nothing was written)", problems,
           hint="overlay the wheel as its release published it (`g4build validate WHEEL` lists every problem)")


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
