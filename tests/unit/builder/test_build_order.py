"""Long units first, with a real ninja: what ninja itself does with a build log (nothing for the order), the
reordered build file through g4build's wrapper (the long unit starts in the first wave), the same through a real
CMake configure + build with two directories (vLLM's shape: the long units in the subproject written last), and
the build file's parsing (never moved past a rule or variable, escapes and continuation lines kept)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from g4build.builder.buildcosts import BuildCosts, UnitCost
from g4build.builder.ninjaorder import reorder, write_wrapper
from g4build.errors import BuildError, ConfigError

PIN, ARCH = "vllm-9.9.9", "sm120"
SHORT, LONG = 0.4, 1.5  # seconds: the long unit outlasts two waves of short ones at -j 2


def _ninja() -> str:
    found = shutil.which("ninja")
    if found is None:
        pytest.skip("no ninja on PATH (the test extras install the registry's ninja)")
    return found


def _log(build: Path) -> dict[str, int]:
    """Start (ms from the run's start) of each output in the last ninja run recorded in ``.ninja_log``."""
    runs: list[dict[str, int]] = [{}]
    for line in (build / ".ninja_log").read_text().splitlines():
        parts = line.split("\t")
        if len(parts) < 5:
            continue
        if parts[3] in runs[-1]:  # the same output again: a later run
            runs.append({})
        runs[-1][parts[3]] = int(parts[0])
    return runs[-1]


def _manifest(build: Path) -> None:
    """CMake's shape: rules and variables first, four short objects, then the long one of another target."""
    build.mkdir(parents=True, exist_ok=True)
    lines = ["ninja_required_version = 1.5", "rule cc", "  command = sleep $secs && touch $out", "",
             "cmake_ninja_workdir = /x", ""]
    for i in range(4):
        lines += [f"build CMakeFiles/_C.dir/csrc/short{i}.cu.o: cc", f"  secs = {SHORT}"]
    lines += ["build _deps/fa-build/CMakeFiles/_vllm_fa2_C.dir/src/flash_fwd_hdim64_bf16_sm80.cu.o: cc",
              f"  secs = {LONG}", "build all: phony " + " ".join(
                  [f"CMakeFiles/_C.dir/csrc/short{i}.cu.o" for i in range(4)]
                  + ["_deps/fa-build/CMakeFiles/_vllm_fa2_C.dir/src/flash_fwd_hdim64_bf16_sm80.cu.o"]), ""]
    (build / "build.ninja").write_text("\n".join(lines))


LONG_OUT = "_deps/fa-build/CMakeFiles/_vllm_fa2_C.dir/src/flash_fwd_hdim64_bf16_sm80.cu.o"


def _costs_project(tmp: Path, units: list[dict[str, object]]) -> Path:
    patches = tmp / "patches"
    (patches / "build-costs").mkdir(parents=True)
    (patches / "build-costs" / f"{PIN}-{ARCH}.json").write_text(json.dumps(
        {"pin": PIN, "arch": ARCH, "measured": "test", "peak_gb": 80, "at_jobs": 32, "margin": 1.25,
         "units": units}))
    return patches


def test_ninja_orders_by_the_build_file_not_by_the_durations_in_its_log(tmp_path: Path) -> None:
    ninja = _ninja()
    build = tmp_path / "b"
    _manifest(build)
    subprocess.run([ninja, "-C", str(build), "-j", "2", "all"], check=True, capture_output=True)
    first = _log(build)
    assert first[LONG_OUT] >= SHORT * 1000 * 0.8  # the long unit waited for the first wave of short ones
    # a second build with the log now holding the real durations (and the commands' own hashes)
    subprocess.run([ninja, "-C", str(build), "-t", "clean"], check=True, capture_output=True)
    subprocess.run([ninja, "-C", str(build), "-j", "2", "all"], check=True, capture_output=True)
    again = _log(build)
    assert set(again) == set(first)
    assert again[LONG_OUT] >= SHORT * 1000 * 0.8, "ninja started the long unit first from its log: recheck"


def test_the_wrapper_starts_the_recorded_long_unit_first(tmp_path: Path) -> None:
    ninja = _ninja()
    build = tmp_path / "b"
    _manifest(build)
    mtime = (build / "build.ninja").stat().st_mtime_ns
    patches = _costs_project(tmp_path, [{"unit": "_vllm_fa2_C.dir/*/flash_fwd_*.cu.o", "seconds": 240}])
    said = write_wrapper(tmp_path / "order", patches, PIN, ARCH)
    assert said.endswith(f"1 recorded units of {PIN} {ARCH} start first")
    wrapper = tmp_path / "order" / "ninja"
    version = subprocess.run([str(wrapper), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout == subprocess.run([ninja, "--version"], capture_output=True, text=True).stdout
    # PYTHONPATH is not needed by the wrapper: it names the folder holding g4build itself
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run([str(wrapper), "-C", str(build), "-j", "2", "all"], capture_output=True, text=True,
                         env=env, check=True)
    assert "1 recorded units start first, longest first (vllm-9.9.9 sm120)" in run.stderr
    starts = _log(build)
    assert starts[LONG_OUT] == min(starts.values())  # ninja spawned it first (relative: a busy machine is slow)
    assert (build / "build.ninja").stat().st_mtime_ns == mtime  # ninja and CMake see no new build file


def test_no_costs_or_no_ninja_refuse_before_anything_is_written(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    patches = _costs_project(tmp_path, [])
    with pytest.raises(ConfigError, match=r"no recorded unit costs for vllm-9\.9\.9 sm120"):
        write_wrapper(tmp_path / "order", patches, PIN, ARCH)
    with pytest.raises(ConfigError, match=r"no recorded unit costs for vllm-9\.9\.9 sm121"):
        write_wrapper(tmp_path / "order", patches, PIN, "sm121")
    other = _costs_project(tmp_path / "o", [{"unit": "x.dir/*/y.o", "seconds": 1}])
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no ninja: vLLM's build requirements were not installed
    with pytest.raises(BuildError, match="no ninja on PATH besides g4build's wrapper"):
        write_wrapper(tmp_path / "order", other, PIN, ARCH)
    assert not (tmp_path / "order").exists()


def _version(ninja: str) -> tuple[int, ...]:
    out = subprocess.run([ninja, "--version"], capture_output=True, text=True, check=True).stdout
    return tuple(int(x) for x in out.split(".")[:2])


@pytest.mark.parametrize("pool", [False, True], ids=["no-pool", "compile-pool"])
def test_the_order_reaches_a_cmake_build_through_cmake_make_program(tmp_path: Path, pool: bool) -> None:
    """Two directories as in vLLM (FlashAttention is a subproject CMake writes after the top's targets);
    a compiler launcher makes the subproject's unit the long one; the order is read from ninja's log. With
    vLLM's compile pool, ninja before 1.12 hands pooled edges out in the order it finds them from the targets
    (``Plan::ScheduleWork`` as each is added), not the build file's: the order holds from 1.12 on."""
    ninja = _ninja()
    if pool and _version(ninja) < (1, 12):
        pytest.skip(f"ninja {_version(ninja)} orders pooled edges by target (1.12+ by priority, then file order)")
    cmake = shutil.which("cmake")
    if cmake is None or shutil.which("cc") is None:
        pytest.skip("no cmake or C compiler")
    src = tmp_path / "proj"
    (src / "csrc").mkdir(parents=True)
    (src / "fa" / "src").mkdir(parents=True)
    for i in range(4):
        (src / "csrc" / f"short{i}.c").write_text(f"int short{i}(void) {{ return {i}; }}\n")
    (src / "fa" / "src" / "flash_fwd_hdim64_bf16_sm80.c").write_text("int fa(void) { return 7; }\n")
    (src / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.20)\nproject(p C)\n"
        "add_library(_C SHARED csrc/short0.c csrc/short1.c csrc/short2.c csrc/short3.c)\nadd_subdirectory(fa)\n")
    (src / "fa" / "CMakeLists.txt").write_text("add_library(_vllm_fa2_C SHARED src/flash_fwd_hdim64_bf16_sm80.c)\n")
    launcher = tmp_path / "slow-cc"
    launcher.write_text(f'#!/bin/sh\ncase "$*" in *flash_fwd_*) sleep {LONG};; *) sleep {SHORT};; esac\n'
                        'exec "$@"\n')
    launcher.chmod(0o755)
    patches = _costs_project(tmp_path, [{"unit": "_vllm_fa2_C.dir/*/flash_fwd_*.c.o", "seconds": 240}])
    write_wrapper(tmp_path / "order", patches, PIN, ARCH)

    def build(folder: Path, *extra: str) -> dict[str, int]:
        # as vLLM's setup.py configures: a compile pool as deep as its jobs, then one build of every target
        pools = ["-DCMAKE_JOB_POOL_COMPILE:STRING=compile", "-DCMAKE_JOB_POOLS:STRING=compile=2"] if pool else []
        subprocess.run([cmake, "-S", str(src), "-B", str(folder), "-G", "Ninja",
                        f"-DCMAKE_C_COMPILER_LAUNCHER={launcher}", *pools, *extra], check=True, capture_output=True)
        subprocess.run([cmake, "--build", str(folder), "-j", "4" if pool else "2", "--target", "_C", "--target",
                        "_vllm_fa2_C"],
                       check=True, capture_output=True)
        return {k: v for k, v in _log(folder).items() if k.endswith(".c.o")}

    fa = "fa/CMakeFiles/_vllm_fa2_C.dir/src/flash_fwd_hdim64_bf16_sm80.c.o"
    plain = build(tmp_path / "plain")
    assert plain[fa] >= SHORT * 1000 * 0.8  # CMake's order: the top directory's units first
    ordered = build(tmp_path / "ordered", f"-DCMAKE_MAKE_PROGRAM={tmp_path / 'order' / 'ninja'}")
    assert set(ordered) == set(plain)
    assert ordered[fa] == min(ordered.values())


COSTS = BuildCosts(pin=PIN, arch=ARCH, peak_gb=80, at_jobs=32, margin=1.0, measured="t",
                   units=(UnitCost(unit="_C.dir/*/long.cu.o", seconds=300),
                          UnitCost(unit="_C.dir/*/mid*.cu.o", seconds=100)))


def test_reorder_moves_whole_statements_longest_first_and_never_past_a_rule_or_variable() -> None:
    text = ("rule cc\n  command = c $in\n"
            "build CMakeFiles/_C.dir/a/mid1.cu.o: cc x.cu $\n    y.cu\n  FLAGS = -O2 $\n      -g\n"
            "flags = -O3\n"
            "# a comment\n"
            "build CMakeFiles/_C.dir/a/short.cu.o: cc s.cu\n"
            "build CMakeFiles/_C.dir/a/mid2.cu.o: cc m.cu\n  FLAGS = -O1\n"
            "build CMakeFiles/_C.dir/a$:b/long.cu.o: cc l.cu\n"
            "default all\n")
    new, moved = reorder(text, COSTS)
    assert moved == 2  # mid1 sits before the variable, so it stays where it is
    assert new.splitlines() == [
        "rule cc", "  command = c $in",
        "build CMakeFiles/_C.dir/a/mid1.cu.o: cc x.cu $", "    y.cu", "  FLAGS = -O2 $", "      -g",
        "flags = -O3",
        "build CMakeFiles/_C.dir/a$:b/long.cu.o: cc l.cu",
        "build CMakeFiles/_C.dir/a/mid2.cu.o: cc m.cu", "  FLAGS = -O1",
        "# a comment",
        "build CMakeFiles/_C.dir/a/short.cu.o: cc s.cu",
        "default all"]
    assert reorder(new, COSTS) == (new, 2)  # a second run changes nothing


def test_an_unreadable_build_file_is_left_as_it_was(tmp_path: Path) -> None:
    from g4build.builder.ninjaorder import reorder_file

    bad = tmp_path / "build.ninja"
    bad.write_text("  FLAGS = stray\nbuild CMakeFiles/_C.dir/a/long.cu.o: cc l.cu\n")
    said = reorder_file(bad, COSTS)
    assert "left in its order (line 1: an indented line outside a declaration)" in said
    assert bad.read_text().startswith("  FLAGS = stray")


def test_the_wrapper_module_is_importable_without_the_cli() -> None:
    # the wrapper runs g4build.builder.ninjaorder in the build's environment: nothing above builder/ loads
    code = ("import sys, g4build.builder.ninjaorder; "
            "sys.exit(any(m.startswith(('g4build.cli', 'typer')) for m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_the_wrapper_says_when_ninja_is_older_than_1_12(tmp_path: Path) -> None:
    """A stand-in ninja reporting 1.11.1 (the wrapper asks it for its version, then runs it)."""
    fake = tmp_path / "old" / "ninja"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n[ "$1" = --version ] && { echo 1.11.1; exit 0; }\necho "ran $*"\n')
    fake.chmod(0o755)
    build = tmp_path / "b"
    _manifest(build)
    patches = _costs_project(tmp_path, [{"unit": "_vllm_fa2_C.dir/*/flash_fwd_*.cu.o", "seconds": 240}])
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    subprocess.run([sys.executable, "-c", "from g4build.builder.ninjaorder import write_wrapper as w; "
                    f"w(__import__('pathlib').Path({str(tmp_path / 'order')!r}), "
                    f"__import__('pathlib').Path({str(patches)!r}), {PIN!r}, {ARCH!r})"], env=env, check=True)
    run = subprocess.run([str(tmp_path / "order" / "ninja"), "-C", str(build), "all"], capture_output=True,
                         text=True, env=env, check=True)
    assert run.stdout == f"ran -C {build} all\n"
    assert "1 recorded units start first" in run.stderr
    assert "ninja 1.11.1 may not keep that order for pooled units: ninja 1.12 or later does" in run.stderr
