"""One wheel as the index lists it: its file's sha256 and size, its METADATA (served beside it, PEP 658) and
what its build-manifest.json says about pin, series, torch and CUDA.

Everything here comes from the wheel, which is untrusted: the filename is parsed with ``packaging`` and must be
made of the characters a wheel filename may hold before it names a file of the site; the project name is
canonicalised and checked the same way; the manifest's values are kept as plain strings for escaping later.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name

from g4build.errors import ValidationError
from g4build.validate.reading import dist_info_of
from g4build.wheelfile.manifestfile import MANIFEST_NAME, loads
from g4build.wheelfile.wheelfile import WheelName, metadata_fields

# What a wheel filename may hold (PEP 427 with PEP 440 local versions): letters, digits, '.', '_', '+', '-'.
# Nothing that is a path separator, a URL's '#', '?' or '%', or HTML's '<', '>', '&', quotes.
_FILENAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\.whl$")
_PROJECT = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
# ASCII only: \d and str.isdigit take other scripts' digits (Arabic-Indic, fullwidth), which must not reach a page
_CUDA = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}(?:\.[0-9]{1,4})?", re.ASCII)
_CHUNK = 1 << 20


@dataclass(frozen=True, kw_only=True)
class Build:
    """What the wheel's build-manifest.json says (each value a string, '' when the manifest lacks it)."""

    pin: str
    series: tuple[str, ...]  # "name vN"
    torch: str
    cuda: str
    arch: str
    os: str
    route: str
    digest: str

    def to_dict(self) -> dict[str, Any]:
        return {"pin": self.pin, "series": list(self.series), "torch": self.torch, "cuda": self.cuda,
                "arch": self.arch, "os": self.os, "route": self.route, "digest": self.digest}


@dataclass(frozen=True, kw_only=True)
class WheelEntry:
    filename: str
    project: str  # canonical (PEP 503) name
    version: str  # normalised by packaging
    sha256: str
    size: int
    metadata: bytes  # the dist-info's METADATA, served as <file>.metadata
    requires_python: str | None
    build: Build | None  # None: the wheel carries no build-manifest.json

    @property
    def metadata_sha256(self) -> str:
        return hashlib.sha256(self.metadata).hexdigest()

    def to_dict(self) -> dict[str, Any]:
        return {"filename": self.filename, "project": self.project, "version": self.version,
                "sha256": self.sha256, "size": self.size, "metadata_sha256": self.metadata_sha256,
                "requires_python": self.requires_python,
                "build": self.build.to_dict() if self.build else None}


def safe_filename(name: str) -> str:
    """``name`` when it can name a file of the site and a link to it; else ValidationError."""
    if not _FILENAME.match(name) or ".." in name:
        raise ValidationError(
            f"{name!r}: a wheel filename of letters, digits and . _ + - was expected",
            hint="rename the file as its build backend named it (NAME-VERSION-PYTHON-ABI-PLATFORM.whl)",
        )
    return name


def _text(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else str(value)


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def build_of(manifest: dict[str, Any]) -> Build:
    pin, target = _mapping(manifest.get("pin")), _mapping(manifest.get("target"))
    series = [s for s in manifest.get("series", []) if isinstance(s, dict)]
    return Build(
        pin=_text(pin.get("name")),
        series=tuple(f"{_text(s.get('name'))} v{_text(s.get('version'))}" for s in series),
        torch=_text(pin.get("torch")),
        # a build records the CUDA it compiled with; an overlay keeps the pin's
        cuda=_text(target.get("cuda") or pin.get("cuda")),
        arch=_text(target.get("arch")),
        os=_text(target.get("os")),
        route=_text(manifest.get("route")),
        digest=_text(manifest.get("digest")),
    )


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def read_entry(path: Path) -> WheelEntry:
    """The index's view of one (already validated) wheel."""
    name = WheelName.parse(safe_filename(path.name))
    project = str(canonicalize_name(name.name))
    if not _PROJECT.match(project):
        raise ValidationError(f"{path.name}: project name {project!r} is not of ASCII letters, digits and '-'",
                              hint="an index serves projects whose names PEP 503 normalises to [a-z0-9-]")
    with zipfile.ZipFile(path) as zf:
        dist = dist_info_of(zf.namelist())
        if dist is None:
            raise ValidationError(f"{path.name}: expected exactly one *.dist-info folder")
        metadata = zf.read(f"{dist}/METADATA")
        manifest_name = f"{dist}/{MANIFEST_NAME}"
        manifest = loads(zf.read(manifest_name), path.name) if manifest_name in zf.namelist() else None
    requires = metadata_fields(metadata).get("requires-python") or None
    if requires is not None:
        try:
            SpecifierSet(requires)
        except InvalidSpecifier as exc:
            raise ValidationError(f"{path.name}: METADATA Requires-Python {requires!r} is no version specifier",
                                  hint="e.g. Requires-Python: >=3.10; rebuild the wheel with a valid one") from exc
    build = build_of(manifest) if manifest is not None else None
    if build is not None and build.cuda and not _CUDA.fullmatch(build.cuda):
        raise ValidationError(f"{path.name}: its {MANIFEST_NAME} names CUDA {build.cuda[:40]!r}; expected MAJOR.MINOR "
                              "of ASCII digits, e.g. 13.0", hint="rebuild the wheel: its manifest was altered")
    return WheelEntry(
        filename=name.filename, project=project, version=str(name.version), sha256=file_sha256(path),
        size=path.stat().st_size, metadata=metadata, requires_python=requires, build=build,
    )
