"""Benchmark: `g4build overlay` of the registry's vLLM 0.21.0 wheel (248 MB) against `cp` of the same file,
side by side in one run, for the pinned wheel (its sha256 as read is the pin's: no per-member verification) and
for an unpinned copy (the same bytes under another file name: every member inflated and held against RECORD,
across cores); and `g4build validate` of the result. Ratios printed.

    python tests/benchmarks/bench_overlay.py [--tries N] [--unpack-pack] [--json]

Each command runs as its own process (bytecode cached, as Python does by default) and its wall time is the best
of N rounds, each round running every command in turn (default 5; a shared machine is noisy: the best try is the
one least disturbed, and a change of load hits every command of a round alike); CPU seconds (the
process and its children) are printed beside it, as they depend far less on the load. The same steps are also
timed inside one Python process (no interpreter start, no imports): that is where the work itself shows.
Needs the package index once (the wheel is fetched into g4build's cache); `--unpack-pack` adds `wheel unpack` +
patch + `wheel pack` (once, slow).
Goals: pinned overlay <= 3x cp, unpinned <= 10x cp on 2 cores, validate <= 2 s.

Floors, measured in the same run: a bare interpreter's start (`python -c pass`), the CLI's start (`g4build
--version`: typer, rich and the root group, no command's module), the sha256 of the whole wheel (what the pinned
overlay cannot skip: the pin vouches only for bytes whose hash it has seen) and the inflating, CRC and sha256 of
the largest member (one deflate stream: one core, whatever the number of cores), so a ratio can be told apart
from what no code change can remove.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path[:0] = [str(HERE.parents[2] / "toolkit"), str(HERE.parents[2])]

from tests.support.wheelsfactory import SeriesSpec, git_patch, make_project  # noqa: E402

from g4build.overlay import sourcecheck  # noqa: E402
from g4build.overlay.wheel import overlay_wheel, plan_overlay  # noqa: E402
from g4build.pins.index import cache_root, fetch_verified  # noqa: E402
from g4build.pins.model import load_pins  # noqa: E402
from g4build.series.model import load_all  # noqa: E402
from g4build.series.scratch import apply_patches  # noqa: E402
from g4build.validate.wheel import ValidateOptions, validate_wheel  # noqa: E402
from g4build.wheelfile.safety import stream_member  # noqa: E402

PIN = "vllm-0.21.0"
TARGET = "vllm/v1/spec_decode/dflash.py"
UNPINNED = "vllm-0.21.0-cp38-abi3-linux_x86_64.whl"  # the pin lists no wheel of this name: verified member-wise
G4BUILD = [sys.executable, "-m", "g4build"]
ENV = dict(os.environ)  # the commands' environment: bytecode cached (set in main), as on a user's machine


def cpu_now() -> float:
    """CPU seconds of this process and of its children that ended (their own children included)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def best(fn: Callable[[], object], tries: int, reset: Callable[[], object] | None = None) -> tuple[float, float]:
    """Wall time and CPU time of ``fn``, each the best of ``tries`` (``reset`` runs untimed before each)."""
    walls, cpus = [], []
    for _ in range(tries):
        if reset:
            reset()
        cpu, start = cpu_now(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - start)
        cpus.append(cpu_now() - cpu)
    return min(walls), min(cpus)


Step = tuple[Callable[[], object], Callable[[], object] | None]  # what is timed, what runs untimed before it


def interleaved(steps: dict[str, Step], tries: int) -> dict[str, tuple[float, float]]:
    """Each step's best wall and CPU time over ``tries`` rounds, every round running every step in turn: a change
    in the machine's load hits all of them alike, not the ones that happened to run then."""
    walls: dict[str, list[float]] = {name: [] for name in steps}
    cpus: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(tries):
        for name, (fn, reset) in steps.items():
            if reset:
                reset()
            cpu, start = cpu_now(), time.perf_counter()
            fn()
            walls[name].append(time.perf_counter() - start)
            cpus[name].append(cpu_now() - cpu)
    return {name: (min(walls[name]), min(cpus[name])) for name in steps}


def run(argv: Sequence[str]) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, env=ENV)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")


def sha256_of(path: Path) -> str:
    """The whole file's sha256, read in 4 MiB chunks (as the pinned overlay reads it)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(4 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def largest_member(path: Path) -> None:
    """Inflate, CRC-check and hash the wheel's largest member: one stream, one core."""
    with zipfile.ZipFile(path) as zf:
        stream_member(zf, max(zf.infolist(), key=lambda i: i.file_size))


def every_member(path: Path) -> None:
    """Inflate, CRC-check and hash every member, one after the other (the CPU that verification divides)."""
    with zipfile.ZipFile(path) as zf:
        for info in zf.infolist():
            stream_member(zf, info)


def series_for_pin(work: Path) -> None:
    """The checkout's series for the pin; none: a small real patch to one vLLM file (G4BUILD_HOME, inherited)."""
    if any(s.patches_for(PIN) for s in load_all()):
        return
    ref = load_pins().get(PIN).wheels["manylinux_x86_64"]
    with zipfile.ZipFile(cache_root() / "wheels" / ref.file) as zf:
        original = zf.read(TARGET).decode()
    head, sep, rest = original.partition("\nimport ")
    patch = git_patch({TARGET: original}, {TARGET: f"{head}\n# g4build bench{sep}{rest}"}, work / "g")
    os.environ["G4BUILD_HOME"] = str(make_project(work / "project", [SeriesSpec(name="bench", patches=[patch])]))


def main() -> None:
    args = sys.argv[1:]
    as_json = "--json" in args
    tries = int(args[args.index("--tries") + 1]) if "--tries" in args else 5
    pin = load_pins().get(PIN)
    ref = pin.wheels["manylinux_x86_64"]
    source = fetch_verified("vllm", ref.file, ref.sha256, cache_dir=cache_root() / "wheels").path
    work = Path(tempfile.mkdtemp(prefix="g4build-bench-"))
    figures: dict[str, object] = {"wheel_mb": round(source.stat().st_size / 1e6, 1), "cpus": os.cpu_count(),
                                  "tries": tries}
    try:
        series_for_pin(work)
        plan = plan_overlay(pin, load_all())
        unpinned = work / "in" / UNPINNED
        unpinned.parent.mkdir()
        shutil.copyfile(source, unpinned)
        source.read_bytes()
        unpinned.read_bytes()  # both in the page cache: every try reads from memory
        out = work / "out"

        def clear() -> None:
            shutil.rmtree(out, ignore_errors=True)
            (work / "copy.whl").unlink(missing_ok=True)

        # processes, side by side: what a user waits for. Bytecode is cached as Python does by default (an
        # environment with PYTHONDONTWRITEBYTECODE would compile every module at each start), in the work folder
        ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        ENV["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
        run([*G4BUILD, "--version"])
        def validate_result() -> None:
            (wheel,) = out.glob("*.whl")  # the unpinned overlay's, just written
            run([*G4BUILD, "validate", str(wheel), "--pin", PIN])

        copy = ["cp", str(source), str(work / "copy.whl")]
        processes = interleaved({
            "python": (lambda: run([sys.executable, "-c", "pass"]), None),
            "start": (lambda: run([*G4BUILD, "--version"]), None),
            "cp": (lambda: run(copy), clear),
            "pinned": (lambda: run([*G4BUILD, "overlay", "--pin", PIN, "--out", str(out), "--no-validate"]), clear),
            "cp 2": (lambda: run(copy), clear),  # noise check
            "unpinned": (lambda: run([*G4BUILD, "overlay", str(unpinned), "--pin", PIN, "--out", str(out),
                                      "--no-validate"]), clear),
            "validate": (validate_result, None),
        }, tries)
        p_python, p_start, p_cp, p_pinned, p_cp_2, p_unpinned, p_validate = processes.values()

        # the same work in this process
        t_cp = best(lambda: shutil.copyfile(source, work / "copy.whl"), tries, clear)
        t_sha = best(lambda: sha256_of(source), tries)
        t_largest = best(lambda: largest_member(source), tries)
        t_every = best(lambda: every_member(source), min(tries, 2))
        t_pinned = best(lambda: overlay_wheel(source, plan, out, require_pin=True), tries, clear)
        t_unpinned = best(lambda: overlay_wheel(unpinned, plan, out), tries, clear)
        workers = sourcecheck.workers
        sourcecheck.workers = lambda: 1  # type: ignore[assignment]
        t_unpinned_1 = best(lambda: overlay_wheel(unpinned, plan, out), min(tries, 2), clear)
        sourcecheck.workers = workers  # type: ignore[assignment]
        overlay_wheel(unpinned, plan, out)
        (wheel,) = out.glob("*.whl")
        t_validate = best(lambda: validate_wheel(wheel, ValidateOptions(pin=PIN)), tries)

        t_unpack_pack = None
        if "--unpack-pack" in args:
            def unpack_patch_pack() -> None:
                wheel_cli = [sys.executable, "-m", "wheel"]
                run([*wheel_cli, "unpack", "-d", str(work / "unpacked"), str(source)])
                (tree,) = (work / "unpacked").iterdir()
                apply_patches(tree, plan.patches, target=tree.name)
                (work / "packed").mkdir()
                run([*wheel_cli, "pack", "-d", str(work / "packed"), str(tree)])

            t_unpack_pack = best(unpack_patch_pack, 1)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    cp = min(p_cp[0], p_cp_2[0])

    def pair(t: tuple[float, float]) -> str:
        return f"{t[0]:.3f} s wall, {t[1]:.3f} s CPU"

    figures.update({
        "process: python -c pass": pair(p_python),
        "process: g4build --version (start, imports)": pair(p_start),
        "process: cp": pair(p_cp),
        "process: cp again (noise check)": pair(p_cp_2),
        "process: overlay, pinned wheel": pair(p_pinned),
        "process: overlay, unpinned copy": pair(p_unpinned),
        "process: validate of the result": pair(p_validate),
        "ratio pinned / cp": round(p_pinned[0] / cp, 1),
        "ratio pinned less start / cp": round((p_pinned[0] - p_start[0]) / cp, 1),
        "ratio unpinned / cp": round(p_unpinned[0] / cp, 1),
        "in process: copyfile": pair(t_cp),
        "in process: sha256 of the wheel (floor)": pair(t_sha),
        "in process: largest member inflated+hashed": pair(t_largest),
        "floor pinned: start + sha256, / cp": round((p_start[0] + t_sha[0]) / cp, 1),
        "in process: every member inflated+hashed": pair(t_every),
        "floor unpinned: start + sha256/cores + max(largest, every/cores), / cp": round(
            (p_start[0] + (t_sha[1] + max(t_largest[1] * (os.cpu_count() or 1), t_every[1])) / (os.cpu_count() or 1))
            / cp, 1),
        "in process: overlay, pinned wheel": pair(t_pinned),
        "in process: overlay, unpinned copy": pair(t_unpinned),
        "in process: overlay, unpinned copy, 1 thread": pair(t_unpinned_1),
        "in process: validate": pair(t_validate),
        "ratio in process pinned / copyfile": round(t_pinned[0] / t_cp[0], 1),
        "ratio in process unpinned / copyfile": round(t_unpinned[0] / t_cp[0], 1),
        "unpack + patch + pack": None if t_unpack_pack is None else pair(t_unpack_pack),
        "load average (1 min) after": round(os.getloadavg()[0], 1),
        "goals": {"pinned<=3x cp": p_pinned[0] <= 3 * cp, "unpinned<=10x cp": p_unpinned[0] <= 10 * cp,
                  "validate<=2s": p_validate[0] <= 2.0},
    })
    if as_json:
        print(json.dumps(figures, indent=2))
        return
    for key, value in figures.items():
        print(f"{key:46} {value}")


if __name__ == "__main__":
    main()
