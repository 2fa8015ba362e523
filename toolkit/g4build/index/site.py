"""``g4build index build``: a folder of wheels becomes the index site, whole or not at all.

Each wheel is copied into a staging folder beside the destination and validated there (what is served is the
copy that passed, not a file that may change after the check); one failing wheel stops the build and nothing
is published. The pages are rendered, and the finished site replaces the destination by a rename. The same
wheels and options give the same bytes in every file.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from g4build.errors import UsageError, ValidationError
from g4build.fsutil import staging_dir, sweep_staging
from g4build.index.entry import WheelEntry, read_entry, safe_filename
from g4build.index.pages import SUMMARY, SiteOptions, ordered, render_site
from g4build.validate.wheel import ValidateOptions, ValidationReport, validate_wheel
from g4build.wheelfile.wheelfile import WheelName

_REPO = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?/[A-Za-z0-9._-]+$")
_URL = re.compile(r"^https?://[^\s<>\"'`]+$")

Say = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class IndexResult:
    site: Path
    entries: tuple[WheelEntry, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"site": str(self.site), "projects": sorted({e.project for e in self.entries}),
                "wheels": [e.to_dict() for e in self.entries], "ok": True}


def check_options(options: SiteOptions) -> None:
    if options.base_url is not None and not _URL.match(options.base_url):
        raise UsageError(f"--base-url {options.base_url!r}: expected an http(s) URL without spaces or quotes",
                         hint="e.g. --base-url https://OWNER.github.io/REPO")
    if options.files_url is not None and not _URL.match(options.files_url):
        raise UsageError(f"--files-url {options.files_url!r}: expected an http(s) URL without spaces or quotes",
                         hint="e.g. --files-url https://github.com/OWNER/REPO/releases/download/TAG")
    if options.repo is not None and not _REPO.match(options.repo):
        raise UsageError(f"--repo {options.repo!r}: expected OWNER/NAME of a GitHub repository")
    if options.torch_index is not None and (options.torch_index.count("{cu}") != 1 or
                                            not _URL.match(options.torch_index)):
        raise UsageError(f"--torch-index {options.torch_index!r}: expected an http(s) URL with one {{cu}}",
                         hint="{cu} stands for the wheel's CUDA line: cu130, cu129, ...")


def find_wheels(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise UsageError(f"{folder}: expected a folder of wheels, found {'a file' if folder.exists() else 'nothing'}")
    wheels = sorted(p for p in folder.iterdir() if p.name.endswith(".whl") and p.is_file())
    if not wheels:
        raise UsageError(f"{folder}: expected wheels (*.whl), found none",
                         hint="point it at the folder g4build wheel --out or g4build overlay --out wrote")
    return wheels


def check_destination(out: Path, wheels_dir: Path) -> None:
    """The site replaces ``out``: only an earlier site, an empty folder or nothing may be there."""
    if out.resolve() == wheels_dir.resolve() or wheels_dir.resolve().is_relative_to(out.resolve()):
        raise UsageError(f"--out {out}: the site would replace the folder the wheels are read from",
                         hint="write the site to a folder of its own, e.g. --out site")
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UsageError(f"--out {out}: expected a folder (or nothing), found a file or a link")
    if out.is_dir() and any(out.iterdir()) and not (out / SUMMARY).is_file():
        raise UsageError(f"--out {out}: the folder holds files and is no g4build index site (no {SUMMARY})",
                         hint="the site replaces the whole folder: name an empty or new folder")


def _publish(site: Path, out: Path, stage: Path) -> None:
    """``site`` becomes ``out``; an earlier site moves into the staging folder (removed with it), and comes back
    if the rename fails."""
    previous = stage / "previous"
    if out.exists():
        os.rename(out, previous)
    try:
        os.rename(site, out)
    except BaseException:
        if previous.exists() and not out.exists():
            os.rename(previous, out)
        raise


def _refusal(failed: list[ValidationReport], total: int) -> ValidationError:
    names = "; ".join(f"{Path(r.wheel).name}: {', '.join(c.name for c in r.failures())}" for r in failed)
    first = failed[0].failures()[0]
    return ValidationError(
        f"{len(failed)} of {total} wheel(s) failed validation, so no index was written ({names})",
        hint=f"{first.name}: {first.detail} (g4build validate WHEEL shows every check)",
    )


def build_index(
    wheels_dir: Path, out: Path, options: SiteOptions, *, pin: str | None = None, say: Say | None = None,
) -> IndexResult:
    """Validate every wheel in ``wheels_dir`` and write the index site to ``out`` (replacing an earlier one)."""
    tell = say or (lambda _text: None)
    check_options(options)
    wheels = find_wheels(wheels_dir)
    for wheel in wheels:  # before anything is copied under that name
        WheelName.parse(safe_filename(wheel.name))
    check_destination(out, wheels_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    sweep_staging(out.parent)  # staging folders a killed run left
    with staging_dir(out.parent) as stage:
        site = stage / "site"
        (site / "files").mkdir(parents=True)
        entries, failed = [], []
        for i, wheel in enumerate(wheels, start=1):
            copy = site / "files" / wheel.name
            tell(f"[{i}/{len(wheels)}] copying {wheel.name}")
            shutil.copyfile(wheel, copy)
            tell(f"[{i}/{len(wheels)}] validating {wheel.name}")
            report = validate_wheel(copy, ValidateOptions(pin=pin))
            if not report.ok:
                failed.append(report)
                continue
            entries.append(read_entry(copy))
        if failed:
            raise _refusal(failed, len(wheels))
        tell("writing the pages")
        for rel, data in render_site(entries, options).items():
            path = site / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        _publish(site, out, stage)
    return IndexResult(site=out, entries=tuple(ordered(entries)))
