"""Fixtures for the dflash-batched-verification behaviour tests: real pinned trees, patched and pristine."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.trees import patched_tree, sdist_tree

PINS = ("vllm-0.21.0", "vllm-0.33.0")
SERIES = "dflash-batched-verification"


@pytest.fixture(scope="session", params=PINS)
def pin(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="session")
def patched(pin: str) -> Path:
    """The pin's tree with every series applied in order (ours among them)."""
    return patched_tree(pin)


@pytest.fixture(scope="session")
def pristine_021() -> Path:
    return sdist_tree("vllm-0.21.0")


@pytest.fixture(scope="session")
def patched_021() -> Path:
    return patched_tree("vllm-0.21.0")
