"""Optional: the image's transformers Gemma 4 model files, diffed against the same transformers release.

A vLLM series cannot carry a transformers change (its patches apply to the vLLM tree), so this part is
written beside the series, not into the pin's patch list: ``transformers-<version>/0001-gemma4-from-image.patch``
when that release is on the package index (the patch is checked against the release's own files), otherwise
the image's files as they are under ``transformers-<version>/gemma4/`` (a build from git has no release to
diff against).
"""

from __future__ import annotations

import tempfile
import zipfile
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from g4build.errors import DownloadError, ImageError
from g4build.image.diff import (
    check_applies,
    compare,
    installed_version,
    package_files,
    render_patch,
    selects_package_file,
)
from g4build.image.layers import clean_member_name, resolve_in_root
from g4build.pins.index import cache_root, fetch_verified, project_files

PACKAGE = "transformers"
SUB = "models/gemma4"
PREFIX = f"{PACKAGE}/{SUB}"


@dataclass(frozen=True, kw_only=True)
class TransformersPart:
    version: str
    modified: tuple[str, ...]
    added: tuple[str, ...]
    files: dict[str, str]  # series-folder-relative path -> text to write
    patch: str | None  # the patch's series-folder-relative path, when diffed against a release
    note: str

    @property
    def empty(self) -> bool:
        return not self.files


def selects(rel: str) -> bool:
    return selects_package_file(rel, None, package=PACKAGE, sub=SUB)


def release_files(version: str, dest: Path) -> dict[str, Path] | None:
    """The release wheel's gemma4 files unpacked under ``dest`` (None when the index has no such release)."""
    wanted = f"{PACKAGE}-{version}-py3-none-any.whl"
    try:
        if not any(f.filename == wanted for f in project_files(PACKAGE)):
            return None
        wheel = fetch_verified(PACKAGE, wanted, None, cache_dir=cache_root() / "wheels")
    except DownloadError:
        return None
    found: dict[str, Path] = {}
    with zipfile.ZipFile(wheel.path) as zf:
        for name in zf.namelist():
            rel = clean_member_name(name)
            if rel and rel.startswith(PREFIX + "/") and rel.endswith(".py") and "__pycache__" not in rel:
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(name))
                found[rel] = target
    return found


def diff_gemma4(root: Path, site: Path) -> TransformersPart:
    """Compare ``site/transformers/models/gemma4`` of the unpacked image with the same transformers release."""
    # resolved inside the image: a link in the image must never lead this walk into the host's folders
    model = root / resolve_in_root(root, (site / PACKAGE / SUB).relative_to(root).as_posix(), follow_final=True)
    version = installed_version(site / PACKAGE, PACKAGE)
    if not model.is_dir() or version is None:
        where = "/" + model.relative_to(root).as_posix()
        raise ImageError(
            f"the image has no installed transformers with Gemma 4 model files next to vLLM ({where})",
            hint="leave out --transformers for this image",
        )
    image = package_files(root, model, prefix=PREFIX)
    folder = f"{PACKAGE}-{version}"
    with ExitStack() as stack:
        scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="g4build-transformers-")))
        release = release_files(version, scratch)
        if release is None:
            files = {f"{folder}/gemma4/{rel[len(PREFIX) + 1:]}": host.read_text(encoding="utf-8", errors="replace")
                     for rel, host in sorted(image.items())}
            return TransformersPart(
                version=version, modified=(), added=tuple(sorted(image)), files=files, patch=None,
                note=f"transformers {version} is not a release on the package index: its Gemma 4 files are kept "
                     f"as they are in {folder}/gemma4/",
            )
        changes = compare(release, image)
        if changes.empty:
            return TransformersPart(version=version, modified=(), added=(), files={}, patch=None,
                                    note=f"transformers {version}'s Gemma 4 files equal the release")
        text = render_patch(release, image, changes)
        patch = f"{folder}/0001-gemma4-from-image.patch"
        check_file = scratch / "check.patch"
        check_file.write_text(text, encoding="utf-8", errors="surrogateescape", newline="\n")
        check_applies(check_file, scratch)
        return TransformersPart(
            version=version, modified=changes.modified, added=changes.added, files={patch: text}, patch=patch,
            note=f"{patch} changes transformers {version}'s Gemma 4 files as the image does (apply it in "
                 f"site-packages; it is not part of the vLLM patches)",
        )
