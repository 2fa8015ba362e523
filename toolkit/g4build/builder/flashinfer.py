"""The Windows FlashInfer route: wheels of the pin's FlashInfer version that the user points the build at.

FlashInfer's ahead-of-time build is Linux-only, and the Windows base keeps the pin's ``requirements/cuda.txt``
(its FlashInfer pins limited to non-Windows), so a Windows vLLM wheel brings no FlashInfer. People who build
FlashInfer for Windows publish wheels (``flashinfer_python``, ``flashinfer_jit_cache``, ``flashinfer_cubin``);
``g4build wheel --os windows --flashinfer-wheel PATH=SHA256`` takes them as inputs: names checked when planning
(project, the pin's FlashInfer version, a Windows or pure tag for the build's Python), each file's sha256 checked
before the long compile starts, the files copied beside the vLLM wheel and recorded (file, sha256) in
build-manifest.json, so ``recipe check --wheel`` and the launch scripts know FlashInfer is there and install it.
Without them the manifest records ``source: none`` and the launch scripts turn every FlashInfer path off.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from typing import Any

from packaging.utils import InvalidWheelFilename, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from g4build.errors import IntegrityError, UsageError
from g4build.pins.model import SHA256_RE, Pin

PROJECTS = ("flashinfer-python", "flashinfer-jit-cache", "flashinfer-cubin")


@dataclass(frozen=True, kw_only=True)
class FlashInferWheel:
    path: str  # as the user gave it (a path on the machine that builds)
    sha256: str

    @property
    def filename(self) -> str:
        return PureWindowsPath(self.path).name  # a Windows path; '/' separates there too

    def spec(self) -> str:
        return f"{self.path}={self.sha256}"


def parse_spec(item: str) -> FlashInferWheel:
    """``PATH=SHA256`` (split at the last ``=``: a Windows path may hold none, a sha256 never does)."""
    path, sep, sha = item.rpartition("=")
    sha = sha.strip().lower()
    if not sep or not path or not SHA256_RE.match(sha):
        raise UsageError(f"--flashinfer-wheel {item!r}: expected PATH=SHA256 (the wheel file, '=', its 64-hex "
                         "sha256)", hint="e.g. --flashinfer-wheel C:\\dl\\flashinfer_python-0.6.8.post1-"
                                         "py3-none-any.whl=<sha256 published with it>")
    return FlashInferWheel(path=path, sha256=sha)


def check_names(wheels: Sequence[FlashInferWheel], pin: Pin, python: str) -> None:
    """Refuse, before anything runs, wheels that are not FlashInfer of the pin's version for Windows x64 and the
    build's Python; flashinfer-python (the ``flashinfer`` module) must be among them."""
    seen: dict[str, str] = {}
    for wheel in wheels:
        name = wheel.filename
        try:
            project, version, _build, tags = parse_wheel_filename(name)
        except (InvalidWheelFilename, InvalidVersion) as exc:
            raise UsageError(f"--flashinfer-wheel {name}: not a wheel file name ({exc})") from exc
        if project not in PROJECTS:
            raise UsageError(f"--flashinfer-wheel {name}: expected a wheel of {', '.join(PROJECTS)}, found {project}")
        if version.public != Version(pin.flashinfer).public:
            raise UsageError(f"--flashinfer-wheel {name}: expected FlashInfer {pin.flashinfer} (pin {pin.name}'s "
                             f"requirements/cuda.txt), found {version}",
                             hint=f"use the {pin.flashinfer} wheels: vLLM {pin.version} is tested with that version")
        fits = [t for t in tags if t.platform in ("win_amd64", "any") and _fits_python(t.interpreter, t.abi, python)]
        if not fits:
            raise UsageError(f"--flashinfer-wheel {name}: expected a win_amd64 (or pure) wheel for Python {python}, "
                             f"found tags {', '.join(sorted(str(t) for t in tags))}")
        if project in seen:
            raise UsageError(f"--flashinfer-wheel: two wheels of {project} ({seen[project]}, {name})")
        seen[project] = name
    if wheels and "flashinfer-python" not in seen:
        raise UsageError("--flashinfer-wheel: expected a flashinfer-python wheel among them (it is the `flashinfer` "
                         f"module vLLM imports), found {', '.join(seen.values())}")


def _fits_python(interpreter: str, abi: str, python: str) -> bool:
    """pip's rule for one tag: pure py3, cpXY for this Python, or a cpXY abi3 wheel of an older (or this) 3.Y."""
    minor = int(python.split(".")[1])
    if interpreter.startswith("py3") and abi == "none":
        return True
    if not (interpreter.startswith("cp3") and interpreter[3:].isdigit()):
        return False
    tag_minor = int(interpreter[3:])
    return (tag_minor == minor and abi in (interpreter, "none")) or (abi == "abi3" and tag_minor <= minor)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_and_copy(wheels: Sequence[FlashInferWheel], out: Path) -> list[dict[str, Any]]:
    """Check every file's sha256 (all before any copy), then copy each into ``out`` under its own name (a
    temporary name first, renamed when whole). Returns the manifest's records."""
    for wheel in wheels:
        path = Path(wheel.path)
        if not path.is_file():
            raise UsageError(f"--flashinfer-wheel {wheel.path}: no such file", hint="give the path of the .whl")
        found = sha256_of(path)
        if found != wheel.sha256:
            raise IntegrityError(f"{wheel.path}: expected sha256 {wheel.sha256}, found {found}",
                                 hint="download the wheel again, or check the sha256 published with it")
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for wheel in wheels:
        dest = out / wheel.filename
        if not (dest.is_file() and sha256_of(dest) == wheel.sha256):
            tmp = out / f".{wheel.filename}.part"
            shutil.copyfile(wheel.path, tmp)
            os.replace(tmp, dest)
        records.append({"file": wheel.filename, "sha256": wheel.sha256})
    return records


def manifest_record(pin: Pin, out: Path, wheels: Sequence[FlashInferWheel]) -> dict[str, Any]:
    """build-manifest.json's ``flashinfer`` for a Windows build: the wheels (re-hashed where they lie in ``out``),
    or none."""
    if not wheels:
        return {"source": "none", "version": pin.flashinfer,
                "why": "no Windows FlashInfer wheels were given (g4build wheel --flashinfer-wheel)"}
    records = []
    for wheel in wheels:
        dest = out / wheel.filename
        found = sha256_of(dest) if dest.is_file() else "missing"
        if found != wheel.sha256:
            raise IntegrityError(f"{dest}: expected sha256 {wheel.sha256} (the FlashInfer wheel the build copied "
                                 f"there), found {found}", hint="rerun the build's flashinfer-wheels step")
        records.append({"file": wheel.filename, "sha256": wheel.sha256})
    return {"source": "wheels", "version": pin.flashinfer, "wheels": records}
