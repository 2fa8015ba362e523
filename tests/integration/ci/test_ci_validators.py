"""The generated workflows against the external validators, offline: check-jsonschema's built-in GitHub workflow
schema and zizmor. Each validator is also shown a broken workflow, so these tests can fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.yamltext import yaml_text

from g4build.ci.workflows import WORKFLOWS_DIR
from g4build.data import project_root

ROOT = project_root()
WORKFLOWS = sorted((ROOT / WORKFLOWS_DIR).glob("*.yml"))


def _tool(name: str, package: str) -> str:
    found = shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if not found:
        pytest.fail(f"{name} is not installed: pip install {package} (it is in the test extra)")
    return found


def _offline_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GH_TOKEN", "GITHUB_TOKEN", "ZIZMOR_GITHUB_TOKEN")}
    return env


def _load(path: Path) -> dict[Any, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    if True in data:  # PyYAML reads YAML 1.1, where a bare `on` key is the boolean true
        data["on"] = data.pop(True)
    return data



@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflow_matches_the_github_workflow_schema(path: Path) -> None:
    tool = _tool("check-jsonschema", "check-jsonschema")
    done = subprocess.run([tool, "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True, timeout=120, check=False, env=_offline_env())
    assert done.returncode == 0, done.stdout + done.stderr


def test_schema_check_rejects_a_broken_workflow(tmp_path: Path) -> None:
    tool = _tool("check-jsonschema", "check-jsonschema")
    broken = _load(ROOT / WORKFLOWS_DIR / "tests.yml")
    broken["jobs"]["test"]["timeout-minutes"] = "ninety"
    broken["jobs"]["test"]["runs_on"] = broken["jobs"]["test"].pop("runs-on")
    path = tmp_path / "broken.yml"
    path.write_text(yaml_text(broken), encoding="utf-8")
    done = subprocess.run([tool, "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True, timeout=120, check=False, env=_offline_env())
    assert done.returncode != 0


def _zizmor(target: Path) -> subprocess.CompletedProcess[str]:
    tool = _tool("zizmor", "zizmor")
    return subprocess.run([tool, "--offline", "--no-progress", "--format", "plain", str(target)],
                          capture_output=True, text=True, timeout=120, check=False, env=_offline_env())


def test_zizmor_reports_nothing_on_the_generated_workflows() -> None:
    done = _zizmor(ROOT / WORKFLOWS_DIR)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No findings" in done.stdout + done.stderr


def test_zizmor_would_catch_an_injection_and_an_unpinned_action(tmp_path: Path) -> None:
    bad = _load(ROOT / WORKFLOWS_DIR / "nightly-wheels.yml")
    steps = bad["jobs"]["resolve"]["steps"]
    steps[0]["uses"] = "actions/checkout@v4"
    steps[-1]["run"] = "g4build ci resolve --pin ${{ inputs.pin }}\n"
    folder = tmp_path / ".github" / "workflows"
    folder.mkdir(parents=True)
    (folder / "bad.yml").write_text(yaml_text(bad, sort_keys=False), encoding="utf-8")
    done = _zizmor(folder)
    assert done.returncode != 0
    assert "template-injection" in done.stdout and "unpinned-uses" in done.stdout
