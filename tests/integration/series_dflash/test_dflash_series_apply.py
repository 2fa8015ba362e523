"""dflash-batched-verification applies to both pinned sdists with zero fuzz, in series order, and leaves files that
byte-compile, carry the fingerprints, and raise no new pyflakes-level (ruff F) findings."""

from __future__ import annotations

import json
import py_compile
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.trees import sdist_tree

from g4build.series import Series, load_all

SERIES = "dflash-batched-verification"
PINS = ("vllm-0.21.0", "vllm-0.33.0")

pytestmark = pytest.mark.network


def _stack_up_to_ours() -> list[Series]:
    stack: list[Series] = []
    for series in load_all():
        stack.append(series)
        if series.name == SERIES:
            return stack
    raise AssertionError(f"{SERIES} is not in patches/series.yaml order")


def _touched(patch: Path) -> list[str]:
    return re.findall(r"^\+\+\+ b/(\S+)$", patch.read_text(), flags=re.MULTILINE)


def _ruff_f(root: Path, files: list[str]) -> set[str]:
    """ruff's F findings as 'file:code:message' (line numbers left out: patches move lines)."""
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "F", "--isolated", "--output-format", "json", *files],
        cwd=root,
        capture_output=True,
        text=True,
    )
    assert out.returncode in (0, 1), out.stderr
    return {f"{Path(d['filename']).relative_to(root)}:{d['code']}:{d['message']}" for d in json.loads(out.stdout)}


@pytest.mark.parametrize("pin", PINS)
def test_series_applies_without_fuzz_and_compiles(pin: str, tmp_path: Path) -> None:
    stack = _stack_up_to_ours()
    ours = stack[-1]
    assert ours.patches_for(pin), f"{SERIES} has no patches for {pin}"
    pristine = sdist_tree(pin)
    # Only the files the stack touches are needed: git apply reads nothing else.
    patches = [p for s in stack for p in s.patches_for(pin)]
    files = sorted({f for p in patches for f in _touched(p.path)})
    for root in (tmp_path / "patched", tmp_path / "pristine"):
        for rel in files:
            if (pristine / rel).is_file():
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(pristine / rel, root / rel)
    work = tmp_path / "patched"
    for patch in patches:
        check = subprocess.run(
            ["git", "apply", "--check", "--verbose", str(patch.path)], cwd=work, capture_output=True, text=True
        )
        assert check.returncode == 0, f"{patch.file} does not apply to {pin}:\n{check.stderr}"
        assert "fuzz" not in check.stderr.lower(), f"{patch.file} needs fuzz on {pin}:\n{check.stderr}"
        subprocess.run(["git", "apply", str(patch.path)], cwd=work, check=True)

    our_files = sorted({f for p in ours.patches_for(pin) for f in _touched(p.path)})
    for rel in our_files:
        py_compile.compile(str(work / rel), doraise=True, cfile=str(tmp_path / "pyc" / (rel + "c")))

    variant = ours.variant(pin)
    assert variant is not None
    assert set(variant.fingerprints) <= set(our_files), "a fingerprint names a file the patches do not touch"
    for rel, texts in variant.fingerprints.items():
        content = (work / rel).read_text()
        for text in texts:
            assert text in content, f"fingerprint {text!r} missing from {rel} after patching {pin}"
            assert text not in (tmp_path / "pristine" / rel).read_text(), f"{text!r} is already upstream in {rel}"

    new_findings = _ruff_f(work, our_files) - _ruff_f(tmp_path / "pristine", our_files)
    assert not new_findings, f"new ruff F findings on {pin}: {sorted(new_findings)}"


@pytest.mark.parametrize("pin", PINS)
def test_every_patch_is_needed_on_the_pristine_tree(pin: str, tmp_path: Path) -> None:
    """No patch of ours reverse-applies to the pristine tree (none is already upstream)."""
    pristine = sdist_tree(pin)
    for patch in _stack_up_to_ours()[-1].patches_for(pin):
        for rel in _touched(patch.path):
            dest = tmp_path / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(pristine / rel, dest)
        reverse = subprocess.run(["git", "apply", "--check", "-R", str(patch.path)], cwd=tmp_path, capture_output=True)
        assert reverse.returncode != 0, f"{patch.file} reverse-applies: {pin} already carries it"
