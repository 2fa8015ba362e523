"""Fixtures for the dflash-batched-verification tests that run the series' code inside the real patched trees:
facts reported by dflash_v1_probe.py, run once per tree in a fresh Python with PYTHONPATH at that tree."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.support.tree_probe import run_tree_probe
from tests.support.trees import patched_tree

PROBE = Path(__file__).parent / "dflash_v1_probe.py"
_FACTS: dict[tuple[str, str], dict[str, Any]] = {}


@pytest.fixture(scope="session")
def v1_facts(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], dict[str, Any]]:
    """v1_facts(pin, mode): what dflash_v1_probe.py reports in the pin's tree with every series applied."""

    def facts(pin: str, mode: str = "all") -> dict[str, Any]:
        if (pin, mode) not in _FACTS:
            work = tmp_path_factory.mktemp(f"dflash-v1-{pin}-{mode}")
            _FACTS[(pin, mode)] = run_tree_probe(PROBE, patched_tree(pin), work, "DFLASH_V1_FACTS", [str(work), mode])
        return _FACTS[(pin, mode)]

    return facts
