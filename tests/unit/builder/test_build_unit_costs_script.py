"""tests/device/unit_costs.py on a real ``.ninja_log``: a build's unit times and peak memory become the data
g4build reads (machine paths dropped), and the next build through the wrapper starts the longest unit first."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from g4build.builder.buildcosts import load_costs
from g4build.builder.ninjaorder import write_wrapper

SCRIPT = Path(__file__).resolve().parents[2] / "device" / "unit_costs.py"
# an object of a source outside the tree: CMake names it after the source's absolute path
LONG = "_deps/fa-build/CMakeFiles/_vllm_fa2_C.dir/home/dev/g4s/cache/fa-1234/src/flash_fwd_a.cu.o"


def _build(folder: Path, ninja: str) -> None:
    """A build whose objects sit where CMake puts them (one under an absolute source path, as vLLM's are)."""
    folder.mkdir(parents=True, exist_ok=True)
    outs = {"CMakeFiles/_C.dir/csrc/short0.cu.o": 0.3, "CMakeFiles/_C.dir/csrc/short1.cu.o": 0.3,
            "CMakeFiles/_C.dir/csrc/quick.cu.o": 0.0, LONG: 1.0, "_C.abi3.so": 0.0}
    lines = ["rule cc", "  command = sleep $secs && mkdir -p $$(dirname $out) && touch $out"]
    for out, secs in outs.items():
        lines += [f"build {out}: cc", f"  secs = {secs}"]
    lines.append("build all: phony " + " ".join(outs))
    (folder / "build.ninja").write_text("\n".join(lines) + "\n")
    subprocess.run([ninja, "-C", str(folder), "-j", "2", "all"], check=True, capture_output=True)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False)


def test_a_builds_log_becomes_the_shipped_data_and_orders_the_next_build(tmp_path: Path) -> None:
    ninja = shutil.which("ninja")
    if ninja is None:
        pytest.skip("no ninja on PATH")
    _build(tmp_path / "first", ninja)
    (tmp_path / "ram.kb").write_text("1000000\n82812500\n4000\n")  # 82812500 kB = 84.8 GB
    patches = tmp_path / "patches"
    out = patches / "build-costs" / "vllm-9.9.9-sm120.json"
    done = _run("--ninja-log", str(tmp_path / "first" / ".ninja_log"), "--ram-kb", str(tmp_path / "ram.kb"),
                "--jobs", "32", "--pin", "vllm-9.9.9", "--arch", "sm120", "--measured", "test run",
                "--min-seconds", "0.2", "--out", str(out))
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert data["peak_gb"] == 84.8 and data["at_jobs"] == 32 and data["margin"] == 1.25
    assert [u["unit"] for u in data["units"]] == [  # longest first; the link and the quick unit left out
        "_vllm_fa2_C.dir/*/flash_fwd_a.cu.o", "_C.dir/*/short0.cu.o", "_C.dir/*/short1.cu.o"]
    assert 0.9 <= data["units"][0]["seconds"] < 2.0
    assert "/home/dev" not in out.read_text()
    costs = load_costs(patches, "vllm-9.9.9", "sm120")
    assert costs is not None and costs.seconds_of(LONG) == data["units"][0]["seconds"]
    # the next build: the long unit (last in its build file) starts in the first wave through the wrapper
    second = tmp_path / "second"
    _build(second, ninja)
    (second / ".ninja_log").unlink()
    for o in second.rglob("*.o"):
        o.unlink()
    write_wrapper(tmp_path / "order", patches, "vllm-9.9.9", "sm120")
    subprocess.run([str(tmp_path / "order" / "ninja"), "-C", str(second), "-j", "2", "all"], check=True,
                   capture_output=True)
    starts = {p[3]: int(p[0]) for p in (ln.split("\t") for ln in (second / ".ninja_log").read_text().splitlines())
              if len(p) >= 5}
    assert starts[LONG] == min(starts.values())  # last in the build file, spawned first


def test_nothing_is_written_when_the_log_has_no_unit_or_the_figures_are_bad(tmp_path: Path) -> None:
    (tmp_path / "empty.log").write_text("# ninja log v7\n")
    out = tmp_path / "o.json"
    done = _run("--ninja-log", str(tmp_path / "empty.log"), "--peak-gb", "80", "--jobs", "32", "--pin", "p",
                "--arch", "a", "--measured", "m", "--out", str(out))
    assert done.returncode == 1 and "no compile unit of 30 s or more" in done.stderr
    (tmp_path / "one.log").write_text("# ninja log v7\n0\t40000\t0\tCMakeFiles/_C.dir/a/x.cu.o\tabc\n")
    done = _run("--ninja-log", str(tmp_path / "one.log"), "--peak-gb", "80", "--jobs", "0", "--pin", "p",
                "--arch", "a", "--measured", "m", "--out", str(out))
    assert done.returncode == 1 and "'at_jobs' must be a positive integer, found 0" in done.stderr
    assert not out.exists()
