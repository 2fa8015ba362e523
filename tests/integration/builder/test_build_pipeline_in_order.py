"""The build route as it runs, to the end: `g4build wheel --arch sm120 --os linux` on a small stand-in for vLLM's
source (tests/fixtures/vllm_standin: setup.py + CMake + one CUDA unit, packed as the pin's sdist), through the real
plan's steps in their real order — source fetch from the verified cache, series applied, prefetch, the build
requirements, a real `pip wheel` with nvcc for sm_120, the manifest written into the wheel and the wheel retagged,
then validate. The first finished vLLM build failed exactly here (validate ran before the manifest existed), and
no test ran the steps in order to the end.

The one stand-in is torch: the torch steps check for the pin's torch built for CUDA, which a CI machine does not
install (several GB); an interpreter wrapper puts a `torch` module reporting that version first on its path.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from tests.support.wheelsfactory import SeriesSpec, git_patch, make_project, run_g4build
from tests.support.yamltext import yaml_text

from g4build.data import patches_dir

pytestmark = [pytest.mark.nvcc, pytest.mark.cmake]
FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_standin"
PIN = "vllm-0.21.0"
SPEC_OLD = (FIXTURE / "vllm" / "spec.py").read_text()
SPEC_NEW = SPEC_OLD.replace("min(n, 8)", "min(n, 16)  # G4 standin: longer drafts")


def _sdist(dest: Path) -> Path:
    """The stand-in tree as the pin's sdist (vllm-0.21.0/..., PKG-INFO, requirements/build/cuda.txt)."""
    files: dict[str, bytes] = {}
    for path in sorted(FIXTURE.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            files[path.relative_to(FIXTURE).as_posix()] = path.read_bytes()
    files["requirements/build/cuda.txt"] = files.pop("requirements-build-cuda.txt")
    files["PKG-INFO"] = b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.21.0\n"
    out = dest / "vllm-0.21.0.tar.gz"
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"vllm-0.21.0/{name}")
            info.size, info.mode, info.mtime = len(data), 0o644, 1_700_000_000
            tar.addfile(info, io.BytesIO(data))
    return out


def _project(root: Path, sdist: Path, work: Path) -> Path:
    pins = yaml.safe_load((patches_dir() / "pins.yaml").read_text())
    pin = pins["pins"][PIN]
    pin["sdist"] = {"file": sdist.name, "sha256": hashlib.sha256(sdist.read_bytes()).hexdigest()}
    pin.pop("wheels", None)
    pin.pop("bases", None)
    pins["pins"] = {PIN: pin}
    pins["default"] = PIN
    patch = git_patch({"vllm/spec.py": SPEC_OLD}, {"vllm/spec.py": SPEC_NEW}, work / "patch")
    make_project(root, [SeriesSpec(name="standin-drafts", patches=[patch],
                                   fingerprints={"vllm/spec.py": ["G4 standin: longer drafts"]})],
                 pins_text=yaml_text(pins))
    (root / "patches" / "deps").mkdir(exist_ok=True)
    (root / "patches" / "deps" / "series.yaml").write_text("order: []\n")
    return root


def _python_with_cuda_torch(folder: Path, torch_version: str, cuda: str) -> Path:
    """An interpreter (this one) that imports a `torch` reporting ``torch_version`` built for ``cuda``."""
    mod = folder / "site" / "torch"
    mod.mkdir(parents=True)
    (mod / "__init__.py").write_text(
        f"__version__ = '{torch_version}+cu{cuda.replace('.', '')}'\n\n\nclass version:\n    cuda = '{cuda}'\n")
    exe = folder / "python-cuda-torch"
    site = folder / "site"
    exe.write_text(f'#!/bin/sh\nPYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{sys.executable}" "$@"\n')
    exe.chmod(0o755)
    return exe


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_wheel_runs_its_steps_in_order_to_a_wheel_that_passes_its_own_validation(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    sdist = _sdist(cache / "sdists")
    project = _project(tmp_path / "project", sdist, tmp_path)
    pin = yaml.safe_load((project / "patches" / "pins.yaml").read_text())["pins"][PIN]
    python = _python_with_cuda_torch(tmp_path / "py", pin["torch"], pin["cuda"])
    bindir = str(Path(sys.executable).parent)
    env = {"G4BUILD_HOME": str(project), "G4BUILD_CACHE": str(cache),
           "PATH": os.pathsep.join([bindir, os.environ.get("PATH", "")]), "PIP_NO_INDEX": "1"}
    root, out = tmp_path / "root", tmp_path / "out"
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    proc = run_g4build("wheel", "--arch", "sm120", "--os", "linux", "--no-flashinfer", "--jobs", "2",
                       "--python", py, "--python-exe", str(python), "--root", str(root), "--out", str(out),
                       "--json", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    result = json.loads(proc.stdout)
    ran = [s["name"] for s in result["result"]]
    planned = [s["name"] for s in result["steps"]]
    assert ran == planned  # every step ran, in the plan's order
    assert planned.index("vllm") < planned.index("manifest") < planned.index("validate") == len(planned) - 1

    wheels = sorted(out.glob("vllm-*.whl"))
    assert len(wheels) == 1, wheels
    wheel = wheels[0]
    # pip wheel named it after the interpreter (cpXY-cpXY-linux_x86_64); the manifest step gave it the tags its
    # library justifies: abi3 (the only extension is one) for the lowest Python it admits, manylinux from glibc
    name_tags = wheel.name[:-len(".whl")].split("-")[-3:]
    assert name_tags[:2] == ["cp310", "abi3"] and name_tags[2].startswith("manylinux_2_"), wheel.name
    assert name_tags[2].endswith("_x86_64") or name_tags[2].endswith("_aarch64")
    with zipfile.ZipFile(wheel) as zf:
        dist = next(n.split("/")[0] for n in zf.namelist() if n.endswith(".dist-info/WHEEL"))
        assert f"Tag: {'-'.join(name_tags)}" in zf.read(f"{dist}/WHEEL").decode()
        manifest = json.loads(zf.read(f"{dist}/build-manifest.json"))
        assert [s["name"] for s in manifest["series"]] == ["standin-drafts"]
        assert wheel.name in manifest["wheels"] and wheel.name in manifest["tags"]
        assert "G4 standin: longer drafts" in zf.read("vllm/spec.py").decode()
    assert json.loads((out / "build-manifest.json").read_text())["wheels"] == manifest["wheels"]

    # what the validate step said, again by hand: series seen, tags held to the library, sm_120 code
    check = run_g4build("validate", str(wheel), "--arch", "sm120", "--pin", PIN, "--json", env=env)
    report = json.loads(check.stdout)
    checks = {c["name"]: c for w in report.get("wheels", [report]) for c in w["checks"]}
    assert check.returncode == 0, json.dumps(checks, indent=1)
    assert "standin-drafts" in checks["series"]["detail"]
    assert checks["tags"]["ok"] and "1 extension modules" in checks["tags"]["detail"]
