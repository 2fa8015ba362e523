"""The nightly's port job, its `run:` scripts executed by bash as GitHub runs them, in a git checkout of the project.

With a stub `g4build` (argv recorded, the files the real commands leave behind faked) the script's own logic is
pinned down: a conflict (exit 8) is a reported result with the new pin as the patch, any other failure fails the job.
The pull-request step pushes to a real (local, bare) remote with a stub `gh`. One run uses the real g4build on a
release no pin names (network: the index and the sdists), as the nightly would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from g4build.ci import load_matrix
from g4build.ci.workflows import WORKFLOWS_DIR
from g4build.data import project_root
from g4build.pins.model import load_pins

ROOT = project_root()

STUB = """#!/usr/bin/env bash
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$G4_TEST_LOG"
case "$1 $2" in
  "pins add") printf '\\n  vllm-%s: {}\\n' "$4" >> patches/pins.yaml; echo '{"pin": "vllm-'"$4"'"}' ;;
  "patches port") echo '{"ok": false, "series": [{"series": "s", "ok": false}]}'; exit "$G4_PORT_EXIT" ;;
  "patches check") echo '{"ok": true}' ;;
esac
"""

GH_STUB = """#!/usr/bin/env bash
python3 -c 'import json, sys; print(json.dumps(["gh", *sys.argv[1:]]))' "$@" >> "$G4_TEST_LOG"
"""


def _steps() -> dict[str, dict[str, Any]]:
    wf = yaml.safe_load((ROOT / WORKFLOWS_DIR / load_matrix().nightly.workflow).read_text(encoding="utf-8"))
    return {s["name"]: s for s in wf["jobs"]["port"]["steps"]}


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@localhost", *args], cwd=cwd,
                          check=True, capture_output=True, text=True).stdout


def _checkout(tmp_path: Path) -> Path:
    """A git checkout holding the project's data (what actions/checkout leaves: a clean work tree)."""
    work = tmp_path / "work"
    work.mkdir(parents=True)
    for part in ("patches", "recipes", "ci"):
        shutil.copytree(ROOT / part, work / part)
    _git(work, "init", "-q", "-b", "main")
    _git(work, "add", "-A")
    _git(work, "commit", "-qm", "project")
    return work


def _run(step: str, work: Path, tmp_path: Path, env: dict[str, str], *, stub: bool = True,
         ) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if stub:
        (bin_dir / "g4build").write_text(STUB, encoding="utf-8")
    else:  # the real CLI of this checkout
        (bin_dir / "g4build").write_text(f'#!/usr/bin/env bash\nexec "{sys.executable}" -m g4build "$@"\n',
                                         encoding="utf-8")
    (bin_dir / "gh").write_text(GH_STUB, encoding="utf-8")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    full = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", G4_TEST_LOG=str(tmp_path / "argv"),
                GITHUB_OUTPUT=str(tmp_path / "out"), GITHUB_STEP_SUMMARY=str(tmp_path / "summary"),
                PYTHONPATH=str(ROOT / "toolkit"), G4BUILD_HOME=str(work), G4BUILD_PLAIN="1", **env)
    # GitHub runs `shell: bash` as `bash --noprofile --norc -eo pipefail {0}`
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", _steps()[step]["run"]],
                          cwd=work, env=full, capture_output=True, text=True, timeout=900, check=False)


PORT = "pin the release and port every series"
PR = "open a pull request (when a token is configured)"


def _argv(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "argv").read_text(encoding="utf-8").splitlines()]


def test_a_conflict_is_reported_and_the_patch_holds_the_new_pin(tmp_path: Path) -> None:
    work = _checkout(tmp_path)
    done = _run(PORT, work, tmp_path, {"RELEASE": "0.40.0", "G4_PORT_EXIT": "8"})
    assert done.returncode == 0, done.stderr
    assert _argv(tmp_path) == [["pins", "add", "--release", "0.40.0", "--json"],
                               ["patches", "port", "--all", "--to", "vllm-0.40.0", "--json"]]
    assert "::warning::the series do not all port to vLLM 0.40.0" in done.stdout
    assert (tmp_path / "out").read_text() == "status=8\n"
    summary = (tmp_path / "summary").read_text()
    assert "(patches port exit 8)" in summary and '"ok": false' in summary
    # port.patch is what `git apply` takes on a clean checkout: here, the new pin only
    clean = tmp_path / "clean"
    _git(tmp_path, "clone", "-q", str(work), str(clean))
    _git(clean, "apply", str(work / "port.patch"))
    assert "vllm-0.40.0: {}" in (clean / "patches" / "pins.yaml").read_text()
    assert not (work / "check.json").exists()


def test_a_clean_port_is_checked_and_another_failure_fails_the_job(tmp_path: Path) -> None:
    work = _checkout(tmp_path)
    done = _run(PORT, work, tmp_path, {"RELEASE": "0.40.0", "G4_PORT_EXIT": "0"})
    assert done.returncode == 0, done.stderr
    assert _argv(tmp_path)[-1] == ["patches", "check", "--pin", "vllm-0.40.0", "--json"]
    assert (work / "check.json").is_file() and "::warning::" not in done.stdout
    failing = _checkout(tmp_path / "again")
    done = _run(PORT, failing, tmp_path / "again", {"RELEASE": "0.40.0", "G4_PORT_EXIT": "7"})
    assert done.returncode == 7
    assert (failing / "port-report.json").is_file()  # still there for the upload step (it runs always())


def test_without_the_token_no_pull_request_is_tried(tmp_path: Path) -> None:
    work = _checkout(tmp_path)
    done = _run(PR, work, tmp_path, {"GH_TOKEN": "", "TOKEN_NAME": "G4BUILD_PORT_TOKEN", "RELEASE": "0.40.0",
                                     "STATUS": "0", "RUN": "7", "BASE": "main", "GH_REPO": "o/r"})
    assert done.returncode == 0, done.stderr
    assert "the repository secret G4BUILD_PORT_TOKEN is not set" in done.stdout
    assert not (tmp_path / "argv").exists() and _git(work, "branch", "--show-current").strip() == "main"


@pytest.mark.parametrize(("status", "draft"), [("0", False), ("8", True)])
def test_with_the_token_the_port_becomes_a_branch_and_a_pull_request(tmp_path: Path, status: str,
                                                                      draft: bool) -> None:
    origin = tmp_path / "origin.git"
    _git(tmp_path, "init", "-q", "--bare", str(origin))
    work = _checkout(tmp_path)
    _git(work, "remote", "add", "origin", str(origin))
    assert _run(PORT, work, tmp_path, {"RELEASE": "0.40.0", "G4_PORT_EXIT": status}).returncode == 0
    done = _run(PR, work, tmp_path, {"GH_TOKEN": "t0ken", "TOKEN_NAME": "G4BUILD_PORT_TOKEN", "RELEASE": "0.40.0",
                                     "STATUS": status, "RUN": "7", "BASE": "main", "GH_REPO": "o/r"})
    assert done.returncode == 0, done.stderr
    branch = "g4build/port-vllm-0.40.0-run7"
    pushed = _git(origin, "show", f"{branch}:patches/pins.yaml")
    assert "vllm-0.40.0: {}" in pushed  # the commit on the pushed branch is the port
    gh = [a for a in _argv(tmp_path) if a[0] == "gh"]
    assert gh[0] == ["gh", "auth", "setup-git"]
    create = gh[1]
    assert create[:3] == ["gh", "pr", "create"] and ("--draft" in create) is draft
    assert create[create.index("--head") + 1] == branch and create[create.index("--base") + 1] == "main"
    body = (work / "pr-body.md").read_text()
    assert f"(exit {status})" in body and '"ok": false' in body


@pytest.mark.network
def test_the_real_port_of_an_unpinned_release(tmp_path: Path) -> None:
    """vLLM 0.27.1 (a release Windows users run wheels of, not pinned here): pinned from the index and its sdist, then
    every series ported from the nearest pin (0.26.0). gemma4-backend-decoupling would port, but
    dflash-batched-verification's 0006 conflicts (0.27.1 sizes those query buffers itself, differently), so the
    job reports the conflict and the patch is the new pin alone (all or nothing)."""
    assert "vllm-0.27.1" not in load_pins().pins, "0.27.1 is pinned now: pick another unpinned release here"
    work = _checkout(tmp_path)
    done = _run(PORT, work, tmp_path, {"RELEASE": "0.27.1"}, stub=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "out").read_text() == "status=8\n"
    report = json.loads((work / "port-report.json").read_text())
    assert report["ok"] is False and report["not_tried"] == ["mm-prefix-fa"]
    gemma4, dflash = report["series"]
    assert (gemma4["series"], gemma4["from"], gemma4["ok"], gemma4["written"]) == (
        "gemma4-backend-decoupling", "vllm-0.26.0", True, False)
    stopped = dflash["patches"][-1]
    assert stopped["status"] == "conflict"
    assert stopped["file"] == "vllm-0.26.0/0006-dflash-query-buffers-for-padded-steps.patch"
    assert all(h["file"] == "vllm/v1/spec_decode/dflash.py" and "three-way merge conflict" in h["why"]
               for h in stopped["hunks"])
    clean = tmp_path / "clean"
    _git(tmp_path, "clone", "-q", str(work), str(clean))
    _git(clean, "apply", str(work / "port.patch"))
    assert _git(clean, "status", "--porcelain").split() == ["M", "patches/pins.yaml"]
    added = load_pins(clean / "patches" / "pins.yaml").get("vllm-0.27.1")
    assert added.version == "0.27.1" and added.sdist.file == "vllm-0.27.1.tar.gz"
