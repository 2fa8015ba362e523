"""Turn a device build's ``.ninja_log`` and peak memory into the shipped build costs of its pin and arch
(``patches/build-costs/<pin>-<arch>.json``, read by ``g4build.builder.buildcosts``): each compile unit's time as
``<target>.dir/*/<file>.o`` (no machine paths), longest first, and the peak memory in use at the run's jobs.

    python tests/device/unit_costs.py --ninja-log $G4S/results/first.ninja_log --ram-kb $G4S/work/ram.kb \\
        --jobs 32 --pin vllm-0.21.0 --arch sm120 --measured "32 cores, H200 host, CUDA 13.0" \\
        --out patches/build-costs/vllm-0.21.0-sm120.json

The file is checked with g4build's own reader before it is written; nothing is written when it fails.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from g4build.builder.buildcosts import parse_costs
from g4build.errors import ConfigError

_OBJ = re.compile(r"CMakeFiles/(?P<target>[^/]+)\.dir/(?:.*/)?(?P<file>[^/]+\.o(?:bj)?)$")


def unit_times(log_text: str) -> dict[str, float]:
    """Seconds per compile unit pattern from a ``.ninja_log`` (v5+: start, end, mtime, output, hash in ms):
    the last run's entry per output; two outputs of one pattern keep the longer."""
    last: dict[str, tuple[int, int]] = {}
    for line in log_text.splitlines():
        parts = line.split("\t")
        if len(parts) >= 4 and parts[0].isdigit() and parts[1].isdigit():
            last[parts[3]] = (int(parts[0]), int(parts[1]))
    units: dict[str, float] = {}
    for output, (start, end) in last.items():
        m = _OBJ.search(output.replace("\\", "/"))
        if m is None:
            continue
        pattern = f"{m['target']}.dir/*/{m['file']}"
        units[pattern] = max(units.get(pattern, 0.0), round((end - start) / 1000, 1))
    return units


def peak_gb(ram_kb: str) -> float:
    """The largest sample of memory in use (kB lines, MemTotal - MemAvailable) in GB."""
    samples = [int(x) for x in ram_kb.split() if x.isdigit()]
    if not samples:
        raise ValueError("no memory samples")
    return round(max(samples) * 1024 / 1e9, 1)


def costs(*, log_text: str, peak: float, jobs: int, pin: str, arch: str, measured: str, margin: float,
          min_seconds: float) -> dict[str, Any]:
    units = sorted(((p, s) for p, s in unit_times(log_text).items() if s >= min_seconds), key=lambda u: (-u[1], u[0]))
    return {"pin": pin, "arch": arch, "measured": measured, "peak_gb": peak, "at_jobs": jobs, "margin": margin,
            "units": [{"unit": p, "seconds": s} for p, s in units]}


def merge(new: dict[str, Any], old: dict[str, Any]) -> dict[str, Any]:
    """``new`` completed by an earlier file of the same pin and arch: units the new build did not compile (a
    smaller kernel profile) are kept from ``old``, scaled by the median new/old ratio of the units both timed (so
    one scale orders them all); the memory figure is the larger per-job one of the two (a build of fewer, heavier
    units needs more per job)."""
    if (old.get("pin"), old.get("arch")) != (new["pin"], new["arch"]):
        raise ValueError(f"--merge: that file is {old.get('pin')} {old.get('arch')}, not {new['pin']} {new['arch']}")
    mine = {u["unit"]: u["seconds"] for u in new["units"]}
    theirs = {u["unit"]: float(u["seconds"]) for u in old.get("units", [])}
    ratios = sorted(mine[k] / theirs[k] for k in mine.keys() & theirs.keys() if theirs[k] > 0)
    if not ratios:
        raise ValueError("--merge: no unit in common with the earlier file, so no common scale")
    scale = ratios[len(ratios) // 2]
    units = dict(mine)
    units.update({k: round(v * scale, 1) for k, v in theirs.items() if k not in mine})
    out = dict(new, units=[{"unit": k, "seconds": v} for k, v in sorted(units.items(), key=lambda u: (-u[1], u[0]))])
    if old["peak_gb"] / old["at_jobs"] > new["peak_gb"] / new["at_jobs"]:
        out.update(peak_gb=old["peak_gb"], at_jobs=old["at_jobs"])
    kept = len(units) - len(mine)
    out["measured"] = (f"{new['measured']}; {kept} units not in that build from the earlier file, x{scale:.2f} "
                       f"(the median ratio of {len(ratios)} units both timed): {old.get('measured', '')}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ninja-log", type=Path, required=True)
    mem = ap.add_mutually_exclusive_group(required=True)
    mem.add_argument("--ram-kb", type=Path, help="memory-in-use samples in kB, one a line (the session's ram.kb)")
    mem.add_argument("--peak-gb", type=float, help="the peak memory in use, GB")
    ap.add_argument("--jobs", type=int, required=True, help="MAX_JOBS of that build")
    ap.add_argument("--pin", required=True)
    ap.add_argument("--arch", required=True)
    ap.add_argument("--measured", required=True, help="where the figures come from: machine, command")
    ap.add_argument("--margin", type=float, default=1.25, help="MAX_JOBS divides the RAM by peak/jobs times this")
    ap.add_argument("--min-seconds", type=float, default=30.0, help="units shorter than this are left out")
    ap.add_argument("--merge", type=Path, help="an earlier file of this pin and arch: units this build lacks")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    try:
        peak = a.peak_gb if a.peak_gb is not None else peak_gb(a.ram_kb.read_text(encoding="utf-8"))
        data = costs(log_text=a.ninja_log.read_text(encoding="utf-8", errors="replace"), peak=peak, jobs=a.jobs,
                     pin=a.pin, arch=a.arch, measured=a.measured, margin=a.margin, min_seconds=a.min_seconds)
        if a.merge is not None:
            old = json.loads(a.merge.read_text(encoding="utf-8"))
            parse_costs(old, a.merge)  # a damaged earlier file is refused, not half used
            data = merge(data, old)
        parse_costs(data, a.out)  # what g4build will read, refused here rather than in a build
    except (OSError, ValueError, ConfigError) as e:
        print(f"unit_costs: {e}", file=sys.stderr)
        return 1
    if not data["units"]:
        print(f"unit_costs: no compile unit of {a.min_seconds:g} s or more in {a.ninja_log}", file=sys.stderr)
        return 1
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    print(f"{a.out}: {len(data['units'])} units, {peak:g} GB at {a.jobs} jobs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
