"""Put build-manifest.json beside the wheels and inside the vLLM wheel's ``*.dist-info/`` (RECORD updated)."""

from __future__ import annotations

import base64
import hashlib
import shutil
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from g4build.errors import BuildError
from g4build.wheelfile.manifestfile import MANIFEST_NAME, dumps
from g4build.wheelfile.wheelfile import narrow_requires_dist


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def add_to_wheel(wheel: Path, manifest: dict[str, Any], requires: Mapping[str, str] | None = None) -> str:
    """Rewrite ``wheel`` with the manifest in its dist-info and, with ``requires`` (project -> specifiers), its
    METADATA's Requires-Dist narrowed to them (RECORD's lines for both recomputed); other members are copied as
    they are."""
    data = dumps(manifest)
    tmp = wheel.with_suffix(".whl.tmp")
    with zipfile.ZipFile(wheel) as src:
        names = src.namelist()
        records = [n for n in names if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
        if len(records) != 1:
            raise BuildError(f"{wheel.name}: expected one *.dist-info/RECORD, found {len(records)}")
        dist_info = records[0].rsplit("/", 1)[0]
        member = f"{dist_info}/{MANIFEST_NAME}"
        meta_name = f"{dist_info}/METADATA"
        metadata = src.read(meta_name) if requires and meta_name in names else None
        narrowed = narrow_requires_dist(metadata, requires or {}) if metadata is not None else None
        with zipfile.ZipFile(tmp, "w") as dst:
            for info in src.infolist():
                if info.filename == member:
                    continue
                if info.filename == meta_name and narrowed is not None:
                    dst.writestr(info, narrowed, compress_type=zipfile.ZIP_DEFLATED)
                elif info.filename == records[0]:
                    lines = [ln for ln in src.read(info).decode().splitlines()
                             if ln and not ln.startswith(member + ",")]
                    if narrowed is not None:
                        lines = [f"{meta_name},{_record_hash(narrowed)},{len(narrowed)}"
                                 if ln.startswith(meta_name + ",") else ln for ln in lines]
                    lines.insert(len(lines) - 1 if lines and lines[-1].startswith(records[0]) else len(lines),
                                 f"{member},{_record_hash(data)},{len(data)}")
                    dst.writestr(info, "\n".join(lines) + "\n", compress_type=zipfile.ZIP_DEFLATED)
                else:
                    with src.open(info) as fin, dst.open(info, "w") as fout:
                        shutil.copyfileobj(fin, fout)
            dst.writestr(zipfile.ZipInfo(member, date_time=(2020, 1, 1, 0, 0, 0)), data,
                         compress_type=zipfile.ZIP_DEFLATED)
    tmp.replace(wheel)
    return member


def stamp(out: Path, manifest: dict[str, Any], *, project: str = "vllm", version: str | None = None,
          requires: Mapping[str, str] | None = None) -> list[str]:
    """Write the manifest beside the wheels in ``out`` and into the ``project`` wheel(s); with ``version``, only
    into that version's wheel (``out`` may hold wheels of earlier builds, which this manifest does not describe);
    ``requires`` narrows their Requires-Dist (the pin's serving ranges)."""
    wheels = sorted(out.glob("*.whl"))
    if not wheels:
        raise BuildError(f"no wheels in {out}: expected the build steps to have written them")
    norm = project.replace("-", "_").lower()
    mine = [w for w in wheels if w.name.split("-", 1)[0].replace("-", "_").lower() == norm
            and (version is None or w.name.split("-")[1] == version)]
    if version is not None and not mine:
        raise BuildError(
            f"no {project} {version} wheel in {out}: expected {norm}-{version}-*.whl, found "
            f"{', '.join(w.name for w in wheels)}",
            hint="run the build step first, or pass the --cuda and --os the wheel was built with (a Windows "
                 "wheel's version also carries its Windows base)",
        )
    manifest = {**manifest, "wheels": [w.name for w in wheels]}
    (out / MANIFEST_NAME).write_bytes(dumps(manifest))
    for w in mine:
        add_to_wheel(w, manifest, requires)
    return [w.name for w in mine]
