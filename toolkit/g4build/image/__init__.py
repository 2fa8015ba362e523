"""The prepatched-image route: an image's installed vLLM Python files, diffed against a pin, become a series.

    open_image (engine | docker save | OCI layout) -> apply_layers (safe, Python files only)
      -> find_package -> compare with the pin's tree -> render_patch (git) -> write_series_folder (atomic)
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from g4build.data import patches_dir
from g4build.errors import UsageError
from g4build.image import transformers as tf
from g4build.image.diff import (
    FileChanges,
    compare,
    find_package,
    installed_version,
    package_files,
    render_patch,
    selects_package_file,
    series_metadata,
    tree_files,
    write_series_folder,
)
from g4build.image.engine import DockerFactory
from g4build.image.layers import ApplyReport, Limits, apply_layers
from g4build.image.model import ImageInfo, LayerStream
from g4build.image.sources import open_image
from g4build.image.transformers import TransformersPart
from g4build.pins.model import Pin

PATCH_FILE = "0001-python-changes-from-image.patch"
_SERIES_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")


@dataclass(frozen=True, kw_only=True)
class ExtractResult:
    series: str
    folder: Path | None  # None when the image carries no change against the pin
    image: ImageInfo
    pin: str
    image_vllm_version: str | None
    package_path: str  # where vLLM sits inside the image
    changes: FileChanges
    report: ApplyReport
    warnings: tuple[str, ...]
    transformers: TransformersPart | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "series": self.series,
            "folder": str(self.folder) if self.folder else None,
            "image": {"reference": self.image.reference, "digest": self.image.digest, "kind": self.image.kind,
                      "platform": self.image.platform},
            "pin": self.pin,
            "image_vllm_version": self.image_vllm_version,
            "package_path": self.package_path,
            "modified": list(self.changes.modified),
            "added": list(self.changes.added),
            "missing_in_image": list(self.changes.missing),
            "layers": self.report.layers,
            "files_unpacked": self.report.files,
            "skipped": [{"layer": s.layer, "name": s.name, "reason": s.reason, "unsafe": s.unsafe}
                        for s in self.report.skipped],
            "warnings": list(self.warnings),
            "transformers": None if self.transformers is None else {
                "version": self.transformers.version, "modified": list(self.transformers.modified),
                "added": list(self.transformers.added), "patch": self.transformers.patch,
                "files": sorted(self.transformers.files), "note": self.transformers.note,
            },
        }


def default_series_name(reference: str) -> str:
    """``image-<name>-<tag>`` from an image reference (registry and digest dropped)."""
    ref = reference.split("@", 1)[0].rsplit("/", 1)[-1]
    slug = re.sub(r"[^a-z0-9]+", "-", ref.lower()).strip("-") or "unnamed"
    return f"image-{slug}"[:64].rstrip("-")


def resolve_output(reference: str, series: str | None, out: Path | None) -> tuple[str, Path]:
    """The series name and its folder; the folder's name must be the series name (the loader checks it)."""
    name = series or (out.name if out is not None else default_series_name(reference))
    if not _SERIES_NAME.fullmatch(name):
        raise UsageError(f"series name '{name}' is not usable: expected lower-case letters, digits, '.', '_', '-'")
    folder = out if out is not None else patches_dir() / name
    if folder.name != name:
        raise UsageError(f"--out {folder} and --series {name} disagree: a series folder is named after its series",
                         hint=f"use --out {folder.parent / name}, or leave one of the two options out")
    return name, folder


def _version_warnings(found: str | None, pin: Pin) -> list[str]:
    if found is None:
        return ["the image has no vllm dist-info: its vLLM version is unknown; check that --pin matches it"]
    try:
        base = Version(found).base_version
    except InvalidVersion:
        return [f"the image's vLLM version '{found}' is not a version; check that --pin matches it"]
    if base != Version(pin.version).base_version:
        return [f"the image has vLLM {found} but the pin is {pin.version}: the patch also carries every upstream "
                f"change between them; pass the nearest --pin"]
    return []


def extract_series(
    *,
    image: str,
    pin: Pin,
    tree: Path | Callable[[], Path],
    series: str | None = None,
    out: Path | None = None,
    platform: str | None = None,
    package_dir: str | None = None,
    docker_factory: DockerFactory | None = None,
    limits: Limits | None = None,
    workdir: Path | None = None,
    with_transformers: bool = False,
    status: Callable[[str], None] | None = None,
) -> ExtractResult:
    """Unpack ``image``'s vLLM Python files, diff them against ``tree`` (the pin's source) and write a series.

    ``tree`` may be a callable: it is called only once the image has been read, so a bad image fails before
    a long source download. ``with_transformers`` also diffs transformers' Gemma 4 files (see transformers.py).
    """
    say = status or (lambda _msg: None)
    with tempfile.TemporaryDirectory(prefix="g4build-image-", dir=workdir, ignore_cleanup_errors=True) as tmp:
        root = Path(tmp) / "rootfs"
        with open_image(image, platform=platform, docker_factory=docker_factory) as opened:
            info = opened.info
            name, folder = resolve_output(info.reference, series, out)
            say(f"unpacking the Python files of {info.reference} ({info.kind}, {info.platform})")

            def announced() -> Iterator[LayerStream]:
                for i, (label, stream) in enumerate(opened.layers, 1):
                    say(f"unpacking layer {i} ({label}) of {info.reference}")
                    yield label, stream

            report = apply_layers(
                announced(), root, limits=limits,
                select=lambda rel: selects_package_file(rel, package_dir) or (with_transformers and tf.selects(rel)),
            )
        package = find_package(root, package_dir)
        found_version = installed_version(package)
        say(f"comparing {package.relative_to(root).as_posix()} with {pin.name}")
        tree = tree() if callable(tree) else tree
        pristine = tree_files(tree)
        installed = package_files(root, package)
        changes = compare(pristine, installed)
        warnings = _version_warnings(found_version, pin)
        unsafe = report.unsafe
        if unsafe:
            warnings.append(f"{len(unsafe)} image entries tried to leave the image root and were skipped")
        extra = tf.diff_gemma4(root, package.parent) if with_transformers else None
        written: Path | None = None
        if not changes.empty or (extra is not None and not extra.empty):
            files: dict[str, str] = {}
            patches: list[dict[str, str]] = []
            checks: list[tuple[str, Path]] = []
            if not changes.empty:
                patch_file = f"{pin.name}/{PATCH_FILE}"
                files[patch_file] = render_patch(pristine, installed, changes)
                patches.append({"file": patch_file, "subject": f"Python changes carried by image {info.reference}"})
                checks.append((patch_file, tree))
            note = (f"Extracted by g4build image extract from {info.origin} (vLLM {found_version or 'unknown'} in "
                    f"the image): {len(changes.modified)} files changed, {len(changes.added)} added"
                    + (f"; {len(changes.missing)} files of the pin absent from the image were left as they are"
                       if changes.missing else "") + ".")
            if extra is not None and not extra.empty:
                files.update(extra.files)
                note += f" {extra.note}."
            metadata = series_metadata(
                name=name, pin=pin.name, origin=info.origin, patches=patches, note=note,
                title=f"Python changes from image {info.reference}",
                why=("The image ships changed vLLM Python files; carrying them as a series lets g4build rebuild the "
                     "kernels for SM120 from the pinned source with the same Python behaviour."),
            )
            say(f"writing series {name}")
            written = write_series_folder(folder, metadata, files, checks)
        return ExtractResult(
            series=name, folder=written, image=info, pin=pin.name, image_vllm_version=found_version,
            package_path="/" + package.relative_to(root).as_posix(), changes=changes, report=report,
            warnings=tuple(warnings), transformers=extra,
        )


__all__ = ["ExtractResult", "Limits", "default_series_name", "extract_series", "resolve_output"]
