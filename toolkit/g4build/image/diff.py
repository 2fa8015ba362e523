"""Compare an image's installed vLLM Python files with the pin's pristine tree and write the difference as a series.

The patch is rendered by git itself (a scratch repository: pristine files committed, the image's files on
top, ``git diff --cached``), so it is a git-style diff with ``a/`` ``b/`` prefixes that ``git apply`` takes.
Noise is filtered by rules kept here as data: byte code, compiled objects, the version file written at build
time, and the folders the build copies in from other projects (FlashAttention, DeepGEMM, triton_kernels).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from g4build.errors import ImageError, PatchConflictError
from g4build.image.layers import resolve_in_root
from g4build.series import yamlfile as series_yaml
from g4build.series.model import load_series
from g4build.util import gitsafe
from g4build.util.gitsafe import is_vcs_name

PACKAGE = "vllm"
SITE_DIRS = ("site-packages", "dist-packages")
SOURCE_SUFFIXES = (".py", ".pyi")
NOISE_PARTS = frozenset({"__pycache__"})
# Files the build writes or copies in from other repositories: present in a wheel, never in the sdist.
GENERATED = (
    "vllm/_version.py",
    "vllm/third_party/deep_gemm/",
    "vllm/third_party/triton_kernels/",
    "vllm/third_party/flashmla/",
    "vllm/vllm_flash_attn/cute/",
    "vllm/vllm_flash_attn/layers/",
    "vllm/vllm_flash_attn/ops/",
)
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "g4build",
    "GIT_AUTHOR_EMAIL": "g4build@localhost",
    "GIT_COMMITTER_NAME": "g4build",
    "GIT_COMMITTER_EMAIL": "g4build@localhost",
    "GIT_CONFIG_NOSYSTEM": "1",
}


@dataclass(frozen=True, kw_only=True)
class FileChanges:
    modified: tuple[str, ...]
    added: tuple[str, ...]
    missing: tuple[str, ...]  # in the pin's tree, not in the image: reported, never turned into deletions

    @property
    def empty(self) -> bool:
        return not (self.modified or self.added)


def is_noise(rel: str) -> bool:
    """True for files that never belong in a series (``rel`` is package-relative, e.g. ``vllm/x/y.py``)."""
    parts = rel.split("/")
    if NOISE_PARTS.intersection(parts) or any(is_vcs_name(p) for p in parts) or not rel.endswith(SOURCE_SUFFIXES):
        return True
    return any(rel == g or (g.endswith("/") and rel.startswith(g)) for g in GENERATED)


def selects_package_file(rel: str, package_dir: str | None = None, package: str = PACKAGE,
                         sub: str = "") -> bool:
    """Which image files to write while unpacking: ``package`` (or its ``sub`` folder) under a site folder, and
    its dist-info; or anything under ``package_dir``."""
    if package_dir is not None and rel.startswith(package_dir.strip("/") + "/"):
        return True
    parts = rel.split("/")
    for i, part in enumerate(parts[:-1]):
        if part in SITE_DIRS:
            below = "/".join(parts[i + 1:])
            if below.startswith(package + "-") and parts[i + 1].endswith(".dist-info"):
                return True
            return package_dir is None and below.startswith(f"{package}/{sub}".rstrip("/") + "/")
    return False


def find_package(root: Path, package_dir: str | None = None) -> Path:
    """The image's installed ``vllm`` folder inside the unpacked ``root``."""
    if package_dir is not None:
        rel = resolve_in_root(root, package_dir.strip("/"), follow_final=True)
        found = root / rel
        if not (found / "__init__.py").is_file():
            raise ImageError(f"the image has no Python package at {package_dir} (no __init__.py there)")
        return found
    hits: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here.name == PACKAGE and here.parent.name in SITE_DIRS and "__init__.py" in filenames:
            hits.append(here)
            dirnames.clear()
    if not hits:
        raise ImageError(
            "the image has no installed vllm package (no site-packages/vllm/__init__.py)",
            hint="if vLLM is installed elsewhere in the image, name its folder with --package-dir",
        )
    if len(hits) > 1:
        where = ", ".join("/" + h.relative_to(root).as_posix() for h in hits)
        raise ImageError(f"the image has {len(hits)} vllm packages: {where}", hint="choose one with --package-dir")
    return hits[0]


def installed_version(package: Path, name: str = PACKAGE) -> str | None:
    """The version from the ``<name>-*.dist-info/METADATA`` beside the package, if any."""
    for info in sorted(package.parent.glob(f"{name}-*.dist-info")):
        meta = info / "METADATA"
        if meta.is_file() and not meta.is_symlink() and not info.is_symlink():  # never read through a link
            m = re.search(r"^Version:\s*(\S+)", meta.read_text(encoding="utf-8", errors="replace"), re.M)
            if m:
                return m.group(1)
    return None


def package_files(root: Path, package: Path, prefix: str = PACKAGE) -> dict[str, Path]:
    """``<prefix>/...`` names -> host files under ``package`` (links resolved inside ``root``), noise out."""
    found: dict[str, Path] = {}
    for dirpath, _dirnames, filenames in os.walk(package):
        for name in filenames:
            host = Path(dirpath) / name
            rel = prefix + "/" + host.relative_to(package).as_posix()
            if is_noise(rel):
                continue
            if host.is_symlink():
                host = root / resolve_in_root(root, host.relative_to(root).as_posix(), follow_final=True)
                if host.is_symlink() or not host.is_file():
                    continue
            found[rel] = host
    return found


def tree_files(tree: Path) -> dict[str, Path]:
    """The same mapping for a source tree (the pin's sdist or checkout), whose package sits at ``tree/vllm``."""
    base = tree / PACKAGE
    if not (base / "__init__.py").is_file():
        raise ImageError(f"{tree} is not a vLLM source tree (no {PACKAGE}/__init__.py)")
    return package_files(tree, base)


def compare(pristine: dict[str, Path], image: dict[str, Path]) -> FileChanges:
    modified = [r for r in sorted(pristine.keys() & image.keys()) if pristine[r].read_bytes() != image[r].read_bytes()]
    return FileChanges(
        modified=tuple(modified),
        added=tuple(sorted(image.keys() - pristine.keys())),
        missing=tuple(sorted(pristine.keys() - image.keys())),
    )


def _git(args: list[str], cwd: Path) -> str:
    env = gitsafe.env({**os.environ, **_GIT_ENV})
    proc = subprocess.run(["git", *gitsafe.config_args(), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, encoding="utf-8", errors="surrogateescape", check=False)
    if proc.returncode != 0:
        raise ImageError(f"git {' '.join(args)} failed in a scratch repository: {proc.stderr.strip()}")
    return proc.stdout


def render_patch(pristine: dict[str, Path], image: dict[str, Path], changes: FileChanges) -> str:
    """A git-style unified diff taking the pristine files of ``changes`` to the image's versions."""
    with tempfile.TemporaryDirectory(prefix="g4build-diff-") as tmp:
        repo = Path(tmp)
        _git(["init", "-q"], repo)
        for rel in changes.modified:
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(pristine[rel], repo / rel)
        _git(["add", "-A"], repo)
        _git(["commit", "-q", "--allow-empty", "-m", "pristine"], repo)
        for rel in (*changes.modified, *changes.added):
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(image[rel], repo / rel)
        _git(["add", "-A"], repo)
        return _git(["diff", "--cached", "--no-color", "--no-renames", "--no-ext-diff", "--binary"], repo)


def check_applies(patch: Path, tree: Path) -> None:
    """``git apply --check`` the patch against ``tree`` (nothing is written).

    Repository discovery stops at ``tree``: run inside a sub-folder of some other repository, ``git apply``
    would silently skip paths outside that sub-folder and the check would prove nothing.
    """
    env = gitsafe.env({**os.environ, "GIT_CEILING_DIRECTORIES": str(tree.resolve().parent)})
    proc = subprocess.run(["git", *gitsafe.config_args(), "apply", "--check", "--whitespace=nowarn",
                           str(patch.resolve())], cwd=tree, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise PatchConflictError(
            f"the extracted patch does not apply to the pin's tree: {proc.stderr.strip()}",
            hint="this is a g4build bug; please report it with the image reference",
        )


def series_metadata(
    *, name: str, pin: str, origin: str, patches: list[dict[str, str]], note: str, title: str, why: str,
) -> dict[str, Any]:
    return {
        "name": name,
        "version": 1,
        "title": title,
        "why": why,
        "refs": [],
        "origin": origin,
        "bug": "",
        "forwarded": "no",
        "applied_upstream": None,
        "python_only": True,
        "pins": {pin: {"patches": patches, "fingerprints": {}, "note": note}},
    }


def write_series_folder(out: Path, metadata: dict[str, Any], files: dict[str, str],
                        checks: list[tuple[str, Path]]) -> Path:
    """Write ``out/series.yaml`` and ``files`` atomically: a folder of ``out``'s name in a temporary sibling,
    each patch in ``checks`` (file, tree) checked with ``git apply --check``, the series loaded as g4build
    loads series, then one rename."""
    if out.exists():
        raise ImageError(f"{out} already exists; a new series needs a fresh folder",
                         hint="choose another name with --series or --out, or remove the folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tmp = scratch / out.name  # the series loader wants the folder named as the series
    try:
        tmp.mkdir()
        for rel, text in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text, encoding="utf-8", errors="surrogateescape", newline="\n")
        (tmp / "series.yaml").write_text(series_yaml.dump(metadata), encoding="utf-8")
        for rel, tree in checks:
            check_applies(tmp / rel, tree)
        load_series(tmp)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out
