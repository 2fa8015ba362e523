"""Benchmark: `index build` of the registry's vLLM 0.21.0 wheel overlaid with the checkout's series, against
copying the wheel and against validating it alone (the index copies, validates, hashes and reads METADATA and
the manifest). One run of the script, the best of 3 tries each, ratios printed.

    python tests/benchmarks/bench_index.py [--json]

Needs the package index once (the wheel is fetched into g4build's cache).
Goal: index build <= 1.5x the validation it cannot skip.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path[:0] = [str(HERE.parents[2] / "toolkit"), str(HERE.parents[2])]

from g4build.index.pages import SiteOptions  # noqa: E402
from g4build.index.site import build_index  # noqa: E402
from g4build.overlay.wheel import overlay_wheel, plan_overlay  # noqa: E402
from g4build.pins.index import cache_root, fetch_verified  # noqa: E402
from g4build.pins.model import load_pins  # noqa: E402
from g4build.series.model import load_all  # noqa: E402
from g4build.validate.wheel import ValidateOptions, validate_wheel  # noqa: E402

PIN = "vllm-0.21.0"
TRIES = 3


def best_of(fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(TRIES):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    pin = load_pins().get(PIN)
    ref = pin.wheels["manylinux_x86_64"]
    source = fetch_verified("vllm", ref.file, ref.sha256, cache_dir=cache_root() / "wheels").path
    work = Path(tempfile.mkdtemp(prefix="g4build-bench-index-"))
    try:
        wheel = overlay_wheel(source, plan_overlay(pin, load_all()), work / "wheels").wheel
        copy_s = best_of(lambda: shutil.copyfile(wheel, work / "copy.whl"))
        validate_s = best_of(lambda: validate_wheel(wheel, ValidateOptions(pin=PIN)))
        index_s = best_of(lambda: build_index(work / "wheels", work / "site", SiteOptions(), pin=PIN))
        result = {
            "wheel": wheel.name, "size_mb": round(wheel.stat().st_size / 1e6, 1),
            "copy_s": round(copy_s, 2), "validate_s": round(validate_s, 2), "index_build_s": round(index_s, 2),
            "index_vs_validate": round(index_s / validate_s, 2), "index_vs_copy": round(index_s / copy_s, 1),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if "--json" in sys.argv:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:>18}: {value}")


if __name__ == "__main__":
    main()
