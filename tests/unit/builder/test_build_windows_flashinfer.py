"""The Windows FlashInfer route of the build: the user's Windows FlashInfer wheels are checked by name when
planning, by sha256 before the compile (the emitted PowerShell read through the real grammar), copied beside the
vLLM wheel and recorded in build-manifest.json; without them the manifest records none."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest
from tests.support.wheelsfactory import build_wheel

from g4build.builder.flashinfer import FlashInferWheel, check_names, parse_spec
from g4build.builder.plan import Options, base_os_of
from g4build.builder.planner import default_layout, make_plan
from g4build.builder.request import series_for
from g4build.builder.script import render_powershell
from g4build.errors import UsageError
from g4build.pins.model import Pin
from g4build.recipes.context import read_wheel_info
from g4build.series.deps import build_series_for, uncovered

from . import ps_tree
from .conftest import run_cli, target

FI = "flashinfer_python-0.6.8.post1-py3-none-any.whl"
JIT = "flashinfer_jit_cache-0.6.8.post1+cu130-cp39-abi3-win_amd64.whl"


def _wheel(folder: Path, name: str) -> tuple[Path, str]:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("flashinfer/__init__.py", f"# {name}\n")
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def _plan(pin: Pin, wheels: tuple[FlashInferWheel, ...], os_name: str = "windows"):  # type: ignore[no-untyped-def]
    """As `g4build wheel` plans it: with the build series for the pin's base tree of that OS."""
    t = target(os_name)
    base_os = base_os_of(pin, os_name)
    return make_plan(pin, series_for(pin), t, layout=default_layout(pin, t, base="/tmp/g4b"),
                     opts=Options(jobs=4, flashinfer_wheels=wheels), build=build_series_for(pin, base_os=base_os),
                     uncovered=uncovered(pin, base_os=base_os))


def test_plan_checks_the_wheels_before_the_source_and_records_them(pin21: Pin) -> None:
    wheels = (FlashInferWheel(path=f"C:\\dl\\{FI}", sha256="a" * 64), FlashInferWheel(path=f"D:\\x\\{JIT}",
                                                                                       sha256="b" * 64))
    plan = _plan(pin21, wheels)
    names = [s.name for s in plan.steps]
    assert names[:3] == ["python", "flashinfer-wheels", "source"]  # a wrong file stops before hours of compiling
    step = plan.step("flashinfer-wheels")
    assert step.command[1:] == ("flashinfer-wheels", "--pin", "vllm-0.21.0", "--python", "3.12", "--out",
                                "C:\\g4b\\wheels", "--wheel", f"C:\\dl\\{FI}={'a' * 64}", "--wheel",
                                f"D:\\x\\{JIT}={'b' * 64}")
    manifest = plan.step("manifest").command
    assert manifest[-4:] == ("--flashinfer-wheel", f"{FI}={'a' * 64}", "--flashinfer-wheel", f"{JIT}={'b' * 64}")
    assert any(n.startswith(f"FlashInfer: the Windows wheels given ({FI}, {JIT})") for n in plan.notes)
    tree = ps_tree.parse(render_powershell(plan))
    cmds = ps_tree.commands(tree)
    [copy] = [c for c in cmds if c.name == "g4build" and c.args[0] == "flashinfer-wheels"]
    [source] = [c for c in cmds if c.name == "g4build" and c.args[:2] == ("source", "fetch")]
    assert copy.index < source.index and f"C:\\dl\\{FI}={'a' * 64}" in copy.args


def test_without_wheels_the_plan_says_flashinfer_is_off(pin21: Pin) -> None:
    plan = _plan(pin21, ())
    assert "flashinfer-wheels" not in [s.name for s in plan.steps]
    assert "--flashinfer-wheel" not in plan.step("manifest").command
    [note] = [n for n in plan.notes if n.startswith("FlashInfer:")]
    assert "the launch scripts turn every FlashInfer path off" in note and "--flashinfer-wheel PATH=SHA256" in note


@pytest.mark.parametrize(("names", "message"), [
    ([FI.replace("0.6.8.post1", "0.6.9")], r"expected FlashInfer 0.6.8.post1 .*found 0.6.9"),
    (["flashinfer_tools-0.6.8.post1-py3-none-any.whl"],
     r"expected a wheel of flashinfer-python, .*found flashinfer-tools"),
    ([FI.replace("py3-none-any", "cp312-cp312-manylinux_2_28_x86_64")], r"expected a win_amd64 \(or pure\) wheel"),
    ([FI.replace("py3-none-any", "cp311-cp311-win_amd64")], r"for Python 3.12"),
    ([JIT], r"expected a flashinfer-python wheel among them"),
    ([FI, FI.replace("py3-none-any", "cp312-cp312-win_amd64")], r"two wheels of flashinfer-python"),
    (["not-a-wheel.zip"], r"not a wheel file name"),
])
def test_wrong_wheels_are_refused_when_planning(pin21: Pin, names: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        check_names([FlashInferWheel(path=f"C:\\dl\\{n}", sha256="a" * 64) for n in names], pin21, "3.12")


def test_abi3_and_pure_wheels_fit(pin21: Pin) -> None:
    check_names([FlashInferWheel(path=f"C:\\dl\\{n}", sha256="a" * 64) for n in (FI, JIT)], pin21, "3.12")


def test_spec_and_os_are_checked_by_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["wheel", "--arch", "sm120", "--dry-run", "--json"]
    code, _, err = run_cli([*base, "--os", "linux", "--flashinfer-wheel", f"/dl/{FI}={'a' * 64}"], capsys)
    assert code == 2 and "--flashinfer-wheel is for Windows builds" in err
    code, _, err = run_cli([*base, "--os", "windows", "--flashinfer-wheel", f"C:\\dl\\{FI}"], capsys)
    assert code == 2 and "expected PATH=SHA256" in err
    code, out, _ = run_cli([*base, "--os", "windows", "--flashinfer-wheel", f"C:\\dl\\{FI}={'A' * 64}"], capsys)
    assert code == 0 and any(s["name"] == "flashinfer-wheels" for s in json.loads(out)["steps"])
    assert parse_spec(f"C:\\a=b\\{FI}={'A' * 64}").path == f"C:\\a=b\\{FI}"  # split at the last '='


def test_copy_step_checks_sha256_before_copying(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fi, fi_sha = _wheel(tmp_path / "dl", FI)
    jit, jit_sha = _wheel(tmp_path / "dl", JIT)
    out = tmp_path / "wheels"
    argv = ["flashinfer-wheels", "--pin", "vllm-0.21.0", "--out", str(out), "--wheel", f"{fi}={fi_sha}"]
    code, _, err = run_cli([*argv, "--wheel", f"{jit}={'0' * 64}"], capsys)
    assert code == 4 and f"expected sha256 {'0' * 64}, found {jit_sha}" in err
    assert not out.exists()  # every file is checked before the first copy
    code, stdout, _ = run_cli([*argv, "--wheel", f"{jit}={jit_sha}", "--json"], capsys)
    assert code == 0 and json.loads(stdout)["wheels"] == [{"file": FI, "sha256": fi_sha},
                                                          {"file": JIT, "sha256": jit_sha}]
    assert sorted(p.name for p in out.iterdir()) == sorted([FI, JIT])
    assert (out / FI).read_bytes() == fi.read_bytes()


def test_manifest_records_the_wheels_or_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "wheels"
    build_wheel(out, version="0.21.0+cu130", tag="cp312-cp312-win_amd64")  # the vLLM wheel it stamps
    base = ["manifest", "--pin", "vllm-0.21.0", "--out", str(out), "--os", "windows", "--json"]
    code, stdout, _ = run_cli(base, capsys)
    assert code == 0
    assert json.loads(stdout)["manifest"]["flashinfer"]["source"] == "none"
    assert json.loads((out / "build-manifest.json").read_text())["flashinfer"]["source"] == "none"
    (vllm,) = out.glob("vllm-*.whl")
    stamped = read_wheel_info(vllm).flashinfer  # what `recipe check --wheel` and the launch scripts read
    assert stamped is not None and stamped.presence == "absent" and "recorded no FlashInfer wheels" in stamped.why
    _, sha = _wheel(out, FI)
    code, stdout, _ = run_cli([*base, "--flashinfer-wheel", f"{FI}={sha}"], capsys)
    assert code == 0
    assert json.loads(stdout)["manifest"]["flashinfer"] == {"source": "wheels", "version": "0.6.8.post1",
                                                           "wheels": [{"file": FI, "sha256": sha}]}
    (vllm,) = out.glob("vllm-*.whl")
    stamped = read_wheel_info(vllm).flashinfer
    assert stamped is not None and (stamped.presence, stamped.wheels) == ("present", (FI,))
    code, _, err = run_cli([*base, "--flashinfer-wheel", f"{FI}={'0' * 64}"], capsys)
    assert code == 4 and "the FlashInfer wheel the build copied there" in err
    code, stdout, _ = run_cli(["manifest", "--pin", "vllm-0.21.0", "--out", str(out), "--os", "linux", "--json"],
                              capsys)
    assert code == 0 and "flashinfer" not in json.loads(stdout)["manifest"]


def test_the_plans_own_commands_run(pin21: Pin, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The flashinfer-wheels and manifest steps exactly as planned (their --out pointed at a folder here)."""
    fi, sha = _wheel(tmp_path / "dl", FI)
    plan = _plan(pin21, (FlashInferWheel(path=str(fi), sha256=sha),))
    out = tmp_path / "wheels"
    build_wheel(out, version=plan.version, tag="cp312-cp312-win_amd64")  # what the vllm step builds

    def here(argv: tuple[str, ...]) -> list[str]:
        args = list(argv[1:])  # without the leading `g4build`
        args[args.index("--out") + 1] = str(out)
        return [a for i, a in enumerate(args) if a != "--state" and (i == 0 or args[i - 1] != "--state")]

    code, _, err = run_cli(here(plan.step("flashinfer-wheels").command), capsys)
    assert code == 0, err
    code, _, err = run_cli(here(plan.step("manifest").command), capsys)
    assert code == 0, err
    record = json.loads((out / "build-manifest.json").read_text())["flashinfer"]
    assert record == {"source": "wheels", "version": "0.6.8.post1", "wheels": [{"file": FI, "sha256": sha}]}
