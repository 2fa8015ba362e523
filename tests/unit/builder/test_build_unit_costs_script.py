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


def _log(path: Path, units: dict[str, float]) -> Path:
    """A .ninja_log (v7) with these compile units, each started at 0 (ms)."""
    rows = [f"0\t{int(s * 1000)}\t0\tCMakeFiles/{u}\th{i}" for i, (u, s) in enumerate(units.items())]
    path.write_text("# ninja log v7\n" + "\n".join(rows) + "\n")
    return path


def test_a_smaller_profiles_build_keeps_the_earlier_units_on_its_own_scale(tmp_path: Path) -> None:
    """A gemma4-profile build times fewer units; --merge keeps the others from the earlier file, scaled by the
    median ratio of the units both timed, and keeps the larger per-job memory figure."""
    earlier = {"pin": "vllm-9.9.9", "arch": "sm120", "measured": "64 cores, busy", "peak_gb": 84.8, "at_jobs": 32,
               "margin": 1.25, "units": [{"unit": "_C.dir/*/a.cu.o", "seconds": 200.0},
                                         {"unit": "_C.dir/*/b.cu.o", "seconds": 100.0},
                                         {"unit": "_C.dir/*/c.cu.o", "seconds": 400.0},
                                         {"unit": "_C.dir/*/gone.cu.o", "seconds": 300.0}]}
    (tmp_path / "old.json").write_text(json.dumps(earlier))
    log = _log(tmp_path / "n.log", {"_C.dir/x/a.cu.o": 100.0, "_C.dir/x/b.cu.o": 60.0, "_C.dir/x/c.cu.o": 160.0,
                                    "_C.dir/x/new.cu.o": 50.0})
    out = tmp_path / "patches" / "build-costs" / "vllm-9.9.9-sm120.json"
    done = _run("--ninja-log", str(log), "--peak-gb", "58.4", "--jobs", "16", "--pin", "vllm-9.9.9", "--arch",
                "sm120", "--measured", "16 cores, idle", "--merge", str(tmp_path / "old.json"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    # ratios 0.5, 0.6, 0.4: the median 0.5 scales the unit only the earlier build had
    assert {u["unit"]: u["seconds"] for u in data["units"]} == {
        "_C.dir/*/c.cu.o": 160.0, "_C.dir/*/gone.cu.o": 150.0, "_C.dir/*/a.cu.o": 100.0, "_C.dir/*/b.cu.o": 60.0,
        "_C.dir/*/new.cu.o": 50.0}
    assert [u["unit"] for u in data["units"]][:2] == ["_C.dir/*/c.cu.o", "_C.dir/*/gone.cu.o"]
    assert (data["peak_gb"], data["at_jobs"]) == (58.4, 16)  # 3.65 GB a job beats 2.65
    assert "1 units not in that build" in data["measured"] and "x0.50" in data["measured"]
    costs = load_costs(tmp_path / "patches", "vllm-9.9.9", "sm120")
    assert costs is not None and round(costs.gb_per_job, 2) == 4.56
    # the earlier file's figure wins when it is the larger per job
    done = _run("--ninja-log", str(log), "--peak-gb", "30", "--jobs", "16", "--pin", "vllm-9.9.9", "--arch",
                "sm120", "--measured", "m", "--merge", str(tmp_path / "old.json"), "--out", str(out))
    assert done.returncode == 0 and (json.loads(out.read_text())["peak_gb"], json.loads(out.read_text())["at_jobs"]) \
        == (84.8, 32)
    # another pin's file, or none in common: refused, nothing written
    out.unlink()
    (tmp_path / "other.json").write_text(json.dumps(dict(earlier, arch="sm90")))
    done = _run("--ninja-log", str(log), "--peak-gb", "30", "--jobs", "16", "--pin", "vllm-9.9.9", "--arch",
                "sm120", "--measured", "m", "--merge", str(tmp_path / "other.json"), "--out", str(out))
    assert done.returncode == 1 and "not vllm-9.9.9 sm120" in done.stderr and not out.exists()
    (tmp_path / "disjoint.json").write_text(json.dumps(dict(earlier, units=[{"unit": "_C.dir/*/q.o", "seconds": 1}])))
    done = _run("--ninja-log", str(log), "--peak-gb", "30", "--jobs", "16", "--pin", "vllm-9.9.9", "--arch",
                "sm120", "--measured", "m", "--merge", str(tmp_path / "disjoint.json"), "--out", str(out))
    assert done.returncode == 1 and "no unit in common" in done.stderr and not out.exists()
