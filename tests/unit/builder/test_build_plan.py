from __future__ import annotations

import dataclasses
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from g4build.builder.plan import Layout, Options, max_jobs
from g4build.builder.planner import default_layout, make_plan
from g4build.builder.platforms import windows
from g4build.errors import UsageError
from g4build.pins.model import Base, Pin
from g4build.series.model import local_label

from .conftest import OPTS, linux_layout, target

COMBOS = [  # every (os, arch, cuda) that matters; the pins' CUDA is 13.0, users also have 12.8/12.9 and 13.2
    *itertools.product(["windows"], ["sm120"], ["12.8", "12.9", "13.0", "13.2"]),
    *itertools.product(["wsl", "linux"], ["sm120"], ["12.9", "13.0", "13.2"]),
    *itertools.product(["linux"], ["sm121", "sm100"], ["12.9", "13.0"]),
    ("linux", "sm90", "13.0"),
]


def _plan(pin: Pin, os_name: str, arch: str, cuda: str, opts: Options = OPTS):  # type: ignore[no-untyped-def]
    t = target(os_name, arch, cuda)
    lay = default_layout(pin, t, base="/home/u/.cache/g4build")
    return make_plan(pin, [], t, layout=lay, opts=opts)


@pytest.mark.parametrize(("os_name", "arch", "cuda"), COMBOS)
def test_plan_for_each_combination(pin21: Pin, os_name: str, arch: str, cuda: str) -> None:
    plan = _plan(pin21, os_name, arch, cuda)
    env = plan.env
    family = cuda.startswith("13") and arch != "sm90"  # Hopper has no family target: 9.0a
    assert env["TORCH_CUDA_ARCH_LIST"].endswith("f" if family else "a")
    assert env["CMAKE_BUILD_TYPE"] == "Release" and env["VLLM_TARGET_DEVICE"] == "cuda"
    assert env["VLLM_VERSION_OVERRIDE"] == env["SETUPTOOLS_SCM_PRETEND_VERSION"] == plan.version
    base_os = "windows" if os_name == "windows" else None
    assert plan.version == f"0.21.0+{local_label(cuda, pin21, [], base_os)}"
    assert plan.version.startswith(f"0.21.0+cu{cuda.replace('.', '')}.g4.")
    names = [s.name for s in plan.steps]
    assert names.index("patches") < names.index("prefetch") < names.index("vllm") < names.index("validate")
    assert names.index("use-existing-torch") < names.index("build-requirements") < names.index("vllm")
    # the manifest goes into the wheel before validate reads it (the first finished build failed on that order)
    assert names.index("vllm") < names.index("manifest") < names.index("validate") and names[-1] == "validate"
    assert env["CMAKE_ARGS"] == f"-C {plan.layout.deps_file}"
    # vLLM's developer switch (FA4's cute folder as a symlink) blanked whatever the user's environment says
    assert env["VLLM_FLASH_ATTN_SRC_DIR"] == ""
    vllm = plan.step("vllm")
    assert vllm.cwd == plan.layout.src and "--no-build-isolation" in vllm.command
    if os_name == "windows":
        # the Windows base: the fork's changes forward-ported onto the pin by `source fetch --os windows`
        assert names[:3] == ["python", "source", "patches"]  # the interpreter is checked before anything
        assert plan.step("source").command[1:-1] == ("source", "fetch", "--pin", "vllm-0.21.0", "--os", "windows",
                                                     "--dest")
        assert plan.step("source").fresh == plan.layout.src == plan.step("source").command[-1]
        assert any(pin21.bases["windows"].commit in n and "forward-ported" in n for n in plan.notes)
        # the base is part of the build's identity: a Windows wheel and a WSL wheel never share a version
        assert plan.version != f"0.21.0+{local_label(cuda, pin21, [])}"
        assert env["DISTUTILS_USE_SDK"] == "1"
        assert "FLASHINFER_CUDA_ARCH_LIST" not in env and "flashinfer-jit-cache" not in names
        assert any("vcvars64.bat" in line for line in plan.setup)
        assert any("vswhere.exe" in line for line in plan.setup)
        assert ("cuda-shim" in names) == (cuda in ("13.0", "13.2"))
        assert ("NVCC_PREPEND_FLAGS" in env) == (cuda in ("13.0", "13.2"))
        assert plan.layout.sep == "\\" and len(plan.layout.root) <= windows.MAX_ROOT_CHARS
    else:
        assert plan.step("source").command[1:-1] == ("source", "fetch", "--pin", "vllm-0.21.0", "--from", "sdist",
                                                     "--dest")
        assert env["FLASHINFER_CUDA_ARCH_LIST"] == env["TORCH_CUDA_ARCH_LIST"]
        # the default FlashInfer route: the recipes' modules for the arch, validated; not upstream's whole cache
        aot = plan.step("flashinfer-aot").command
        assert aot[aot.index("--arch") + 1] == env["FLASHINFER_CUDA_ARCH_LIST"]
        assert names.index("vllm") < names.index("flashinfer-aot") < names.index("flashinfer-validate") < \
            names.index("manifest")
        assert "flashinfer-jit-cache" not in names and "flashinfer-source" not in names
        full = _plan(pin21, os_name, arch, cuda, dataclasses.replace(OPTS, flashinfer_full=True))
        # a clone into a folder: when it runs again (new pin) the old clone must go first, or git refuses
        assert full.step("flashinfer-source").fresh == full.step("flashinfer-source").command[-1]
        assert "flashinfer-jit-cache" in [s.name for s in full.steps]
        assert "flashinfer-aot" not in [s.name for s in full.steps]
        assert plan.setup == ()


def test_plan_is_pure_and_deterministic(pin21: Pin) -> None:
    a, b = _plan(pin21, "windows", "sm120", "13.0"), _plan(pin21, "windows", "sm120", "13.0")
    assert a == b and a.to_dict() == b.to_dict()
    assert [s.digest(a.env, a.identity) for s in a.steps] == [s.digest(b.env, b.identity) for s in b.steps]


def test_digests_change_with_inputs(pin21: Pin) -> None:
    a = _plan(pin21, "linux", "sm120", "13.0")
    b = _plan(pin21, "linux", "sm120", "13.0", Options(jobs=8))
    assert a.step("vllm").digest(a.env, a.identity) != b.step("vllm").digest(b.env, b.identity)


def test_json_shape(pin21: Pin) -> None:
    d = _plan(pin21, "windows", "sm120", "13.0").to_dict()
    assert {"target", "env", "steps"} <= set(d)
    assert d["target"]["arch"] == "sm120" and d["target"]["os"] == "windows"
    assert all(set(s) == {"name", "command", "cwd", "env"} for s in d["steps"])


def test_pin_of_0_33_plans_too(pin33: Pin) -> None:
    plan = _plan(pin33, "linux", "sm120", "13.0")
    assert plan.version.startswith("0.33.0+cu130.g4.")


def test_windows_without_a_base_is_refused(pin33: Pin) -> None:
    bare = dataclasses.replace(pin33, bases={})
    with pytest.raises(UsageError, match="no Windows base"):
        _plan(bare, "windows", "sm120", "13.0")


def test_windows_base_can_be_any_fork(pin21: Pin) -> None:
    other = dataclasses.replace(pin21, bases={"windows": Base(remote="https://example.invalid/fork.git",
                                                               commit="abcdef1")})
    plan = _plan(other, "windows", "sm120", "13.0")
    assert "--os" in plan.step("source").command
    assert any("https://example.invalid/fork.git at abcdef1" in n and "forward-ported" not in n for n in plan.notes)
    # another fork commit is another build
    assert plan.version != _plan(pin21, "windows", "sm120", "13.0").version


@pytest.mark.parametrize(("os_name", "arch", "cuda", "error", "text"), [
    ("windows", "sm121", "13.0", UsageError, "not a target on windows"),
    ("wsl", "sm90", "13.0", UsageError, "not a target on wsl"),
    ("linux", "sm120", "12.6", UsageError, "needs CUDA >= 12.8"),
    ("linux", "sm120", "12.8", UsageError, "FlashInfer"),  # FlashInfer's AOT build needs 12.9 for sm_120
    ("linux", "sm121", "12.8", UsageError, "needs CUDA >= 12.9"),
])
def test_bad_input_fails_before_any_step(pin21: Pin, os_name: str, arch: str, cuda: str,
                                         error: type[Exception], text: str) -> None:
    with pytest.raises(error, match=text):
        _plan(pin21, os_name, arch, cuda)


def test_windows_cuda_12_8_needs_no_flashinfer_cuda(pin21: Pin) -> None:
    assert _plan(pin21, "windows", "sm120", "12.8").env["TORCH_CUDA_ARCH_LIST"] == "12.0a"


def test_no_flashinfer_option(pin21: Pin) -> None:
    plan = _plan(pin21, "linux", "sm120", "13.0", Options(jobs=2, flashinfer=False))
    assert not [s for s in plan.steps if s.name.startswith("flashinfer")]
    assert "FLASHINFER_CUDA_ARCH_LIST" not in plan.env


def test_no_flashinfer_lifts_only_flashinfers_cuda_floor(pin21: Pin) -> None:
    # CUDA 12.8 compiles vLLM for sm_120 but not FlashInfer's kernels: without FlashInfer the plan is fine
    plan = _plan(pin21, "linux", "sm120", "12.8", Options(jobs=2, flashinfer=False))
    assert plan.env["TORCH_CUDA_ARCH_LIST"] == "12.0a"
    with pytest.raises(UsageError, match=r"needs CUDA >= 12\.8"):
        _plan(pin21, "linux", "sm120", "12.6", Options(jobs=2, flashinfer=False))


def test_docker_executor_is_linux_only(pin21: Pin) -> None:
    with pytest.raises(UsageError, match="docker"):
        make_plan(pin21, [], target("windows", executor="docker"), layout=linux_layout(), opts=OPTS)


def test_layout_rules(pin21: Pin) -> None:
    long_root = "C:\\Users\\someone\\Documents\\builds\\vllm"
    lay = Layout(root=long_root, out=long_root + "\\w", cache="C:\\g4b\\deps", sep="\\")
    with pytest.raises(UsageError, match="260-character"):
        make_plan(pin21, [], target("windows"), layout=lay, opts=OPTS)
    with pytest.raises(UsageError, match="Windows drive"):
        make_plan(pin21, [], target("wsl"), layout=linux_layout("/mnt/c/g4b"), opts=OPTS)
    with pytest.raises(UsageError, match="white space"):
        make_plan(pin21, [], target("linux"), layout=linux_layout("/home/u/my builds"), opts=OPTS)


@pytest.mark.parametrize(("mem", "cores", "threads", "jobs"), [
    (16, 32, 1, 3), (64, 16, 1, 12), (128, 16, 1, 16), (8, 8, 1, 1), (2, 4, 1, 1), (64, 32, 2, 6),
])
def test_max_jobs_from_ram_and_cores(mem: float, cores: int, threads: int, jobs: int) -> None:
    assert max_jobs(mem_gb=mem, cores=cores, nvcc_threads=threads) == jobs


@pytest.mark.parametrize(("fake", "ok", "found"), [
    (None, False, "found no torch"),
    ("2.11.0+cpu", False, "found 2.11.0+cpu without CUDA"),
    ("2.13.0+cu130", False, "found 2.13.0+cu130 built for CUDA 13.0:"),
    ("2.11.0+cu130", True, ""),
])
def test_torch_step_runs_and_says_what_to_install(
    pin21: Pin, tmp_path: Path, fake: str | None, ok: bool, found: str,
) -> None:
    # the plan's own command, run by a real interpreter without site-packages and with a stand-in torch
    if fake:
        (tmp_path / "torch").mkdir()
        cuda = None if fake.endswith("+cpu") else "13.0"
        (tmp_path / "torch" / "__init__.py").write_text(
            f"import types\n__version__ = {fake!r}\nversion = types.SimpleNamespace(cuda={cuda!r})\n")
    g4b = (sys.executable, "-m", "g4build")  # this checkout's CLI runs the check in the plan's interpreter
    plan = _plan(pin21, "linux", "sm120", "13.0", Options(jobs=1, python=(sys.executable, "-S"), g4build=g4b))
    step = plan.step("torch")
    assert not step.resumable
    assert step.command[:5] == (*g4b, "build-check", "torch")  # readable: what it checks, not a program
    toolkit = str(Path(__file__).resolve().parents[3] / "toolkit")
    proc = subprocess.run(step.command, capture_output=True, text=True, check=False,
                          env={"PYTHONPATH": os.pathsep.join((str(tmp_path), toolkit)),
                               "PATH": os.environ.get("PATH", "")})
    assert (proc.returncode == 0) is ok, proc.stderr
    if not ok:
        assert f"expected torch {pin21.torch} built for CUDA" in proc.stderr and found in proc.stderr
        assert f"install torch=={pin21.torch} from the PyTorch cu130 wheel index" in proc.stderr


def test_flashinfer_build_requirements_come_from_its_pyproject(tmp_path: Path, pin21: Pin) -> None:
    plan = _plan(pin21, "linux", "sm120", "13.0", dataclasses.replace(OPTS, flashinfer_full=True))
    names = [s.name for s in plan.steps]
    assert names.index("flashinfer-build-requirements") == names.index("flashinfer-python") - 1
    step = plan.step("flashinfer-build-requirements")
    assert step.cwd == plan.step("flashinfer-python").cwd
    code = step.command[step.command.index("-c") + 1]
    # run the step's code for real, with a recording `pip` module first on the path
    fake = tmp_path / "fake"
    (fake / "pip").mkdir(parents=True)
    (fake / "pip" / "__init__.py").write_text("")
    (fake / "pip" / "__main__.py").write_text(
        "import json, sys\nwith open('pip-calls.jsonl', 'a') as f:\n    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
    )
    project = tmp_path / "flashinfer"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=77", "apache-tvm-ffi>=0.1.6,!=0.1.8,<0.2"]\n'
    )
    subprocess.run([sys.executable, "-c", code], cwd=project, check=True,
                   env={**os.environ, "PYTHONPATH": str(fake)})
    calls = (project / "pip-calls.jsonl").read_text().splitlines()
    assert calls == ['["install", "build"]', '["install", "setuptools>=77", "apache-tvm-ffi>=0.1.6,!=0.1.8,<0.2"]']
