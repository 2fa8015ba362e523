"""The gemma4-backend-decoupling and mm-prefix-fa patches on the real pinned sdists: each applies with zero fuzz
after the series before it (patches/series.yaml order), the patched files byte-compile, ruff's F rules report
nothing new in them, and the fingerprints the metadata declares are there."""

from __future__ import annotations

import py_compile
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.support.trees import sdist_tree

from g4build.series import Series, load_all

pytestmark = pytest.mark.network

PINS = ["vllm-0.21.0", "vllm-0.33.0"]
OURS = ("gemma4-backend-decoupling", "mm-prefix-fa")


def _touched(patch: Path) -> list[str]:
    return re.findall(r"^diff --git a/(\S+) b/\S+$", patch.read_text(), flags=re.M)


def _ruff_f(path: Path) -> set[tuple[str, str]]:
    """F findings as (code, message): line numbers move when a patch adds lines."""
    ruff = shutil.which("ruff")
    assert ruff is not None, "ruff is needed on PATH"
    proc = subprocess.run(
        [ruff, "check", "--select", "F", "--isolated", "--output-format", "concise", str(path)],
        capture_output=True,
        text=True,
    )
    found = set()
    for line in proc.stdout.splitlines():
        m = re.match(r"^.+?:\d+:\d+: (F\d+) (.*)$", line)
        if m:
            found.add((m.group(1), m.group(2)))
    return found


@pytest.mark.parametrize("pin", PINS)
def test_our_series_apply_with_zero_fuzz_and_stay_clean(pin: str, tmp_path: Path) -> None:
    pristine = sdist_tree(pin)
    chain: list[Series] = []
    for series in load_all():
        chain.append(series)
        if series.name == OURS[-1]:
            break
    assert [s.name for s in chain if s.name in OURS] == list(OURS)
    # A work tree holding just the files the chain touches (git apply needs nothing else).
    work = tmp_path / "tree"
    touched = sorted({f for s in chain for p in s.patches_for(pin) for f in _touched(p.path)})
    for rel in touched:
        if (pristine / rel).is_file():
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(pristine / rel, work / rel)
    work.mkdir(exist_ok=True)
    ours_touched: set[str] = set()
    for series in chain:
        patches = series.patches_for(pin)
        if series.name in OURS:
            assert patches, f"{series.name} has no patches for {pin}"
        for patch in patches:
            # git apply takes no fuzz: a hunk whose context moved off by even one line fails here.
            check = subprocess.run(
                ["git", "apply", "--check", "--verbose", str(patch.path)], cwd=work, capture_output=True, text=True
            )
            assert check.returncode == 0, f"{series.name}/{patch.file} does not apply on {pin}:\n{check.stderr}"
            subprocess.run(["git", "apply", str(patch.path)], cwd=work, check=True)
            if series.name in OURS:
                ours_touched.update(_touched(patch.path))
    for rel in sorted(ours_touched):
        patched = work / rel
        py_compile.compile(str(patched), cfile=str(tmp_path / "pyc" / (rel + "c")), doraise=True)
        before = _ruff_f(pristine / rel) if (pristine / rel).is_file() else set()
        assert _ruff_f(patched) <= before, f"new ruff F findings in {rel}"
    for series in chain:
        if series.name not in OURS:
            continue
        variant = series.variant(pin)
        assert variant is not None
        for rel, texts in variant.fingerprints.items():
            content = (work / rel).read_text()
            for text in texts:
                assert text in content, f"{series.name}: fingerprint {text!r} missing from {rel}"
