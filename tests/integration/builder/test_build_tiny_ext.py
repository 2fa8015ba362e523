"""CI-sized real build: the native executor runs a plan that builds the tests' own CUDA extension wheel with
this machine's nvcc for sm_120, and the library in the wheel holds sm_120 SASS."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename
from rich.console import Console

from g4build.builder.arch import parse_arch
from g4build.builder.executors.native import NativeExecutor
from g4build.builder.host import find_nvcc, nvcc_version
from g4build.builder.plan import Layout, Options, Target
from g4build.builder.steps import extension_plan

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "tiny_cuda_ext"

pytestmark = pytest.mark.nvcc


def _cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:  # the registry's nvidia-cuda-cuobjdump wheel
        import nvidia

        for base in nvidia.__path__:
            for cand in Path(base).glob("*/bin/cuobjdump"):
                return str(cand)
    except ImportError:
        pass
    return None


def _fatbin_archs(lib: Path) -> set[str]:
    """SASS archs in a library: cuobjdump --list-elf when present, else the cubin names embedded in .nv_fatbin."""
    tool = _cuobjdump()
    if tool:
        out = subprocess.run([tool, "--list-elf", str(lib)], capture_output=True, text=True, check=True).stdout
        return set(re.findall(r"\.(sm_\d+[af]?)\.cubin", out))
    data = lib.read_bytes()
    return {m.decode() for m in re.findall(rb"sm_\d+[af]?", data)}


@pytest.fixture(scope="module")
def nvcc() -> tuple[str, str]:
    path = find_nvcc()
    version = nvcc_version(path) if path else None
    if not path or not version:
        pytest.skip("nvcc not found")
    return path, version


def test_native_executor_builds_an_sm120_wheel(tmp_path: Path, nvcc: tuple[str, str]) -> None:
    path, version = nvcc
    project = tmp_path / "tiny"
    shutil.copytree(FIXTURE, project)
    target = Target(os="linux", arch=parse_arch("sm120"), python=f"{sys.version_info[0]}.{sys.version_info[1]}",
                    cuda=version)
    layout = Layout(root=str(tmp_path / "root"), out=str(tmp_path / "wheels"), cache=str(tmp_path / "deps"))
    plan = extension_plan(target=target, layout=layout, opts=Options(jobs=2, python=(sys.executable,)),
                          project=str(project), name="tiny", version=f"0.1.0+cu{version.replace('.', '')}.g4.test",
                          cuda_home=str(Path(path).resolve().parent.parent))
    assert plan.env["TORCH_CUDA_ARCH_LIST"] == ("12.0f" if version >= "13" else "12.0a")

    result = NativeExecutor(console=Console(file=open(tmp_path / "console.txt", "w"))).run(plan)  # noqa: SIM115

    assert [s.status for s in result.steps] == ["done"]
    log = Path(result.steps[0].log or "").read_text()
    assert "-gencode=arch=compute_120" in log  # the plan's arch list reached nvcc
    (wheel,) = Path(layout.out).glob("*.whl")
    name, ver, _build, tags = parse_wheel_filename(wheel.name)
    assert name == "tiny-cuda-ext" and str(ver) == plan.version
    assert all(t.platform.startswith("linux") for t in tags)
    with zipfile.ZipFile(wheel) as zf:
        lib = tmp_path / "libtiny_kernels.so"
        lib.write_bytes(zf.read("tiny_cuda_ext/libtiny_kernels.so"))
    archs = _fatbin_archs(lib)
    assert any(a.startswith("sm_120") for a in archs), archs
    assert not {a for a in archs if not a.startswith("sm_120")}, archs  # nothing else compiled in

    # resume: the same plan again skips the finished step
    again = NativeExecutor(console=Console(file=open(tmp_path / "console2.txt", "w"))).run(plan)  # noqa: SIM115
    assert [s.status for s in again.steps] == ["skipped"]
