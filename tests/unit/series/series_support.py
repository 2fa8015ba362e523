"""Helpers for the patch engine tests: small real git trees and synthetic series in tmp_path."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from tests.support.yamltext import yaml_text

from g4build.series.model import Series, load_all

PIN = "vllm-1.0.0"
PINS_YAML = {
    "default": PIN,
    "pins": {
        PIN: {
            "version": "1.0.0",
            "upstream": {"remote": "https://example.invalid/vllm.git", "commit": "abcdef1"},
            "sdist": {"file": "vllm-1.0.0.tar.gz", "sha256": "0" * 64},
            "torch": "2.11.0", "cuda": "13.0", "flashinfer": "0.6.8",
        },
        "vllm-2.0.0": {
            "version": "2.0.0",
            "upstream": {"remote": "https://example.invalid/vllm.git", "commit": "abcdef2"},
            "sdist": {"file": "vllm-2.0.0.tar.gz", "sha256": "1" * 64},
            "torch": "2.11.0", "cuda": "13.0", "flashinfer": "0.6.8",
        },
    },
}

ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def git(cwd: Path, *args: str, stdin: bytes | None = None) -> str:
    proc = subprocess.run(["git", *args], cwd=cwd, input=stdin, capture_output=True, check=True,
                          env={**os.environ, **ENV})
    return proc.stdout.decode()


def numbered(n: int = 40, prefix: str = "line") -> str:
    return "".join(f"{prefix} {i}\n" for i in range(1, n + 1))


def replace_line(text: str, old: str, new: str) -> str:
    lines = text.splitlines(keepends=True)
    idx = lines.index(old + "\n")
    lines[idx] = new + "\n"
    return "".join(lines)


# The shared fixture text: a 40-line file and the two single-line edits the series in these tests make.
Diff = Callable[[dict[str, str], dict[str, str | None]], bytes]
BASE = numbered(40)
TEN = replace_line(BASE, "line 10", "line 10 patched")
TWENTY = replace_line(TEN, "line 20", "line 20 patched")


def middle_upstream_series(home: Home, mkdiff: Diff) -> tuple[str, str]:
    """Three patches on one file; patch 3's context holds patch 2's line. Returns (tree text, all applied)."""
    one = replace_line(BASE, "line 10", "line 10 patched")
    two = replace_line(one, "line 20", "line 20 patched")
    three = replace_line(two, "line 22", "line 22 patched")
    home.add_series("s", [("ten", mkdiff({"m.py": BASE}, {"m.py": one})),
                          ("twenty", mkdiff({"m.py": one}, {"m.py": two})),
                          ("twenty-two", mkdiff({"m.py": two}, {"m.py": three}))])
    # upstream took patch 2 only
    return replace_line(BASE, "line 20", "line 20 patched"), three


def make_tree(path: Path, files: dict[str, str], *, repo: bool = True) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (path / rel).parent.mkdir(parents=True, exist_ok=True)
        (path / rel).write_text(text)
    if repo:
        git(path, "init", "-q")
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", "base")
    return path


def diff_of(tmp: Path, before: dict[str, str], after: dict[str, str | None]) -> bytes:
    """A real `git diff` from ``before`` to ``after`` (None deletes a file)."""
    work = tmp / f"diffwork-{len(list(tmp.glob('diffwork-*')))}"
    make_tree(work, before)
    for rel, text in after.items():
        if text is None:
            (work / rel).unlink()
        else:
            (work / rel).parent.mkdir(parents=True, exist_ok=True)
            (work / rel).write_text(text)
    git(work, "add", "-A")
    return subprocess.run(["git", "diff", "--cached", "--no-color"], cwd=work, capture_output=True,
                          check=True).stdout


def snapshot(tree: Path) -> dict[str, bytes]:
    return {str(p.relative_to(tree)): p.read_bytes() for p in sorted(tree.rglob("*"))
            if p.is_file() and ".git" not in p.relative_to(tree).parts}


@dataclass
class Home:
    """A g4build home in tmp_path: patches/pins.yaml, patches/series.yaml and series folders."""

    root: Path

    @property
    def patches(self) -> Path:
        return self.root / "patches"

    def add_series(
        self, name: str, patches: list[tuple[str, bytes]], *, pin: str = PIN, applied_upstream: str | None = None,
        note: str = "", fingerprints: dict[str, list[str]] | None = None, extra_pins: dict[str, Any] | None = None,
    ) -> Series:
        folder = self.patches / name
        entries = []
        for i, (subject, data) in enumerate(patches, start=1):
            rel = f"{pin}/{i:04d}-p{i}.patch"
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_bytes(data)
            entries.append({"file": rel, "subject": subject})
        pins: dict[str, Any] = {pin: {"patches": entries, "fingerprints": fingerprints or {}, "note": note}}
        pins.update(extra_pins or {})
        meta = {"name": name, "version": 1, "title": f"{name} title", "why": "because\nreasons", "refs": ["#1"],
                "origin": "g4build", "bug": "", "forwarded": "no", "applied_upstream": applied_upstream,
                "python_only": True, "pins": pins}
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "series.yaml").write_text("# test series\n" + yaml_text(meta, sort_keys=False))
        order_file = self.patches / "series.yaml"
        order = yaml.safe_load(order_file.read_text())["order"]
        order_file.write_text("# order\n" + yaml_text({"order": [*order, name]}))
        return self.get(name)

    def get(self, name: str) -> Series:
        return next(s for s in self.stack() if s.name == name)

    def stack(self) -> list[Series]:
        return load_all(self.patches)
