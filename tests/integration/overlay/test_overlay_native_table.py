"""The docs' table of what runs natively on SM120 in each pin's overlaid registry wheel (toolkit/docs/routes/
overlay.md, "What runs natively", which README links) is what `g4build validate --arch sm120` says of them: for
every pin, the registry wheel overlaid by the real `g4build overlay`, then validated for sm_120."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from g4build.pins.index import cache_root
from g4build.pins.model import load_pins
from g4build.validate.fatbin import Arch
from g4build.validate.wheel import ValidateOptions, validate_wheel

pytestmark = [pytest.mark.heavy, pytest.mark.network]

REPO = Path(__file__).resolve().parents[3]
PAGE = REPO / "toolkit" / "docs" / "routes" / "overlay.md"


def table() -> dict[str, tuple[set[str], set[str]]]:
    """pin -> (libraries JIT-compiled from PTX, libraries with no code for sm_120), as the page says."""
    section = PAGE.read_text(encoding="utf-8").split("## What runs natively", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("vllm-"):
            libs = [set(re.findall(r"`([\w.]+\.so)`", cell)) for cell in cells[1:]]
            rows[cells[0]] = (libs[0], libs[1])
    return rows


def test_the_page_has_a_row_per_pin() -> None:
    assert set(table()) == set(load_pins().pins)


@pytest.mark.parametrize("name", sorted(load_pins().pins))
def test_what_validate_says_of_the_overlaid_registry_wheel(name: str, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "toolkit"), "G4BUILD_HOME": str(REPO),
           "G4BUILD_CACHE": str(cache_root())}
    # --no-validate: the table is about the arch checks, read below; the overlay's own validation is tested apart
    # (tests/integration/overlay/test_overlay_registry_vllm.py)
    done = subprocess.run([sys.executable, "-m", "g4build", "overlay", "--pin", name, "--out", str(tmp_path),
                           "--no-validate"],
                          env=env, capture_output=True, text=True, check=False, timeout=1800)
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("vllm-*.whl")
    report = validate_wheel(wheel, ValidateOptions(archs=(Arch.parse("sm120"),), pin=name))
    found: dict[str, set[str]] = {"ptx-only": set(), "none": set()}
    for lib in report.archs:
        verdict = lib.verdicts.get("sm_120")
        failed = any(c.name == f"arch sm_120 {lib.file}" and not c.ok for c in report.checks)
        if verdict in found and failed:
            found[verdict].add(Path(lib.file).name)
    assert (found["ptx-only"], found["none"]) == table()[name]
