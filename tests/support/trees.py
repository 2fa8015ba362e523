"""Real vLLM source trees for tests: the pinned sdist from the package index (cached), extracted,
with chosen series applied by ``git apply`` (zero fuzz). Shared by the series behaviour tests."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import zipfile
from pathlib import Path

from g4build.pins.index import cache_lock, cache_root, fetch_verified, project_files
from g4build.pins.model import load_pins
from g4build.series.model import load_all
from g4build.source.fetch import safe_extract_tar

_TREES = Path(os.environ.get("G4BUILD_TEST_TREES") or cache_root() / "test-trees")


def sdist_tree(pin_name: str) -> Path:
    """The pin's sdist, extracted once per machine (read-only use: copy before changing it)."""
    pin = load_pins().get(pin_name)
    dest = _TREES / pin.name / "pristine"
    with cache_lock(dest):  # test runs in parallel (two checkouts, say) share these trees
        if (dest / "vllm" / "__init__.py").is_file():
            return dest
        got = fetch_verified("vllm", pin.sdist.file, pin.sdist.sha256, cache_dir=cache_root() / "sdists")
        tmp = dest.with_name("pristine.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        top = safe_extract_tar(got.path, tmp)
        shutil.rmtree(dest, ignore_errors=True)
        top.rename(dest)
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def patched_tree(pin_name: str, series_names: list[str] | None = None) -> Path:
    """A copy of the pin's tree with the named series (default: all, in order) applied."""
    all_series = load_all()
    chosen = [s for s in all_series if series_names is None or s.name in series_names]
    # The patches' bytes are in the key: a patch edited without a version bump must not reuse a stale tree.
    digest = hashlib.sha256(b"".join(p.read_bytes() for s in chosen for p in s.patches_for(pin_name)))
    key = "+".join(s.name + str(s.version) for s in chosen) + "-" + digest.hexdigest()[:10]
    dest = _TREES / pin_name / f"patched-{key}"
    stamp = dest / ".g4build-test-tree"
    pristine = sdist_tree(pin_name)
    with cache_lock(dest):
        if stamp.is_file():
            return dest
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(pristine, tmp, symlinks=True)
        for s in chosen:
            for p in s.patches_for(pin_name):
                subprocess.run(["git", "apply", "--whitespace=nowarn", str(p.path)], cwd=tmp, check=True)
        (tmp / ".g4build-test-tree").write_text(key)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    return dest


def unpacked_wheel(project: str, name: str) -> Path:
    """A registry wheel (sha256 from the index), unpacked once per machine."""
    dest = cache_root() / "test-trees" / "wheels" / name.removesuffix(".whl")
    with cache_lock(dest):
        if (dest / ".unpacked").is_file():
            return dest
        entry = next(x for x in project_files(project) if x.filename == name)
        wheel = fetch_verified(project, name, entry.sha256, cache_dir=cache_root() / "wheels")
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        with zipfile.ZipFile(wheel.path) as zf:
            zf.extractall(tmp)
        (tmp / ".unpacked").write_text(entry.sha256)
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    return dest
