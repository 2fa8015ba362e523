"""Write tests/device/results/wheel-sm120.json from what a device hold brought back: the JSON
collect_wheel_result.py wrote, the compile-work count (bench_wheel_compile_work.sh SAMPLE=0 or its timed run),
and, where a collected file lacks them, figures the device printed (named as such). Paths on the device are
written relative to its work folder; nothing is computed that was not measured, except what is marked computed.

    python tests/device/wheel_result.py --collected OUT/wheel-sm120.json --count OUT/count.json \
        [--work-json OUT/work.json] [--ninja-from first|rebuild] [--printed-unit NAME=SECONDS ...] \
        --out tests/device/results/wheel-sm120.json
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

FIRST_BUILD_CPU_S = 27_037  # the first finished build's summed unit time (FACTS, fourth round)
C2X_S = 1_112  # its scaled_mm_c2x unit, now left out (vllm-kernel-archs v2)


def _relative(value: Any) -> Any:
    """Device paths made relative to the session folder ($G4S), recursively."""
    if isinstance(value, str):
        return re.sub(r"/(?:root|home/[\w.-]+)/g4s/", "$G4S/", value)  # the session folder's default, $HOME/g4s
    if isinstance(value, list):
        return [_relative(v) for v in value]
    if isinstance(value, dict):
        return {k: _relative(v) for k, v in value.items()}
    return value


def _ninja_summary(n: dict[str, Any] | None) -> dict[str, Any] | None:
    if not n:
        return None
    return {"span_s": n["span_s"], "units": n["compile_units"], "unit_s_summed": n["cpu_s"],
            "per_target": n["per_target"], "critical": n["critical"][:8]}


def build(args: argparse.Namespace) -> Any:
    c = json.loads(args.collected.read_text(encoding="utf-8"))
    count = json.loads(args.count.read_text(encoding="utf-8")) if args.count else None
    timed = json.loads(args.work_json.read_text(encoding="utf-8")) if args.work_json else None
    ninja = c.get("ninja")
    first_ninja = ninja if args.ninja_from == "first" else None
    rebuild_ninja = ninja if args.ninja_from == "rebuild" else (c["rebuild"].get("ninja"))
    # the first build's wheel: the one its manifest tagged (a rebuild adds a wheel of another version beside it)
    built = next(iter(c.get("manifest_tags") or {}), c["wheel"][0]["name"] if c["wheel"] else None)
    steps = c["steps_s"]
    stats = c["rebuild"].get("sccache") or ""
    hits = {k: int(v) for k, v in re.findall(r"^Cache hits \((CUDA|C/C\+\+)\)\s+(\d+)$", stats, re.M)}
    misses = re.search(r"^Cache misses\s+(\d+)$", stats, re.M)
    other_s = sum(v for k, v in steps.items() if k != "vllm")
    result: dict[str, Any] = {
        "what": "g4build wheel --arch sm120 --os linux --no-flashinfer --jobs $(nproc), pin vllm-0.21.0, through "
                "tests/device/wheel_sm120_session.sh stash/start/wait/collect/rebuild/bench (build_vllm_wheel.sh); "
                "written by tests/device/wheel_result.py",
        "machine": c["machine"],
        "build_options": c.get("build_options"),  # the profile the bare command resolved to (manifest)
        "build": {
            "exit": int(c["build_rc"]) if c.get("build_rc") is not None else None,
            "steps_s": steps,
            "vllm_step_s": steps.get("vllm"),
            "goal_vllm_step_s": 720,
            "peak_ram_used_gb": c["peak_ram_gb"],
            "peak_ram_note": "MemTotal - MemAvailable sampled every 2 s over the whole hold",
            "ninja": _ninja_summary(first_ninja),
            "printed_units_s": {k: float(v) for k, v in (item.split("=", 1) for item in args.printed_unit)},
            "printed_units_note": "read from the collector's printed critical list on the device, where the "
                                  "collected file lacks the first build's ninja log" if args.printed_unit else None,
        },
        "wheel": {"name": built, "bytes": next((w["bytes"] for w in c["wheel"] if w["name"] == built), None),
                  "why_tags": (c.get("manifest_tags") or {}).get(built), "cubins": c["cubins"]},
        "validate": c["validate"],
        "rebuild_after_python_only_bump": {
            "exit": (c["rebuild"].get("run") or {}).get("rc"),
            "command_s": (c["rebuild"].get("run") or {}).get("seconds"),
            "steps_s": c["rebuild"]["steps_s"],
            "sccache_hits": hits, "sccache_misses": int(misses[1]) if misses else None,
            "cuda_units_recompiled": int(misses[1]) if misses else None,
            "ninja": _ninja_summary(rebuild_ninja),
        },
        "compile_work": None if count is None else {
            "per_target": count["per_target"],
            "upstream_units": count["work"]["upstream"]["units"], "plan_units": count["work"]["plan"]["units"],
            "upstream_proxy_items": count["work"]["upstream"]["proxy_items"],
            "plan_proxy_items": count["work"]["plan"]["proxy_items"],
            "ratio_proxy": round(count["work"]["ratio_proxy"], 2),
            "ratio_seconds": (timed or {}).get("work", {}).get("ratio_seconds"),
            "skipped_upstream": args.skipped_upstream,
        },
        "thirty_two_core": {
            "computed_not_run": True,
            "unit_s": FIRST_BUILD_CPU_S - C2X_S,
            "units_over_32_cores_s": round((FIRST_BUILD_CPU_S - C2X_S) / 32),
            "other_steps_s": round(other_s, 1),
        },
    }
    return _relative(result)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collected", type=Path, required=True)
    ap.add_argument("--count", type=Path)
    ap.add_argument("--work-json", type=Path, help="bench_wheel_compile_work.sh's work.json of a timed run")
    ap.add_argument("--ninja-from", choices=("first", "rebuild"), default="first",
                    help="which build the collected file's top-level ninja log is (collectors before "
                         "first.ninja_log was kept read it after the rebuild)")
    ap.add_argument("--printed-unit", action="append", default=[], metavar="NAME=SECONDS")
    ap.add_argument("--skipped-upstream", default=None, help="dependencies upstream's configure went without")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.write_text(json.dumps(build(args), indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
