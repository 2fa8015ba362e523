"""Gather what one device hold of the build route left (tests/device/wheel_sm120_session.sh) into one JSON result:
the machine, per-step times, ninja's per-unit times and the critical path, peak RAM, the wheel (name, tags, size),
validate's JSON, cubin archs per library, the Python-only rebuild through the compiler cache and the compile-work
bench. Missing parts are recorded as missing, never guessed.

    python tests/device/collect_wheel_result.py --g4s $HOME/g4s --out $OUT/wheel-sm120.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any


def _run(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def machine() -> dict[str, Any]:
    mem = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal:")), 0)
    return {"cores": os.cpu_count(), "ram_gb": round(mem / 1024 ** 2, 1), "python": platform.python_version(),
            "nvcc": _run("nvcc", "--version").splitlines()[-1:] or None,
            "gpus": _run("nvidia-smi", "-L").splitlines(),
            "torch": _run("python3", "-c", "import torch; print(torch.__version__)"),
            "cmake": (_run("cmake", "--version").splitlines() or [""])[0],
            "ninja": _run("ninja", "--version"), "glibc": platform.libc_ver()[1]}


def ninja_units(log: Path) -> dict[str, Any]:
    """Per-output times from a .ninja_log (v5+: start end mtime output hash, ms), the last entry per output."""
    last: dict[str, tuple[int, int]] = {}
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        parts = line.split("\t")
        if len(parts) >= 4 and parts[0].isdigit():
            last[parts[3]] = (int(parts[0]), int(parts[1]))
    units = [{"output": o, "start_s": s / 1000, "seconds": (e - s) / 1000} for o, (s, e) in last.items()]
    units.sort(key=lambda u: -u["seconds"])
    compiled = [u for u in units if u["output"].endswith((".o", ".obj"))]
    span = (max(e for _, e in last.values()) - min(s for s, _ in last.values())) / 1000 if last else 0.0
    per_target: dict[str, dict[str, float]] = {}
    for u in compiled:
        m = re.search(r"CMakeFiles/([^/]+)\.dir/", u["output"])
        t = per_target.setdefault(m[1] if m else "?", {"units": 0, "cpu_s": 0.0})
        t["units"] += 1
        t["cpu_s"] = round(t["cpu_s"] + u["seconds"], 1)
    return {"log": str(log), "entries": len(units), "compile_units": len(compiled),
            "cpu_s": round(sum(u["seconds"] for u in compiled), 1), "span_s": round(span, 1),
            "critical": compiled[:8], "per_target": per_target,
            "units": [{"output": u["output"].rsplit("CMakeFiles/", 1)[-1], "seconds": round(u["seconds"], 1),
                       "start_s": round(u["start_s"], 1)} for u in compiled]}


def cubins(results: Path) -> dict[str, str]:
    text = (results / "cubins.txt").read_text(encoding="utf-8") if (results / "cubins.txt").is_file() else ""
    return dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--g4s", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    g4s: Path = args.g4s
    res, work = g4s / "results", g4s / "work"
    current = sorted((work / "root").glob("src/build/temp*/.ninja_log"), key=lambda p: p.stat().st_mtime)
    first = res / "first.ninja_log"  # kept by the rebuild, which makes the tree anew
    logs = [first] if first.is_file() else current
    ram = [int(x) for x in (work / "ram.kb").read_text().split()] if (work / "ram.kb").is_file() else []
    wheels = sorted((work / "wheels").glob("vllm-*.whl"))
    start = int((g4s / "build.start").read_text()) if (g4s / "build.start").is_file() else None
    state = _json(res / "g4build-state.json") or {}
    rebuilt = _json(g4s / "results-rebuild" / "g4build-state.json") or {}
    result: dict[str, Any] = {
        "command": "g4build wheel --arch sm120 --os linux --no-flashinfer --jobs $(nproc) (tests/device/"
                   "build_vllm_wheel.sh through tests/device/wheel_sm120_session.sh)",
        "machine": machine(),
        "build_rc": (g4s / "build.rc").read_text().strip() if (g4s / "build.rc").is_file() else None,
        "steps_s": {k: v.get("seconds") for k, v in state.get("done", {}).items()},
        "wall_s_to_rc": (int((g4s / "build.rc").stat().st_mtime) - start) if start and (g4s / "build.rc").is_file()
        else None,
        "peak_ram_gb": round(max(ram) / 1024 ** 2, 1) if ram else None,
        "ninja": ninja_units(logs[0]) if logs else None,
        "wheel": [{"name": w.name, "bytes": w.stat().st_size, "tags": w.name[:-4].split("-")[-3:]} for w in wheels],
        "validate": _json(res / "validate.json"),
        "manifest_tags": (_json(res / "build-manifest.json") or {}).get("tags"),
        # what the bare command built: its --kernels default resolves per arch (sm120: gemma4 since it became
        # the default; the runs recorded before it built every kernel)
        "build_options": (_json(res / "build-manifest.json") or {}).get("build_options"),
        "cubins": cubins(res),
        "rebuild": {"run": _json(g4s / "results-rebuild" / "rebuild.json"),
                    "steps_s": {k: v.get("seconds") for k, v in rebuilt.get("done", {}).items()},
                    "ninja": ninja_units(current[-1]) if first.is_file() and current else None,
                    "sccache": (g4s / "results-rebuild" / "sccache-stats.txt").read_text()
                    if (g4s / "results-rebuild" / "sccache-stats.txt").is_file() else None},
        "compile_work": _json(g4s / "results-bench" / "work.json"),
        "compile_count": (_json(g4s / "results-bench" / "count.json") or {}).get("work"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    n = result["ninja"] or {}
    print(json.dumps({"build_rc": result["build_rc"], "steps_s": result["steps_s"], "peak_ram_gb":
                      result["peak_ram_gb"], "span_s": n.get("span_s"), "cpu_s": n.get("cpu_s"),
                      "critical": [(u["output"][-70:], u["seconds"]) for u in n.get("critical", [])[:5]],
                      "wheel": result["wheel"], "validate_ok": (result["validate"] or {}).get("ok")}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
