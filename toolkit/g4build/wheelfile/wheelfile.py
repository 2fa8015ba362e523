"""Wheel names, METADATA and RECORD: parsing and writing, no I/O beyond the bytes given."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
from collections.abc import Mapping
from dataclasses import dataclass

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from g4build.errors import ValidationError

SUPPORTED_PLATFORMS = ("win_amd64", "linux_x86_64")
_MANYLINUX = re.compile(r"^(manylinux\d*(_\d+_\d+)?|musllinux_\d+_\d+)_x86_64$")
_CPYTHON = re.compile(r"^cp3\d+$")


@dataclass(frozen=True, kw_only=True)
class WheelName:
    filename: str
    name: str  # as spelled in the filename (escaped: '-' -> '_')
    version: Version
    build: str
    tags: tuple[str, ...]  # "interpreter-abi-platform"

    @classmethod
    def parse(cls, filename: str) -> WheelName:
        try:
            _, version, build, tags = parse_wheel_filename(filename)
        except (InvalidWheelFilename, InvalidVersion) as exc:
            raise ValidationError(
                f"{filename}: not a valid wheel filename ({exc})",
                hint="expected NAME-VERSION(-BUILD)?-PYTHON-ABI-PLATFORM.whl",
            ) from exc
        return cls(
            filename=filename,
            name=filename.split("-", 1)[0],
            version=version,
            build="".join(str(p) for p in build),
            tags=tuple(sorted(str(t) for t in tags)),
        )

    @property
    def project(self) -> str:
        return str(canonicalize_name(self.name))

    def with_version(self, version: str) -> str:
        """This filename with another version (tags and build kept)."""
        rest = self.filename[:-len(".whl")].split("-")[2:]
        return "-".join([self.name, version.replace("-", "_"), *rest]) + ".whl"


def tags_fit_target(tags: tuple[str, ...]) -> tuple[bool, str]:
    """True when one tag is CPython (cpXY or abi3) on Windows x64 or Linux x86_64."""
    fitting = []
    for tag in tags:
        interp, abi, plat = tag.split("-")
        plat_ok = plat in SUPPORTED_PLATFORMS or bool(_MANYLINUX.match(plat))
        abi_ok = abi == "abi3" or bool(_CPYTHON.match(abi))
        if plat_ok and abi_ok and _CPYTHON.match(interp):
            fitting.append(tag)
    if fitting:
        return True, f"{', '.join(fitting)} fits win_amd64 / manylinux x86_64 with abi3 or cpXY"
    return False, (
        f"tags {', '.join(tags)}: none is CPython (abi3 or cpXY) on win_amd64, manylinux*_x86_64 or linux_x86_64"
    )


def dist_info_name(name: str, version: str) -> str:
    return f"{name.replace('-', '_')}-{version}.dist-info"


def record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@dataclass(frozen=True, kw_only=True)
class RecordRow:
    path: str
    hash: str  # "sha256=..." or "" (RECORD itself)
    size: str


def parse_record(raw: bytes, where: str) -> list[RecordRow]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{where}: RECORD is not UTF-8") from exc
    rows = []
    for i, fields in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not fields:
            continue
        if len(fields) != 3:
            raise ValidationError(f"{where}: RECORD line {i}: expected 3 fields (path,hash,size), found {len(fields)}")
        rows.append(RecordRow(path=fields[0], hash=fields[1], size=fields[2]))
    return rows


def format_record(rows: list[RecordRow]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in rows:
        writer.writerow([row.path, row.hash, row.size])
    return out.getvalue().encode("utf-8")


def metadata_fields(raw: bytes) -> dict[str, str]:
    """The first value of each header of a METADATA file (the part before the body)."""
    fields: dict[str, str] = {}
    for line in raw.decode("utf-8", "replace").splitlines():
        if not line.strip():
            break
        if line[:1] in (" ", "\t") or ":" not in line:
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    return fields


def set_metadata_version(raw: bytes, version: str) -> bytes:
    """METADATA with its ``Version:`` header replaced; every other byte kept."""
    lines = raw.split(b"\n")
    for i, line in enumerate(lines):
        if not line.strip():
            break
        if line.lower().startswith(b"version:"):
            end = b"\r" if line.endswith(b"\r") else b""
            lines[i] = b"Version: " + version.encode() + end
            return b"\n".join(lines)
    raise ValidationError("METADATA has no Version header")


def _narrowed(text: str, bounds: Mapping[str, str]) -> str | None:
    """A Requires-Dist value with its project's bound added (None: not a bounded project, or not parseable)."""
    try:
        req = Requirement(text)
    except InvalidRequirement:
        return None
    bound = bounds.get(canonicalize_name(req.name))
    if bound is None:
        return None
    req.specifier = SpecifierSet(",".join(s for s in (str(req.specifier), bound) if s))
    return str(req)


def narrow_requires_dist(raw: bytes, bounds: Mapping[str, str]) -> bytes:
    """METADATA whose ``Requires-Dist`` for each project in ``bounds`` (name -> PEP 440 specifiers) also carries
    that bound (both must hold: pip intersects them); a project it does not require yet gets its own line after
    the last header. Every other byte is kept."""
    wanted: dict[str, str] = {str(canonicalize_name(k)): v for k, v in bounds.items() if v}
    if not wanted:
        return raw
    lines = raw.split(b"\n")
    seen: set[str] = set()
    end = len(lines)
    for i, line in enumerate(lines):
        if not line.strip():
            end = i
            break
        key, sep, value = line.partition(b":")
        if not sep or key.strip().lower() != b"requires-dist":
            continue
        cr = b"\r" if value.endswith(b"\r") else b""
        text = value.strip().decode("utf-8", "replace")
        narrowed = _narrowed(text, wanted)
        if narrowed is not None:
            seen.add(canonicalize_name(Requirement(text).name))
            lines[i] = b"Requires-Dist: " + narrowed.encode() + cr
    added = [f"Requires-Dist: {name}{spec}".encode() for name, spec in wanted.items() if name not in seen]
    return b"\n".join(lines[:end] + added + lines[end:])


def extend_local_label(version: Version, digest: str) -> str:
    """``0.21.0+cu132`` -> ``0.21.0+cu132.g4.<digest>``; ``0.21.0`` -> ``0.21.0+g4.<digest>``."""
    label = f"{version.local}.g4.{digest}" if version.local else f"g4.{digest}"
    return f"{version.public}+{label}"


def record_hash_of(sha256: bytes) -> str:
    """RECORD's form of a sha256 digest computed elsewhere (chunk by chunk): urlsafe base64, no padding."""
    return "sha256=" + base64.urlsafe_b64encode(sha256).rstrip(b"=").decode()
