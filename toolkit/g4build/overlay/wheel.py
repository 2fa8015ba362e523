"""The overlay route: lay the Python-only series over an existing vLLM wheel, without compiling.

Only the files the patches touch are extracted and patched (in a scratch folder, all patches first; where the
stack does not apply with zero fuzz, file by file with a three-way merge against the pin's own files, see
``merge``); the new wheel copies every other member's compressed bytes as they are, renames the dist-info folder for the
new version, rewrites METADATA's Version, adds build-manifest.json and regenerates RECORD. Since its members
are copied raw under a new RECORD, the source wheel must be the pin's (sha256 of the whole file as read, checked
before anything is published) or pass validate's checks member by member (``sourcecheck``: the structural ones
first, the members' while the new wheel is written, before its RECORD is). Wheel and
manifest are written into a locked staging folder in the destination, checked there (``check``: the CLI
validates) and only then renamed into place, so a refusal, a failed check, Ctrl-C or a kill leaves no wheel
behind; a kill leaves the staging folder, which the next overlay into the folder removes.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import tempfile
import zipfile
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, TypeVar

from packaging.version import Version

from g4build.emit.manifest import make_manifest
from g4build.errors import IntegrityError, PatchConflictError, UnsafeArchiveError, UsageError, ValidationError
from g4build.fsutil import staging_dir, sweep_staging
from g4build.overlay.merge import APPLIED, FileOutcome, Pristine, merge_over
from g4build.overlay.sourcecheck import (
    NotPinned,
    Verification,
    WheelSource,
    check_structure,
    pin_ref,
    read_dist_info,
    sha256_as_read,
)
from g4build.pins.model import Pin
from g4build.pins.serving import requires_dist
from g4build.series.model import Series, stack_digest, unmet_requirements
from g4build.series.scratch import PatchFile, apply_patches, touched_paths
from g4build.util.faults import fault
from g4build.wheelfile.manifestfile import MANIFEST_NAME, dumps
from g4build.wheelfile.safety import ZIP_OR_OS_ERRORS, ZIP_READ_ERRORS, check_limits, read_small
from g4build.wheelfile.sources import Snapshot, Streamed
from g4build.wheelfile.wheelfile import (
    RecordRow,
    WheelName,
    dist_info_name,
    extend_local_label,
    format_record,
    narrow_requires_dist,
    record_hash,
    set_metadata_version,
)
from g4build.wheelfile.zipraw import ByteSource, RawZipWriter

T = TypeVar("T")

PROJECT = "vllm"


@dataclass(frozen=True, kw_only=True)
class OverlayPlan:
    pin: Pin
    series: tuple[Series, ...]
    digest: str
    pristine: Pristine | None = None  # the pin's own files for a merge (default: read from the pin's sdist)

    def pristine_files(self, paths: Sequence[str]) -> dict[str, bytes]:
        if self.pristine is not None:
            return self.pristine(paths)
        from g4build.source.fetch import pristine_files  # only a merge needs the sdist (and git): not every start

        return pristine_files(self.pin, paths)

    @property
    def fingerprints(self) -> dict[str, list[tuple[str, str]]]:
        """Per path, (series, text) pairs a patched file must hold."""
        found: dict[str, list[tuple[str, str]]] = {}
        for s in self.series:
            variant = s.variant(self.pin.name)
            for path, texts in (variant.fingerprints if variant else {}).items():
                found.setdefault(path, []).extend((s.name, t) for t in texts)
        return found

    @property
    def patches(self) -> tuple[PatchFile, ...]:
        pin = self.pin.name
        return tuple(PatchFile(label=f"{s.name}/{p.file}", path=p.path)
                     for s in self.series for p in s.patches_for(pin))

    def manifest(self, extra: dict[str, Any], created: datetime.datetime | None = None) -> dict[str, Any]:
        return make_manifest(self.pin, self.series, route="overlay", extra=extra, created=created)


def plan_overlay(pin: Pin, all_series: Sequence[Series], *, pristine: Pristine | None = None) -> OverlayPlan:
    """The series with patches for ``pin``, in order; refuses any that is not Python-only. ``pristine``: where a
    merge gets the pin's own files (default: the pin's sdist, fetched only when a merge needs it)."""
    needed = tuple(s for s in all_series if s.patches_for(pin.name))
    if not needed:
        raise UsageError(
            f"no series has patches for pin {pin.name}: there is nothing to overlay",
            hint="`g4build patches list` shows the series and the pins they cover",
        )
    unmet = unmet_requirements(needed, all_series, pin.name)
    if unmet:
        raise UsageError(
            f"on {pin.name} " + "; ".join(f"{name} needs {req}" for name, req in unmet) + " (series.yaml requires): "
            "an overlay with one and not the other is broken",
            hint="overlay every series of the order",
        )
    compiled = [s.name for s in needed if not s.python_only]
    if compiled:
        raise UsageError(
            f"series {', '.join(compiled)} for pin {pin.name} is not Python-only (python_only: false): "
            "it changes compiled code, which an overlay cannot do",
            hint="build the wheel instead: `g4build wheel`",
        )
    return OverlayPlan(pin=pin, series=needed, digest=stack_digest(pin, needed), pristine=pristine)


def check_version(version: Version, pin: Pin, what: str) -> None:
    if version.public != Version(pin.version).public:
        raise UsageError(
            f"{what} is vLLM {version}, pin {pin.name} expects {pin.version} (any local label)",
            hint="pass a wheel of the pinned version, or choose the pin that matches it with --pin",
        )
    if version.local and ".g4." in f".{version.local}.":
        raise UsageError(f"{what} ({version}) already carries g4 series; overlay the original wheel instead")


@dataclass(frozen=True, kw_only=True)
class Patched:
    """The outcome of patching the touched files: new bytes per path (None: deleted), and per file how."""

    files: dict[str, bytes | None]
    outcomes: tuple[FileOutcome, ...] = ()


def safe_member(name: str) -> str:
    rel = PurePosixPath(name)
    if rel.is_absolute() or ".." in rel.parts or "\\" in name:
        raise UnsafeArchiveError(f"wheel member {name!r} would land outside the folder")
    return str(rel)


def touched_by(plan: OverlayPlan) -> set[str]:
    """Every path the plan's patches read or write (what an overlay extracts, patches and compares)."""
    return {p for patch in plan.patches for p in touched_paths(patch.read_bytes())}


def patch_into(root: Path, read: dict[str, bytes], plan: OverlayPlan, target: str) -> Patched:
    """Write ``read`` (path -> bytes) into the empty folder ``root``, apply every patch there, and return the
    changed files (``None``: removed). Where the stack does not apply with zero fuzz, each file is applied alone
    or merged three ways with the pin's own files (``merge``); a file that does neither raises."""
    for name, data in read.items():
        dest = root / safe_member(name)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    try:
        apply_patches(root, plan.patches, target=target)
    except PatchConflictError as exc:
        merged, outcomes = merge_over(read, plan.patches, pin=plan.pin.name, pristine=plan.pristine_files,
                                      fingerprints=plan.fingerprints, first=exc, target=target)
        return Patched(files=merged, outcomes=outcomes)
    files: dict[str, bytes | None] = {}
    for rel in sorted(touched_by(plan)):
        path = root / rel
        new = path.read_bytes() if path.is_file() else None
        if new != read.get(rel):
            files[rel] = new
    return Patched(files=files, outcomes=tuple(FileOutcome(path=rel, how="applied", detail=APPLIED)
                                               for rel in sorted(touched_by(plan))))


def patch_files(read: dict[str, bytes], plan: OverlayPlan, target: str) -> Patched:
    """``patch_into`` a scratch folder of its own (the wheel route)."""
    with tempfile.TemporaryDirectory(prefix="g4build-overlay-") as tmp:
        return patch_into(Path(tmp), read, plan, target)


@dataclass(frozen=True, kw_only=True)
class OverlayResult:
    wheel: Path
    version: str
    changed: tuple[str, ...]
    added: tuple[str, ...]
    removed: tuple[str, ...]
    manifest: Path
    leftovers_removed: tuple[Path, ...] = ()  # staging folders of killed runs, removed
    leftovers_kept: tuple[Path, ...] = ()  # ... and those in use by another run (or not claimable here)
    files: tuple[FileOutcome, ...] = ()  # per touched file: applied / merged / already

    def to_dict(self) -> dict[str, Any]:
        return {"wheel": str(self.wheel), "version": self.version, "changed": list(self.changed),
                "added": list(self.added), "removed": list(self.removed), "manifest": str(self.manifest),
                "files": [o.to_dict() for o in self.files],
                "leftovers_removed": [str(p) for p in self.leftovers_removed],
                "leftovers_kept": [str(p) for p in self.leftovers_kept]}


def overlay_wheel(
    source: Path, plan: OverlayPlan, out_dir: Path, *, require_pin: bool = False,
    check: Callable[[Path], None] | None = None,
) -> OverlayResult:
    """Write the overlaid wheel into ``out_dir``; nothing is written when any check or patch fails. ``check``
    gets the finished wheel (under its final name, in the staging folder); raising there leaves no wheel.

    A file named as one of the pin's wheels is first streamed: read once while it is copied, hashed on the way,
    and its members' RECORD rows carried over unverified only when the sha256 of the whole file as read is the
    pin's. Any other wheel (or one whose sha256 is not the pin's) is read into memory once and every member is
    held against RECORD (across cores, while the new wheel is written from those same bytes into the staging
    folder) before the new RECORD is written and anything is published. ``require_pin``: refuse (exit 4) a
    wheel whose sha256 is not the pin's instead of verifying it member by member (the pin's registry wheel)."""
    wheel = WheelName.parse(source.name)
    if wheel.project != PROJECT:
        raise UsageError(f"{source.name} is a wheel of {wheel.name}, not of {PROJECT}")
    check_version(wheel.version, plan.pin, source.name)
    ref = pin_ref(plan.pin, source)
    found = None
    removed: list[Path] = []  # staging folders of killed runs swept, whichever attempt swept them
    if ref is not None:
        try:
            streamed = Streamed.open(source)
        except OSError:
            pass  # unreadable: the snapshot below says so, as for any wheel
        else:
            with streamed:
                try:
                    return _overlay(source, streamed, plan, out_dir, sha256=ref.sha256.lower(), check=check,
                                    removed=removed)
                except Exception:
                    found = sha256_as_read(streamed)
                    if found == ref.sha256.lower():
                        raise  # the pin's own bytes: the failure is the overlay's, not the wheel's
    if require_pin:
        if ref is None:
            found = f"the pin lists {', '.join(r.file for r in plan.pin.wheels.values()) or 'no wheel'}"
        else:
            found = f"sha256 {found or 'unknown: unreadable, or it changed while read'}, the pin's {ref.sha256}"
        raise IntegrityError(f"{source}: not the wheel pin {plan.pin.name} records ({found})",
                             hint="the cached copy is damaged or was replaced: it is fetched again on the next run")
    try:
        snapshot = Snapshot.read(source)
    except OSError as exc:
        raise ValidationError(f"{source.name}: not a readable wheel ({exc})",
                              hint="download the wheel again (`g4build validate WHEEL` says the same)") from exc
    return _overlay(source, snapshot, plan, out_dir, sha256=None, check=check, removed=removed)


def guarded(name: str, read: Callable[[], T]) -> T:
    """A read of the source wheel's members: a damaged or hostile archive is refused before anything is written."""
    try:
        return read()
    except ZIP_READ_ERRORS as exc:
        raise ValidationError(f"{name}: not a readable wheel ({type(exc).__name__}: {exc})",
                              hint="download the wheel again (`g4build validate WHEEL` says the same)") from exc


@contextlib.contextmanager
def _refusal_first(verifying: list[Verification]) -> Iterator[None]:
    """A failure while members are still being verified: the members' refusal, if any, is the error."""
    try:
        yield
    except Exception as exc:
        for verification in verifying:
            verification.refusal_before(exc)
        raise


def _overlay(
    source: Path, src: WheelSource, plan: OverlayPlan, out_dir: Path, *, sha256: str | None,
    check: Callable[[Path], None] | None, removed: list[Path],
) -> OverlayResult:
    """The overlay from one source's bytes; ``sha256``: the pin's, which a streamed source must prove."""
    wheel = WheelName.parse(source.name)
    new_version = extend_local_label(wheel.version, plan.digest)
    old_dist = dist_info_name(wheel.name, str(wheel.version))
    new_dist = dist_info_name(wheel.name, new_version)
    try:
        zf = zipfile.ZipFile(src.file())
    except ZIP_OR_OS_ERRORS as exc:  # not a zip, or cut short in transfer
        raise ValidationError(f"{source.name}: not a readable wheel ({exc})",
                              hint="download the wheel again (`g4build validate WHEEL` says the same)") from exc
    verifying: list[Verification] = []  # a snapshot's members, verified while the new wheel is written
    with zf, _refusal_first(verifying):
        check_limits(zf.infolist(), source.name)  # first: it also refuses what the lines below cannot read
        infos = [i for i in zf.infolist() if not i.is_dir()]
        by_name = {i.filename: i for i in infos}
        for name in (f"{old_dist}/METADATA", f"{old_dist}/RECORD"):
            if name not in by_name:
                raise ValidationError(f"{source.name}: {name} is missing", hint="is this a wheel of the pin's release?")
        if f"{old_dist}/{MANIFEST_NAME}" in by_name:
            raise UsageError(
                f"{source.name} already holds {old_dist}/{MANIFEST_NAME}: g4build built or overlaid it, so its "
                "files are not the pinned release's",
                hint="overlay the original release wheel instead",
            )
        dist = guarded(source.name, lambda: read_dist_info(source.name, zf, old_dist))
        touched = touched_by(plan)

        def read_touched() -> dict[str, bytes]:
            return guarded(source.name, lambda: {n: read_small(zf, n, source.name)
                                                 for n in sorted(touched) if n in by_name})

        helper = ThreadPoolExecutor(max_workers=2, thread_name_prefix="g4build-patch")
        checking: list[Future[None]] = []  # the pinned wheel's structural checks, beside the patches and the copy
        if isinstance(src, Snapshot):  # validate's order: the structure, then the members (beside the writing)
            check_structure(source.name, zf, wheel, old_dist, dist)
            verification = Verification(source.name, src, zf, old_dist, dist)
            verifying.append(verification)
            read = read_touched()

            def verified_pristine(paths: Sequence[str]) -> dict[str, bytes]:
                verification.wait()  # a merge fetches the pin's sdist: not for a wheel its own RECORD refutes
                return plan.pristine_files(paths)

            patching = helper.submit(patch_files, read, replace(plan, pristine=verified_pristine),
                                     source.name)
        else:  # the pin's bytes (proved at the end): checks and patches run while the copy streams, each on its
            read = read_touched()  # own (the copy waits for the patches at the first member they touch)
            patching = helper.submit(patch_files, read, plan, source.name)
            checking.append(helper.submit(check_structure, source.name, zf, wheel, old_dist, dist))
        raw_metadata = guarded(source.name, lambda: read_small(zf, f"{old_dist}/METADATA", source.name))
        # the pin's recorded serving ranges (transformers for Gemma 4) narrow what pip may install beside it
        metadata = narrow_requires_dist(set_metadata_version(raw_metadata, new_version), requires_dist(plan.pin))
        created = datetime.datetime(*zf.getinfo(f"{old_dist}/RECORD").date_time)

        @functools.cache
        def manifest_bytes() -> bytes:
            """Made when first written (a snapshot's sha256 is computed beside the verification). The same wheel
            overlaid twice gives the same bytes: the manifest's time is the source wheel's own; its sha256 is the
            one computed from the bytes read (a streamed source proves it before publishing)."""
            return dumps(plan.manifest({"source_wheel": {"file": source.name, "sha256": sha256
                                                         if isinstance(src, Streamed) else src.sha256},
                                        "wheel": wheel.with_version(new_version)}, created=created))

        def rename(name: str) -> str:
            return new_dist + name[len(old_dist):] if name.startswith(old_dist + "/") else name

        def extra() -> list[tuple[str, bytes]]:
            for check_done in checking:
                check_done.result()  # the structural checks passed
            for verification in verifying:
                verification.wait()  # RECORD carries the source's rows: only once every member matched them
            rows = _record(dist.rows, patching.result(), rename, metadata=(f"{new_dist}/METADATA", metadata),
                           manifest=(f"{new_dist}/{MANIFEST_NAME}", manifest_bytes()), record=f"{new_dist}/RECORD")
            return [(f"{new_dist}/{MANIFEST_NAME}", manifest_bytes()), (f"{new_dist}/RECORD", format_record(rows))]

        target = out_dir / wheel.with_version(new_version)
        made_out = not out_dir.exists()
        try:
            with helper:
                _check_out(out_dir, target)
                out_dir.mkdir(parents=True, exist_ok=True)
                swept, kept = sweep_staging(out_dir)
                removed.extend(swept)  # a streamed attempt that fell back swept them already
                with staging_dir(out_dir) as stage, (stage / target.name).open("xb") as out:
                    _write_members(RawZipWriter(out), src, zf, patching.result, touched, rename, old_dist=old_dist,
                                   metadata=metadata, extra=extra)
                    out.close()
                    if isinstance(src, Streamed) and src.finish() != sha256:
                        raise NotPinned(f"{source.name}: sha256 {src.finish()}, not the pin's {sha256}")
                    fault("after-wheel-write")
                    (stage / MANIFEST_NAME).write_bytes(manifest_bytes())
                    if check is not None:
                        check(stage / target.name)
                    fault("before-publish")
                    os.replace(stage / target.name, target)  # the wheel first: a manifest never describes a wheel
                    os.replace(stage / MANIFEST_NAME, out_dir / MANIFEST_NAME)  # that is not there
        except BaseException:
            if made_out:
                with contextlib.suppress(OSError):
                    out_dir.rmdir()  # --out as it was: absent
            raise
    patched = patching.result()
    return OverlayResult(
        wheel=target, version=new_version,
        changed=tuple(n for n, d in patched.files.items() if d is not None and n in by_name),
        added=tuple(n for n, d in patched.files.items() if d is not None and n not in by_name),
        removed=tuple(n for n, d in patched.files.items() if d is None),
        manifest=out_dir / MANIFEST_NAME,
        leftovers_removed=tuple(removed), leftovers_kept=tuple(kept), files=patched.outcomes,
    )


def _check_out(out_dir: Path, target: Path) -> None:
    """Refuse an --out that the two renames at the end could not complete (a folder or a file where the wheel,
    the manifest or --out itself must go): checked before anything is written, so --out stays as it was."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: expected a folder, found a file", hint="name a folder for the wheel")
    for path in (target, out_dir / MANIFEST_NAME):
        if path.is_dir() and not path.is_symlink():
            raise UsageError(f"{path}: expected a file or nothing there, found a folder",
                             hint="remove or rename that folder, or overlay into another --out")


def _write_members(
    writer: RawZipWriter, raw: ByteSource, zf: zipfile.ZipFile, patched: Callable[[], Patched], touched: set[str],
    rename: Callable[[str], str], *, old_dist: str, metadata: bytes, extra: Callable[[], list[tuple[str, bytes]]],
) -> None:
    """Members in file order: unchanged runs copied verbatim, renamed ones re-headed, changed ones deflated;
    new files go just before the dist-info folder, ``extra()`` (manifest, RECORD) at the end. ``patched()`` is
    asked for only at the first member the patches touch (it may still be running until then)."""
    ordered = sorted(zf.infolist(), key=lambda i: i.header_offset)
    ends = [i.header_offset for i in ordered[1:]] + [zf.start_dir]
    record = f"{old_dist}/RECORD"
    stamp = zf.getinfo(record).date_time
    known = {i.filename for i in ordered}
    added: list[str] | None = None  # new files, written once, before the dist-info or at the end
    run: list[zipfile.ZipInfo] = []
    run_end = 0

    def write_added() -> None:
        nonlocal added
        if added is None:
            files = patched().files
            added = [n for n, d in files.items() if d is not None and n not in known]
            for new in added:
                writer.write(new, files[new] or b"", date_time=stamp)

    for info, end in zip(ordered, ends, strict=True):
        name = info.filename
        if name in touched and run:  # the patches may still be running: copy (and hash) what comes before first
            writer.copy_verbatim(raw, run, run_end)
            run = []
        changed = name in touched and name in patched().files
        if not changed and rename(name) == name:
            run.append(info)
            run_end = end
            continue
        if run:
            writer.copy_verbatim(raw, run, run_end)
            run = []
        if name.startswith(old_dist + "/"):
            write_added()
        if changed:
            data = patched().files[name]
            if data is not None:
                writer.write(name, data, date_time=info.date_time, external_attr=info.external_attr)
        elif name == f"{old_dist}/METADATA":
            writer.write(rename(name), metadata, date_time=info.date_time, external_attr=info.external_attr)
        elif name != record:
            writer.copy_raw(raw, info, rename(name))
    if run:
        writer.copy_verbatim(raw, run, run_end)
    write_added()
    for name, data in extra():
        writer.write(name, data, date_time=stamp)
    writer.close()


def _record(
    rows: list[RecordRow], patched: Patched, rename: Callable[[str], str], *, metadata: tuple[str, bytes],
    manifest: tuple[str, bytes], record: str,
) -> list[RecordRow]:
    """RECORD for the new wheel: unchanged rows kept (renamed), changed rows rehashed, new rows added."""
    out = []
    for row in rows:
        if row.path in patched.files:
            data = patched.files[row.path]
            if data is not None:
                out.append(RecordRow(path=row.path, hash=record_hash(data), size=str(len(data))))
            continue
        name = rename(row.path)
        if name in (metadata[0], record):
            continue
        out.append(RecordRow(path=name, hash=row.hash, size=row.size))
    known = {r.path for r in rows}
    for name, data in patched.files.items():
        if data is not None and name not in known:
            out.append(RecordRow(path=name, hash=record_hash(data), size=str(len(data))))
    for name, data in (metadata, manifest):
        out.append(RecordRow(path=name, hash=record_hash(data), size=str(len(data))))
    out.append(RecordRow(path=record, hash="", size=""))
    return out
