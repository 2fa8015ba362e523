"""`g4build ci render --check` through the real CLI: passes on the committed files, fails once they are stale."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from g4build.ci.workflows import WORKFLOWS_DIR

RunG4 = Callable[..., subprocess.CompletedProcess[str]]  # the run_g4build fixture (conftest.py)


def test_committed_workflows_are_current(run_g4build: RunG4) -> None:
    done = run_g4build("ci", "render", "--check")
    assert done.returncode == 0, done.stderr


def test_check_detects_stale_workflows_after_a_data_edit(project_copy: Path, run_g4build: RunG4) -> None:
    assert run_g4build("ci", "render", "--check", home=project_copy).returncode == 0
    data = project_copy / "ci" / "matrix.yaml"
    text = data.read_text(encoding="utf-8")
    assert 'cron: "5 1 * * *"' not in text
    data.write_text(re.sub(r'cron: "[^"]*"', 'cron: "5 1 * * *"', text, count=1), encoding="utf-8")
    stale = run_g4build("ci", "render", "--check", home=project_copy)
    assert stale.returncode == 3
    assert "nightly-wheels.yml" in stale.stderr and "tests.yml" not in stale.stderr.split("hint")[0]
    assert "g4build ci render" in stale.stderr
    written = run_g4build("ci", "render", home=project_copy)
    assert written.returncode == 0, written.stderr
    assert "- cron: 5 1 * * *" in (project_copy / WORKFLOWS_DIR / "nightly-wheels.yml").read_text(encoding="utf-8")
    assert run_g4build("ci", "render", "--check", home=project_copy).returncode == 0


def test_check_detects_a_hand_edit_and_a_missing_file(project_copy: Path, run_g4build: RunG4) -> None:
    tests_yml = project_copy / WORKFLOWS_DIR / "tests.yml"
    tests_yml.write_text(tests_yml.read_text(encoding="utf-8") + "# local tweak\n", encoding="utf-8")
    (project_copy / WORKFLOWS_DIR / "nightly-wheels.yml").unlink()
    done = run_g4build("ci", "render", "--check", "--json", home=project_copy)
    assert done.returncode == 3
    assert '"stale": [\n    ".github/workflows/nightly-wheels.yml",\n    ".github/workflows/tests.yml"' in done.stdout


