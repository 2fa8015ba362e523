"""`g4build wheel` and its step commands through the real CLI entry point."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

from g4build.wheelfile.manifestfile import MANIFEST_NAME, loads

from .conftest import run_cli


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    return run_cli(argv, capsys)


def test_readme_main_job_dry_run_works_anywhere(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["wheel", "--arch", "sm120", "--os", "windows", "--dry-run", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    assert data["target"]["os"] == "windows" and data["target"]["arch"] == "sm120"
    assert data["env"]["TORCH_CUDA_ARCH_LIST"] == "12.0f"
    assert [s["name"] for s in data["steps"]][:3] == ["python", "source", "patches"]
    assert data["steps"][1]["command"][-6:-2] == ["--pin", "vllm-0.21.0", "--os", "windows"]
    code, out, _ = _run(["wheel", "--arch", "sm_120", "--os", "windows", "--dry-run"], capsys)
    assert code == 0 and "vcvars" not in out and "TORCH_CUDA_ARCH_LIST" in out


@pytest.mark.parametrize(("argv", "code", "text"), [
    (["--arch", "sm86", "--os", "linux"], 2, "arch 'sm86'"),
    (["--arch", "sm121", "--os", "windows"], 2, "not a target on windows"),
    (["--arch", "sm120", "--os", "linux", "--cuda", "12.4"], 2, "needs CUDA >= 12.8"),
    (["--arch", "sm120", "--os", "linux", "--pin", "vllm-9.9.9"], 2, "unknown pin"),
    (["--arch", "sm120", "--os", "beos"], 2, "unknown OS"),
])
def test_bad_input_exits_with_its_code(capsys: pytest.CaptureFixture[str], argv: list[str], code: int,
                                       text: str) -> None:
    got, _, err = _run(["wheel", *argv, "--dry-run"], capsys)
    assert got == code and text in err


def test_emit_script(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ps1 = tmp_path / "build.ps1"
    assert _run(["wheel", "--arch", "12.0f", "--os", "windows", "--emit-script", str(ps1)], capsys)[0] == 0
    raw = ps1.read_bytes()
    assert raw.startswith(b"\xef\xbb\xbf")  # Windows PowerShell 5.1 reads UTF-8 only with a byte order mark
    assert "Invoke-Step 'vllm'" in raw.decode("utf-8-sig")
    assert [p.name for p in tmp_path.iterdir()] == ["build.ps1"]  # no temporary file left beside it
    sh = tmp_path / "build.sh"
    assert _run(["wheel", "--arch", "sm120", "--os", "linux", "--jobs", "3", "--emit-script", str(sh)], capsys)[0] == 0
    text = sh.read_text()
    assert text.startswith("#!/usr/bin/env bash") and 'MAX_JOBS="${MAX_JOBS:-3}"' in text
    assert subprocess.run(["bash", "-n", str(sh)], check=False).returncode == 0


def test_relative_out_is_one_absolute_folder_for_every_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the nightly passes `--out wheelhouse`; steps run in different folders, so it must become one absolute path
    monkeypatch.chdir(tmp_path)
    code, out, _ = _run(["wheel", "--arch", "sm120", "--os", "linux", "--out", "wheelhouse", "--dry-run", "--json"],
                        capsys)
    assert code == 0
    data = json.loads(out)
    wheels = (tmp_path / "wheelhouse").resolve().as_posix()
    assert data["target"]["out"] == wheels
    writers = {s["name"]: s["command"] for s in data["steps"]
               if s["name"] in ("vllm", "flashinfer-aot", "flashinfer-validate", "validate", "manifest")}
    assert len(writers) == 5
    for name, command in writers.items():
        assert any(a == wheels or a.startswith(wheels + "/") for a in command), name
        assert "wheelhouse" not in [a.split("/", 1)[0] for a in command], name


def test_relative_paths_for_another_kind_of_machine_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["wheel", "--arch", "sm120", "--os", "windows", "--out", "wheelhouse", "--dry-run"], capsys)
    assert code == 2 and "absolute path on the windows machine" in " ".join(err.split())
    code, out, _ = _run(["wheel", "--arch", "sm120", "--os", "windows", "--root", "C:\\b", "--out", "D:\\w",
                         "--dry-run", "--json"], capsys)
    assert code == 0 and json.loads(out)["target"]["out"] == "D:\\w"


def test_native_build_for_another_os_is_refused_before_anything_runs(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["wheel", "--arch", "sm120", "--os", "windows"], capsys)
    assert code == 2 and "must run on windows" in err  # a usage error (exit 2), not a failed build (9)
    assert "--emit-script" in err and "--dry-run" in err


def test_recipes_flag_adds_a_launch_script_step_per_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    from g4build.recipes import recipe_names

    code, out, _ = _run(["wheel", "--arch", "sm120", "--os", "windows", "--recipes", "--dry-run", "--json"], capsys)
    assert code == 0
    data = json.loads(out)
    steps = [s for s in data["steps"] if s["name"].startswith("recipe-")]
    assert [s["name"] for s in steps] == [f"recipe-{n}" for n in recipe_names()] and steps
    assert steps[0]["command"][1:4] == ["recipe", "render", recipe_names()[0]]
    assert steps[0]["command"][4:6] == ["--shell", "powershell"]
    assert steps[0]["command"][-1] == f"C:\\g4b\\wheels\\vllm-{data['target']['version']}-*.whl"


def _wheel(path: Path, name: str = "vllm", version: str = "0.21.0+cu130.g4.x") -> Path:
    dist = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": b"", f"{dist}/METADATA": f"Name: {name}\nVersion: {version}\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp38-abi3-linux_x86_64\n"}
    lines = []
    for n, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{n},sha256={digest},{len(data)}")
    lines.append(f"{dist}/RECORD,,")
    whl = path / f"{name}-{version}-cp38-abi3-linux_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        for n, data in files.items():
            zf.writestr(n, data)
        zf.writestr(f"{dist}/RECORD", "\n".join(lines) + "\n")
    return whl


def test_manifest_goes_beside_the_wheels_and_into_the_vllm_dist_info(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from g4build.builder.plan import wheel_version
    from g4build.builder.request import series_for
    from g4build.pins.model import load_pins
    from g4build.series.deps import build_series_for

    pin = load_pins().get("vllm-0.21.0")
    version = wheel_version(pin, series_for(pin), "13.0", build=build_series_for(pin))  # as the plan names it
    vllm = _wheel(tmp_path, version=version)
    other = _wheel(tmp_path, "flashinfer_python", "0.6.8.post1")
    earlier = _wheel(tmp_path, version="0.21.0+cu130.g4.0ld")  # an earlier build's wheel left in --out
    earlier_bytes = earlier.read_bytes()
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"done": {"vllm": {"digest": "d", "seconds": 12.5}}}))
    code, out, _ = _run(["manifest", "--out", str(tmp_path), "--state", str(state), "--arch", "sm120",
                         "--os", "linux", "--cuda", "13.0", "--json"], capsys)
    assert code == 0 and json.loads(out)["wheels_stamped"] == [vllm.name]
    beside = loads((tmp_path / MANIFEST_NAME).read_bytes(), "beside")
    assert beside["route"] == "build" and beside["pin"]["name"] == "vllm-0.21.0"
    assert beside["timings"] == {"vllm": 12.5} and beside["target"]["arch"] == "sm120"
    assert sorted(beside["wheels"]) == sorted([vllm.name, other.name, earlier.name])
    assert earlier.read_bytes() == earlier_bytes  # this manifest does not describe it
    with zipfile.ZipFile(vllm) as zf:
        member = f"vllm-{version}.dist-info/" + MANIFEST_NAME
        inside = zf.read(member)
        record = zf.read(f"vllm-{version}.dist-info/RECORD").decode().splitlines()
        assert zf.read("vllm/__init__.py") == b""
    assert loads(inside, "inside") == beside
    digest = base64.urlsafe_b64encode(hashlib.sha256(inside).digest()).rstrip(b"=").decode()
    assert f"{member},sha256={digest},{len(inside)}" in record
    assert record[-1].endswith("RECORD,,")
    with zipfile.ZipFile(other) as zf:
        assert not [n for n in zf.namelist() if n.endswith(MANIFEST_NAME)]
    # stamping twice keeps one entry
    assert _run(["manifest", "--out", str(tmp_path), "--cuda", "13.0"], capsys)[0] == 0
    with zipfile.ZipFile(vllm) as zf:
        assert zf.namelist().count(member) == 1
        assert sum(1 for ln in zf.read(f"vllm-{version}.dist-info/RECORD").decode().splitlines()
                   if ln.startswith(member)) == 1
    # a --cuda whose wheel is not there says what it expected and what it found
    code, _, err = _run(["manifest", "--out", str(tmp_path), "--cuda", "12.9"], capsys)
    flat = " ".join(err.split())
    assert code != 0 and "expected vllm-0.21.0+cu129" in flat and vllm.name in flat


def test_prefetch_command_writes_the_initial_cache(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    remote = tmp_path / "remote"
    remote.mkdir()
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "c"], ["tag", "v1"]):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@e", *args], cwd=remote, check=True)
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "CMakeLists.txt").write_text(f"FetchContent_Declare(dep GIT_REPOSITORY {remote.as_uri()} GIT_TAG v1)\n")
    out_file = tmp_path / "b" / "deps.cmake"
    code, out, _ = _run(["prefetch", "--tree", str(tree), "--cache", str(tmp_path / "c"), "--write", str(out_file),
                         "--json"], capsys)
    assert code == 0
    (row,) = json.loads(out)
    assert row["name"] == "dep" and row["variables"] == ["FETCHCONTENT_SOURCE_DIR_DEP"]
    assert f'FETCHCONTENT_SOURCE_DIR_DEP "{(tmp_path / "c" / "dep-v1").as_posix()}"' in out_file.read_text()


def test_every_g4build_command_in_a_plan_exists(capsys: pytest.CaptureFixture[str]) -> None:
    import typer

    from g4build.cli import app

    root: Any = typer.main.get_command(app)
    code, out, _ = _run(["wheel", "--arch", "sm120", "--os", "linux", "--recipes", "--dry-run", "--json"], capsys)
    assert code == 0
    windows = json.loads(_run(["wheel", "--arch", "sm120", "--os", "windows", "--dry-run", "--json"], capsys)[1])
    commands = [s["command"][1:] for s in json.loads(out)["steps"] + windows["steps"] if s["command"][0] == "g4build"]
    assert {c[0] for c in commands} >= {"source", "patches", "prefetch", "deps", "validate", "manifest", "recipe",
                                        "cuda-shim"}
    for argv in commands:
        if argv[0] == "patches" and "patches" not in root.commands:
            continue  # the patches engine lands separately
        cmd = root
        words = list(argv)
        while hasattr(cmd, "commands") and words and words[0] in cmd.commands:
            cmd = cmd.commands[words.pop(0)]
        assert not hasattr(cmd, "commands"), argv  # reached a command, not a group
        options = {o for p in cmd.params for o in getattr(p, "opts", [])}
        assert {w for w in words if w.startswith("--")} <= options, (argv, options)


def test_release_selects_its_pin_or_says_how_to_pin_it(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["wheel", "--arch", "sm120", "--os", "linux", "--dry-run", "--json"]
    code, by_release, _ = _run([*base, "--release", "0.33.0"], capsys)
    assert code == 0
    code, by_pin, _ = _run([*base, "--pin", "vllm-0.33.0"], capsys)
    assert code == 0
    assert json.loads(by_release)["steps"] == json.loads(by_pin)["steps"]
    code, _, err = _run([*base, "--release", "0.40.1"], capsys)
    assert code == 2
    assert "0.40.1 is not pinned" in err and "patches check --release 0.40.1" in err
    code, _, err = _run([*base, "--release", "0.33.0", "--pin", "vllm-0.33.0"], capsys)
    assert code == 2 and "not both" in err


def test_docker_build_mounts_root_and_copies_wheels_to_out(tmp_path: Path) -> None:
    from g4build.builder.request import docker_hosts
    from g4build.pins.index import cache_root

    chosen = docker_hosts("vllm-0.21.0", root=str(tmp_path / "root"), out=str(tmp_path / "wheels"))
    assert chosen.work == tmp_path / "root" and chosen.out == tmp_path / "wheels"
    default = docker_hosts("vllm-0.21.0", root=None, out=None)
    assert default.work == cache_root() / "docker" / "vllm-0.21.0" and default.out == Path.cwd() / "wheelhouse"
    assert chosen.deps == default.deps == cache_root() / "deps"
    relative = docker_hosts("vllm-0.21.0", root="r", out="w")
    assert relative.work == Path.cwd() / "r" and relative.out == Path.cwd() / "w"


def test_machine_choices_use_this_machine_only_where_it_compiles() -> None:
    from g4build.builder.arch import parse_arch
    from g4build.builder.host import HostFacts
    from g4build.builder.plan import Target, max_jobs
    from g4build.builder.request import FOREIGN_CORES, FOREIGN_MEM_GB, machine_choices

    here = HostFacts(os="linux", cores=4, mem_gb=64.0, free_gb=100.0, nvcc="/opt/host-cuda/bin/nvcc",
                     nvcc_version="12.8", cxx="/usr/bin/g++", launcher="sccache")
    mine = max_jobs(mem_gb=64.0, cores=4)
    foreign = max_jobs(mem_gb=FOREIGN_MEM_GB, cores=FOREIGN_CORES)
    assert mine != foreign

    def tgt(os_name: str, executor: str) -> Target:
        return Target(os=os_name, arch=parse_arch("sm120"), python="3.12", cuda="13.0", executor=executor)

    # a native build here: everything from this machine
    assert machine_choices(tgt("linux", "native"), here) == (mine, "sccache", "/opt/host-cuda")
    # a container on this machine: its RAM and cores, but the image's CUDA and no host launcher
    assert machine_choices(tgt("linux", "docker"), here) == (mine, None, None)
    assert machine_choices(tgt("wsl", "docker"), here) == (mine, None, None)
    # another machine (or none probed): a typical desktop
    assert machine_choices(tgt("windows", "native"), here) == (foreign, None, None)
    assert machine_choices(tgt("linux", "native"), None) == (foreign, None, None)
