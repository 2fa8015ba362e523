"""tests/device/compile_work_result.py on the real benchmark run it folded (tests/device/results/compile-work-sm120/,
the 32-core hold) and the real .ninja_log of that hold's build: the recorded ratios regenerate from them, a
sample past the timeout counts at the timeout, and a run whose timeouts cannot be weighed writes nothing."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "tests" / "device" / "compile_work_result.py"
RESULTS = ROOT / "tests" / "device" / "results"
BENCH = RESULTS / "compile-work-sm120"
sys.path.insert(0, str(SCRIPT.parent))

from compile_work_result import build_units, result  # noqa: E402


def _fold(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, check=False)


def test_the_recorded_ratios_regenerate_from_the_runs_files() -> None:
    recorded = json.loads((RESULTS / "wheel-sm120-compile-work.json").read_text())
    again = result(BENCH, 400, ["flashmla"], RESULTS / "wheel-sm120-32c.json", RESULTS / "wheel-sm120-32c.ninja_log",
                   ("DeepGEMM _C",))
    for key in ("upstream", "plan_configured", "ratio_proxy", "ratio_seconds", "upstream_undercounted", "plan_built"):
        assert again[key] == recorded[key], key
    assert recorded["upstream"]["units"] == 408 and recorded["plan_configured"]["units"] == 161
    assert recorded["plan_built"]["units"] == recorded["plan_built"]["build_units"] == 117
    # the measured build is the other reading: upstream's sampled estimate over the build's own CPU-seconds
    built = recorded["plan_built"]
    assert built["ratio_seconds_measured"] == round(recorded["upstream"]["seconds"] / built["build_cpu_seconds"], 2)
    assert built["ratio_seconds_measured"] < built["ratio_seconds"]  # one sample a family undercounted the plan


def test_a_sample_past_the_timeout_counts_at_it_not_at_the_mean() -> None:
    bench_own = json.loads((BENCH / "work.json").read_text())["work"]["upstream"]
    folded = result(BENCH, 400, [], None, None)["upstream"]
    assert len(folded["timed_out_families"]) == 5 and "_C:csrc/attention" in folded["timed_out_families"]
    assert not set(folded["timed_out_families"]) & set(folded["untimed_families"])
    units = sum(bench_own["families"][f]["units"] for f in folded["timed_out_families"])
    mean = bench_own["families"]["_C:csrc/attention"]["seconds"] / bench_own["families"]["_C:csrc/attention"]["units"]
    assert abs(folded["seconds"] - (bench_own["seconds"] + units * (400 - mean))) < 1


def test_the_builds_units_are_its_objects_by_family() -> None:
    units = build_units(RESULTS / "wheel-sm120-32c.ninja_log")
    assert sum(units.values()) == 117  # links (the .so files) are not units
    assert units["_vllm_fa2_C:csrc/flash_attn/src"] == 20  # head dims 128 and 256 (gemma4)
    assert "_vllm_fa3_C:hopper" not in units


def test_timeouts_without_the_runs_timeout_write_nothing(tmp_path: Path) -> None:
    shutil.copytree(BENCH, tmp_path / "b")
    out = tmp_path / "r.json"
    refused = _fold("--bench", str(tmp_path / "b"), "--out", str(out))
    assert refused.returncode != 0 and "give --timeout" in refused.stderr and not out.exists()
    # a run that recorded them (the benchmark does now) needs no --timeout
    times = json.loads((tmp_path / "b" / "times.json").read_text())
    times |= {"timeout": 300.0, "timed_out": {"_C:csrc/attention": {"upstream": 300.0}}}
    (tmp_path / "b" / "times.json").write_text(json.dumps(times))
    done = _fold("--bench", str(tmp_path / "b"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["upstream"]["timed_out_families"] == ["_C:csrc/attention"]
