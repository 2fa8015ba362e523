"""Fixtures for the recipe integration tests: the real CLI in a subprocess, and recording stubs on PATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]

STUB = """#!{python}
import json, os, sys
with open(os.environ["G4_STUB_RECORD"], "a", encoding="utf-8") as f:
    f.write(json.dumps({{"prog": {name!r}, "argv": sys.argv[1:], "env": dict(os.environ)}}) + "\\n")
{tail}
"""


def g4build(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "toolkit"), "G4BUILD_HOME": str(REPO), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "g4build", *args], capture_output=True, text=True,
                          encoding="utf-8", env=env, cwd=cwd or REPO)


def make_wheel(path: Path, manifest: dict[str, Any] | None = None, metadata: str | None = None) -> Path:
    """A small real wheel (zip) with an optional g4build build-manifest.json and METADATA in its dist-info."""
    path.parent.mkdir(parents=True, exist_ok=True)
    dist = "-".join(path.name.split("-")[:2]) + ".dist-info"  # the wheel's own, as its file name says
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("vllm/__init__.py", "")
        if manifest is not None:
            archive.writestr(f"{dist}/build-manifest.json", json.dumps(manifest))
        if metadata is not None:
            archive.writestr(f"{dist}/METADATA", metadata)
    return path


# The local checkpoint folders the shipped recipes name (./models/...), made in the folder scripts run from
MODEL_FOLDERS = ("gemma-4-26B-A4B-it-NVFP4", "gemma-4-26B-A4B-it-DFlash", "gemma-4-31B-it-DFlash")


class Stubs:
    """A folder of recording programs (vllm, nvidia-smi, python3) to put first on PATH; scripts run in its parent,
    which holds the recipes' ./models/ folders and stands for the active venv (VIRTUAL_ENV, python3 inside it)."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "stub-bin"
        self.dir.mkdir()
        for name in MODEL_FOLDERS:
            (root / "models" / name).mkdir(parents=True)
        self.record = root / "record.jsonl"
        self.add("vllm")
        self.gpu("12.0")
        self.add("python3")

    def add(self, name: str, tail: str = "") -> None:
        path = self.dir / name
        path.write_text(STUB.format(python=sys.executable, name=name, tail=tail), encoding="utf-8")
        path.chmod(0o755)

    def gpu(self, compute_capability: str) -> None:
        """nvidia-smi answering -L with one GPU and --query-gpu=compute_cap with ``compute_capability``."""
        self.add("nvidia-smi", (
            'if any(a.startswith("--query-gpu=compute_cap") for a in sys.argv[1:]):\n'
            f'    print({compute_capability!r})\n'
            'else:\n'
            '    print("GPU 0: NVIDIA GeForce RTX 5090 (UUID: GPU-stub)")'
        ))

    def remove(self, name: str) -> None:
        (self.dir / name).unlink()

    def run(self, script: Path, *, extra_path: str = "/usr/bin:/bin", env: dict[str, str] | None = None,
            ) -> subprocess.CompletedProcess[str]:
        env = {"PATH": f"{self.dir}:{extra_path}" if extra_path else str(self.dir),
               "G4_STUB_RECORD": str(self.record), "HOME": str(self.dir), "LANG": "C.UTF-8",
               "VIRTUAL_ENV": str(self.dir.parent), **(env or {})}
        return subprocess.run(["/bin/bash", str(script)], capture_output=True, text=True, encoding="utf-8",
                              env=env, cwd=self.dir.parent)

    def programs(self) -> list[str]:
        """The programs called, in order, with nvidia-smi's queries folded into one entry."""
        names = [c["prog"] for c in self.calls()]
        return [n for i, n in enumerate(names) if not (n == "nvidia-smi" and i and names[i - 1] == n)]

    def calls(self) -> list[dict[str, Any]]:
        if not self.record.exists():
            return []
        return [json.loads(line) for line in self.record.read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def stubs(tmp_path: Path) -> Stubs:
    return Stubs(tmp_path)
