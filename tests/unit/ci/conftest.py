"""Fixtures for the CI matrix tests: the real ci/matrix.yaml, edited copies of it, and the real CLI."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from g4build.ci import MatrixSpec, load_matrix
from g4build.data import project_root

ROOT = project_root()


@pytest.fixture
def matrix_data() -> dict[str, Any]:
    """A fresh, editable copy of the real matrix data."""
    data = yaml.safe_load((ROOT / "ci" / "matrix.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return copy.deepcopy(data)


@pytest.fixture
def spec_from(tmp_path: Path) -> Callable[[dict[str, Any]], MatrixSpec]:
    """Write matrix data to a real file and load it the way the CLI does."""

    def load(data: dict[str, Any]) -> MatrixSpec:
        path = tmp_path / "matrix.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return load_matrix(path)

    return load


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
