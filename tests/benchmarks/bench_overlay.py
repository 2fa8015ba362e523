"""Benchmark: overlay of the registry's vLLM 0.21.0 wheel (248 MB) against copying the file and against
`wheel unpack` + patch + `wheel pack`; and the time `validate` takes on it. One run of the script, ratios printed.

    python tests/benchmarks/bench_overlay.py [--json]

Needs the package index (the wheel is fetched once into g4build's cache) and `pip install wheel`.
Goals: overlay <= 3x the copy, >= 10x faster than unpack/pack, validate <= 5 s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path[:0] = [str(HERE.parents[2] / "toolkit"), str(HERE.parents[2])]

from tests.support.wheelsfactory import SeriesSpec, git_patch, make_project  # noqa: E402

from g4build.overlay.wheel import overlay_wheel, plan_overlay  # noqa: E402
from g4build.pins.index import cache_root, fetch_verified  # noqa: E402
from g4build.pins.model import load_pins  # noqa: E402
from g4build.series.model import load_all  # noqa: E402
from g4build.series.scratch import apply_patches  # noqa: E402
from g4build.validate import cudatools  # noqa: E402
from g4build.validate.fatbin import Arch  # noqa: E402
from g4build.validate.wheel import ValidateOptions, validate_wheel  # noqa: E402

PIN = "vllm-0.21.0"
TARGET = "vllm/v1/spec_decode/dflash.py"
TRIES = 3  # the quick steps are timed 3 times and the best kept (a shared machine is noisy); unpack/pack once


def timed(fn: Callable[[], object], *, best_of: int = 1, reset: Callable[[], object] | None = None) -> float:
    """Wall time of ``fn``; the best of ``best_of`` tries (``reset`` runs untimed before each)."""
    best = float("inf")
    for _ in range(best_of):
        if reset:
            reset()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    as_json = "--json" in sys.argv
    pin = load_pins().get(PIN)
    ref = pin.wheels["manylinux_x86_64"]
    source = fetch_verified("vllm", ref.file, ref.sha256, cache_dir=cache_root() / "wheels").path
    work = Path(tempfile.mkdtemp(prefix="g4build-bench-"))
    try:
        series = [s for s in load_all() if s.patches_for(PIN)]
        if not series:  # no series in this checkout yet: a small real patch to one vLLM file
            with zipfile.ZipFile(source) as zf:
                original = zf.read(TARGET).decode()
            head, sep, rest = original.partition("\nimport ")
            patch = git_patch({TARGET: original}, {TARGET: f"{head}\n# g4build bench{sep}{rest}"}, work / "g")
            root = make_project(work / "project", [SeriesSpec(name="bench", patches=[patch])])
            os.environ["G4BUILD_HOME"] = str(root)
            series = load_all()
        plan = plan_overlay(pin, series)
        source.read_bytes()  # warm the page cache so every timing reads from memory

        t_copy = timed(lambda: shutil.copyfile(source, work / "copy.whl"), best_of=TRIES,
                       reset=lambda: (work / "copy.whl").unlink(missing_ok=True))
        (work / "copy.whl").unlink()
        result = None

        def overlay() -> None:
            nonlocal result
            result = overlay_wheel(source, plan, work / "out")

        t_overlay = timed(overlay, best_of=TRIES, reset=lambda: shutil.rmtree(work / "out", ignore_errors=True))
        assert result is not None

        def unpack_patch_pack() -> None:
            run = [sys.executable, "-m", "wheel"]
            subprocess.run([*run, "unpack", "-d", str(work / "unpacked"), str(source)], check=True,
                           capture_output=True)
            (tree,) = (work / "unpacked").iterdir()
            apply_patches(tree, plan.patches, target=tree.name)
            (work / "packed").mkdir()
            subprocess.run([*run, "pack", "-d", str(work / "packed"), str(tree)], check=True, capture_output=True)

        t_unpack_pack = timed(unpack_patch_pack)
        t_validate = timed(lambda: validate_wheel(result.wheel, ValidateOptions(pin=PIN)), best_of=TRIES)
        cpu = time.process_time()
        validate_wheel(result.wheel, ValidateOptions(pin=PIN))
        cpu_validate = time.process_time() - cpu  # all threads of this process: the work, whatever the load
        sm120 = (Arch.parse("sm120"),)
        t_validate_arch = timed(lambda: validate_wheel(result.wheel, ValidateOptions(pin=PIN, archs=sm120)),
                                best_of=TRIES)
        tool = cudatools.find_cuobjdump()
        t_cross = timed(lambda: validate_wheel(result.wheel, ValidateOptions(pin=PIN, archs=sm120, cuobjdump=tool))) \
            if tool else None
    finally:
        shutil.rmtree(work, ignore_errors=True)

    figures = {
        "wheel_mb": round(source.stat().st_size / 1e6, 1),
        "cpus": os.cpu_count(),
        "copy_s": round(t_copy, 3),
        "overlay_s": round(t_overlay, 3),
        "unpack_patch_pack_s": round(t_unpack_pack, 2),
        "overlay_vs_copy": round(t_overlay / t_copy, 2),
        "unpack_pack_vs_overlay": round(t_unpack_pack / t_overlay, 1),
        "validate_s": round(t_validate, 2),
        "validate_cpu_s": round(cpu_validate, 2),
        "load_average_1min": round(os.getloadavg()[0], 1),
        "validate_arch_sm120_s": round(t_validate_arch, 2),
        "validate_arch_sm120_cuobjdump_s": None if t_cross is None else round(t_cross, 2),
        "goals": {"overlay_vs_copy<=3": t_overlay <= 3 * t_copy, "unpack_pack_vs_overlay>=10": t_unpack_pack >= 10 *
                  t_overlay, "validate<=5s": t_validate <= 5.0},
    }
    if as_json:
        print(json.dumps(figures, indent=2))
        return
    for key, value in figures.items():
        print(f"{key:34} {value}")


if __name__ == "__main__":
    main()
