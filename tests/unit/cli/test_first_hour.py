"""The papercuts a new user hits in the first hour, each through the real command line: shell names as --os
takes them, exit codes as the docs document them, wheels that cannot install where the script runs, copyable
dry-run steps, script modes, quiet broken pipes, `ci render --check` outside a project, and the drafter that
follows `--set model=`."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import g4build.cli as cli
import g4build.data as data
from g4build.emit.manifest import make_manifest
from g4build.pins.model import load_pins

REPO = Path(__file__).resolve().parents[3]
RECIPE = "gemma4-26b-a4b-nvfp4-dflash"
BASELINE = "gemma4-26b-a4b-nvfp4-baseline"  # needs no series: any vLLM wheel may serve it
LINUX_WHEEL = "vllm-0.21.0+cu130.g4.0123456789-cp38-abi3-manylinux_2_31_x86_64.whl"
WIN_WHEEL = "vllm-0.21.0+cu132-cp312-cp312-win_amd64.whl"


def g4(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO / "toolkit"), "G4BUILD_HOME": str(REPO), **(env or {})}
    return subprocess.run([sys.executable, "-m", "g4build", *args], capture_output=True, text=True,
                          encoding="utf-8", env=full, cwd=cwd or REPO, timeout=300, check=False)


def wheel(path: Path, manifest: dict[str, object] | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    dist = "-".join(path.name.split("-")[:2]) + ".dist-info"  # the wheel's own, as its file name says
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("vllm/__init__.py", "")
        if manifest is not None:
            archive.writestr(f"{dist}/build-manifest.json", json.dumps(manifest))
    return path


# --- --shell takes what --os takes: aliases and any case ---------------------------------------------------


@pytest.mark.parametrize(("given", "suffix"), [("pwsh", ".ps1"), ("PowerShell", ".ps1"), ("PWSH", ".ps1"),
                                               ("Bash", ".sh")])
def test_shell_aliases_and_case(tmp_path: Path, given: str, suffix: str) -> None:
    done = g4("recipe", "render", RECIPE, "--shell", given, "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert [p.name for p in tmp_path.iterdir()] == [RECIPE + suffix]


def test_an_unknown_shell_names_the_ones_taken() -> None:
    done = g4("recipe", "render", RECIPE, "--shell", "fish")
    assert done.returncode == 2
    assert "expected one of bash, powershell, pwsh" in done.stderr and "fish" in done.stderr


# --- a wheel that is not there: exit 5 everywhere (docs: 5 = file missing), nothing written -------------------


@pytest.mark.parametrize("args", [
    ("recipe", "render", RECIPE, "--shell", "bash", "--wheel", "nothere.whl"),
    ("recipe", "check", RECIPE, "--wheel", "nothere.whl"),
    ("validate", "nothere.whl"),
    ("overlay", "nothere.whl", "--pin", "vllm-0.21.0"),
])
def test_a_missing_wheel_exits_5(tmp_path: Path, args: tuple[str, ...]) -> None:
    out = tmp_path / "out"
    done = g4(*args, *(("--out", str(out)) if args[0] in ("recipe", "overlay") and args[1] != "check" else ()),
              cwd=tmp_path)
    assert done.returncode == 5, done.stderr
    assert "nothere.whl: expected a wheel file, found nothing there" in done.stderr
    assert not out.exists()


def test_a_folder_for_a_wheel_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "x.whl").mkdir()
    done = g4("validate", "x.whl", cwd=tmp_path)
    assert done.returncode == 2 and "x.whl: expected a wheel file, found a folder" in done.stderr


def test_the_docs_document_exit_5_for_a_missing_file() -> None:
    page = (REPO / "toolkit" / "docs" / "troubleshooting.md").read_text(encoding="utf-8")  # moved out of README
    assert "5 index unreachable or file missing" in " ".join(page.split())


# --- the wheel must fit the script: platform (refused for .ps1) and arch (warned) ------------------------------


def test_a_linux_wheel_is_refused_for_a_powershell_script(tmp_path: Path) -> None:
    linux = wheel(tmp_path / LINUX_WHEEL)
    out = tmp_path / "out"
    done = g4("recipe", "render", BASELINE, "--shell", "powershell", "--out", str(out), "--wheel", str(linux))
    assert done.returncode == 11, done.stderr
    said = " ".join(done.stderr.split())
    assert "is a Linux wheel (manylinux_2_31_x86_64), but a PowerShell launch script installs it on Windows" in said
    assert "win_amd64" in said and "--shell bash" in said  # what to do instead
    assert not out.exists()
    # the same wheel in a bash script (WSL/Linux) is fine
    ok = g4("recipe", "render", BASELINE, "--shell", "bash", "--out", str(out), "--wheel", str(linux))
    assert ok.returncode == 0, ok.stderr
    assert "wheel-platform" not in ok.stderr


def test_a_windows_wheel_in_a_bash_script_is_warned(tmp_path: Path) -> None:
    win = wheel(tmp_path / WIN_WHEEL)
    done = g4("recipe", "render", BASELINE, "--shell", "bash", "--out", str(tmp_path / "out"), "--wheel", str(win))
    assert done.returncode == 0, done.stderr
    assert "warning [wheel-platform]" in done.stderr and "--shell powershell" in done.stderr


def test_the_arch_warning_names_validate_unless_built_for_the_card(tmp_path: Path) -> None:
    pin = load_pins().get("vllm-0.21.0")
    overlaid = wheel(tmp_path / "a" / LINUX_WHEEL, make_manifest(pin, [], route="overlay"))
    done = g4("recipe", "render", BASELINE, "--shell", "bash", "--out", str(tmp_path / "a"), "--wheel", str(overlaid))
    assert done.returncode == 0, done.stderr
    said = " ".join(done.stderr.split())
    assert "warning [wheel-arch]" in said and f"g4build validate {overlaid} --arch sm120" in said  # as given
    assert "g4build wheel --arch sm120 --os linux" in said  # a command that runs: --os is required
    target = {"target": {"arch": "sm120", "os": "linux", "cuda": "13.0"}}
    built = wheel(tmp_path / "b" / LINUX_WHEEL, make_manifest(pin, [], route="build", extra=target))
    done = g4("recipe", "render", BASELINE, "--shell", "bash", "--out", str(tmp_path / "b"), "--wheel", str(built))
    assert done.returncode == 0, done.stderr
    assert "wheel-arch" not in done.stderr


# --- the drafter follows --set model= (both checkpoints found the same way) -----------------------------------


def _spec_json(text: str) -> dict[str, object]:
    words = shlex.split(text.split("vllm_args=(", 1)[1].split(")", 1)[0])
    return dict(json.loads(words[words.index("--speculative-config") + 1]))


@pytest.mark.parametrize("model", ["D:/models/gemma-4-26B-A4B-it-NVFP4", "/srv/models/gemma-4-26B-A4B-it-NVFP4",
                                   "D:\\models\\gemma-4-26B-A4B-it-NVFP4"])
def test_the_drafter_follows_set_model(model: str) -> None:
    done = g4("recipe", "render", RECIPE, "--shell", "bash", "--set", f"model={model}")
    assert done.returncode == 0, done.stderr
    folder = model[: max(model.rfind("/"), model.rfind("\\")) + 1]
    assert _spec_json(done.stdout)["model"] == folder + "gemma-4-26B-A4B-it-DFlash"
    assert "speculative.model follows --set model=" in done.stderr


@pytest.mark.parametrize("model", ["D:\\models\\x", "D:/models/x", "/srv/models/x", "./elsewhere/x"])
def test_show_and_render_agree_on_the_drafter_after_set_model(model: str) -> None:
    shown = g4("recipe", "show", RECIPE, "--json", "--set", f"model={model}")
    rendered = g4("recipe", "render", RECIPE, "--shell", "bash", "--set", f"model={model}")
    assert shown.returncode == 0 and rendered.returncode == 0, shown.stderr + rendered.stderr
    data = json.loads(shown.stdout)
    argv = data["argv"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == _spec_json(rendered.stdout) and data["speculative"]["model"] == spec["model"]
    assert argv[1:] == shlex.split(rendered.stdout.split("vllm_args=(", 1)[1].split(")", 1)[0])  # every word
    assert spec["model"] != "./models/gemma-4-26B-A4B-it-DFlash"  # moved beside the target, in both


def test_an_explicit_drafter_or_a_hub_id_is_left_alone() -> None:
    mine = g4("recipe", "render", RECIPE, "--shell", "bash", "--set", "model=/srv/m/target",
              "--set", "speculative.model=/elsewhere/drafter")
    assert mine.returncode == 0, mine.stderr
    assert _spec_json(mine.stdout)["model"] == "/elsewhere/drafter" and "follows" not in mine.stderr
    hub = g4("recipe", "render", RECIPE, "--shell", "bash", "--set", "model=nvidia/Gemma-4-26B-A4B-NVFP4")
    assert hub.returncode == 0, hub.stderr
    assert _spec_json(hub.stdout)["model"] == "./models/gemma-4-26B-A4B-it-DFlash" and "follows" not in hub.stderr


# --- wheel --dry-run: each step a command line that runs as printed -------------------------------------------


def test_dry_run_steps_are_copyable_bash() -> None:
    plan = json.loads(g4("wheel", "--arch", "sm120", "--os", "linux", "--dry-run", "--json").stdout)
    shown = g4("wheel", "--arch", "sm120", "--os", "linux", "--dry-run").stdout.splitlines()
    lines = [shown[i + 1].strip() for i, line in enumerate(shown) if re.match(r"\s*\d+\. ", line)]
    assert len(lines) == len(plan["steps"])
    checks = 0
    for line, step in zip(lines, plan["steps"], strict=True):
        assert shlex.split(line) == step["command"], line
        if step["name"] in ("python", "torch", "torch-kept"):  # the checks read as what they check, no program
            assert "-c" not in step["command"] and len(line) < 120, line
        checks += "build-check" in step["command"]
    assert checks >= 2  # the torch checks, through `g4build build-check`


def test_dry_run_steps_are_powershell_quoted() -> None:
    from g4build.util.shellquote import ps_command

    plan = json.loads(g4("wheel", "--arch", "sm120", "--os", "windows", "--dry-run", "--json").stdout)
    shown = g4("wheel", "--arch", "sm120", "--os", "windows", "--dry-run").stdout
    for step in plan["steps"]:
        assert ps_command(step["command"]) in shown
    windows_root = next(s["command"] for s in plan["steps"] if s["name"] == "validate")  # a quoted pattern
    line = ps_command(windows_root)
    pytest.importorskip("tree_sitter_powershell")
    from tests.unit.builder.ps_tree import _walk, parse, string_value

    tree = parse(line + "\n")
    literals = [string_value(n) for n in _walk(tree.root_node) if n.type == "string_literal"]
    assert windows_root[2] in literals  # the wheel pattern reaches g4build as one argument, exactly


# --- --emit-script modes ---------------------------------------------------------------------------------------


def test_emitted_scripts_have_sensible_modes(tmp_path: Path) -> None:
    for os_name, name, mode in (("windows", "build.ps1", 0o644), ("linux", "build.sh", 0o755)):
        done = g4("wheel", "--arch", "sm120", "--os", os_name, "--emit-script", str(tmp_path / name))
        assert done.returncode == 0, done.stderr
        umask = os.umask(0)
        os.umask(umask)
        assert (tmp_path / name).stat().st_mode & 0o777 == mode & ~umask, name


# --- `| head -1`: a reader that leaves early is no error -------------------------------------------------------


def test_a_closed_pipe_exits_0_quietly() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "toolkit"), "G4BUILD_HOME": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "g4build", "wheel", "--arch", "sm120", "--os", "windows",
                             "--dry-run"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=REPO)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline()
    proc.stdout.close()  # as `head -1` does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert err == ""


# --- ci render --check outside a project -----------------------------------------------------------------------


def test_ci_check_without_a_project_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    installed = tmp_path / "site" / "g4build" / "_data"  # what an installed (non-editable) g4build reads
    for folder in ("patches", "recipes", "ci"):
        shutil.copytree(REPO / folder, installed / folder)
    monkeypatch.setattr(data, "_installed_data", lambda: installed)
    monkeypatch.setenv("G4BUILD_HOME", str(installed))
    with pytest.raises(SystemExit) as exc:
        cli.main(["ci", "render", "--check"])
    assert exc.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "ci render --check compares a checkout's .github/workflows/ with ci/matrix.yaml" in err
    assert "stale" not in err
    assert not (installed / ".github").exists()


# --- wheel --os windows for a pin without a Windows base: the routes that work, each of them a working command --


def test_a_pin_without_a_windows_base_names_the_routes_that_work() -> None:
    done = g4("wheel", "--arch", "sm120", "--os", "windows", "--pin", "vllm-0.26.0", "--dry-run")
    assert done.returncode == 2
    said = " ".join(done.stderr.split())
    assert "pin vllm-0.26.0 names no Windows base" in said
    routes = re.findall(r"`(g4build [^`]+)`", said)
    overlay = next(r for r in routes if r.startswith("g4build overlay "))
    assert overlay.endswith("--pin vllm-0.26.0") and "win_amd64.whl" in overlay
    wsl = next(r for r in routes if "--os wsl" in r)
    assert g4(*shlex.split(wsl)[1:], "--dry-run").returncode == 0  # the suggested build plans as written
    assert "bases.windows to vllm-0.26.0 in patches/pins.yaml" in said and "full commit of its 0.26.0 release" in said


def test_source_fetch_of_a_missing_windows_base_names_the_same_routes(tmp_path: Path) -> None:
    done = g4("source", "fetch", "--pin", "vllm-0.26.0", "--os", "windows", "--dest", str(tmp_path / "src"))
    assert done.returncode == 2
    said = " ".join(done.stderr.split())
    assert "pin vllm-0.26.0 names no windows base" in said and "no verified fork tree" in said
    routes = re.findall(r"`(g4build [^`]+)`", said)
    assert any(r.startswith("g4build overlay vllm-0.26.0+cu132-cp312-cp312-win_amd64.whl") for r in routes)
    wsl = next(r for r in routes if "--os wsl" in r)
    assert g4(*shlex.split(wsl)[1:], "--dry-run").returncode == 0
    assert not (tmp_path / "src").exists()
