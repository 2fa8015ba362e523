"""Put build-manifest.json beside the wheels and inside the vLLM wheel's ``*.dist-info/`` (RECORD updated)."""

from __future__ import annotations

import shutil
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from g4build.errors import BuildError
from g4build.validate.tags import expected_tag, read_tag_facts
from g4build.wheelfile.manifestfile import MANIFEST_NAME, dumps
from g4build.wheelfile.wheelfile import metadata_fields, narrow_requires_dist, record_hash


def _record_line(line: str, rewritten: Mapping[str, bytes]) -> str:
    name = line.split(",", 1)[0]
    new = rewritten.get(name)
    return line if new is None else f"{name},{record_hash(new)},{len(new)}"


def _retagged(wheel_text: bytes, tag: str) -> bytes:
    """The dist-info WHEEL file with its Tag lines replaced by ``tag`` (other lines kept, in order)."""
    lines = wheel_text.decode().splitlines()
    kept = [ln for ln in lines if not ln.startswith("Tag:")]
    at = next((i for i, ln in enumerate(lines) if ln.startswith("Tag:")), len(kept))
    return ("\n".join([*kept[:at], f"Tag: {tag}", *kept[at:]]) + "\n").encode()


def add_to_wheel(wheel: Path, manifest: dict[str, Any], requires: Mapping[str, str] | None = None,
                 tag: str | None = None) -> Path:
    """Rewrite ``wheel`` with the manifest in its dist-info, with ``requires`` (project -> specifiers) its
    METADATA's Requires-Dist narrowed to them, and with ``tag`` its WHEEL file's tags and its filename changed
    to that one tag (RECORD's lines for all three recomputed); other members are copied as they are. Returns
    the wheel's path (a new name when retagged: the old file is gone then)."""
    data = dumps(manifest)
    target = wheel
    if tag is not None:
        target = wheel.with_name("-".join([*wheel.name[:-len(".whl")].split("-")[:-3], tag]) + ".whl")
    tmp = target.with_suffix(".whl.tmp")
    try:
        with zipfile.ZipFile(wheel) as src:
            names = src.namelist()
            records = [n for n in names if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
            if len(records) != 1:
                raise BuildError(f"{wheel.name}: expected one *.dist-info/RECORD, found {len(records)}")
            dist_info = records[0].rsplit("/", 1)[0]
            member = f"{dist_info}/{MANIFEST_NAME}"
            meta_name = f"{dist_info}/METADATA"
            wheel_name = f"{dist_info}/WHEEL"
            metadata = src.read(meta_name) if requires and meta_name in names else None
            narrowed = narrow_requires_dist(metadata, requires or {}) if metadata is not None else None
            tags_file = _retagged(src.read(wheel_name), tag) if tag is not None and wheel_name in names else None
            rewritten = {n: b for n, b in ((meta_name, narrowed), (wheel_name, tags_file)) if b is not None}
            with zipfile.ZipFile(tmp, "w") as dst:
                for info in src.infolist():
                    if info.filename == member:
                        continue
                    if info.filename in rewritten:
                        dst.writestr(info, rewritten[info.filename], compress_type=zipfile.ZIP_DEFLATED)
                    elif info.filename == records[0]:
                        lines = [ln for ln in src.read(info).decode().splitlines()
                                 if ln and not ln.startswith(member + ",")]
                        lines = [_record_line(ln, rewritten) for ln in lines]
                        lines.insert(len(lines) - 1 if lines and lines[-1].startswith(records[0]) else len(lines),
                                     f"{member},{record_hash(data)},{len(data)}")
                        dst.writestr(info, "\n".join(lines) + "\n", compress_type=zipfile.ZIP_DEFLATED)
                    else:
                        with src.open(info) as fin, dst.open(info, "w") as fout:
                            shutil.copyfileobj(fin, fout)
                dst.writestr(zipfile.ZipInfo(member, date_time=(2020, 1, 1, 0, 0, 0)), data,
                             compress_type=zipfile.ZIP_DEFLATED)
        tmp.replace(target)
    except BaseException:  # an interrupt or a full disk: no half-written copy left beside the wheel
        tmp.unlink(missing_ok=True)
        raise
    if target != wheel:
        wheel.unlink()
    return target


def retag_for(wheel: Path) -> tuple[str, list[str]]:
    """The one tag a Linux wheel's libraries justify (validate.tags), and why; its current tag when there is
    nothing better to say (a Windows or pure-Python wheel)."""
    current = "-".join(wheel.name[:-len(".whl")].split("-")[-3:])
    with zipfile.ZipFile(wheel) as zf:
        meta = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        fields = metadata_fields(zf.read(meta[0])) if len(meta) == 1 else {}
    if "." in current.split("-")[0]:  # a compressed tag set (py2.py3-none-any): not ours to change
        return current, ["compressed tag set kept"]
    return expected_tag(current, read_tag_facts(wheel), fields.get("requires-python"))


def stamp(out: Path, manifest: dict[str, Any], *, project: str = "vllm", version: str | None = None,
          requires: Mapping[str, str] | None = None, retag: bool = False) -> list[str]:
    """Write the manifest beside the wheels in ``out`` and into the ``project`` wheel(s); with ``version``, only
    into that version's wheel (``out`` may hold wheels of earlier builds, which this manifest does not describe);
    ``requires`` narrows their Requires-Dist (the pin's serving ranges); ``retag`` gives each the tag its
    libraries justify (validate.tags: abi3, manylinux_2_X), recorded in the manifest's ``tags``. A wheel of the
    same version and tag as a newer one (an earlier run of the same build) is replaced by it. Returns the
    stamped wheels' names."""
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
    planned: dict[str, tuple[Path, str | None]] = {}  # final name -> (newest source, its tag)
    why: dict[str, list[str]] = {}
    for w in sorted(mine, key=lambda p: p.stat().st_mtime):  # the newest of one final name wins
        tag, reasons = retag_for(w) if retag else (None, [])
        final = w.name if tag is None else "-".join([*w.name[:-len(".whl")].split("-")[:-3], tag]) + ".whl"
        planned[final], why[final] = (w, tag), reasons
    chosen = {src for src, _ in planned.values()}
    stale = [w for w in mine if w not in chosen]
    names = sorted({*(w.name for w in wheels if w not in mine), *planned})
    manifest = {**manifest, "wheels": names, **({"tags": {n: why[n] for n in sorted(planned)}} if retag else {})}
    for _, (w, tag) in sorted(planned.items()):
        add_to_wheel(w, manifest, requires, tag=tag)
    for w in stale:  # an older wheel of a final name was replaced by the rewrite itself
        if w.name not in planned:
            w.unlink()
    # beside the wheels last: an interrupted stamp leaves no manifest naming wheels that are not there
    (out / MANIFEST_NAME).write_bytes(dumps(manifest))
    return sorted(planned)
