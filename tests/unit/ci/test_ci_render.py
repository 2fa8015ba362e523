"""The generated workflows: in sync with the data, schema-valid, zizmor-clean, and secure by construction."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from g4build.ci import load_matrix, render_all, stale_files
from g4build.ci.workflows import HEADER, WORKFLOWS_DIR
from g4build.data import project_root

from .conftest import RunG4

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


def _steps(workflow: dict[Any, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(job_id, step) for job_id, job in workflow["jobs"].items() for step in job.get("steps", [])]


# ---------------------------------------------------------------- --check


def test_committed_workflows_are_current(run_g4build: RunG4) -> None:
    done = run_g4build("ci", "render", "--check")
    assert done.returncode == 0, done.stderr
    assert {p.name for p in WORKFLOWS} == {"nightly-wheels.yml", "tests.yml"}


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


def test_stale_files_compares_bytes(tmp_path: Path) -> None:
    rendered = render_all(load_matrix())
    assert stale_files(tmp_path, rendered) == [r.path.as_posix() for r in rendered]
    for r in rendered:
        (tmp_path / r.path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / r.path).write_text(r.text, encoding="utf-8")
    assert stale_files(tmp_path, rendered) == []


# ---------------------------------------------------------------- external validators


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
    path.write_text(yaml.safe_dump(broken), encoding="utf-8")
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
    (folder / "bad.yml").write_text(yaml.safe_dump(bad, sort_keys=False), encoding="utf-8")
    done = _zizmor(folder)
    assert done.returncode != 0
    assert "template-injection" in done.stdout and "unpinned-uses" in done.stdout


# ---------------------------------------------------------------- properties of the output


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_security_properties(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith(HEADER)
    wf = _load(path)
    assert wf["permissions"] == {}
    for job_id, job in wf["jobs"].items():
        assert "permissions" in job, job_id
        assert set(job["permissions"].values()) <= {"read", "write"}
        if job_id != "publish":
            assert "write" not in job["permissions"].values(), job_id
    for job_id, step in _steps(wf):
        if "run" in step:
            assert "${{" not in step["run"], (job_id, step["name"])
        if "uses" in step:
            assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", step["uses"]), step["uses"]
            if step["uses"].startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False
    for line in text.splitlines():
        if "uses: " in line:
            assert re.search(r"@[0-9a-f]{40} # v\d", line), line


def test_nightly_follows_the_data() -> None:
    spec = load_matrix()
    wf = _load(ROOT / WORKFLOWS_DIR / spec.nightly.workflow)
    on = wf["on"]
    assert on["schedule"] == [{"cron": spec.nightly.cron}]
    inputs = on["workflow_dispatch"]["inputs"]
    assert set(inputs) == {"pin", "release", "arch"}
    assert inputs["arch"]["options"] == ["default", "all", *spec.axes["arch"]]
    jobs = wf["jobs"]
    assert list(jobs) == ["resolve", "drift", "build", "check", "gpu-smoke", "publish"]
    build = jobs["build"]
    assert build["env"]["SCCACHE_GHA_ENABLED"] == "true"
    assert build["env"]["SCCACHE_GHA_VERSION"] == "${{ matrix.cache_key }}"
    assert build["continue-on-error"] == "${{ !matrix.required }}"
    scripts = "\n".join(s.get("run", "") for s in build["steps"])
    assert "g4build wheel --arch \"$G4_ARCH\" --os \"$G4_OS\"" in scripts
    assert "g4build validate" in scripts and "g4build recipe render" in scripts
    drift = "\n".join(s.get("run", "") for s in jobs["drift"]["steps"])
    assert 'g4build patches check --release "$RELEASE" --json > drift.json' in drift
    assert f"vars.{spec.nightly.gpu_runner_variable} != ''" in jobs["gpu-smoke"]["if"]
    assert jobs["gpu-smoke"]["runs-on"] == f"${{{{ vars.{spec.nightly.gpu_runner_variable} }}}}"
    assert jobs["publish"]["permissions"] == {"contents": "write"}
    assert "needs.build.result == 'success'" in jobs["publish"]["if"]
    # no registry host is written into the workflow: the index comes from pip's configuration
    assert "pypi" not in (ROOT / WORKFLOWS_DIR / spec.nightly.workflow).read_text(encoding="utf-8").lower()


def test_tests_workflow_runs_the_project_test_command() -> None:
    spec = load_matrix()
    wf = _load(ROOT / WORKFLOWS_DIR / spec.tests.workflow)
    job = wf["jobs"]["test"]
    assert job["strategy"]["matrix"]["python"] == list(spec.tests.python)
    runs = [s["run"].strip() for s in job["steps"] if "run" in s]
    assert runs == [spec.tests.install, spec.tests.run] == ["pip install -e '.[test]'", "python -m pytest"]
