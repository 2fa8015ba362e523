"""Compile one real vLLM kernel unit for upstream's default arch list and for the plan's sm_120 list, in the
same run, and print both times and their ratio.

    python tests/benchmarks/bench_arch_compile.py [--pin vllm-0.21.0] [--unit csrc/...cu ...] [--cutlass DIR]
        [--torch-headers] [--parallel N] [--timeout S] [--json FILE]

The vLLM tree is the pin's sdist (tests/support/trees.py: downloaded once from the package index, cached).
The default unit, ``csrc/libtorch_stable/quantization/cutlass_w4a8/w4a8_utils.cu``, needs CUTLASS headers and
no torch: pass ``--cutlass`` (a CUTLASS checkout at the pin's tag, e.g. the one ``g4build prefetch`` keeps),
or let the script find ``<g4build cache>/deps/cutlass-<tag>``. Units that include torch headers work when
``--torch-headers`` is given and the CUDA toolkit has the cuBLAS/cuSPARSE headers torch's CUDA headers need.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "toolkit"), str(ROOT)]

from tests.support.trees import sdist_tree  # noqa: E402

from g4build.builder.arch import UPSTREAM_DEFAULT_ARCH_LIST, cuda_arch_list, gencode_flags, parse_arch  # noqa: E402
from g4build.builder.deps import find_deps  # noqa: E402
from g4build.builder.host import find_nvcc, nvcc_version  # noqa: E402
from g4build.pins.index import cache_root  # noqa: E402

# what vLLM's CMake passes every CUDA unit of _C (torch extension + vLLM's own feature switches)
VLLM_DEFINES = ["-DENABLE_FP8", "-DTORCH_EXTENSION_NAME=_C", "-DPy_LIMITED_API=3", "-U__CUDA_NO_HALF_OPERATORS__",
                "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__"]
DEFAULT_UNIT = "csrc/libtorch_stable/quantization/cutlass_w4a8/w4a8_utils.cu"


def compile_once(nvcc: str, unit: Path, includes: list[Path], flags: list[str], out: Path,
                 timeout: float | None = None) -> float:
    cmd = [nvcc, "-c", str(unit), "-o", str(out), "-O3", "-std=c++17", "--expt-relaxed-constexpr",
           "--expt-extended-lambda", "-Xcompiler", "-fPIC", *VLLM_DEFINES, *(f"-I{p}" for p in includes), *flags]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        return float("inf")
    took = time.perf_counter() - start
    if proc.returncode:
        raise RuntimeError(f"nvcc failed on {unit.name} ({' '.join(flags)}):\n{proc.stderr[-1500:]}")
    return took


def bench_unit(nvcc: str, tree: Path, unit: str, includes: list[Path], lists: dict[str, str], repeat: int,
               timeout: float | None) -> dict[str, float]:
    """Both arch lists for one unit, alternating per round so drift hits both equally."""
    times = dict.fromkeys(lists, 0.0)
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(repeat):
            for label, arch_list in lists.items():
                took = compile_once(nvcc, tree / unit, includes, gencode_flags(arch_list), Path(tmp) / f"{rnd}.o",
                                    timeout)
                times[label] += took
                print(f"  {unit} round {rnd + 1} {label:17s}: {took:7.2f} s", flush=True)
    return {k: v / repeat for k, v in times.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pin", default="vllm-0.21.0")
    ap.add_argument("--unit", action="append", help=f"a .cu of the tree (repeatable; default {DEFAULT_UNIT})")
    ap.add_argument("--cutlass", type=Path)
    ap.add_argument("--torch-headers", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--parallel", type=int, default=1,
                    help="units benchmarked at once (each nvcc is single-threaded: keep it at most the core count)")
    ap.add_argument("--timeout", type=float, help="seconds per compile; a unit past it is reported as a bound")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()

    nvcc = find_nvcc()
    version = nvcc_version(nvcc) if nvcc else None
    if not nvcc or not version:
        raise SystemExit("nvcc not found: put the CUDA toolkit's bin on PATH or set CUDA_HOME")
    tree = sdist_tree(args.pin)
    cutlass = args.cutlass
    if cutlass is None:
        tag = next(d.tag for d in find_deps(tree) if d.name == "cutlass")
        cutlass = cache_root() / "deps" / f"cutlass-{tag}"
    if not (cutlass / "include" / "cutlass" / "cutlass.h").is_file():
        raise SystemExit(f"no CUTLASS at {cutlass}: pass --cutlass DIR (a checkout at the pin's tag)")
    includes = [tree / "csrc", cutlass / "include", cutlass / "tools" / "util" / "include"]
    if args.torch_headers:
        import torch

        t_inc = Path(torch.__file__).parent / "include"
        includes += [t_inc, t_inc / "torch" / "csrc" / "api" / "include", Path(sysconfig.get_paths()["include"])]
    units = args.unit or [DEFAULT_UNIT]
    plan_list = cuda_arch_list(parse_arch("sm120"), version)
    lists = {"upstream default": UPSTREAM_DEFAULT_ARCH_LIST, "g4build sm120": plan_list}
    print(f"{len(units)} unit(s) of {args.pin}; nvcc {version}; {os.cpu_count()} cores; {args.parallel} at once; "
          f"repeat {args.repeat}")
    print(f"upstream default [{UPSTREAM_DEFAULT_ARCH_LIST}] vs g4build sm120 [{plan_list}]")
    def one(unit: str) -> dict[str, float] | None:
        try:
            r = bench_unit(nvcc, tree, unit, includes, lists, args.repeat, args.timeout)
        except RuntimeError as exc:  # one unit that does not compile here must not cost the others' results
            print(f"SKIPPED {unit}: {exc}", flush=True)
            return None
        up, ours = r["upstream default"], r["g4build sm120"]
        print(f"DONE {unit}: upstream {up:.1f} s, sm120 {ours:.1f} s", flush=True)
        return r

    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        futures = {u: pool.submit(one, u) for u in units}
        results = {u: r for u, f in futures.items() if (r := f.result()) is not None}
    print(f"{'unit':70s} {'upstream':>9s} {'sm120':>8s} {'ratio':>6s}")
    ratios = []
    finished = {u: r for u, r in results.items() if all(math.isfinite(v) for v in r.values())}
    for unit, r in results.items():
        up, ours = r["upstream default"], r["g4build sm120"]
        if unit not in finished:
            bound = f">= {args.timeout / ours:.1f}x" if math.isfinite(ours) else "n/a"
            print(f"{unit:70s} {'timeout':>9s} {ours:7.1f}s {bound} (past --timeout {args.timeout:.0f} s)")
            continue
        ratios.append(up / ours)
        print(f"{unit:70s} {up:8.1f}s {ours:7.1f}s {up / ours:5.1f}x")
    if not ratios:
        raise SystemExit("no unit finished both compiles within --timeout")
    total_up = sum(r["upstream default"] for r in finished.values())
    total_ours = sum(r["g4build sm120"] for r in finished.values())
    geo = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    print(f"{len(finished)} unit(s) that finished: {total_up:.1f} s vs {total_ours:.1f} s = "
          f"{total_up / total_ours:.1f}x less compile time for the sm120 plan (geometric mean of the per-unit "
          f"ratios {geo:.1f}x)")
    if args.json:
        args.json.write_text(json.dumps({"nvcc": version, "cores": os.cpu_count(), "lists": lists,
                                         "units": {u: {k: (v if math.isfinite(v) else None) for k, v in r.items()}
                                                   for u, r in results.items()},
                                         "total_ratio": total_up / total_ours,
                                         "geomean_ratio": geo}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
