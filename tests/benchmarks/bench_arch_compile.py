"""Compile one real vLLM kernel unit for upstream's default arch list and for the plan's sm_120 list, in the
same run, and print both times and their ratio.

    python tests/benchmarks/bench_arch_compile.py [--pin vllm-0.21.0] [--unit csrc/...cu] [--cutlass DIR]

The vLLM tree is the pin's sdist (tests/support/trees.py: downloaded once from the package index, cached).
The default unit, ``csrc/libtorch_stable/quantization/cutlass_w4a8/w4a8_utils.cu``, needs CUTLASS headers and
no torch: pass ``--cutlass`` (a CUTLASS checkout at the pin's tag, e.g. the one ``g4build prefetch`` keeps),
or let the script find ``<g4build cache>/deps/cutlass-<tag>``. Units that include torch headers work when
``--torch-headers`` is given and the CUDA toolkit has the cuBLAS/cuSPARSE headers torch's CUDA headers need.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "toolkit"), str(ROOT)]

from tests.support.trees import sdist_tree  # noqa: E402

from g4build.build.arch import UPSTREAM_DEFAULT_ARCH_LIST, cuda_arch_list, gencode_flags, parse_arch  # noqa: E402
from g4build.build.deps import find_deps  # noqa: E402
from g4build.build.host import find_nvcc, nvcc_version  # noqa: E402
from g4build.index import cache_root  # noqa: E402

DEFAULT_UNIT = "csrc/libtorch_stable/quantization/cutlass_w4a8/w4a8_utils.cu"


def compile_once(nvcc: str, unit: Path, includes: list[Path], flags: list[str], out: Path) -> float:
    cmd = [nvcc, "-c", str(unit), "-o", str(out), "-O3", "-std=c++17", "--expt-relaxed-constexpr",
           "--expt-extended-lambda", "-Xcompiler", "-fPIC", *(f"-I{p}" for p in includes), *flags]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    took = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(f"nvcc failed ({' '.join(flags)}):\n{proc.stderr[-2000:]}")
    return took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pin", default="vllm-0.21.0")
    ap.add_argument("--unit", default=DEFAULT_UNIT)
    ap.add_argument("--cutlass", type=Path)
    ap.add_argument("--torch-headers", action="store_true")
    ap.add_argument("--repeat", type=int, default=1)
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
    unit = tree / args.unit
    plan_list = cuda_arch_list(parse_arch("sm120"), version)
    lists = {"upstream default": UPSTREAM_DEFAULT_ARCH_LIST, "g4build sm120": plan_list}
    print(f"unit {args.unit} of {args.pin}; nvcc {version}; {os.cpu_count()} cores; repeat {args.repeat}")
    times: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.repeat):
            for label, arch_list in lists.items():  # alternate so drift hits both equally
                took = compile_once(nvcc, unit, includes, gencode_flags(arch_list), Path(tmp) / f"{rnd}.o")
                times[label] = times.get(label, 0.0) + took
                print(f"  round {rnd + 1} {label:17s} [{arch_list}]: {took:7.2f} s")
    up, ours = times["upstream default"], times["g4build sm120"]
    print(f"upstream default ({UPSTREAM_DEFAULT_ARCH_LIST}): {up / args.repeat:.2f} s")
    print(f"g4build sm120 ({plan_list}): {ours / args.repeat:.2f} s")
    print(f"ratio: {up / ours:.1f}x less compile time for the sm120 plan")
    return 0


if __name__ == "__main__":
    sys.exit(main())
