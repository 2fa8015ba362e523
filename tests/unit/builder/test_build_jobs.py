"""MAX_JOBS from the memory measured per nvcc job for the pin and arch (patches/build-costs), and the build-order
step the plan gets where the pin's longest units are recorded: the shipped data as read, the numbers a desktop
gets, the plan's step and CMAKE_ARGS, the command that writes the wrapper, and bad data refused in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from g4build.builder.buildcosts import choose_jobs, costs_file, load_costs
from g4build.builder.host import HostFacts
from g4build.builder.plan import Options, max_jobs
from g4build.builder.planner import make_plan
from g4build.builder.request import machine_choices
from g4build.data import patches_dir
from g4build.errors import ConfigError
from g4build.pins.model import Pin

from .conftest import linux_layout, run_cli, target

GIB64 = 64 * 2**30 / 1e9  # a "64 GB" desktop as the machine reports it: 68.7 GB


def test_the_shipped_figure_for_vllm_0_21_on_sm120() -> None:
    costs = load_costs(patches_dir(), "vllm-0.21.0", "sm120")
    assert costs is not None
    # peak 58.4 GB at 16 jobs on 16 cores (the gemma4 profile, FA2's heavy units a sixth of it), 3.65 GB a job,
    # with a quarter more for the heavy units meeting; 32 jobs of the whole set had needed 2.65 GB a job
    assert costs.gb_per_job == pytest.approx(58.4 / 16 * 1.25)
    # unit times of the side-by-side hold's .ninja_log: the longest units first, a short one after them
    fa2 = costs.seconds_of("_deps/vllm-flash-attn-build/CMakeFiles/_vllm_fa2_C.dir/csrc/flash_attn/src/"
                           "flash_fwd_split_hdim64_bf16_sm80.cu.o")
    paged = costs.seconds_of("CMakeFiles/_C.dir/csrc/attention/paged_attention_v2.cu.o")
    short = costs.seconds_of("CMakeFiles/_C.dir/csrc/layernorm_kernels.cu.o")
    # the 16-core build's own times, and units only the whole set compiles on that scale (x0.73)
    assert paged == 329.7 and fa2 == 318.5
    assert short is not None and short < fa2 / 2
    assert costs.seconds_of("CMakeFiles/_C.dir/csrc/no_such_unit.cu.o") is None
    assert load_costs(patches_dir(), "vllm-0.21.0", "sm121") is None  # never measured


def test_the_shipped_sm90_figure_puts_flash_attention_first() -> None:
    """The sm_90 build (FA2 alone, the gemma4 profile) started its FA2 units at 266-554 s in file order; its
    recorded costs put them ahead of every _C unit."""
    costs = load_costs(patches_dir(), "vllm-0.21.0", "sm90")
    assert costs is not None
    fa2 = costs.seconds_of("_deps/vllm-flash-attn-build/CMakeFiles/_vllm_fa2_C.dir/csrc/flash_attn/src/"
                           "flash_fwd_split_hdim128_fp16_sm80.cu.o")
    assert fa2 == 507.7
    c_units = [u.seconds for u in costs.units if u.unit.startswith("_C.dir/")]
    assert c_units and max(c_units) < fa2


@pytest.mark.parametrize(("mem", "cores", "jobs", "bound"), [
    (GIB64, 16, 15, "the RAM"),  # 16 jobs peaked at 58.4 GB: a 64 GB desktop keeps one core's worth free
    (GIB64, 24, 15, "the RAM"),
    (128 * 2**30 / 1e9, 24, 24, "the cores"),
    (32 * 2**30 / 1e9, 16, 7, "the RAM"),  # 5 GB a job gave 6
    (2.0, 8, 1, "one at the least"),
])
def test_jobs_from_the_measured_figure(mem: float, cores: int, jobs: int, bound: str) -> None:
    costs = load_costs(patches_dir(), "vllm-0.21.0", "sm120")
    choice = choose_jobs(mem_gb=mem, cores=cores, costs=costs)
    assert choice.jobs == jobs
    assert choice.why.endswith(f"{cores} cores; {jobs} job{'s' * (jobs != 1)}, bound by {bound}")
    assert "4.6 GB a job, measured for vllm-0.21.0 sm120: peak 58.4 GB at 16 jobs, x1.25 margin" in choice.why


def test_unmeasured_builds_keep_five_gb_a_job() -> None:
    choice = choose_jobs(mem_gb=GIB64, cores=32, costs=None)
    assert choice.jobs == 13 == max_jobs(mem_gb=GIB64, cores=32)
    assert choice.why == "69 GB RAM / 5 GB a job, not measured for this build = 13; 32 cores; 13 jobs, bound by the RAM"
    assert choose_jobs(mem_gb=GIB64, cores=None, costs=None).why.endswith("unknown cores; 13 jobs, bound by the RAM")
    assert choose_jobs(mem_gb=GIB64, cores=32, costs=None, nvcc_threads=2).jobs == 6


def test_machine_choices_take_the_pins_figure() -> None:
    here = HostFacts(os="linux", cores=16, mem_gb=GIB64, free_gb=100.0, nvcc=None, nvcc_version=None, cxx=None,
                     launcher=None)
    costs = load_costs(patches_dir(), "vllm-0.21.0", "sm120")
    assert machine_choices(target("linux"), here, costs)[0] == 15
    assert machine_choices(target("linux"), here)[0] == 13


def test_the_plan_runs_ninja_through_the_wrapper_where_units_are_recorded(pin21: Pin) -> None:
    lay = linux_layout()
    plain = make_plan(pin21, [], target("linux"), layout=lay, opts=Options(jobs=4))
    assert "build-order" not in [s.name for s in plain.steps]
    assert "CMAKE_MAKE_PROGRAM" not in plain.env["CMAKE_ARGS"]
    plan = make_plan(pin21, [], target("linux"), layout=lay, opts=Options(jobs=4, unit_order=True))
    names = [s.name for s in plan.steps]
    assert names[names.index("build-order") + 1] == "vllm"  # after the build requirements (they bring ninja)
    assert names.index("build-requirements") < names.index("build-order")
    step = plan.step("build-order")
    assert step.command == ("g4build", "build-order", "--pin", "vllm-0.21.0", "--arch", "sm120", "--write",
                            f"{lay.root}/build-order")
    assert plan.env["CMAKE_ARGS"].endswith(f" -DCMAKE_MAKE_PROGRAM={lay.root}/build-order/ninja")
    assert any(n.startswith("long units first: CMake runs ninja through /home/u/g4b/v21/build-order/ninja")
               for n in plan.notes)
    assert not any(n.startswith("long units first") for n in plain.notes)
    # Windows: the wrapper is a POSIX shell script, so no step and no make program
    from g4build.builder.plan import Layout

    wlay = Layout(root="C:\\g4b\\v21", out="C:\\g4b\\v21\\w", cache="C:\\g4b\\deps", sep="\\")
    win = make_plan(pin21, [], target("windows"), layout=wlay, opts=Options(jobs=4, unit_order=True))
    assert "build-order" not in [s.name for s in win.steps]
    assert "CMAKE_MAKE_PROGRAM" not in win.env.get("CMAKE_ARGS", "")


def test_wheel_plans_the_order_and_the_figure_from_the_shipped_data(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["wheel", "--arch", "sm120", "--os", "linux", "--root", "/home/u/b", "--dry-run",
                            "--json"], capsys)
    assert code == 0
    plan = json.loads(out)
    assert "build-order" in [s["name"] for s in plan["steps"]]
    assert "-DCMAKE_MAKE_PROGRAM=/home/u/b/build-order/ninja" in plan["env"]["CMAKE_ARGS"]
    code, out, _ = run_cli(["wheel", "--arch", "sm121", "--os", "linux", "--root", "/home/u/b", "--dry-run",
                            "--json"], capsys)
    assert code == 0
    assert "build-order" not in [s["name"] for s in json.loads(out)["steps"]]


def test_a_windows_script_divides_its_ram_by_the_measured_figure(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    ps1 = tmp_path / "b.ps1"
    assert run_cli(["wheel", "--arch", "sm120", "--os", "windows", "--emit-script", str(ps1)], capsys)[0] == 0
    text = ps1.read_text(encoding="utf-8")
    assert "[Math]::Floor($ram / 4562500000)" in text
    assert "~4.6 GB per nvcc job" in text


def test_build_order_command_writes_the_wrapper(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("ninja") is None:
        pytest.skip("no ninja on PATH")
    code, out, _ = run_cli(["build-order", "--pin", "vllm-0.21.0", "--arch", "sm120", "--write",
                            str(tmp_path / "o")], capsys)
    assert code == 0 and "143 recorded units of vllm-0.21.0 sm120 start first" in out
    assert (tmp_path / "o" / "ninja").stat().st_mode & 0o111
    assert json.loads((tmp_path / "o" / "unit-costs.json").read_text()) == json.loads(
        costs_file(patches_dir(), "vllm-0.21.0", "sm120").read_text())
    code, _, err = run_cli(["build-order", "--pin", "vllm-0.21.0", "--arch", "sm121", "--write",
                            str(tmp_path / "p")], capsys)
    assert code == ConfigError.exit_code and "no recorded unit costs for vllm-0.21.0 sm121" in err
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(("text", "says"), [
    ("{", "expected JSON, could not read it"),
    ('{"pin": "p", "arch": "a", "at_jobs": 32, "margin": 1.25}', "'peak_gb' must be a positive number, found None"),
    ('{"pin": "p", "arch": "a", "peak_gb": 80, "at_jobs": 3.5, "margin": 1}', "'at_jobs' must be a positive integer"),
    ('{"pin": "p", "arch": "a", "peak_gb": 80, "at_jobs": 32, "margin": 1, "units": [{"unit": "x"}]}',
     "'units' must be a list of"),
    ('{"pin": "q", "arch": "a", "peak_gb": 80, "at_jobs": 32, "margin": 1}', "records pin 'q' arch 'a', expected"),
])
def test_bad_costs_files_are_refused_in_one_line(tmp_path: Path, text: str, says: str) -> None:
    (tmp_path / "build-costs").mkdir()
    costs_file(tmp_path, "p", "a").write_text(text)
    with pytest.raises(ConfigError) as err:
        load_costs(tmp_path, "p", "a")
    assert says in err.value.message and "\n" not in err.value.message
    assert "tests/device/unit_costs.py" in (err.value.hint or "") or "file name" in (err.value.hint or "")


def test_the_planned_step_writes_the_wrapper_cmake_is_told_about(pin21: Pin, tmp_path: Path) -> None:
    """The build-order step run as planned (g4build's own command, in its cwd) leaves an executable ninja
    wrapper exactly where CMAKE_MAKE_PROGRAM in the vllm step's CMAKE_ARGS points."""
    import os
    import subprocess
    import sys

    if shutil.which("ninja") is None:
        pytest.skip("no ninja on PATH")
    root = tmp_path / "b"
    root.mkdir()
    plan = make_plan(pin21, [], target("linux"), layout=linux_layout(str(root)),
                     opts=Options(jobs=4, unit_order=True, g4build=(sys.executable, "-m", "g4build")))
    step = plan.step("build-order")
    subprocess.run(step.command, cwd=step.cwd, check=True, capture_output=True, env={**os.environ, **step.env})
    [make] = [a.split("=", 1)[1] for a in plan.env["CMAKE_ARGS"].split() if a.startswith("-DCMAKE_MAKE_PROGRAM=")]
    assert os.access(make, os.X_OK)
    version = subprocess.run([make, "--version"], capture_output=True, text=True, check=True).stdout
    assert version == subprocess.run(["ninja", "--version"], capture_output=True, text=True).stdout


def test_a_wheel_planned_on_a_64_gib_16_core_desktop_gets_15_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The planned MAX_JOBS on such a machine (its probe stands in: this one has other RAM and cores)."""
    from g4build.builder import request

    desktop = HostFacts(os="linux", cores=16, mem_gb=GIB64, free_gb=500.0, nvcc=None, nvcc_version=None,
                        cxx=None, launcher=None)
    monkeypatch.setattr(request, "host_os", lambda: "linux")
    monkeypatch.setattr(request, "probe", lambda at: desktop)
    planned = request.plan_wheel(request.WheelRequest(arch="sm120", os_name="linux", root="/home/u/b"))
    assert planned.plan.env["MAX_JOBS"] == "15"  # 5 GB a job gave 13; 16 jobs peaked at 58.4 GB
    assert planned.plan.gb_per_job == pytest.approx(58.4 / 16 * 1.25)
    sm121 = request.plan_wheel(request.WheelRequest(arch="sm121", os_name="linux", root="/home/u/b"))
    assert sm121.plan.env["MAX_JOBS"] == "13"  # never measured: 5 GB a job
