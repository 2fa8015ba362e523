"""Golden files: every recipe rendered for both shells equals tests/golden/recipes/ byte for byte.

After an intended change, regenerate them with ``G4BUILD_UPDATE_GOLDEN=1 python -m pytest tests/integration/recipes``
and review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from g4build.pins.model import load_pins
from g4build.recipes import SHELLS, load_recipe, recipe_names, render, script_filename, write_script
from g4build.recipes.flashinfer import FlashInferInfo
from g4build.recipes.gpu_guard import KernelTarget
from g4build.recipes.script import WheelRef

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "recipes"
UPDATE = os.environ.get("G4BUILD_UPDATE_GOLDEN") == "1"
WHEEL = "vllm-0.21.0+cu130.g4.0123456789-cp38-abi3-linux_x86_64.whl"
WIN_WHEEL = "vllm-0.21.0+cu130.g4.0123456789-cp312-cp312-win_amd64.whl"
FI_WHEELS = ("flashinfer_python-0.6.8.post1-py3-none-any.whl",
             "flashinfer_jit_cache-0.6.8.post1+cu130-cp39-abi3-win_amd64.whl")
# how the script finds FlashInfer: not known (checked at start), known absent (off in the env), wheels installed
VARIANTS: dict[str, tuple[WheelRef | None, FlashInferInfo | None]] = {
    "": (None, None),
    "with-wheel": (WheelRef(path=WHEEL, beside_script=True), None),
    "without-flashinfer": (WheelRef(path=WIN_WHEEL, beside_script=True),
                           FlashInferInfo(presence="absent", why="its METADATA requires no flashinfer-python for "
                                          "its platform and its build recorded no FlashInfer wheels")),
    "with-flashinfer-wheels": (WheelRef(path=WIN_WHEEL, beside_script=True, companions=FI_WHEELS),
                               FlashInferInfo(presence="present", why="built with FlashInfer wheels",
                                              wheels=FI_WHEELS)),
    # a wheel g4build built for sm120 with CUDA 13 (TORCH_CUDA_ARCH_LIST 12.0f): the script stops on other GPUs
    "built-for-sm120": (WheelRef(path=WHEEL, beside_script=True,
                                 kernel_archs=(KernelTarget(major=12, minor=0, suffix="f"),)), None),
}


def cases() -> list[tuple[str, str, str]]:
    out = [(name, shell, "") for name in recipe_names() for shell in SHELLS]
    out += [("gemma4-26b-a4b-nvfp4-dflash", shell, variant) for variant in VARIANTS if variant for shell in SHELLS]
    return out


@pytest.mark.parametrize(("name", "shell", "variant"), cases())
def test_rendered_script_matches_golden(tmp_path: Path, name: str, shell: str, variant: str) -> None:
    wheel, flashinfer = VARIANTS[variant]
    recipe = load_recipe(name)  # with its pin, as `recipe render` passes it: the script checks that environment
    text = render(recipe, shell, wheel=wheel, flashinfer=flashinfer, pin=load_pins().get(recipe.pin))
    fresh = write_script(text, tmp_path / script_filename(name, shell), shell)
    golden = GOLDEN / variant / script_filename(name, shell)
    if UPDATE:
        golden.parent.mkdir(parents=True, exist_ok=True)
        golden.write_bytes(fresh.read_bytes())
    assert golden.is_file(), f"{golden} is missing: run with G4BUILD_UPDATE_GOLDEN=1"
    assert fresh.read_bytes() == golden.read_bytes(), f"{golden} differs: review, then G4BUILD_UPDATE_GOLDEN=1"


def test_every_golden_file_has_a_recipe() -> None:
    expected = {GOLDEN / v / script_filename(n, s) for n, s, v in cases()}
    present = {p for p in GOLDEN.rglob("*") if p.is_file()}
    assert present <= expected, f"stale golden files: {sorted(map(str, present - expected))}"
