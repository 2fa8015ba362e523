"""The generated workflows: in sync with the data and secure by construction (read as data, no tools)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from g4build.ci import load_matrix, render_all, stale_files, write_rendered
from g4build.ci.workflows import HEADER, WORKFLOWS_DIR
from g4build.data import project_root

ROOT = project_root()
WORKFLOWS = sorted((ROOT / WORKFLOWS_DIR).glob("*.yml"))


def _load(path: Path) -> dict[Any, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    if True in data:  # PyYAML reads YAML 1.1, where a bare `on` key is the boolean true
        data["on"] = data.pop(True)
    return data


def _steps(workflow: dict[Any, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(job_id, step) for job_id, job in workflow["jobs"].items() for step in job.get("steps", [])]


def test_committed_workflows_are_what_the_data_renders() -> None:
    assert {p.name for p in WORKFLOWS} == {"nightly-wheels.yml", "tests.yml"}
    assert stale_files(ROOT, render_all(load_matrix())) == [], "run `g4build ci render` and commit the result"


def test_stale_files_compares_bytes(tmp_path: Path) -> None:
    rendered = render_all(load_matrix())
    assert stale_files(tmp_path, rendered) == [r.path.as_posix() for r in rendered]
    for r in rendered:
        (tmp_path / r.path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / r.path).write_text(r.text, encoding="utf-8")
    assert stale_files(tmp_path, rendered) == []


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_security_properties(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.startswith(HEADER)
    wf = _load(path)
    assert wf["permissions"] == {}
    # the only grants beyond reading, each in the one job that needs it
    writes = {"publish": {"contents": "write"}, "attest": {"id-token": "write", "attestations": "write"},
              "pages": {"pages": "write", "id-token": "write"}}
    for job_id, job in wf["jobs"].items():
        assert "permissions" in job, job_id
        assert set(job["permissions"].values()) <= {"read", "write"}
        granted = {k: v for k, v in job["permissions"].items() if v == "write"}
        assert granted == writes.get(job_id, {}), job_id
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
    assert list(jobs) == ["resolve", "drift", "port", "build", "check", "gpu-smoke", "attest", "publish", "pages"]
    build = jobs["build"]
    bucket = f"vars.{spec.nightly.sccache_prefix}_BUCKET"
    # the Actions cache per cell's key, or the user's bucket when its variable is set (then the key is empty:
    # sccache would turn the Actions cache on for any SCCACHE_GHA_VERSION)
    assert build["env"]["SCCACHE_GHA_ENABLED"] == f"${{{{ {bucket} == '' }}}}"
    assert build["env"]["SCCACHE_GHA_VERSION"] == f"${{{{ {bucket} == '' && matrix.cache_key || '' }}}}"
    assert build["env"]["SCCACHE_BUCKET"] == f"${{{{ {bucket} }}}}"
    creds = [s for s in build["steps"] if "AWS_SECRET_ACCESS_KEY" in s.get("env", {})]
    assert [s["name"] for s in creds] == ["build the wheels"]  # no third-party action of the job sees them
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
    assert "needs.attest.result == 'success'" in jobs["publish"]["if"]
    assert jobs["attest"]["if"].removesuffix(" }}") in jobs["publish"]["if"]  # attested whenever published
    (attest,) = [s for s in jobs["attest"]["steps"] if s["uses"].startswith("actions/attest-build-provenance@")]
    assert attest["with"] == {"subject-path": "dist/g4build-*/wheelhouse/*.whl"}
    publish = "\n".join(s.get("run", "") for s in jobs["publish"]["steps"])
    assert "g4build index build release --out site" in publish
    assert "gh release create \"$tag\" --draft" in publish and "gh release edit \"$tag\" --draft=false" in publish
    assert jobs["pages"]["needs"] == ["publish"] and jobs["pages"]["environment"]["name"] == "github-pages"
    # no registry host is written into the workflow: the index comes from pip's configuration
    assert "pypi" not in (ROOT / WORKFLOWS_DIR / spec.nightly.workflow).read_text(encoding="utf-8").lower()


def test_nightly_ports_a_release_that_is_not_pinned() -> None:
    spec = load_matrix()
    port = _load(ROOT / WORKFLOWS_DIR / spec.nightly.workflow)["jobs"]["port"]
    assert port["needs"] == ["resolve", "drift"]
    assert port["if"] == "${{ !cancelled() && needs.resolve.outputs.pin == '' }}"
    assert port["permissions"] == {"contents": "read"}  # the pull request goes through the configured token
    steps = {s["name"]: s for s in port["steps"]}
    run = steps["pin the release and port every series"]
    assert run["env"] == {"RELEASE": "${{ needs.resolve.outputs.release }}"}
    assert 'g4build pins add --release "$RELEASE"' in run["run"]
    assert 'g4build patches port --all --to "$pin" --json > port-report.json' in run["run"]
    upload = steps["upload the port (a patch) and its report"]
    assert upload["if"] == "always()" and upload["with"]["path"].split() == [
        "port.patch", "port-report.json", "pins-add.json", "check.json"]
    pr = steps["open a pull request (when a token is configured)"]
    assert pr["env"]["GH_TOKEN"] == f"${{{{ secrets.{spec.nightly.port_token_secret} }}}}"
    assert pr["env"]["STATUS"] == "${{ steps.port.outputs.status }}"
    assert "gh pr create" in pr["run"]


def test_tests_workflow_runs_the_project_test_command() -> None:
    spec = load_matrix()
    wf = _load(ROOT / WORKFLOWS_DIR / spec.tests.workflow)
    job = wf["jobs"]["test"]
    assert job["strategy"]["matrix"]["python"] == list(spec.tests.python)
    runs = [s["run"].strip() for s in job["steps"] if "run" in s]
    assert runs == [spec.tests.install, spec.tests.run] == ["pip install -e '.[test]'", "python -m pytest"]


def test_written_workflows_are_not_stale(tmp_path: Path) -> None:
    rendered = render_all(load_matrix())
    assert stale_files(tmp_path, rendered) == [r.path.as_posix() for r in rendered]
    write_rendered(tmp_path, rendered)
    assert stale_files(tmp_path, rendered) == []
    assert all(b"\r\n" not in (tmp_path / r.path).read_bytes() for r in rendered)
