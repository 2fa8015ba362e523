"""The build times README and the build-route page give are the timed device runs' own figures
(tests/device/results/wheel-sm120-<N>c.json, desktop_build_result.py's output), and the compile-work ratios the
page quotes are the recorded ones, said as the estimates they are."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
RESULTS = ROOT / "tests" / "device" / "results"
BUILD_PAGE = (ROOT / "toolkit" / "docs" / "routes" / "build.md").read_text()
README = (ROOT / "README.md").read_text()


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


@pytest.mark.parametrize("cores", [16, 32])
def test_the_build_page_gives_each_timed_runs_own_figures(cores: int) -> None:
    r = json.loads((RESULTS / f"wheel-sm120-{cores}c.json").read_text())
    assert r["command"]["rc"] == 0 and r["validate_ok"] is True
    page = _flat(BUILD_PAGE)
    assert f"**{r['command']['minutes']} minutes on {cores} cores**" in page
    said = re.search(rf"\*\*{r['command']['minutes']} minutes on {cores} cores\*\* \(([^)]*)\)", page)
    assert said is not None
    figures = said[1]
    assert f"{r['command']['seconds']} s" in figures
    assert f"{r['cpu_seconds']:,} CPU-seconds" in figures and f"{r['units']} units" in figures
    assert f"into {r['span_s']} s against a bound of {r['packing_bound_s']} s" in figures
    assert f"{r['jobs']} jobs peaked at {r['peak_memory_gb']} GB" in figures
    assert f"wheel-sm120-{cores}c.json" in figures


def test_the_readme_names_both_desktop_times() -> None:
    r16, r32 = (json.loads((RESULTS / f"wheel-sm120-{c}c.json").read_text())["command"]["minutes"] for c in (16, 32))
    assert f"{r32} minutes on 32 cores and {r16} on 16" in _flat(README)


def test_the_compile_work_ratios_quoted_are_the_recorded_ones() -> None:
    """Rounded to one decimal, as estimates: one sampled unit a family errs either way, so no ratio is called a
    bound; the measured build's reading is the one given first."""
    w = json.loads((RESULTS / "wheel-sm120-compile-work.json").read_text())
    page = _flat(BUILD_PAGE)
    built = w["plan_built"]
    assert f"about {built['ratio_seconds_measured']:.1f} times the compile work of the sm_120 build" in page
    assert f"measured {built['build_cpu_seconds']:,} CPU-seconds; {built['ratio_seconds']:.1f} times" in page
    assert f"about {w['ratio_seconds']:.1f} times that of `--kernels all`" in page
    ratios = [built["ratio_seconds_measured"], built["ratio_seconds"], w["ratio_seconds"]]
    assert not any(f"at least {r:.1f} times" in page or f"at least {r:.1f}x" in page for r in ratios)
