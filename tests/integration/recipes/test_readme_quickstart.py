"""README's quickstart, run as written.

The bash block runs in bash from its first line to its last, `set -e`: a fresh clone (git's clone copies this
checkout's files), a venv, pip and uv, `g4build doctor`, the overlay, the model download, `recipe render`, then
the launch script. What cannot happen here is stood in for, each at its own edge: pip, uv and hf are recorded
(downloads); the doctor runs the real command against the recorded WSL machine that is ready for the overlay
route (this machine has no GPU); the launch script runs with recording stubs for vllm, nvidia-smi and python3.
The overlay writes the wheel `g4build overlay --pin` writes (its manifest); the heavy variant runs the real
overlay of the registry's wheel. The PowerShell block renders a script that parses with the same words."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.integration.recipes.conftest import REPO, Stubs, make_wheel
from tests.integration.recipes.test_recipe_powershell_ast import PsScript

from g4build.emit.manifest import make_manifest
from g4build.pins.index import cache_root
from g4build.pins.model import load_pins
from g4build.series.model import load_all

README = (REPO / "README.md").read_text(encoding="utf-8")
QUICK = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
RECIPE = "gemma4-26b-a4b-nvfp4-dflash"


def block(language: str) -> str:
    (found,) = re.findall(rf"```{language}\n(.*?)```", QUICK, re.S)
    return str(found)


def line(language: str, needle: str) -> str:
    (found,) = [x for x in block(language).splitlines() if needle in x]
    return str(found)


def overlaid(folder: Path, pin_name: str, name: str) -> Path:
    """A wheel as `g4build overlay --pin PIN` names and stamps it: its manifest carries the pin's series."""
    pin = load_pins().get(pin_name)
    series = [s for s in load_all() if s.variant(pin.name) is not None]
    return make_wheel(folder / name, make_manifest(pin, series, route="overlay"))


_RECORD = '''import json, os, sys
with open(os.environ["QS_RECORD"], "a", encoding="utf-8") as fh:
    fh.write(json.dumps({"prog": os.path.basename(sys.argv[0]), "argv": sys.argv[1:], "cwd": os.getcwd(),
                         "venv": os.environ.get("VIRTUAL_ENV")}) + "\\n")
'''

_STANDINS = {
    # git clone URL DEST: this checkout's files (tracked and new ones git does not ignore)
    "git": _RECORD + '''import subprocess, shutil
from pathlib import Path
real = shutil.which("git", path=os.environ["QS_PATH"])
if sys.argv[1:2] != ["clone"]:  # any other git command (the overlay's own) is git's
    os.execv(real, [real, *sys.argv[1:]])
dest = Path(sys.argv[3])
listed = subprocess.run([real, "-C", os.environ["QS_REPO"], "ls-files", "-co", "--exclude-standard", "-z"],
                        capture_output=True, check=True, env={"PATH": os.environ["QS_PATH"]}).stdout
for rel in filter(None, listed.decode().split("\\0")):
    src = Path(os.environ["QS_REPO"], rel)
    if src.is_file():
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
''',
    # python3 -m venv DIR: a venv whose activate sets VIRTUAL_ENV as venv's does
    "python3": _RECORD + '''from pathlib import Path
if sys.argv[1:3] != ["-m", "venv"]:
    os.execv(os.environ["QS_PYTHON"], [os.environ["QS_PYTHON"], *sys.argv[1:]])
venv = Path(sys.argv[3]).absolute()
(venv / "bin").mkdir(parents=True)
(venv / "bin" / "activate").write_text(f'export VIRTUAL_ENV="{venv}"\\nexport PATH="$VIRTUAL_ENV/bin:$PATH"\\n')
''',
    # python -m pip / -m uv: recorded (downloads); anything else is the real Python
    "python": _RECORD + '''if sys.argv[1:2] != ["-m"] or sys.argv[2] not in ("pip", "uv"):
    os.execv(os.environ["QS_PYTHON"], [os.environ["QS_PYTHON"], *sys.argv[1:]])
''',
    "hf": _RECORD + '''from pathlib import Path
Path(sys.argv[sys.argv.index("--local-dir") + 1]).mkdir(parents=True)
''',
}

# The real `g4build doctor` command, on the recorded WSL machine ready for the overlay route (the GPU stand-in).
_DOCTOR = '''import sys
import g4build.cli.doctor as cli_doctor
from tests.unit.doctor.recorded import RecordedProbe
run = cli_doctor.run_doctor
cli_doctor.SystemProbe = lambda: RecordedProbe("wsl-5090-overlay")
cli_doctor.run_doctor = lambda probe, **kw: run(probe, **{**kw, "python": kw.get("python") or "python3"})
from g4build.cli import main
sys.argv[0] = "g4build"
main()
'''


def quickstart_env(tmp: Path, *, real_overlay: bool) -> tuple[dict[str, str], Path]:
    bin_dir, record = tmp / "qs-bin", tmp / "qs-record.jsonl"
    bin_dir.mkdir()
    for name, body in _STANDINS.items():
        (bin_dir / name).write_text(f"#!{sys.executable}\n{body}", encoding="utf-8")
        (bin_dir / name).chmod(0o755)
    (tmp / "doctor.py").write_text(_DOCTOR, encoding="utf-8")
    wheel = overlaid(tmp / "standin", "vllm-0.33.0", "vllm-0.33.0+g4.0123456789-cp38-abi3-manylinux_2_28_x86_64.whl")
    overlay = ('  overlay) if [ -z "$QS_REAL_OVERLAY" ]; then shift; while [ $# -gt 0 ]; do [ "$1" = --out ] && '
               f'out=$2; shift; done; mkdir -p "$out"; cp {shlex.quote(str(wheel))} "$out"/; exit 0; fi;;\n')
    (bin_dir / "g4build").write_text(
        "#!/bin/sh\ncase \"$1\" in\n"
        f"  doctor) exec {shlex.quote(sys.executable)} {shlex.quote(str(tmp / 'doctor.py'))} \"$@\";;\n"
        f"{overlay}esac\nexec {shlex.quote(sys.executable)} -m g4build \"$@\"\n", encoding="utf-8")
    (bin_dir / "g4build").chmod(0o755)
    env = {**os.environ, "HOME": str(tmp / "home"), "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "QS_PATH": os.environ["PATH"], "QS_PYTHON": sys.executable, "QS_REPO": str(REPO), "QS_RECORD": str(record),
           "PYTHONPATH": f"{REPO / 'toolkit'}{os.pathsep}{REPO}", "G4BUILD_REPO": "https://example.invalid/g4build.git",
           "G4BUILD_CACHE": str(cache_root() if real_overlay else tmp / "cache"), "COLUMNS": "200"}
    env.pop("G4BUILD_HOME", None)  # the clone is the project, found from where the commands run
    env.pop("VIRTUAL_ENV", None)
    if real_overlay:
        env["QS_REAL_OVERLAY"] = "1"
    (tmp / "home").mkdir()
    return env, record


def run_bash_quickstart(tmp: Path, stubs: Stubs, *, real_overlay: bool) -> list[dict[str, Any]]:
    """Every line of the bash block, `set -e`; then its launch script with the recording stubs."""
    lines = block("bash").strip().splitlines()
    *setup, launch = lines
    assert launch.startswith("./launch/")
    env, record = quickstart_env(tmp, real_overlay=real_overlay)
    work = tmp / "work"
    work.mkdir()
    done = subprocess.run(["bash", "-e", "-c", "\n".join(setup)], cwd=work, env=env, capture_output=True, text=True,
                          check=False, timeout=900)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert "route overlay, pin vllm-0.33.0" in done.stdout  # the doctor ran, for the route and pin, and passed
    clone = work / "g4build"
    script = clone / launch
    assert script.is_file() and os.access(script, os.X_OK)
    result = stubs.run(script)
    assert result.returncode == 0, result.stderr
    (vllm,) = [c for c in stubs.calls() if c["prog"] == "vllm"]
    target = line("bash", "hf download nvidia/").split("--local-dir ")[1].strip().replace("~", str(tmp / "home"))
    assert vllm["argv"][:2] == ["serve", target]
    spec = json.loads(vllm["argv"][vllm["argv"].index("--speculative-config") + 1])
    assert spec["model"] == str(Path(target).parent / "gemma-4-26B-A4B-it-DFlash")  # beside the target, as README says
    # everything the script opens was downloaded by the block: the target and the drafter, each by its repository
    calls = [json.loads(x) for x in record.read_text(encoding="utf-8").splitlines()]
    downloads = {c["argv"][1]: c["argv"][c["argv"].index("--local-dir") + 1] for c in calls if c["prog"] == "hf"}
    assert downloads == {"nvidia/Gemma-4-26B-A4B-NVFP4": target, "z-lab/gemma-4-26B-A4B-it-DFlash": spec["model"]}
    (installed,) = [c["argv"] for c in stubs.calls() if c["prog"] == "python3" and c["argv"][:1] == ["-m"]]
    assert installed[:3] == ["-m", "pip", "install"]
    assert Path(installed[3]).resolve().parent == (clone / "dist").resolve()  # the wheel the overlay wrote
    return [json.loads(x) for x in record.read_text(encoding="utf-8").splitlines()]


def test_the_bash_quickstart_runs_as_written(tmp_path: Path, stubs: Stubs) -> None:
    calls = run_bash_quickstart(tmp_path, stubs, real_overlay=False)
    venv = str(tmp_path / "home" / "g4b-venv")
    installs = [c for c in calls if c["prog"] == "python"]
    # every install goes into the venv the block made and activated, through its python (never a bare pip)
    assert installs and all(c["venv"] == venv for c in installs)
    torch = [c["argv"] for c in installs if any(str(a).startswith("torch==") for a in c["argv"])]
    pin = load_pins().get("vllm-0.33.0")
    assert torch == [["-m", "uv", "pip", "install", f"torch=={pin.torch}", "--torch-backend",
                      "cu" + pin.cuda.replace(".", "")]]  # the pin's torch, for its CUDA line


@pytest.mark.network
@pytest.mark.heavy  # the registry wheel of the pin the quickstart names (~300 MB), fetched once into the cache
def test_the_bash_quickstart_with_the_real_overlay(tmp_path: Path, stubs: Stubs) -> None:
    run_bash_quickstart(tmp_path, stubs, real_overlay=True)


def test_the_quickstarts_doctor_overlay_and_torch_name_one_pin() -> None:
    for language in ("bash", "powershell"):
        text = block(language)
        pins = set(re.findall(r"--pin (vllm-[\d.]+)", text))
        (pin_name,) = pins
        pin = load_pins().get(pin_name)
        assert f"g4build doctor --route overlay --pin {pin_name}" in text
        assert f"torch=={pin.torch} --torch-backend cu{pin.cuda.replace('.', '')}" in text
        assert "--set pin=" not in line(language, "g4build recipe render")  # the pin follows the wheel


def test_the_powershell_quickstarts_doctor_passes_on_a_machine_ready_for_it() -> None:
    """The block's doctor line, its route and pin as written, on the recorded Windows machine that has what the
    overlay route needs (driver, the pin's CUDA torch) and no CUDA toolkit or Visual Studio (no GPU here)."""
    from tests.unit.doctor.recorded import RecordedProbe

    from g4build.doctor import run_doctor

    words = line("powershell", "g4build doctor").split()
    route, pin = words[words.index("--route") + 1], load_pins().get(words[words.index("--pin") + 1])
    report = run_doctor(RecordedProbe("windows-5090-overlay"), python="python", pin_torch=pin.torch, pin=pin,
                        route=route, workdir="C:\\g4b")
    assert report.failed == (), [(f.check, f.summary) for f in report.failed]
    assert {f.check: f.status for f in report.findings}["torch"] == "ok"


def test_the_powershell_quickstart_as_written() -> None:
    text = block("powershell")
    lines = text.strip().splitlines()
    # the execution policy for this window, before the first script (Activate.ps1) runs
    policy = lines.index("Set-ExecutionPolicy -Scope Process -ExecutionPolicy Bypass")
    assert policy < next(i for i, x in enumerate(lines) if x.endswith("Activate.ps1"))
    # every install goes into the active venv: its python, never py -3.x -m pip or a bare pip
    for x in lines:
        for part in x.split(";"):
            words = part.split()
            if "pip" in words:
                assert words[:3] in (["python", "-m", "pip"], ["python", "-m", "uv"]), x
    # one wheel, the newest, however many overlays the folder holds
    assert "| Select-Object -First 1" in line("powershell", "$wheel =")
    # where the fork's wheel comes from is said, and it is the file the overlay line reads
    fork = re.search(r"g4build overlay \S+\\(vllm-[^\s\\]+\.whl)", text)
    assert fork is not None and f"`{fork.group(1)}`" in QUICK and "Releases page" in QUICK


def test_the_powershell_quickstart_renders_a_script_that_parses(tmp_path: Path) -> None:
    pytest.importorskip("tree_sitter_powershell")
    render = line("powershell", "g4build recipe render")
    pin = re.search(r"--pin (vllm-[\d.]+)", line("powershell", "g4build overlay"))
    assert pin is not None
    wheel = overlaid(tmp_path / "wheels", pin.group(1), "vllm-0.26.0+cu132.g4.0123456789-cp312-cp312-win_amd64.whl")
    out = tmp_path / "launch"
    words = render.split()[1:]  # PowerShell passes these words as they are: none is quoted
    words[words.index("$wheel")] = str(wheel)
    words[words.index("--out") + 1] = str(out)
    env = {**os.environ, "PYTHONPATH": str(REPO / "toolkit"), "G4BUILD_HOME": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "g4build", *words], env=env, capture_output=True, text=True,
                          check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"pin {pin.group(1)} follows the wheel's build-manifest.json" in done.stderr
    ps = PsScript((out / f"{RECIPE}.ps1").read_bytes())
    assert not ps.root.has_error
    argv = ps.array("$vllmArgs")
    target = render.split("--set model=")[1].split()[0]
    assert argv[:2] == ["serve", target]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["model"] == target.rsplit("\\", 1)[0] + "\\gemma-4-26B-A4B-it-DFlash"
