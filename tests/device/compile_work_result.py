"""tests/device/results/wheel-sm120-compile-work.json: the timed compile-work ratio of upstream's default arch
list against g4build's sm_120 plan, from what `bench_wheel_compile_work.sh` returned (work.json, times.json,
measure.txt), recorded beside the timed builds (issue "a desktop's build").

    python tests/device/compile_work_result.py --bench BENCH_RESULTS --timeout 400 --skipped-upstream flashmla \\
        --build tests/device/results/wheel-sm120-32c.json --ninja-log NINJA_LOG --command "..." --out OUT.json

Every figure is the benchmark's own arithmetic (sampled seconds x unit counts, per family), with one change: a
family whose sampled unit ran past the timeout counts each unit at the timeout (a floor), where a benchmark run
before `timed_out` was recorded used its configuration's mean. Older runs' timeouts are read from measure.txt.
What upstream's count leaves out is said (`upstream_undercounted_because`); one sampled unit a family can err
either way on both sides, so the ratios are estimates, not bounds.

With `--ninja-log` (a real build's .ninja_log), the plan is also re-weighed over the units that build compiled:
each of its objects takes its family's sampled plan time. That is how a benchmark that configured another
profile of the plan (the whole kernel set) still gives the ratio for the profile the build used; the build's own
CPU-seconds are written beside it, measured under the build's load rather than the benchmark's, with the ratio
against them (`ratio_seconds_measured`) and how far the sampled estimate of the same units fell from them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "toolkit"), str(ROOT)]

from tests.benchmarks.bench_wheel_compile_work import family_from, per_unit_seconds, sampled_mean  # noqa: E402

TIMEOUT_LINE = re.compile(r"^TIMEOUT (upstream|plan) (\S+)\s*$", re.M)
OBJECT = re.compile(r"(?:^|/)CMakeFiles/([^/]+)\.dir/(.+)\.o$")


def timeouts(bench: Path, measured: dict[str, Any], timeout: float | None) -> dict[str, dict[str, float]]:
    """Family -> configuration -> the floor, from times.json's `timed_out`, else measure.txt's TIMEOUT lines (a
    run from before the benchmark recorded them; then the timeout it ran with must be given)."""
    if "timed_out" in measured:
        return {fam: {cfg: float(t) for cfg, t in by_cfg.items()} for fam, by_cfg in measured["timed_out"].items()}
    found = TIMEOUT_LINE.findall((bench / "measure.txt").read_text(errors="replace"))
    if found and timeout is None:
        raise SystemExit(f"{bench / 'measure.txt'}: {len(found)} samples ran past the timeout; give --timeout (the "
                         "BENCH_TIMEOUT of that run) so they count at it")
    out: dict[str, dict[str, float]] = {}
    for cfg, fam in found:
        out.setdefault(fam, {})[cfg] = float(timeout or 0)
    return out


def weigh(rows: dict[str, dict[str, Any]], cfg: str, times: dict[str, dict[str, float]],
          floors: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Seconds of one configuration's families, each a unit as the benchmark counts it (per_unit_seconds)."""
    fallback = sampled_mean(times, cfg)
    seconds = 0.0
    how: dict[str, list[str]] = {"timed": [], "timed_out": [], "untimed": []}
    for fam, row in rows.items():
        per, way = per_unit_seconds(fam, cfg, times, floors, fallback)
        seconds += row["units"] * (per or 0.0)
        how[way].append(fam)
    return {"units": sum(r["units"] for r in rows.values()), "seconds": round(seconds),
            "timed_out_families": sorted(how["timed_out"]), "untimed_families": sorted(how["untimed"])}


def build_units(ninja_log: Path) -> dict[str, int]:
    """Family -> objects compiled, from a .ninja_log (the last entry of each output; links are not units)."""
    objects = {cols[3] for line in ninja_log.read_text(errors="replace").splitlines()
               if not line.startswith("#") and len(cols := line.split("\t")) >= 4}
    found = Counter(family_from(m[1], m[2]) for o in objects if (m := OBJECT.search(o)))
    return dict(sorted(found.items()))


def result(bench: Path, timeout: float | None, skipped: list[str], build: Path | None,
           ninja_log: Path | None, uncounted: tuple[str, ...] = ()) -> dict[str, Any]:
    work = json.loads((bench / "work.json").read_text())["work"]
    measured = json.loads((bench / "times.json").read_text())
    times, floors = measured["times"], timeouts(bench, measured, timeout)
    up = weigh(work["upstream"]["families"], "upstream", times, floors)
    plan = weigh(work["plan"]["families"], "plan", times, floors)
    out: dict[str, Any] = {
        "what": "compile work of vLLM 0.21.0: upstream's default arch list (7.5 8.0 8.6 8.9 9.0 10.0 11.0 "
                "12.0+PTX, pristine tree) against g4build's sm_120 plan (series and build series applied), both "
                "configured by the real CMake; units counted from build.ninja, sampled units timed with their "
                "generated commands (written by tests/device/compile_work_result.py)",
        "machine": {"cores": measured.get("cores"), "parallel": measured.get("parallel"),
                    "sample_per_family": measured.get("sample")},
        "upstream": {**up, "proxy_items": work["upstream"]["proxy_items"]},
        "plan_configured": {**plan, "proxy_items": work["plan"]["proxy_items"]},
        "ratio_proxy": round(work["ratio_proxy"], 2),
        "ratio_seconds": round(up["seconds"] / plan["seconds"], 2),
        # upstream's side is undercounted for these reasons; sampling (one unit a family) errs either way on both
        # sides, so a ratio is an estimate, not a bound (plan_built compares it with a measured build)
        "upstream_undercounted": bool(skipped or uncounted or up["timed_out_families"]),
        "upstream_undercounted_because": (
            [f"upstream's {name} units were not configured (its sources were not carried); upstream builds them "
             "and the plan does not" for name in skipped]
            + [f"upstream's {what}: not a compile unit of build.ninja, so not counted" for what in uncounted]
            + ([f"{len(up['timed_out_families'])} upstream families ran past the {timeout:g} s timeout and count "
                "at it"] if up["timed_out_families"] and timeout else [])),
    }
    if ninja_log:
        units = build_units(ninja_log)
        fallback = sampled_mean(times, "plan")
        missing = [f for f in units if "plan" not in times.get(f, {})]
        secs = sum(n * (per_unit_seconds(f, "plan", times, None, fallback)[0] or 0.0) for f, n in units.items())
        built: dict[str, Any] = {"units": sum(units.values()), "seconds": round(secs),
                                 "families_untimed": missing, "ratio_seconds": round(up["seconds"] / secs, 2)}
        if build:
            b = json.loads(build.read_text())
            built |= {"result": build.name, "build_options": b.get("build_options"),
                      "build_units": b.get("units"), "build_cpu_seconds": b.get("cpu_seconds"),
                      "build_jobs": b.get("jobs")}
            if b.get("cpu_seconds"):
                # the same plan measured whole, under its build's own load: one sampled unit a family can miss a
                # family's spread either way, so the ratio is given against both
                built["ratio_seconds_measured"] = round(up["seconds"] / b["cpu_seconds"], 2)
                built["sampled_over_measured"] = round(secs / b["cpu_seconds"], 2)
        out["plan_built"] = built
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", type=Path, required=True, help="the benchmark's results folder")
    ap.add_argument("--timeout", type=float, help="BENCH_TIMEOUT of the run (for one that did not record it)")
    ap.add_argument("--skipped-upstream", nargs="*", default=[], help="BENCH_SKIP_UPSTREAM's dependencies")
    ap.add_argument("--uncounted-upstream", action="append", default=[],
                    help="work upstream's build does that the unit count cannot see (a custom command), said")
    ap.add_argument("--build", type=Path, help="the timed build's result JSON (desktop_build_result.py)")
    ap.add_argument("--ninja-log", type=Path, help="that build's .ninja_log: re-weigh the plan over its units")
    ap.add_argument("--command", action="append", default=[], help="a device call, in order (repeatable)")
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    measured = json.loads((args.bench / "times.json").read_text())
    out = result(args.bench, args.timeout if args.timeout is not None else measured.get("timeout"),
                 args.skipped_upstream, args.build, args.ninja_log, tuple(args.uncounted_upstream))
    out["commands"], out["notes"] = args.command, args.note
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    built = out.get("plan_built", {})
    print(json.dumps({k: out[k] for k in ("ratio_proxy", "ratio_seconds", "upstream_undercounted")}
                     | {f"built_{k}": built[k] for k in ("ratio_seconds", "ratio_seconds_measured") if k in built}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
