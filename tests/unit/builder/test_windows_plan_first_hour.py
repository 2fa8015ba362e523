"""The Windows `--dry-run` plan as a first-time reader meets it: what to install first, how long and how much disk,
MAX_JOBS not taken from the planning machine, and check steps shown by what they check (the full program stays
in --json and the emitted script)."""

from __future__ import annotations

import json

import pytest

from g4build.builder.buildcosts import load_costs
from g4build.builder.host import MIN_FREE_GB
from g4build.builder.plan import max_jobs
from g4build.builder.prereqs import COMPILE_CPU_SECONDS, estimate_seconds
from g4build.builder.request import FOREIGN_CORES, FOREIGN_MEM_GB
from g4build.data import patches_dir

from .conftest import run_cli

PLAN = ["wheel", "--arch", "sm120", "--os", "windows", "--dry-run"]


def test_the_plan_says_what_to_install_first(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(PLAN, capsys)
    assert code == 0
    first = " ".join(out.split("install first", 1)[1].split("\nenvironment", 1)[0].split())
    assert "Visual Studio 2022" in first and "Desktop development with C++" in first
    assert "CUDA 13.0 toolkit" in first
    assert "LongPathsEnabled" in first and "core.longpaths true" in first
    assert "virtual environment with Python 3.12" in first


def test_the_plan_gives_time_and_disk(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli([*PLAN, "--jobs", "16"], capsys)
    assert code == 0
    assert COMPILE_CPU_SECONDS == {"all": 18_094, "gemma4": 12_442}
    minutes = 23  # 18,094 CPU-seconds over 16 jobs (1,131 s) x 1.10, and 130 s of the rest
    text = " ".join(out.split())
    assert f"estimate: about {minutes} minutes with MAX_JOBS=16 once its downloads are cached: 18,094 CPU-seconds" \
        in text
    assert "a first run also downloads torch" in text
    assert f"{MIN_FREE_GB:.0f} GB free at the build root" in text
    code, out, _ = run_cli([*PLAN, "--jobs", "16", "--json"], capsys)
    assert f"about {minutes} minutes" in json.loads(out)["estimate"]
    # the gemma4 profile's measured work (12,442 CPU-seconds) is a WSL or Linux build's: the Windows base tree has
    # no variant of the series that implements the profile, so its estimate stays the whole set's
    code, out, _ = run_cli([*PLAN, "--jobs", "16", "--kernels", "gemma4"], capsys)
    assert code == 2
    code, out, _ = run_cli([*PLAN[:4], "wsl", *PLAN[5:], "--jobs", "16"], capsys)
    assert code == 0 and "about 16 minutes with MAX_JOBS=16 once its downloads are cached: 12,442 CPU-seconds" \
        in " ".join(out.split())


@pytest.mark.parametrize("cores", [16, 32])
def test_the_estimate_is_within_a_tenth_of_each_timed_build(cores: int) -> None:
    """The estimate against the timed device builds of the profile sm120 builds by default (their own result
    files): never under what was measured by more than 2%, never over it by more than 10%."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    run = json.loads((root / "tests" / "device" / "results" / f"wheel-sm120-{cores}c.json").read_text())
    assert run["build_options"]["kernels"] == "gemma4" and run["jobs"] == cores
    measured = run["command"]["seconds"]
    assert 0.98 * measured <= estimate_seconds("gemma4", cores) <= 1.10 * measured
    # and the longest unit bounds it below whatever the cores
    assert estimate_seconds("gemma4", 1000) == estimate_seconds("gemma4", 10_000)


def test_the_whole_sets_estimate_is_near_its_32_core_build() -> None:
    """--kernels all (the Windows plan's profile) against the 32-core build the build page records (801 s, before
    the long units went first, so the estimate may be under it), within 10%; and never under the gemma4 one."""
    from pathlib import Path

    page = " ".join((Path(__file__).resolve().parents[3] / "toolkit/docs/routes/build.md").read_text().split())
    assert "(`--kernels all`) took 12.7 minutes on 64 cores (the vLLM step 12.1) and 13.4 minutes on 32 (801 s;" in page
    assert 0.90 * 801 <= estimate_seconds("all", 32) <= 1.10 * 801
    for jobs in (2, 8, 16, 32, 64):
        assert estimate_seconds("all", jobs) > estimate_seconds("gemma4", jobs)
    assert estimate_seconds("all", 1000) == 341 * 1.10 + 130


def test_max_jobs_is_the_targets_default_not_this_machines(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run_cli([*PLAN, "--json"], capsys)
    data = json.loads(out)
    # the target's default machine (32 GB, 16 cores) at the per-job memory measured for the pin and arch
    costs = load_costs(patches_dir(), "vllm-0.21.0", "sm120")
    assert costs is not None
    assert data["env"]["MAX_JOBS"] == str(max_jobs(mem_gb=FOREIGN_MEM_GB, cores=FOREIGN_CORES,
                                                   gb_per_job=costs.gb_per_job))
    (note,) = [n for n in data["notes"] if n.startswith("MAX_JOBS:")]
    assert "the machine it runs on" in note and "not this one's" in note and "--jobs N" in note


def test_check_steps_read_as_what_they_check(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(PLAN, capsys)
    assert code == 0
    steps = out.split("\nsteps", 1)[1].split("\nnote:", 1)[0]
    assert max(len(line) for line in steps.splitlines()) < 240  # was a 500-character python -c one-liner
    assert "g4build build-check python --python-exe python --version 3.12 --venv" in steps
    assert "g4build build-check torch --python-exe python --torch 2.11.0 --cuda 13.0" in steps
    assert " -c " not in steps


def test_build_check_runs_the_check_in_that_interpreter(capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    code, _, err = run_cli(["build-check", "python", "--python-exe", sys.executable, "--version", "2.7"], capsys)
    assert code == 9 and "the build's Python 2.7: the check in" in err
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    code, _, _ = run_cli(["build-check", "python", "--python-exe", sys.executable, "--version", here], capsys)
    assert code == 0
    code, _, err = run_cli(["build-check", "torch", "--python-exe", "/nonexistent/python", "--torch", "2.11.0",
                            "--cuda", "13.0"], capsys)
    assert code == 9 and "could not be started" in err


def test_a_linux_plan_has_no_windows_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["wheel", "--arch", "sm120", "--os", "linux", "--dry-run", "--json"], capsys)
    assert code == 0 and json.loads(out)["prerequisites"] == []
