"""The publish job's index and release steps, run by bash as GitHub runs them: the real g4build builds the
index from a real (small) wheel, and a stub `gh` records what the release step asks of GitHub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from tests.support.indexsite import tiny_vllm_wheel

from g4build.ci import load_matrix
from g4build.ci.workflows import WORKFLOWS_DIR
from g4build.data import project_root

ROOT = project_root()

GH_STUB = """#!/usr/bin/env bash
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$G4_TEST_LOG"
"""


def _steps() -> dict[str, dict[str, Any]]:
    wf = yaml.safe_load((ROOT / WORKFLOWS_DIR / load_matrix().nightly.workflow).read_text(encoding="utf-8"))
    return {s["name"]: s for s in wf["jobs"]["publish"]["steps"]}


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_publish_builds_the_index_and_releases_wheels_with_their_metadata(tmp_path: Path) -> None:
    work = tmp_path / "work"
    wheel = tiny_vllm_wheel(work / "release", tmp_path / "pack")
    (work / "release" / "drift.json").write_text("{}", encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "g4build").write_text(f'#!/usr/bin/env bash\nexec "{sys.executable}" -m g4build "$@"\n')
    (bin_dir / "gh").write_text(GH_STUB)
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    log = tmp_path / "gh.jsonl"
    out = tmp_path / "github_output"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(ROOT / "toolkit"),
               GITHUB_OUTPUT=str(out), G4_TEST_LOG=str(log), GH_REPO="Some-Owner/g4build", RELEASE="0.21.0",
               PIN="vllm-0.21.0", RUN="42", INDEX_URL="", LEFT_OUT="none", GH_TOKEN="x",
               G4_TORCH_INDEX="https://torch.invalid/whl/{cu}")
    steps = _steps()
    done = _bash(steps["build the package index"]["run"], work, env)
    assert done.returncode == 0, done.stderr
    url = "https://some-owner.github.io/g4build"
    assert out.read_text(encoding="utf-8") == f"index_url={url}\n"
    site = work / "site"
    assert not (site / "files").exists()  # the wheels are release assets, not pages
    assert sorted(p.name for p in (work / "assets").iterdir()) == [f"{wheel.name}.metadata"]
    (entry,) = json.loads((work / "index.json").read_text(encoding="utf-8"))["wheels"]
    assert entry["build"]["pin"] == "vllm-0.21.0"
    links = json.loads((site / "simple" / "vllm" / "index.json").read_text(encoding="utf-8"))["files"]
    assert links[0]["url"] == ("https://github.com/Some-Owner/g4build/releases/download/g4build-vllm-0.21.0-run42/"
                               + wheel.name.replace("+", "%2B"))

    done = _bash(steps["create the release (immutable once published)"]["run"], work, {**env, "INDEX_URL": url})
    assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    create, publish = calls
    assert create[:4] == ["release", "create", "g4build-vllm-0.21.0-run42", "--draft"]
    assert sorted(create[create.index("notes.md") + 1:]) == [
        f"assets/{wheel.name}.metadata", "release/drift.json", f"release/{wheel.name}"]
    assert publish == ["release", "edit", "g4build-vllm-0.21.0-run42", "--draft=false"]
    notes = (work / "notes.md").read_text(encoding="utf-8")
    assert f"gh attestation verify {wheel.name} --repo Some-Owner/g4build" in notes
    assert f'"vllm=={entry["version"]}" --extra-index-url {url}/simple/' in notes
    assert "--extra-index-url https://torch.invalid/whl/cu130" in notes
