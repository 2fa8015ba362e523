"""The overlay route for an installed vLLM: patch a venv's files in place, with a backup to undo it exactly.

State lives in ``<venv>/.g4build-overlay/``: ``backup/`` holds each touched file as it was (RECORD included),
``record.json`` is the journal (see ``venvjournal``), written before any installed file changes. One overlay
or undo runs per venv at a time (a lock); a run killed at any point is finished or rolled back by the next.
Undo refuses to discard a file changed after the overlay unless forced, and puts symlinks back as symlinks.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from g4build.errors import UnsafeArchiveError, UsageError, ValidationError
from g4build.fsutil import remove_tree
from g4build.overlay.venvjournal import (
    RECORD_JSON,
    STATE,
    Entry,
    Journal,
    describe,
    fsync_dir,
    fsync_file,
    read_journal,
    refuse_edits,
    restore,
    venv_lock,
    write_file,
    write_journal,
)
from g4build.overlay.wheel import PROJECT, OverlayPlan, check_version, patch_into, safe_member, touched_by
from g4build.util.faults import fault
from g4build.wheelfile.manifestfile import MANIFEST_NAME, dumps
from g4build.wheelfile.wheelfile import RecordRow, format_record, metadata_fields, parse_record, record_hash

__all__ = ["STATE", "Installed", "VenvResult", "find_installed", "overlay_venv", "recover", "undo_venv"]


@dataclass(frozen=True, kw_only=True)
class Installed:
    site_packages: Path
    dist_info: Path
    version: Version


@dataclass(frozen=True, kw_only=True)
class VenvResult:
    venv: Path
    action: str  # "overlay" or "undo"
    files: tuple[str, ...]
    digest: str

    def to_dict(self) -> dict[str, Any]:
        return {"venv": str(self.venv), "action": self.action, "files": list(self.files), "digest": self.digest}


def find_installed(venv: Path) -> Installed:
    """The venv's site-packages holding vLLM, and vLLM's dist-info folder."""
    candidates = [*sorted(venv.glob("lib/python3*/site-packages")), venv / "Lib" / "site-packages"]
    for site in candidates:
        if not (site / PROJECT / "__init__.py").is_file():
            continue
        for dist in sorted(site.glob("*.dist-info")):
            meta = dist / "METADATA"
            if meta.is_file():
                fields = metadata_fields(meta.read_bytes())
                if canonicalize_name(fields.get("name", "")) == PROJECT:
                    try:
                        version = Version(fields.get("version", ""))
                    except InvalidVersion as exc:
                        raise ValidationError(
                            f"{meta}: expected a PEP 440 Version header, found {fields.get('version')!r}",
                            hint="reinstall vLLM into the venv (pip install --force-reinstall --no-deps vllm==…)",
                        ) from exc
                    return Installed(site_packages=site, dist_info=dist, version=version)
    raise UsageError(
        f"no installed vLLM found in {venv} (looked in lib/python3*/site-packages and Lib/site-packages)",
        hint="pass the venv's top folder (the one holding bin/ or Scripts/)",
    )


_LINKED_HINT = (
    "install vLLM into the venv without linked folders (pip install --force-reinstall --no-deps vllm==…), or "
    "overlay the wheel itself: `g4build overlay WHEEL`"
)


def refuse_linked_folders(site: Path, rels: list[str] | set[str], *, hint: str = _LINKED_HINT) -> None:
    """Refuse when a folder between ``site`` and a file the overlay (or its undo) writes is a symlink: the write
    would land wherever the link points (another venv, a checkout), outside this venv. A linked *file* is fine: it
    is replaced by a regular file and comes back a link on undo."""
    for rel in sorted(rels):
        parent = PurePosixPath(safe_member(rel)).parent
        for depth in range(1, len(parent.parts) + 1):
            folder = site / PurePosixPath(*parent.parts[:depth])
            if folder.is_symlink():
                raise UnsafeArchiveError(
                    f"{folder} is a symlink (to {os.readlink(folder)}): writing {rel} through it would change files "
                    f"outside {site}; nothing was changed",
                    hint=hint,
                )
            if not folder.is_dir():
                break  # created by the overlay: a real folder


def _patch(scratch: Path, read: dict[str, bytes], plan: OverlayPlan, target: str) -> dict[str, bytes | None]:
    """Patch copies of the touched files in ``scratch`` (inside the state folder); return the changed ones."""
    scratch.mkdir()
    return dict(patch_into(scratch, read, plan, target).files)


def overlay_venv(venv: Path, plan: OverlayPlan) -> VenvResult:
    """Patch the venv's vLLM in place: one run per venv at a time, journaled so a kill can be recovered."""
    with venv_lock(venv):
        state = venv / STATE
        recover(venv)
        if (state / RECORD_JSON).is_file():
            done = read_journal(state)
            raise UsageError(
                f"{venv} already carries a g4build overlay (digest {done.digest}, pin {done.pin})",
                hint="undo it first: `g4build overlay --venv PATH --undo`",
            )
        inst = find_installed(venv)
        check_version(inst.version, plan.pin, f"the vLLM installed in {venv}")
        site = inst.site_packages
        dist_rel = inst.dist_info.relative_to(site).as_posix()
        record_path = inst.dist_info / "RECORD"
        manifest_rel = f"{dist_rel}/{MANIFEST_NAME}"
        if (site / manifest_rel).exists():
            raise UsageError(f"{site / manifest_rel} exists: this vLLM was already built or overlaid by g4build")
        refuse_linked_folders(site, {*touched_by(plan), manifest_rel, f"{dist_rel}/RECORD"})
        if not record_path.is_file():
            raise ValidationError(f"{record_path} is missing: cannot keep the installed RECORD true")
        rows = parse_record(record_path.read_bytes(), str(record_path))
        try:
            state.mkdir()
            read = {rel: (site / safe_member(rel)).read_bytes()
                    for rel in sorted(touched_by(plan)) if (site / rel).is_file()}
            changes = _patch(state / "scratch", read, plan, f"the vLLM installed in {venv}")  # raises before writes
            changes[manifest_rel] = dumps(plan.manifest({"venv": str(venv)}))
            changes[f"{dist_rel}/RECORD"] = format_record(_record(rows, changes, site))
            journal = _prepare(state, site, venv, plan, changes)
        except BaseException:
            remove_tree(state)  # no installed file was touched yet: leave the venv as it was found
            raise
        fault("venv-overlay-after-journal")
        for n, entry in enumerate(journal.files, 1):
            data = changes[entry.path]
            target = site / entry.path
            if data is None:
                if target.is_symlink() or target.exists():
                    target.unlink()
            else:
                write_file(state, target, data)
            fault(f"venv-overlay-after-file-{n}")
        journal.status = "done"
        write_journal(state, journal)
        remove_tree(state / "tmp")
    return VenvResult(venv=venv, action="overlay", files=tuple(e.path for e in journal.files), digest=plan.digest)


def _prepare(state: Path, site: Path, venv: Path, plan: OverlayPlan, changes: dict[str, bytes | None]) -> Journal:
    """Back up every file the overlay changes, then write the journal: the last step before any installed change."""
    remove_tree(state / "scratch")
    backup = state / "backup"
    entries = []
    for rel, data in sorted(changes.items()):
        now = describe(site / rel)
        if now.kind == "file":
            (backup / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(site / rel, backup / rel)
            fsync_file(backup / rel)
        entries.append(Entry(path=rel, kind=now.kind, before=now.before, link=now.link,
                             after=hashlib.sha256(data).hexdigest() if data is not None else None))
    for folder in sorted({p.parent for p in backup.rglob("*")} | {backup}) if backup.is_dir() else []:
        fsync_dir(folder)
    # site-packages relative to the venv: undo then works on a moved venv and writes nowhere else
    journal = Journal(status="overlaying", pin=plan.pin.name, digest=plan.digest,
                      site_packages=site.relative_to(venv).as_posix(), files=entries,
                      created_dirs=_dirs_to_create(site, [rel for rel, data in changes.items() if data is not None]))
    write_journal(state, journal)
    fsync_dir(venv)
    return journal


def _dirs_to_create(site: Path, rels: list[str]) -> list[str]:
    """The folders writing ``rels`` will create under ``site``, deepest first (undo removes them in that order)."""
    missing: set[str] = set()
    for rel in rels:
        parent = PurePosixPath(rel).parent
        while parent != PurePosixPath(".") and not (site / parent).is_dir():
            missing.add(parent.as_posix())
            parent = parent.parent
    return sorted(missing, key=lambda d: (-d.count("/"), d))


def _remove_created_dir(folder: Path) -> None:
    """Remove a folder the overlay created: its bytecode cache too, anything else stays (and so does it)."""
    shutil.rmtree(folder / "__pycache__", ignore_errors=True)
    try:
        folder.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ValidationError(
            f"{folder} was created by the overlay but now holds other files ({exc.strerror}); it was left in place",
            hint="move those files away and remove the folder by hand to restore the venv exactly",
        ) from exc


def _record(rows: list[RecordRow], changes: dict[str, bytes | None], site: Path) -> list[RecordRow]:
    """The installed RECORD with the changed files rehashed (paths as RECORD spells them, relative to site)."""
    out, seen = [], set()
    for row in rows:
        rel = os.path.normpath(row.path).replace(os.sep, "/")
        if rel in changes:
            seen.add(rel)
            data = changes[rel]
            if data is not None:
                out.append(RecordRow(path=row.path, hash=record_hash(data), size=str(len(data))))
            continue
        out.append(row)
    for rel, data in changes.items():
        if rel not in seen and data is not None:
            out.append(RecordRow(path=rel, hash=record_hash(data), size=str(len(data))))
    return out


def _site_of(venv: Path, recorded: str) -> Path:
    """The recorded site-packages, which must lie in ``venv`` (records of older g4build hold absolute paths)."""
    path = Path(recorded)
    if path.is_absolute():
        if not path.resolve().is_relative_to(venv.resolve()):
            raise ValidationError(
                f"{venv / STATE / RECORD_JSON} names site-packages {recorded}, outside {venv}; refusing to write there",
                hint="undo from the venv the overlay was made in",
            )
        return path
    return venv / safe_member(recorded)


def recover(venv: Path) -> str | None:
    """Finish what a killed run left: restore the files of a half-done overlay or undo, sweep a stale state folder.

    Returns the status that was recovered from (None when there was nothing to do). Call with the venv's lock held.
    """
    state = venv / STATE
    if not state.exists():
        return None
    if not (state / RECORD_JSON).is_file():
        # killed before the journal was written (nothing installed was changed yet) or during undo's final
        # cleanup (everything was already restored): either way the folder holds nothing needed any more
        remove_tree(state)
        return "stale"
    journal = read_journal(state)
    if journal.status == "done":
        return None
    _restore_all(venv, state, journal)
    return journal.status


def _restore_all(venv: Path, state: Path, journal: Journal) -> None:
    site = _site_of(venv, journal.site_packages)
    # a folder linked away after the overlay: restoring through it would write elsewhere
    refuse_linked_folders(site, {e.path for e in journal.files}, hint=(
        "put the real folder back in place of the link, then run the undo again (or reinstall vLLM into the venv: "
        "pip install --force-reinstall --no-deps vllm==…, then remove the venv's .g4build-overlay folder)"))
    if journal.status != "undoing":
        journal.status = "undoing"
        write_journal(state, journal)
    for n, entry in enumerate(journal.files, 1):
        restore(state, site, entry)
        fault(f"venv-undo-after-file-{n}")
    for folder in journal.created_dirs:
        _remove_created_dir(site / folder)
    fault("venv-undo-before-cleanup")
    # dropping the journal is the commit point; what is left of the folder after a kill is swept by recover()
    (state / RECORD_JSON).unlink()
    fsync_dir(state)
    fault("venv-undo-during-cleanup")
    remove_tree(state)


def undo_venv(venv: Path, *, force: bool = False) -> VenvResult:
    """Restore every file the overlay touched (and RECORD), then drop the state folder.

    Refuses when a file changed after the overlay (a user's edit would be lost) unless ``force``.
    """
    with venv_lock(venv):
        state = venv / STATE
        if (state / RECORD_JSON).is_file():
            journal = read_journal(state)
            site = _site_of(venv, journal.site_packages)
            if journal.status == "done" and not force:
                refuse_edits(site, journal, venv)
            _restore_all(venv, state, journal)
            return VenvResult(venv=venv, action="undo", files=tuple(e.path for e in journal.files),
                              digest=journal.digest)
        stale = recover(venv)
        left = " (removed the state folder an interrupted run left behind)" if stale else ""
        raise UsageError(f"{venv} has no g4build overlay to undo ({state / RECORD_JSON} is missing){left}")
