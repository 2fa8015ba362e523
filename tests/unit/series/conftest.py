"""Fixtures for the patch engine tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tests.support.yamltext import yaml_text
from tests.unit.series.series_support import PINS_YAML, Home, diff_of


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Home:
    root = tmp_path / "home"
    (root / "patches").mkdir(parents=True)
    (root / "patches" / "pins.yaml").write_text(yaml_text(PINS_YAML, sort_keys=False))
    (root / "patches" / "series.yaml").write_text("# order\norder: []\n")
    monkeypatch.setenv("G4BUILD_HOME", str(root))
    return Home(root=root)


@pytest.fixture
def mkdiff(tmp_path: Path) -> Callable[[dict[str, str], dict[str, str | None]], bytes]:
    scratch = tmp_path / "diffs"
    scratch.mkdir()
    return lambda before, after: diff_of(scratch, before, after)
