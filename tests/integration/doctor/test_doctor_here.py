"""`g4build doctor` for real on the machine running the tests; expectations are read from the machine itself."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from g4build.doctor import SystemProbe, run_doctor
from g4build.doctor.checks import check_cuda, check_python_and_torch

TOOLKIT = Path(__file__).resolve().parents[3] / "toolkit"


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-engine.sock'}")


def _torch_here() -> dict[str, object]:
    code = "import json, torch; print(json.dumps({'cuda': torch.version.cuda}))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else {}


def test_doctor_here_reflects_this_machine(no_engine: None, tmp_path: Path) -> None:
    report = run_doctor(SystemProbe(), pin_torch="2.11.0", workdir=str(tmp_path))
    found = {f.check: f for f in report.findings}
    if shutil.which("nvidia-smi") is None:
        assert found["gpu"].status == "warn" and "R580" in found["gpu"].fix  # README: R580
        assert "driver" not in found
    assert found["docker"].status == "warn" and "start Docker" in found["docker"].fix
    assert found["docker"].summary.endswith("no Docker engine socket or pipe here (Docker is not installed or not "
                                            "started)")
    py = found["python"]
    assert py.status == "ok" and py.detail["version"] == "{}.{}.{}".format(*sys.version_info[:3])
    torch = _torch_here()
    if not torch:
        assert found["torch"].status == "fail" and "not importable" in found["torch"].summary
    elif torch["cuda"] is None:
        assert found["torch"].status == "fail" and "CPU-only" in found["torch"].summary
    free = shutil.disk_usage(tmp_path).free
    assert found["disk"].detail["free_bytes"] == pytest.approx(free, rel=0.05)
    assert found["memory"].detail["max_jobs"] >= 1
    assert not sys.platform.startswith("win") or "long-paths" in found


@pytest.mark.nvcc
def test_doctor_reads_the_real_nvcc() -> None:
    out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    release = re.search(r"release (\d+\.\d+)", out)
    assert release
    found = {f.check: f for f in check_cuda(SystemProbe(), wsl=False)}
    assert found["cuda"].detail["version"] == release.group(1)
    assert found["cuda"].status == ("ok" if tuple(map(int, release.group(1).split("."))) >= (12, 8) else "fail")


def test_a_python_that_does_not_exist_fails_with_the_fix(tmp_path: Path) -> None:
    (finding,) = check_python_and_torch(SystemProbe(), str(tmp_path / "no-python"), "2.11.0")
    assert finding.check == "python" and finding.status == "fail" and "--python" in finding.fix


def test_the_command_exits_14_exactly_when_a_check_fails(no_engine: None, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(TOOLKIT), "COLUMNS": "300"}
    proc = subprocess.run([sys.executable, "-m", "g4build", "doctor", "--json", "--path", str(tmp_path)],
                          capture_output=True, text=True, env=env, check=False)
    data = json.loads(proc.stdout)
    failed = [f["check"] for f in data["findings"] if f["status"] == "fail"]
    assert data["ok"] is (not failed)
    assert proc.returncode == (14 if failed else 0), proc.stderr
    if failed:
        assert f"{len(failed)} check(s) failed" in proc.stderr
    table = subprocess.run([sys.executable, "-m", "g4build", "doctor", "--path", str(tmp_path)],
                           capture_output=True, text=True, env=env, check=False)
    assert table.returncode == proc.returncode
    assert all(check in table.stdout for check in ("gpu", "cuda", "python", "memory", "disk", "docker"))


@pytest.mark.skipif(sys.platform == "win32", reason="the stand-in nvidia-smi is a shell script")
def test_the_table_prints_what_the_tools_said_as_text(no_engine: None, tmp_path: Path) -> None:
    # A real nvidia-smi first on PATH whose GPU name looks like rich markup: the table shows it as it is.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '[/x][bold]Odd GPU, 12.0, 580.65'\n")
    smi.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(TOOLKIT), "COLUMNS": "300",
           "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    table = subprocess.run([sys.executable, "-m", "g4build", "doctor", "--path", str(tmp_path)],
                           capture_output=True, text=True, env=env, check=False)
    assert "Traceback" not in table.stderr and table.returncode in (0, 14), table.stderr
    assert "GPU 0: [/x][bold]Odd GPU, SM120 detected" in table.stdout


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_a_path_that_is_not_a_folder_is_refused(tmp_path: Path, kind: str) -> None:
    # free space of some parent would be a different answer than the one asked for: refuse, exit 2, no report
    where = tmp_path / "not-yet" / "build"
    if kind == "file":
        where = tmp_path / "file.txt"
        where.write_text("x")
    env = {**os.environ, "PYTHONPATH": str(TOOLKIT), "COLUMNS": "300"}
    proc = subprocess.run([sys.executable, "-m", "g4build", "doctor", "--json", "--path", str(where)],
                          capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 2, proc.stderr
    error = json.loads(proc.stdout)
    assert set(error) == {"error", "hint", "exit_code"} and error["exit_code"] == 2
    assert str(where) in error["error"] and "expected" in error["error"]
    assert "found nothing there" in proc.stderr if kind == "missing" else "found a file" in proc.stderr
