"""The launch scripts' environment check fails closed: an installed transformers whose version does not parse
(a METADATA Version that is no PEP 440 version, or holds terminal escape sequences) stops the launch like one
outside the pin's range, printed escaped; a check that itself fails (python exits other than 0 or 3) stops it
too, saying so. G4BUILD_ALLOW_ENVIRONMENT=1 still serves anyway. Real bash runs the rendered script; python3 is
the real interpreter for the check, against a site folder made here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.integration.recipes.conftest import Stubs, g4build

from g4build.pins.model import load_pins
from g4build.pins.serving import MISMATCH_EXIT, check_program

RECIPE = "gemma4-26b-a4b-nvfp4-baseline"
HOSTILE_VERSIONS = {
    "escape sequences": "5.10.0\x1b]0;pwned\x07\x1b[31mRED",
    "not a version": "five point ten",
    "empty": "",
}


def _site(tmp_path: Path, transformers: str) -> Path:
    site = tmp_path / "site"
    for project, version in (("transformers", transformers), ("torch", "2.11.0+cu130")):
        info = site / f"{project}-{'x' if project == 'transformers' else version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n",
                                       encoding="utf-8")
    return site


def _script(tmp_path: Path) -> Path:
    out = tmp_path / "out"
    result = g4build("recipe", "render", RECIPE, "--shell", "bash", "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out / f"{RECIPE}.sh"


def _real_python_for_the_check(stubs: Stubs, tail: str = "") -> None:
    stubs.add("python3", "if sys.argv[1:2] == ['-c'] and 'importlib.metadata as m' in sys.argv[2]:\n"
                         + (tail or "    os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"))


@pytest.mark.parametrize("case", sorted(HOSTILE_VERSIONS))
def test_an_unparseable_transformers_version_stops_the_launch(tmp_path: Path, stubs: Stubs, case: str) -> None:
    _real_python_for_the_check(stubs)
    result = stubs.run(_script(tmp_path), env={"PYTHONPATH": str(_site(tmp_path, HOSTILE_VERSIONS[case]))})
    assert result.returncode == 1, result.stderr
    assert stubs.programs() == ["nvidia-smi", "python3"]  # no vllm
    assert "does not parse as a version" in result.stderr and "expected transformers>=" in result.stderr
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr
    if case == "escape sequences":
        assert "\\x1b]0;pwned\\x07\\x1b[31mRED" in result.stderr  # shown escaped, as ascii() writes it


def test_allow_environment_still_serves_past_an_unparseable_version(tmp_path: Path, stubs: Stubs) -> None:
    _real_python_for_the_check(stubs)
    site = _site(tmp_path, HOSTILE_VERSIONS["escape sequences"])
    result = stubs.run(_script(tmp_path), env={"PYTHONPATH": str(site), "G4BUILD_ALLOW_ENVIRONMENT": "1"})
    assert result.returncode == 0 and stubs.programs()[-1] == "vllm", result.stderr
    assert result.stderr.splitlines()[-1].startswith("note: G4BUILD_ALLOW_ENVIRONMENT=1")


def test_a_check_that_fails_itself_stops_the_launch(tmp_path: Path, stubs: Stubs) -> None:
    _real_python_for_the_check(stubs, "    sys.exit(5)")
    result = stubs.run(_script(tmp_path))
    assert result.returncode == 1 and stubs.programs() == ["nvidia-smi", "python3"], result.stderr
    assert "error: the environment check did not run to its end (python exited 5)" in result.stderr


def test_the_program_alone_exits_3_and_reports_unparsed_in_json(tmp_path: Path) -> None:
    site = _site(tmp_path, "not.a.version!")
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    program = check_program(load_pins().get("vllm-0.21.0"))
    run = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True)
    assert run.returncode == MISMATCH_EXIT, run.stderr
    as_json = subprocess.run([sys.executable, "-c", program, "--json"], env=env, capture_output=True, text=True)
    rows = {row["project"]: row for row in json.loads(as_json.stdout)}
    assert rows["transformers"]["ok"] is False and rows["transformers"]["unparsed"] is True
