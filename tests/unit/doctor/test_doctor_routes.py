"""`g4build doctor` checks what the chosen route and pin need: a machine ready to serve an overlaid wheel (driver,
the pin's CUDA torch; no CUDA toolkit, no Visual Studio) passes the overlay route and fails the build route; the
torch it is held against is the chosen pin's, which `--wheel` reads from the wheel's build-manifest.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tests.unit.doctor.recorded import RecordedProbe

from g4build.doctor import DoctorReport, run_doctor
from g4build.emit.manifest import make_manifest
from g4build.pins.model import load_pins

REPO = Path(__file__).resolve().parents[3]


def doctor(scenario: str, route: str, pin_name: str) -> DoctorReport:
    pin = load_pins().get(pin_name)
    python = "python" if scenario.startswith("windows") else "python3"
    return run_doctor(RecordedProbe(scenario), python=python, pin_torch=pin.torch, pin=pin, route=route,
                      workdir="C:\\g4b" if python == "python" else "/home/dev")


@pytest.mark.parametrize(("scenario", "pin"), [("windows-5090-overlay", "vllm-0.26.0"),
                                               ("wsl-5090-overlay", "vllm-0.33.0")])
def test_a_machine_ready_to_serve_passes_the_overlay_route_not_the_build(scenario: str, pin: str) -> None:
    for route in ("overlay", "nightly"):
        report = doctor(scenario, route, pin)
        assert report.failed == (), [(f.check, f.summary) for f in report.failed]
        checks = {f.check: f.status for f in report.findings}
        assert not {"cuda", "msvc", "memory", "docker", "compiler-cache"} & set(checks)  # a build's needs
        assert checks["torch"] == "ok" and "torch-pin" not in checks  # the pin's own torch
        assert report.to_dict()["route"] == route and report.to_dict()["pin"] == pin
    build = doctor(scenario, "build", pin)
    failed = {f.check for f in build.failed}
    assert "cuda" in failed  # no nvcc: a build cannot run here
    if scenario.startswith("windows"):
        assert {"msvc", "git-longpaths"} <= failed
        assert {f.check: f.status for f in doctor(scenario, "overlay", pin).findings}["git-longpaths"] == "warn"


def test_the_torch_is_the_chosen_pins() -> None:
    # the WSL machine has 0.33.0's torch 2.14: held against the default pin's 2.11 it is named, with what runs
    report = doctor("wsl-5090-overlay", "overlay", "vllm-0.21.0")
    (pin_torch,) = [f for f in report.findings if f.check == "torch-pin"]
    assert pin_torch.status == "warn"
    assert pin_torch.summary == "vLLM 0.21.0 (vllm-0.21.0) runs with torch 2.11.0, found 2.14.0+cu130"
    assert "python -m pip install torch==2.11.0" in pin_torch.fix
    with pytest.raises(ValueError, match="expected one of build, overlay, nightly"):
        doctor("wsl-5090-overlay", "serve", "vllm-0.33.0")


def g4(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "toolkit"), "G4BUILD_HOME": str(REPO), "COLUMNS": "300"}
    return subprocess.run([sys.executable, "-m", "g4build", *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300, check=False)


def test_the_cli_reads_route_and_pin_from_the_wheel(tmp_path: Path) -> None:
    pin = load_pins().get("vllm-0.33.0")
    wheel = tmp_path / "vllm-0.33.0+g4.0123456789-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("vllm-0.33.0+g4.0123456789.dist-info/build-manifest.json",  # the wheel's own dist-info
                         json.dumps(make_manifest(pin, [], route="overlay")))
    done = g4("doctor", "--wheel", str(wheel), "--json")
    assert done.returncode in (0, 14), done.stderr  # this machine's own findings decide between the two
    report = json.loads(done.stdout)
    assert (report["route"], report["pin"]) == ("overlay", "vllm-0.33.0")
    assert not {"cuda", "msvc"} & {f["check"] for f in report["findings"]}
    mismatch = g4("doctor", "--wheel", str(wheel), "--pin", "vllm-0.21.0")
    assert mismatch.returncode == 2 and "was built from pin vllm-0.33.0" in mismatch.stderr
    bad = g4("doctor", "--route", "serve")
    assert bad.returncode == 2 and "expected one of build, overlay, nightly" in bad.stderr


def test_no_gpu_fails_a_serving_route_and_only_warns_a_build() -> None:
    scenario = "linux-driver-down"  # nvidia-smi there, the driver not answering: no GPU listed
    for route in ("overlay", "nightly"):
        report = doctor(scenario, route, "vllm-0.33.0")
        (gpu,) = [f for f in report.findings if f.check == "gpu"]
        assert gpu.status == "fail" and gpu in report.failed
        assert gpu.fix is not None and "vLLM serves on an NVIDIA GPU" in gpu.fix and "R580" in gpu.fix
        assert "build" not in gpu.fix  # the fix speaks of serving
        assert len(report.findings) > 3  # the other checks still ran
    (build_gpu,) = [f for f in doctor(scenario, "build", "vllm-0.33.0").findings if f.check == "gpu"]
    assert build_gpu.status == "warn" and "a build without a GPU still targets sm_120" in str(build_gpu.fix)
