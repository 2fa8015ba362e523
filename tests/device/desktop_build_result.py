"""tests/device/results/wheel-sm120-<N>c.json: one timed `g4build wheel` run on an N-core machine (issue "a
desktop's build"), from the folder `wheel_runs_session.sh collect` writes (results/: <arch>/ninja_log,
build-out-tail.txt, build-manifest.json, g4build-state.json, validate.json, cubins.txt, build.rc; ram.kb).

    python tests/device/desktop_build_result.py --results RESULTS --arch sm120 --cores 16 \
        --machine "1-GPU H200 kind: 16 cores, 125 GB" --command "..." --out tests/device/results/wheel-sm120-16c.json

Every figure is read from what the run wrote: the whole command's seconds from build_vllm_wheel.sh's last line,
the vllm step from g4build's state, units, CPU-seconds, span and the packing bound (max(CPU-seconds / cores,
longest unit)) from the .ninja_log, jobs from the manifest's MAX_JOBS, the peak memory in use from the samples
the session took every 2 s (MemTotal - MemAvailable).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "toolkit"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from wheel_e2e_result import build_summary, load

from g4build.pins.index import sha256_file

EXITED = re.compile(r"g4build wheel exited (\d+) after (\d+) s")


def command_seconds(tail: str) -> tuple[int, int] | None:
    """(rc, seconds) from build_vllm_wheel.sh's closing line, the last one when a log holds several."""
    found = EXITED.findall(tail)
    return (int(found[-1][0]), int(found[-1][1])) if found else None


def peak_memory_gb(ram_kb: Path) -> float | None:
    """The highest memory-in-use sample, GB (10^9 bytes); samples are kB (/proc/meminfo's unit, 1024 bytes)."""
    if not ram_kb.is_file():
        return None
    values = [int(v) for v in ram_kb.read_text().split() if v.isdigit()]
    return round(max(values) * 1024 / 1e9, 1) if values else None


def wheel_facts(wheel: Path, built: list[str]) -> dict[str, Any]:
    """The brought-back wheel's sha256 and bytes, refused unless the manifest names it (a wheel of another
    build cannot stand in for this one's)."""
    if wheel.name not in built:
        raise SystemExit(f"{wheel}: not the wheel this build wrote (its manifest names {built or 'none'})")
    label = wheel.name.split("-")[1].rsplit(".g4.", 1)
    return {"file": wheel.name, "sha256": sha256_file(wheel), "bytes": wheel.stat().st_size,
            "manifest_digest": label[1] if len(label) == 2 else None}


def result(results: Path, arch: str, cores: int, machine: str, commands: list[str]) -> dict[str, Any]:
    d = results / arch
    tail = (d / "build-out-tail.txt").read_text(errors="replace") if (d / "build-out-tail.txt").is_file() else ""
    ended = command_seconds(tail)
    if ended is None:
        raise SystemExit(f"{d / 'build-out-tail.txt'}: no 'g4build wheel exited RC after N s' line: the build did "
                         "not end inside the hold, or the tail is from another script")
    manifest = load(d / "build-manifest.json") or {}
    env = manifest.get("env") or {}
    summary = build_summary(results, arch, cores)
    ninja = summary["ninja"] or {}
    peak = peak_memory_gb(results / "ram.kb")
    jobs = int(env["MAX_JOBS"]) if str(env.get("MAX_JOBS", "")).isdigit() else None
    options = manifest.get("build_options") or {}
    # --kernels always (its default is per arch: gemma4 for sm120 since --kernels auto), --flash-attn unless all
    profile = "".join(f" --{k.replace('_', '-')} {v}" for k, v in sorted(options.items())
                      if v != "all" or k == "kernels")
    return {
        "what": f"g4build wheel --arch {arch} --os linux --no-flashinfer{profile}, timed on {cores} cores "
                "(written by tests/device/desktop_build_result.py)",
        "machine": machine,
        "commands": commands,
        "build_options": manifest.get("build_options"),
        "torch_cuda_arch_list": env.get("TORCH_CUDA_ARCH_LIST"),
        "command": {"rc": ended[0], "seconds": ended[1], "minutes": round(ended[1] / 60, 1)},
        "vllm_step_s": summary["step_seconds"].get("vllm"),
        "steps_s": summary["step_seconds"],
        "jobs": jobs,
        "units": ninja.get("units"),
        "cpu_seconds": ninja.get("cpu_seconds"),
        "span_s": ninja.get("span_s"),
        "packing_bound_s": ninja.get("packing_bound_s"),
        "span_over_bound": round(ninja["span_s"] / ninja["packing_bound_s"], 2) if ninja.get("packing_bound_s")
        else None,
        "fa2_units_started_s": ninja.get("fa2_units_started_s"),
        "longest": ninja.get("longest"),
        "peak_memory_gb": peak,
        "peak_gb_per_job": round(peak / jobs, 2) if peak and jobs else None,
        "validate_ok": summary["validate_ok"],
        "cubins": summary["cubins"],
        "wheels": [w for w in manifest.get("wheels", []) if isinstance(w, str)] or None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, required=True, help="the collected results/ folder")
    ap.add_argument("--arch", default="sm120")
    ap.add_argument("--cores", type=int, required=True)
    ap.add_argument("--machine", required=True)
    ap.add_argument("--command", action="append", default=[], help="a device call, in order (repeatable)")
    ap.add_argument("--loads", type=Path, help="sm120_wheel_loads.py's JSON of this wheel: its sha256 and bytes")
    ap.add_argument("--wheel", type=Path, help="the wheel brought back (`bring`, parts joined and checked): its "
                    "sha256 and bytes; its name must be the one the manifest records")
    ap.add_argument("--note", action="append", default=[])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    out = result(args.results, args.arch, args.cores, args.machine, args.command)
    if args.loads:
        out["wheel"] = (load(args.loads) or {}).get("wheel")
    if args.wheel:
        out["wheel"] = wheel_facts(args.wheel, out["wheels"] or [])
    out["notes"] = args.note
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in ("command", "vllm_step_s", "jobs", "units", "cpu_seconds", "span_s",
                                          "packing_bound_s", "peak_memory_gb")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
