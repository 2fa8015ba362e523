"""``g4build index build``: a folder of wheels becomes the index site, whole or not at all.

Each wheel is copied into a staging folder beside the destination and validated there (what is served is the
copy that passed, not a file that may change after the check); one failing wheel stops the build and nothing
is published. The pages are rendered, and the finished site replaces the destination by a rename. The same
wheels and options give the same bytes in every file.

Only a folder the tool made is replaced: its g4build-index.json must carry the marker and list every file the
folder holds (``site_problem``). Publishing is two renames, the earlier site set aside under a fixed name beside
``--out`` first; a kill between them leaves it there, where it survives any later failing build until a build
publishes. It is never renamed back to ``--out``: a folder at that name may be one no run set aside, and a build
that fails must not create ``--out``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from g4build.errors import UsageError, ValidationError
from g4build.fsutil import staging_dir, sweep_staging
from g4build.index.entry import WheelEntry, read_entry, safe_filename
from g4build.index.pages import MARKER, SUMMARY, SiteOptions, ordered, render_site
from g4build.validate.wheel import ValidateOptions, ValidationReport, validate_wheel
from g4build.wheelfile.sources import check_wheel_file
from g4build.wheelfile.wheelfile import WheelName

# Checked whole (fullmatch: '$' would let a trailing newline through) and ASCII only: a host, an optional port,
# a path of unreserved characters and '%' escapes. Nothing a shell, a Markdown page or HTML reads specially:
# no whitespace, quotes, '$', backticks, ';', '|', '&', '(', ')', '<', '>', '?', '#'.
_REPO = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/(?!\.\.?$)[A-Za-z0-9._-]{1,100}", re.ASCII)
_URL = re.compile(r"https?://[A-Za-z0-9](?:[A-Za-z0-9.-]{0,252})(?::[0-9]{1,5})?(?:/[A-Za-z0-9._~%/+-]*)?",
                  re.ASCII)
SUMMARY_MAX_BYTES = 64 << 20

Say = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class IndexResult:
    site: Path
    entries: tuple[WheelEntry, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"site": str(self.site), "projects": sorted({e.project for e in self.entries}),
                "wheels": [e.to_dict() for e in self.entries], "ok": True}


_URL_TEXT = ("an http(s) URL of ASCII letters, digits and . _ ~ % / + - (no spaces, line breaks, quotes, query or "
             "shell characters such as $ ` ; | &)")


def check_options(options: SiteOptions) -> None:
    if options.base_url is not None and not _URL.fullmatch(options.base_url):
        raise UsageError(f"--base-url {options.base_url!r}: expected {_URL_TEXT}",
                         hint="e.g. --base-url https://OWNER.github.io/REPO")
    if options.files_url is not None and not _URL.fullmatch(options.files_url):
        raise UsageError(f"--files-url {options.files_url!r}: expected {_URL_TEXT}",
                         hint="e.g. --files-url https://github.com/OWNER/REPO/releases/download/TAG")
    if options.repo is not None and not _REPO.fullmatch(options.repo):
        raise UsageError(f"--repo {options.repo!r}: expected OWNER/NAME of a GitHub repository (ASCII letters, "
                         "digits and - in OWNER; . _ - also in NAME)", hint="e.g. --repo octo-org/g4build")
    if options.torch_index is not None and (options.torch_index.count("{cu}") != 1 or
                                            not _URL.fullmatch(options.torch_index.replace("{cu}", "cu130"))):
        raise UsageError(f"--torch-index {options.torch_index!r}: expected {_URL_TEXT}, with one {{cu}}",
                         hint="{cu} stands for the wheel's CUDA line: cu130, cu129, ...")


def find_wheels(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise UsageError(f"{folder}: expected a folder of wheels, found {'a file' if folder.exists() else 'nothing'}")
    wheels = sorted(p for p in folder.iterdir() if p.name.endswith(".whl") and not p.is_dir())
    if not wheels:
        raise UsageError(f"{folder}: expected wheels (*.whl), found none",
                         hint="point it at the folder g4build wheel --out or g4build overlay --out wrote")
    return wheels


def check_unique(wheels: list[Path]) -> None:
    """One file per project, version and tag, compared as an installer does (PEP 503 names, PEP 440 versions,
    tags in lower case): ``VLLM-0.21.0-...``, ``vllm-0.021.0-...`` and ``vllm-0.21.0.0-...`` are one wheel to pip,
    served twice. Versions are compared as ``Version`` objects, not as text: 0.21.0 == 0.21.0.0 under PEP 440
    (trailing zeros of the release do not count), though their normalised texts differ."""
    seen: dict[tuple[str, Version, str], str] = {}
    for wheel in wheels:
        name = WheelName.parse(wheel.name)
        for tag in name.tags:
            key = (name.project, Version(str(name.version)), tag.lower())
            if key in seen:
                raise ValidationError(
                    f"{seen[key]} and {wheel.name}: two wheels for {name.project} {name.version} ({tag}); an index "
                    "serves one file per project, version and tags (names compared as PEP 503 and PEP 440 "
                    "normalise them), so no index was written", hint="keep one of the two in the folder")
            seen[key] = wheel.name


def _summary_of(folder: Path) -> dict[str, Any] | str:
    """The folder's summary, or why it is not one ``index build`` wrote."""
    path = folder / SUMMARY
    try:
        info = path.lstat()
    except FileNotFoundError:
        return f"no {SUMMARY}"
    if not stat.S_ISREG(info.st_mode) or info.st_size > SUMMARY_MAX_BYTES:
        return f"its {SUMMARY} is not a regular file of at most {SUMMARY_MAX_BYTES} bytes"
    try:
        data = json.loads(path.read_bytes())
    except (ValueError, RecursionError):
        data = None
    if not (isinstance(data, dict) and data.get("generator") == "g4build index" and data.get("marker") == MARKER
            and isinstance(data.get("site_files"), list) and all(isinstance(f, str) for f in data["site_files"])):
        return f"its {SUMMARY} is not the record index build writes (marker {MARKER!r} and its list of files)"
    return data


def _unreadable(exc: OSError) -> None:
    raise exc  # a folder that cannot be listed may hold anything: not replaced unseen


def site_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a site ``index build`` wrote (None: it is, holding nothing the site did not write)."""
    data = _summary_of(folder)
    if isinstance(data, str):
        return data
    listed = {*data["site_files"], SUMMARY}
    parents = {p.as_posix() for f in listed for p in Path(f).parents}
    extra = []
    for root, dirs, files in os.walk(folder, onerror=_unreadable):
        for name in (*dirs, *files):
            path = Path(root, name)
            rel = path.relative_to(folder).as_posix()
            kind = path.lstat().st_mode
            if not ((stat.S_ISDIR(kind) and rel in parents) or (stat.S_ISREG(kind) and rel in listed)):
                extra.append(rel)
        dirs[:] = [d for d in dirs if not Path(root, d).is_symlink()]
    if extra:
        shown = ", ".join(sorted(extra)[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        return f"it holds files the site did not write ({shown})"
    return None


def check_destination(out: Path, wheels_dir: Path) -> None:
    """The site replaces ``out``: only a site this tool wrote, an empty folder or nothing may be there."""
    if out.resolve() == wheels_dir.resolve() or wheels_dir.resolve().is_relative_to(out.resolve()):
        raise UsageError(f"--out {out}: the site would replace the folder the wheels are read from",
                         hint="write the site to a folder of its own, e.g. --out site")
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UsageError(f"--out {out}: expected a folder (or nothing), found a file or a link")
    if out.is_dir() and any(out.iterdir()) and (why := site_problem(out)):
        raise UsageError(f"--out {out}: the folder holds files and is no g4build index site: {why}; it was left "
                         "as it is", hint="the site replaces the whole folder: name an empty or new folder")


def aside_of(out: Path) -> Path:
    """Where publishing sets the earlier site aside: beside ``out``, a fixed name the next run looks for."""
    return out.with_name(f".{out.name}.g4build-previous")


def recover(out: Path) -> str | None:
    """Finish what a killed publish left at the aside name: removed when ``out`` is there (killed after the
    renames); when ``out`` is gone (killed between them, or a folder planted there) it is left where it is and
    nothing becomes ``out`` until this build publishes, which then drops it: a build that fails leaves ``out``
    absent, never filled from the aside name. Says what it did."""
    aside = aside_of(out)
    if not os.path.lexists(aside):
        return None
    if aside.is_symlink() or not aside.is_dir():
        why: str | None = "it is a link or a file"
    else:  # an empty folder was set aside as well as a site (--out may name an empty folder)
        why = site_problem(aside) if any(aside.iterdir()) else None
    if why:
        raise UsageError(f"{aside}: expected an earlier index site a killed run set aside, found something else "
                         f"({why}); nothing was changed", hint=f"move {aside} away, then run again")
    if not os.path.lexists(out):
        return (f"found an earlier site a killed run set aside ({aside}); it is replaced once this build "
                "publishes, and left there if the build fails")
    with staging_dir(out.parent) as stage:
        os.rename(aside, stage / "previous")  # one rename, then removed with the staging folder (or by a sweep)
    return f"removed the earlier site a killed run had set aside ({aside})"


def _publish(site: Path, out: Path, stage: Path) -> None:
    """``site`` becomes ``out``; an earlier site is set aside first (``aside_of``), put back if the second rename
    fails, and once the new site is in place moved into the staging folder, removed with it: a kill while it
    is removed leaves a staging folder the next run sweeps, not a half site at the aside name."""
    aside = aside_of(out)
    had = os.path.lexists(out)
    if had:
        os.rename(out, aside)
    try:
        os.rename(site, out)
    except BaseException:
        if had and not os.path.lexists(out):
            os.rename(aside, out)
        raise
    if os.path.lexists(aside):  # the earlier site, or one a killed run left beside a missing out (``recover``)
        os.rename(aside, stage / "previous")


@contextmanager
def _writing(out: Path) -> Iterator[None]:
    """An OSError while the site is written (a read-only or full folder) is a usage error naming the place."""
    try:
        yield
    except OSError as exc:
        where = exc.filename or out
        raise UsageError(f"--out {out}: the site could not be written ({exc.strerror or exc}: {where})",
                         hint=f"name a folder you can write to: the site is built beside it, in {out.parent}, "
                              "and renamed into place") from exc


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
    for wheel in wheels:  # before anything is copied under that name, or read
        WheelName.parse(safe_filename(wheel.name))
        try:
            check_wheel_file(wheel)
        except OSError as exc:
            why = f"{wheel}: cannot be read ({exc.strerror})" if exc.strerror else str(exc)
            raise ValidationError(f"{why}, so no index was written", hint="keep only wheel files in the folder") \
                from exc
    check_unique(wheels)
    with _writing(out):
        if (done := recover(out)) is not None:
            tell(done)
        check_destination(out, wheels_dir)
        out.parent.mkdir(parents=True, exist_ok=True)
        sweep_staging(out.parent)  # staging folders a killed run left
        entries = _build(wheels, out, options, pin, tell)
    return IndexResult(site=out, entries=tuple(ordered(entries)))


def _build(wheels: list[Path], out: Path, options: SiteOptions, pin: str | None, tell: Say) -> list[WheelEntry]:
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
    return entries
