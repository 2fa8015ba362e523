"""Fixtures for the CI matrix unit tests: the real ci/matrix.yaml and edited copies of it, loaded from files."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.yamltext import yaml_text

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
        path.write_text(yaml_text(data, sort_keys=False), encoding="utf-8")
        return load_matrix(path)

    return load
