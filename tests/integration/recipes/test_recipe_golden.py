"""Golden files: every recipe rendered for both shells equals tests/golden/recipes/ byte for byte.

After an intended change, regenerate them with ``G4BUILD_UPDATE_GOLDEN=1 python -m pytest tests/integration/recipes``
and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from g4build.recipes import SHELLS, load_recipe, recipe_names, render, script_filename, write_script
from g4build.recipes.script import WheelRef

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "recipes"
UPDATE = os.environ.get("G4BUILD_UPDATE_GOLDEN") == "1"
WHEEL = "vllm-0.21.0+cu130.g4.0123456789-cp38-abi3-linux_x86_64.whl"


def cases() -> list[tuple[str, str, bool]]:
    out = [(name, shell, False) for name in recipe_names() for shell in SHELLS]
    out += [("gemma4-26b-a4b-nvfp4-dflash", shell, True) for shell in SHELLS]
    return out


@pytest.mark.parametrize(("name", "shell", "with_wheel"), cases())
def test_rendered_script_matches_golden(tmp_path: Path, name: str, shell: str, with_wheel: bool) -> None:
    wheel = WheelRef(path=WHEEL, beside_script=True) if with_wheel else None
    fresh = write_script(render(load_recipe(name), shell, wheel=wheel), tmp_path / script_filename(name, shell), shell)
    golden = GOLDEN / ("with-wheel" if with_wheel else "") / script_filename(name, shell)
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_bytes(fresh.read_bytes())
    assert golden.is_file(), f"{golden} is missing: run with G4BUILD_UPDATE_GOLDEN=1"
    assert fresh.read_bytes() == golden.read_bytes(), f"{golden} differs: review, then G4BUILD_UPDATE_GOLDEN=1"


def test_every_golden_file_has_a_recipe() -> None:
    expected = {GOLDEN / ("with-wheel" if w else "") / script_filename(n, s) for n, s, w in cases()}
    present = {p for p in GOLDEN.rglob("*") if p.is_file()}
    assert present <= expected, f"stale golden files: {sorted(map(str, present - expected))}"
