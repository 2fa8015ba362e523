"""Fixtures for the CI integration tests: a copy of the project to edit, and the real CLI in a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from tests.support.yamltext import yaml_text

from g4build.data import project_root

ROOT = project_root()


@pytest.fixture
def project_copy(tmp_path: Path) -> Path:
    """A project root holding copies of the data the ci commands read and the committed workflows."""
    root = tmp_path / "project"
    for folder in ("ci", "patches"):
        shutil.copytree(ROOT / folder, root / folder)
    shutil.copytree(ROOT / ".github" / "workflows", root / ".github" / "workflows")
    return root


RunG4 = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run_g4build() -> RunG4:
    """Run the real CLI in a subprocess (``home`` sets G4BUILD_HOME, i.e. which project it reads)."""

    def run(*args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "toolkit"), env.get("PYTHONPATH", "")])
        env["COLUMNS"] = "200"
        if home is not None:
            env["G4BUILD_HOME"] = str(home)
        else:
            env.pop("G4BUILD_HOME", None)
        return subprocess.run(
            [sys.executable, "-m", "g4build", *args], capture_output=True, text=True, env=env, timeout=120,
            check=False,
        )

    return run


def set_windows_base(root: Path, pin: str, present: bool) -> None:
    """Give ``pin`` a Windows base tree in the copy's pins file, or take it away."""
    path = root / "patches" / "pins.yaml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    bases = data["pins"][pin].get("bases") or {}
    if present:
        bases["windows"] = {"remote": "https://example.invalid/vllm-windows.git", "commit": "0123456789abcdef"}
    else:
        bases.pop("windows", None)
    data["pins"][pin]["bases"] = bases
    path.write_text(yaml_text(data, sort_keys=False), encoding="utf-8")


@pytest.fixture
def windows_base() -> Callable[[Path, str, bool], None]:
    return set_windows_base


@pytest.fixture
def with_windows_base(project_copy: Path) -> Path:
    """A project copy whose two pins both name a Windows base, so Windows cells are buildable."""
    for pin in ("vllm-0.21.0", "vllm-0.33.0"):
        set_windows_base(project_copy, pin, True)
    return project_copy
