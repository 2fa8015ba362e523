"""Every series in patches/series.yaml, on both pinned sdists: the files its patches touch byte-compile and raise
no new ruff F (pyflakes-level) findings once the whole stack is applied, each fingerprint its metadata declares
is present after patching and absent before, and no patch is already upstream (none reverse-applies).

That each patch applies with zero fuzz, cumulatively and in order, is the patch engine's own check
(tests/integration/series/test_series_engine_real.py: `patches check` must report every series `needed`, every
patch `applies`).
"""

from __future__ import annotations

import json
import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.trees import patched_tree, sdist_tree

from g4build.series.model import Series, load_all
from g4build.series.patchfile import parse_patch, touched_paths

pytestmark = pytest.mark.network

PINS = ("vllm-0.21.0", "vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0")
SERIES = load_all()


def _touched(series: Series, pin: str) -> list[str]:
    return sorted({f for p in series.patches_for(pin) for f in _paths(p.path)})


def _paths(patch: Path) -> set[str]:
    return touched_paths(parse_patch(patch.read_bytes(), where=patch.name))


def _ruff_f(root: Path, files: list[str]) -> set[str]:
    """ruff's F findings as 'file:code:message' (line numbers left out: patches move lines)."""
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "F", "--isolated", "--output-format", "json", *files],
        cwd=root, capture_output=True, text=True, check=False,
    )
    assert out.returncode in (0, 1), out.stderr
    return {f"{Path(d['filename']).relative_to(root)}:{d['code']}:{d['message']}" for d in json.loads(out.stdout)}


@pytest.mark.parametrize("series", SERIES, ids=[s.name for s in SERIES])
@pytest.mark.parametrize("pin", PINS)
def test_series_files_compile_stay_clean_and_carry_fingerprints(pin: str, series: Series, tmp_path: Path) -> None:
    assert series.patches_for(pin), f"{series.name} has no patches for {pin}"
    pristine, patched = sdist_tree(pin), patched_tree(pin)
    files = _touched(series, pin)
    for rel in files:
        py_compile.compile(str(patched / rel), doraise=True, cfile=str(tmp_path / "pyc" / (rel + "c")))
    existing = [rel for rel in files if (pristine / rel).is_file()]
    new_findings = _ruff_f(patched, files) - _ruff_f(pristine, existing)
    assert not new_findings, f"new ruff F findings from {series.name} on {pin}: {sorted(new_findings)}"

    variant = series.variant(pin)
    assert variant is not None and variant.fingerprints, f"{series.name} declares no fingerprints for {pin}"
    assert set(variant.fingerprints) <= set(files), "a fingerprint names a file the patches do not touch"
    for rel, texts in variant.fingerprints.items():
        after = (patched / rel).read_text()
        before = (pristine / rel).read_text() if (pristine / rel).is_file() else ""
        for text in texts:
            assert text in after, f"{series.name}: fingerprint {text!r} missing from {rel} after patching {pin}"
            assert text not in before, f"{series.name}: fingerprint {text!r} is already upstream in {rel}"

    for patch in series.patches_for(pin):  # none is already in the pristine release
        scratch = tmp_path / "reverse" / patch.path.stem
        for rel in _paths(patch.path):
            if (pristine / rel).is_file():
                (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(pristine / rel, scratch / rel)
        scratch.mkdir(parents=True, exist_ok=True)
        reverse = subprocess.run(["git", "apply", "--check", "-R", str(patch.path)], cwd=scratch,
                                 capture_output=True, check=False,
                                 env={**os.environ, "GIT_CEILING_DIRECTORIES": str(scratch.parent)})
        assert reverse.returncode != 0, f"{patch.file} reverse-applies: {pin} already carries it"
