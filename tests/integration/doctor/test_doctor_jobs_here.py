"""`g4build doctor --route build` on this machine says the MAX_JOBS a build of the pin gets here, from this
machine's RAM and cores over the peak per nvcc job measured for the pin on sm120 (patches/build-costs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from g4build.builder.buildcosts import BUILD_ARCH, choose_jobs, load_costs
from g4build.data import patches_dir

TOOLKIT = Path(__file__).resolve().parents[3] / "toolkit"


def test_the_build_route_prints_the_figure_it_uses(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(TOOLKIT), "COLUMNS": "400",
           "DOCKER_HOST": f"unix://{tmp_path / 'no-engine.sock'}"}
    env.pop("MAX_JOBS", None)
    proc = subprocess.run([sys.executable, "-m", "g4build", "doctor", "--route", "build", "--pin", "vllm-0.21.0",
                           "--json", "--path", str(tmp_path)], capture_output=True, text=True, env=env, check=False)
    [memory] = [f for f in json.loads(proc.stdout)["findings"] if f["check"] == "memory"]
    costs = load_costs(patches_dir(), "vllm-0.21.0", BUILD_ARCH)
    want = choose_jobs(mem_gb=memory["detail"]["bytes"] / 1e9, cores=os.cpu_count(), costs=costs)
    assert memory["detail"]["max_jobs"] == want.jobs and memory["detail"]["why"] == want.why
    assert "measured for vllm-0.21.0 sm120: peak 58.4 GB at 16 jobs, x1.25 margin" in memory["summary"]
    table = subprocess.run([sys.executable, "-m", "g4build", "doctor", "--route", "build", "--path", str(tmp_path)],
                           capture_output=True, text=True, env=env, check=False)
    assert f"use MAX_JOBS={want.jobs} (" in table.stdout and "4.6 GB a job, measured" in table.stdout
