"""Fold the FlashInfer ahead-of-time device runs into ``tests/device/results/flashinfer-sm120.json`` (issue 51):
the scoped sm_120 build (``g4build flashinfer-aot --arch 12.0f`` on the GPU machine: modules, cubin archs,
seconds, bytes, validate), its sm_90 twin's sampler on the H200 with FlashInfer's JIT unavailable
(``flashinfer_aot_probe.py``), and the sm_120 wheel loaded on the H200 (``--foreign-arch``).

    python tests/device/flashinfer_result.py --record R/flashinfer-aot.json --log R/aot.log \\
        --validate V/validate-sm120.json --wheel V/jit-cache-sm120.whl.zip --wheel-name V/wheel-name.txt \\
        --sm90-record sm90/flashinfer-aot.json --gpu G/flashinfer-aot-gpu.json \\
        --foreign F/flashinfer-aot-sm120-on-h200.json --machine "..." --out tests/device/results/flashinfer-sm120.json

Each input is what a device call brought back (the commands are in tests/device/README.md); nothing is typed in
by hand but the machine's description.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path
from typing import Any

PUBLISHED_FULL_MB = 189  # upstream's flashinfer-jit-cache for sm120f, every module (FlashInfer's own index)


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def wheel_facts(wheel: Path, name: str) -> dict[str, Any]:
    with zipfile.ZipFile(wheel) as z:
        libs = {i.filename: i.file_size for i in z.infolist() if i.filename.endswith(".so")}
    return {"file": name, "bytes": wheel.stat().st_size, "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
            "libraries": libs}


def cubin_archs(validate: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for wheel in validate.get("wheels", []):
        for check in wheel.get("checks", []):
            m = re.match(r"arch (sm_\d+\w*) .*/([^/]+\.so)$", check.get("name", ""))
            if m:
                out[m[2]] = check.get("detail", "")
    return out


def fold(a: argparse.Namespace) -> dict[str, Any]:
    record, validate = _json(a.record), _json(a.validate)
    gpu, foreign, sm90 = _json(a.gpu), _json(a.foreign), _json(a.sm90_record)
    log = a.log.read_text(encoding="utf-8")
    command_s = re.search(r"command: (\d+) s", log)
    wheel = wheel_facts(a.wheel, a.wheel_name.read_text(encoding="utf-8").strip())
    validate_ok = all(c.get("ok") for w in validate.get("wheels", []) for c in w.get("checks", []))
    return {
        "what": "FlashInfer modules the recipes load, compiled ahead of time by g4build flashinfer-aot",
        "machine": a.machine,
        "scoped_sm120": {
            "command": "g4build flashinfer-aot --pin vllm-0.21.0 --arch 12.0f --jobs 16",
            "flashinfer": record["flashinfer"], "sdist_sha256": record["sdist"]["sha256"],
            "modules": record["modules"], "module_archs": record["module_archs"],
            "compile_seconds": record["seconds"],
            "command_seconds": int(command_s[1]) if command_s else None,
            "library_bytes": record["bytes"],
            "wheel_of_that_run": record["wheels"][0],
            "rebuilt_wheel": wheel,
            "validate_ok": validate_ok, "cubins": cubin_archs(validate),
            "against_published_full": {"published_full_mb": PUBLISHED_FULL_MB,
                                       "scoped_mb": round(wheel["bytes"] / 1e6, 1),
                                       "ratio": round(PUBLISHED_FULL_MB / (wheel["bytes"] / 1e6), 1)},
        },
        "sm90_twin": {"command": "g4build flashinfer-aot --pin vllm-0.21.0 --arch 9.0 --jobs 2 (built on 2 CPU cores)",
                      "modules": sm90["modules"], "module_archs": sm90["module_archs"],
                      "skipped": sm90["skipped"], "compile_seconds": sm90["seconds"], "wheels": sm90["wheels"]},
        "sampler_without_jit": gpu,
        "sm120_wheel_on_h200": foreign,
        "checks": {
            "scoped_modules_only": sorted(record["modules"]) == sorted(record["bytes"]),
            "sm120_validate_ok": validate_ok,
            "sampler_from_aot_no_compile": bool(gpu.get("ok")),
            "sm120_wheel_fails_cleanly_on_other_gpu": bool(foreign.get("ok")),
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("record", "log", "validate", "wheel", "wheel-name", "sm90-record", "gpu", "foreign", "out"):
        ap.add_argument(f"--{name}", type=Path, required=True)
    ap.add_argument("--machine", required=True)
    a = ap.parse_args(argv)
    try:
        result = fold(a)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
        print(f"flashinfer_result: {e}", file=sys.stderr)
        return 1
    # the device machine's scratch folders (the probe's venv-less site, the build's output) as names, not paths
    text = re.sub(r"/(?:tmp|root)/[A-Za-z0-9_.-]+", "$WORK", json.dumps(result, indent=1))
    a.out.write_text(text + "\n", encoding="utf-8")
    print(json.dumps(result["checks"]))
    return 0 if all(result["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
