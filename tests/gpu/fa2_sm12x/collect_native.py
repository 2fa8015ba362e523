"""One result file for a native FA2 library build (``device_run.sh native`` / ``build_fa2.sh native``): the build
infos, the per-unit compile times from ninja's ``.ninja_log`` files (one per call; a unit interrupted in one call
and rebuilt in the next counts once, from the call that finished it) and ``lib_archs.py``'s reading.

    python collect_native.py --build-info B.json --lib-archs A.json --ninja-log CALL1.ninja_log [--ninja-log ...]
        --machine "16 cores ..." --out tests/device/results/fa2-sm120-library.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def ninja_units(logs: list[Path]) -> dict[str, float]:
    """output -> seconds, later logs overriding earlier ones (ninja logs version 5+: start end mtime output hash)."""
    units: dict[str, float] = {}
    for log in logs:
        for line in log.read_text().splitlines():
            if line.startswith("#"):
                continue
            start, end, _mtime, output, *_ = line.split("\t")
            units[output] = (int(end) - int(start)) / 1000
    return units


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-info", type=Path, required=True)
    parser.add_argument("--lib-archs", type=Path, required=True)
    parser.add_argument("--ninja-log", type=Path, action="append", default=[])
    parser.add_argument("--machine", required=True)
    parser.add_argument("--note", action="append", default=[])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    info = json.loads(args.build_info.read_text())
    if info.get("library"):
        info["library"] = Path(info["library"]).name
    archs = json.loads(args.lib_archs.read_text())
    units = ninja_units(args.ninja_log)
    cu = {k: v for k, v in units.items() if k.endswith(".cu.o")}
    result: dict[str, Any] = {
        "what": "vllm-flash-attn FA2 library (_vllm_fa2_C) built natively for sm_120 with g4build's dependency series",
        "machine": args.machine,
        "build": info,
        "compile_units": {
            "cuda_units": len(cu),
            "cuda_seconds_sum": round(sum(cu.values()), 1),
            "cuda_seconds_mean": round(statistics.mean(cu.values()), 1) if cu else None,
            "cuda_seconds_max": round(max(cu.values()), 1) if cu else None,
            "per_unit_s": {Path(k).name.removesuffix(".o"): round(v, 1) for k, v in sorted(cu.items())},
            "how": "ninja's own start/end per unit, -j 16 on 16 cores; the units that a call interrupted are "
            "counted from the call that finished them",
        },
        "library_archs": archs,
        "notes": args.note,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result["compile_units"].items() if k != "per_unit_s"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
