"""Fixtures for the dflash-batched-verification behaviour tests: real pinned trees, patched and pristine, each
checked in an interpreter of its own (in_tree.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.integration.series_dflash.in_tree import PATCHED, Tree
from tests.support.trees import patched_tree, sdist_tree

PINS = ("vllm-0.21.0", "vllm-0.26.0", "vllm-0.29.0", "vllm-0.33.0")
SERIES = "dflash-batched-verification"

_TREES: dict[Path, Tree] = {}


def _tree(path: Path, *labels: str) -> Tree:
    """One Tree per path for the session: its scenarios run once, in one child interpreter."""
    if path not in _TREES:
        _TREES[path] = Tree(path, frozenset(labels))
    return _TREES[path]


@pytest.fixture(scope="session", params=PINS)
def pin(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def patched_path(pin: str) -> Path:
    """The pin's tree with every series applied in order (ours among them)."""
    return patched_tree(pin)


@pytest.fixture(scope="session")
def patched(pin: str, patched_path: Path) -> Tree:
    return _tree(patched_path, PATCHED, f"patched-{pin}")


@pytest.fixture(scope="session")
def pristine_021_path() -> Path:
    return sdist_tree("vllm-0.21.0")


@pytest.fixture(scope="session")
def pristine_021(pristine_021_path: Path) -> Tree:
    return _tree(pristine_021_path, "pristine-vllm-0.21.0")


@pytest.fixture(scope="session")
def patched_021() -> Tree:
    return _tree(patched_tree("vllm-0.21.0"), PATCHED, "patched-vllm-0.21.0")
