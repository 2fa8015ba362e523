"""The overlay route for an installed vLLM: patch a venv's files in place, with a backup to undo it exactly.

State lives in ``<venv>/.g4build-overlay/``: ``backup/`` holds each touched file as it was (and RECORD),
``record.json`` lists what was done. The record is written before any installed file changes, so an
interrupted overlay can still be undone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from g4build.errors import UsageError, ValidationError
from g4build.manifest import MANIFEST_NAME, dumps
from g4build.wheels.overlay import PROJECT, OverlayPlan, check_version, patch_files, safe_member, touched_by
from g4build.wheels.wheelfile import RecordRow, format_record, metadata_fields, parse_record, record_hash

STATE = ".g4build-overlay"
RECORD_JSON = "record.json"


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


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".g4build-tmp")
    tmp.write_bytes(data)
    if path.exists():
        shutil.copymode(path, tmp)
    os.replace(tmp, path)


def overlay_venv(venv: Path, plan: OverlayPlan) -> VenvResult:
    state = venv / STATE
    if (state / RECORD_JSON).is_file():
        done = json.loads((state / RECORD_JSON).read_text())
        raise UsageError(
            f"{venv} already carries a g4build overlay (digest {done.get('digest')}, pin {done.get('pin')})",
            hint="undo it first: `g4build overlay --venv PATH --undo`",
        )
    inst = find_installed(venv)
    check_version(inst.version, plan.pin, f"the vLLM installed in {venv}")
    site = inst.site_packages
    touched = sorted(touched_by(plan))
    read = {rel: (site / safe_member(rel)).read_bytes() for rel in touched if (site / rel).is_file()}
    patched = patch_files(read, plan, f"the vLLM installed in {venv}")  # raises before anything is written
    dist_rel = inst.dist_info.relative_to(site).as_posix()
    record_path = inst.dist_info / "RECORD"
    manifest_rel = f"{dist_rel}/{MANIFEST_NAME}"
    if (site / manifest_rel).exists():
        raise UsageError(f"{site / manifest_rel} exists: this vLLM was already built or overlaid by g4build")
    manifest = dumps(plan.manifest({"venv": str(venv)}))
    changes: dict[str, bytes | None] = {**patched.files, manifest_rel: manifest}
    rows = parse_record(record_path.read_bytes(), str(record_path)) if record_path.is_file() else None
    if rows is None:
        raise ValidationError(f"{record_path} is missing: cannot keep the installed RECORD true")
    new_rows = _record(rows, changes, site)

    backup = state / "backup"
    files = []
    for rel, data in sorted(changes.items()):
        before = site / rel
        if before.is_file():
            (backup / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(before, backup / rel)
        files.append({"path": rel, "before": _sha(before) if before.is_file() else None,
                      "after": hashlib.sha256(data).hexdigest() if data is not None else None})
    (backup / dist_rel).mkdir(parents=True, exist_ok=True)
    shutil.copy2(record_path, backup / dist_rel / "RECORD")
    # site-packages relative to the venv: undo then works on a moved venv and writes nowhere else
    record = {"pin": plan.pin.name, "digest": plan.digest, "site_packages": site.relative_to(venv).as_posix(),
              "record": f"{dist_rel}/RECORD", "files": files,
              "created_dirs": _dirs_to_create(site, [rel for rel, data in changes.items() if data is not None])}
    _write(state / RECORD_JSON, json.dumps(record, indent=2).encode())

    for rel, data in changes.items():
        target = site / rel
        if data is None:
            target.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            _write(target, data)
    _write(record_path, format_record(new_rows))
    return VenvResult(venv=venv, action="overlay", files=tuple(sorted(changes)), digest=plan.digest)


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


def undo_venv(venv: Path) -> VenvResult:
    """Restore every file the overlay touched (and RECORD) from the backup, then drop the state folder."""
    state = venv / STATE
    if not (state / RECORD_JSON).is_file():
        raise UsageError(f"{venv} has no g4build overlay to undo ({state / RECORD_JSON} is missing)")
    record = json.loads((state / RECORD_JSON).read_text())
    site = _site_of(venv, str(record["site_packages"]))
    backup = state / "backup"
    for entry in record["files"]:
        rel = safe_member(entry["path"])
        if entry["before"] is None:
            (site / rel).unlink(missing_ok=True)
        else:
            saved = backup / rel
            if _sha(saved) != entry["before"]:
                raise ValidationError(f"the backup of {rel} in {backup} was changed; refusing to restore it")
            _write(site / rel, saved.read_bytes())
            shutil.copystat(saved, site / rel)
    rec = safe_member(record["record"])
    _write(site / rec, (backup / rec).read_bytes())
    shutil.copystat(backup / rec, site / rec)
    for folder in record.get("created_dirs", []):
        _remove_created_dir(site / safe_member(folder))
    shutil.rmtree(state)
    return VenvResult(venv=venv, action="undo", files=tuple(e["path"] for e in record["files"]),
                      digest=str(record["digest"]))
