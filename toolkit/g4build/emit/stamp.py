"""Put build-manifest.json beside the wheels and inside the vLLM wheel's ``*.dist-info/`` (RECORD updated).

Only ``--out`` is written: each rewrite goes to a temporary file of its own beside the wheel (created with
O_EXCL under a random name, so a planted ``<final>.whl.tmp`` link is never followed), renamed over the target;
a SIGTERM or Ctrl-C removes it again. One stamp holds ``--out``'s lock at a time, every wheel's new name is
planned before any is written (two wheels that would take one name are refused, none touched), and members
are inflated within the limits validate uses.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import threading
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from g4build.errors import BuildError
from g4build.fsutil import umasked, write_atomic
from g4build.pins.index import cache_lock
from g4build.util.faults import fault
from g4build.validate.tags import expected_tag, read_tag_facts
from g4build.wheelfile.manifestfile import MANIFEST_NAME, dumps
from g4build.wheelfile.safety import check_limits, read_small
from g4build.wheelfile.wheelfile import metadata_fields, narrow_requires_dist, record_hash

LOCK = ".g4build-manifest"  # out/.g4build-manifest.lock: two stamps of one --out take turns


def _text(raw: bytes, wheel: Path, name: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BuildError(f"{wheel.name}: {name} is not UTF-8 (byte {exc.start}): expected the text a build "
                         "backend writes", hint="rebuild the wheel; g4build rewrites only well-formed wheels") from None


def _record_line(line: str, rewritten: Mapping[str, bytes]) -> str:
    name = line.split(",", 1)[0]
    new = rewritten.get(name)
    return line if new is None else f"{name},{record_hash(new)},{len(new)}"


def _retagged(wheel_text: str, tag: str) -> bytes:
    """The dist-info WHEEL file with its Tag lines replaced by ``tag`` (other lines kept, in order)."""
    lines = wheel_text.splitlines()
    kept = [ln for ln in lines if not ln.startswith("Tag:")]
    at = next((i for i, ln in enumerate(lines) if ln.startswith("Tag:")), len(kept))
    return ("\n".join([*kept[:at], f"Tag: {tag}", *kept[at:]]) + "\n").encode()


def top_dist_info(names: list[str], wheel: Path) -> str:
    """The wheel's own ``*.dist-info`` folder: the one at the top (a vendored package's nested one is content)."""
    records = [n for n in names if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
    if len(records) != 1:
        raise BuildError(f"{wheel.name}: expected one *.dist-info/RECORD at the top, found {len(records)}",
                         hint="this is no wheel a build backend makes")
    return records[0].rsplit("/", 1)[0]


@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """SIGTERM (a CI job cancelled, `kill`) unwinds like Ctrl-C, so each rewrite's cleanup runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    before = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def final_name(wheel: Path, tag: str | None) -> str:
    return wheel.name if tag is None else "-".join([*wheel.name[:-len(".whl")].split("-")[:-3], tag]) + ".whl"


def add_to_wheel(wheel: Path, manifest: dict[str, Any], requires: Mapping[str, str] | None = None,
                 tag: str | None = None) -> Path:
    """Rewrite ``wheel`` with the manifest in its dist-info, with ``requires`` (project -> specifiers) its
    METADATA's Requires-Dist narrowed to them, and with ``tag`` its WHEEL file's tags and its filename changed
    to that one tag (RECORD's lines for all three recomputed); other members are copied as they are. Returns
    the wheel's path (a new name when retagged: the old file is gone then)."""
    data = dumps(manifest)
    target = wheel.with_name(final_name(wheel, tag))
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=wheel.parent)  # O_EXCL, 0600
    tmp = Path(tmp_name)
    try:
        with zipfile.ZipFile(wheel) as src, os.fdopen(fd, "w+b") as sink:
            check_limits(src.infolist(), wheel.name)
            names = src.namelist()
            dist_info = top_dist_info(names, wheel)
            record, member = f"{dist_info}/RECORD", f"{dist_info}/{MANIFEST_NAME}"
            meta_name, wheel_name = f"{dist_info}/METADATA", f"{dist_info}/WHEEL"

            def text(name: str) -> str:
                return _text(read_small(src, name, wheel.name), wheel, name)

            metadata = text(meta_name).encode() if requires and meta_name in names else None
            narrowed = narrow_requires_dist(metadata, requires or {}) if metadata is not None else None
            tags_file = _retagged(text(wheel_name), tag) if tag is not None and wheel_name in names else None
            rewritten = {n: b for n, b in ((meta_name, narrowed), (wheel_name, tags_file)) if b is not None}
            with zipfile.ZipFile(sink, "w") as dst:
                for info in src.infolist():
                    if info.filename == member:
                        continue
                    if info.filename in rewritten:
                        dst.writestr(info, rewritten[info.filename], compress_type=zipfile.ZIP_DEFLATED)
                    elif info.filename == record:
                        lines = [ln for ln in text(record).splitlines() if ln and not ln.startswith(member + ",")]
                        lines = [_record_line(ln, rewritten) for ln in lines]
                        lines.insert(len(lines) - 1 if lines and lines[-1].startswith(record) else len(lines),
                                     f"{member},{record_hash(data)},{len(data)}")
                        dst.writestr(info, "\n".join(lines) + "\n", compress_type=zipfile.ZIP_DEFLATED)
                    else:
                        with src.open(info) as fin, dst.open(info, "w") as fout:
                            shutil.copyfileobj(fin, fout)
                        fault("stamp-mid-rewrite")
                dst.writestr(zipfile.ZipInfo(member, date_time=(2020, 1, 1, 0, 0, 0)), data,
                             compress_type=zipfile.ZIP_DEFLATED)
        if os.name != "nt":  # mkstemp's 0600: the wheel keeps the mode a new file gets here
            os.chmod(tmp, umasked(0o644))
        os.replace(tmp, target)
    except BaseException:  # an interrupt, SIGTERM or a full disk: no half-written copy left beside the wheel
        tmp.unlink(missing_ok=True)
        raise
    if target != wheel:
        wheel.unlink()
    return target


def retag_for(wheel: Path) -> tuple[str, list[str]]:
    """The one tag a Linux wheel's libraries justify (validate.tags), and why; its current tag when there is
    nothing better to say (a Windows or pure-Python wheel). A library that cannot be read or binds a version
    no real release has is refused: no tag is guessed for it."""
    current = "-".join(wheel.name[:-len(".whl")].split("-")[-3:])
    with zipfile.ZipFile(wheel) as zf:  # METADATA read within its own limit; the members' sizes are read_tag_facts'
        meta = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        raw = read_small(zf, meta[0], wheel.name) if len(meta) == 1 else b""
        fields = metadata_fields(_text(raw, wheel, meta[0]).encode()) if raw else {}
    if "." in current.split("-")[0]:  # a compressed tag set (py2.py3-none-any): not ours to change
        return current, ["compressed tag set kept"]
    facts = read_tag_facts(wheel)
    if refusals := facts.refusals():
        raise BuildError(f"{wheel.name}: cannot tag it: {'; '.join(refusals[:3])}",
                         hint="a real build's libraries are well-formed; rebuild the wheel, and validate it")
    return expected_tag(current, facts, fields.get("requires-python"))


def _plan(out: Path, mine: list[Path], retag: bool) -> tuple[dict[str, tuple[Path, str | None]], dict[str, list[str]]]:
    """Each final name -> (the wheel that becomes it, its tag), refusing two wheels that would take one name
    before any is written. A wheel already at a final name (an earlier run's output) is replaced by the fresh
    build that takes it; two fresh ones, or a wheel that would be overwritten before it is stamped, refuse."""
    sources: dict[str, list[tuple[Path, str | None]]] = {}
    why: dict[str, list[str]] = {}
    for w in mine:
        tag, reasons = retag_for(w) if retag else (None, [])
        final = final_name(w, tag)
        sources.setdefault(final, []).append((w, tag))
        why.setdefault(final, reasons)
        if w.name != final:
            why[final] = reasons
    planned: dict[str, tuple[Path, str | None]] = {}
    for final, ws in sorted(sources.items()):
        fresh = [(w, t) for w, t in ws if w.name != final]
        occupant = out / final
        if len(fresh) > 1 or (occupant.exists() and occupant not in [w for w, _ in ws]):
            names = sorted({*(w.name for w, _ in fresh), *([final] if occupant.exists() else [])})
            raise BuildError(f"{' and '.join(names)} would all become {final}: expected one wheel per name in "
                             f"{out} (nothing was changed)",
                             hint="move the wheels of other builds out of --out, then run the manifest step again")
        planned[final] = fresh[0] if fresh else ws[0]
    return planned, why


def stamp(out: Path, manifest: dict[str, Any], *, project: str = "vllm", version: str | None = None,
          requires: Mapping[str, str] | None = None, retag: bool = False) -> list[str]:
    """Write the manifest beside the wheels in ``out`` and into the ``project`` wheel(s); with ``version``, only
    into that version's wheel (``out`` may hold wheels of earlier builds, which this manifest does not describe);
    ``requires`` narrows their Requires-Dist (the pin's serving ranges); ``retag`` gives each the tag its
    libraries justify (validate.tags: abi3, manylinux_2_X), recorded in the manifest's ``tags``. A wheel already
    at the name a fresh build takes (an earlier run of the same build) is replaced by it. Returns the stamped
    wheels' names."""
    with cache_lock(out / LOCK), _sigterm_exits():
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
        planned, why = _plan(out, mine, retag)
        names = sorted({*(w.name for w in wheels if w not in mine), *planned})  # the names after the retag
        manifest = {**manifest, "wheels": names, **({"tags": {n: why[n] for n in sorted(planned)}} if retag else {})}
        for _, (w, tag) in sorted(planned.items()):
            add_to_wheel(w, manifest, requires, tag=tag)
        # beside the wheels last: an interrupted stamp leaves no manifest naming wheels that are not there
        write_atomic(out / MANIFEST_NAME, dumps(manifest), mode=umasked(0o644))
        return sorted(planned)
