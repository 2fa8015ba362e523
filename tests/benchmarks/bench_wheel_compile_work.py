"""Whole-wheel compile work: upstream's default arch list against g4build's sm_120 plan, from real CMake configures.

    # 1. configure both trees with the real CMake of vLLM (and its FetchContent dependencies), nothing compiled
    python tests/benchmarks/bench_wheel_compile_work.py configure --tree UPSTREAM_SRC --build UP \
        --arch-list "7.5 8.0 8.6 8.9 9.0 10.0 11.0 12.0+PTX" [--deps-file prefetched-deps.cmake]
    python tests/benchmarks/bench_wheel_compile_work.py configure --tree PLAN_SRC --build PLAN \
        --arch-list 12.0f --deps-file PLAN_DEPS.cmake       # a tree and deps file made by g4build's own steps
    # 2. time sampled units of every family with the exact commands CMake generated (a machine with nvcc, torch)
    python tests/benchmarks/bench_wheel_compile_work.py measure --upstream UP --plan PLAN --sample 2 \
        --parallel 16 --json times.json
    # 3. count units per target and family, combine with the times, print the ratio
    python tests/benchmarks/bench_wheel_compile_work.py count --upstream UP --plan PLAN [--times times.json] \
        [--json result.json]

What a unit is compiled for is read from each build folder's build.ninja (``g4build.builder.units``): vLLM and
vllm-flash-attn put ``-gencode`` flags on each source, so the configure alone decides every kernel family's
arch list. A *family* is a target plus the folder of its sources (``_vllm_fa2_C:csrc/flash_attn/src``,
``_C:csrc/quantization/marlin`` ...): units of one family share their code and templates, so their compile
times are alike. Extrapolation: a family's work is its unit count times the mean time of its sampled units
under that configuration; a family without a sampled time takes the mean of all sampled units of that
configuration (said in the output). Without times the script prints a proxy: per CUDA unit one work item per
SASS code plus one per PTX-only virtual arch, per C++ unit one item.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "toolkit"), str(ROOT)]

from g4build.builder.units import CompileUnit, summary, units_from_ninja  # noqa: E402

CONFIGS = ("upstream", "plan")


def family_of(unit: CompileUnit, build: Path) -> str:
    """``target:folder`` with the folder relative to the tree (or dependency) the source comes from."""
    return family_from(unit.target, unit.source)


def family_from(target: str, source: str) -> str:
    """:func:`family_of` for a target and a source path (a .ninja_log's object path gives both)."""
    parent = Path(source).parent
    for marker in ("csrc", "hopper", "flash_attn"):  # vLLM's and its dependencies' source roots
        parts = parent.parts
        if marker in parts:
            parent = Path(*parts[parts.index(marker):])
            break
    else:
        parent = Path(parent.name)
    return f"{target}:{parent.as_posix()}"


def proxy_items(unit: CompileUnit) -> int:
    """Work items of the no-times proxy: one per SASS, one per virtual arch that only yields PTX; C++: one."""
    if unit.language != "CUDA":
        return 1
    sass_nums = {c.removeprefix("sm_") for c in unit.sass}
    ptx_only = [c for c in unit.ptx if c.removeprefix("compute_") not in sass_nums]
    return max(1, len(unit.sass) + len(ptx_only))


def load_units(build: Path) -> list[CompileUnit]:
    ninja = build / "build.ninja"
    if not ninja.is_file():
        raise SystemExit(f"{ninja} missing: run the configure step first")
    return units_from_ninja(ninja.read_text(encoding="utf-8"))


def families(units: Iterable[CompileUnit], build: Path) -> dict[str, list[CompileUnit]]:
    found: dict[str, list[CompileUnit]] = defaultdict(list)
    for u in units:
        found[family_of(u, build)].append(u)
    return dict(sorted(found.items()))


def sampled_mean(times: dict[str, dict[str, float]] | None, cfg: str) -> float | None:
    """The mean of a configuration's sampled families: what a family without a time of its own takes."""
    sampled = [t for fam_times in (times or {}).values() if (t := fam_times.get(cfg)) is not None]
    return statistics.fmean(sampled) if sampled else None


def per_unit_seconds(fam: str, cfg: str, times: dict[str, dict[str, float]] | None,
                     timed_out: dict[str, dict[str, float]] | None, fallback: float | None,
                     ) -> tuple[float | None, str]:
    """A family's seconds a unit and how they were had: its sampled mean ("timed"), else the timeout its sample
    ran past ("timed_out": a floor, the family took longer), else the configuration's mean ("untimed")."""
    mean = (times or {}).get(fam, {}).get(cfg)
    if mean is not None:
        return mean, "timed"
    floor = (timed_out or {}).get(fam, {}).get(cfg)
    if floor is not None:
        return floor, "timed_out"
    return fallback, "untimed"


def compile_work(fams: dict[str, dict[str, list[CompileUnit]]], times: dict[str, dict[str, float]] | None,
                 timed_out: dict[str, dict[str, float]] | None = None) -> dict[str, Any]:
    """Per configuration: units, proxy items and (with times) estimated seconds, per family and in total. A family
    whose sample ran past the timeout counts each unit at the timeout (a floor: the family took longer), not at the
    configuration's mean."""
    out: dict[str, Any] = {}
    for cfg, by_family in fams.items():
        fallback = sampled_mean(times, cfg)
        rows = {}
        for fam, units in by_family.items():
            per_unit, how = per_unit_seconds(fam, cfg, times, timed_out, fallback)
            rows[fam] = {"units": len(units), "cuda_units": sum(u.language == "CUDA" for u in units),
                         "proxy_items": sum(proxy_items(u) for u in units),
                         "codes": sorted({c for u in units for c in u.codes}),
                         "seconds": None if per_unit is None else len(units) * per_unit, "timed": how == "timed",
                         "timed_out": how == "timed_out"}
        out[cfg] = {"families": rows,
                    "units": sum(r["units"] for r in rows.values()),
                    "proxy_items": sum(r["proxy_items"] for r in rows.values()),
                    "seconds": sum(r["seconds"] for r in rows.values()) if times and fallback is not None else None,
                    "untimed_families": sorted(f for f, r in rows.items() if not r["timed"] and not r["timed_out"]),
                    "timed_out_families": sorted(f for f, r in rows.items() if r["timed_out"])}
    up, plan = out["upstream"], out["plan"]
    out["ratio_proxy"] = up["proxy_items"] / max(1, plan["proxy_items"])
    if up["seconds"] and plan["seconds"]:
        out["ratio_seconds"] = up["seconds"] / plan["seconds"]
    return out


def configure(args: argparse.Namespace) -> int:
    """vLLM's CMake configure as its setup.py runs it (Ninja, Release, the Python, nvcc), nothing built."""
    tree, build = args.tree.resolve(), args.build.resolve()
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    cmd = ["cmake", "-S", str(tree), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
           "-DVLLM_TARGET_DEVICE=cuda", f"-DVLLM_PYTHON_EXECUTABLE={sys.executable}",
           f"-DCMAKE_CUDA_COMPILER={cuda_home}/bin/nvcc", f"-DFETCHCONTENT_BASE_DIR={build / 'fetchcontent'}"]
    if args.deps_file:
        cmd += ["-C", str(args.deps_file.resolve())]
    cmd += [f"-D{d}" for d in args.define or ()]
    env = {**os.environ, "TORCH_CUDA_ARCH_LIST": args.arch_list}
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=tree, capture_output=True, text=True, check=False)
    (build / "configure.log").parent.mkdir(parents=True, exist_ok=True)
    (build / "configure.log").write_text(proc.stdout + proc.stderr, encoding="utf-8")
    if proc.returncode:
        print(proc.stdout[-4000:] + proc.stderr[-4000:])
        return proc.returncode
    for line in proc.stdout.splitlines():
        if any(k in line for k in ("architectures", "ARCHS", "Building", "Not building", "FA3")):
            print(line)
    print(f"configured {tree} for [{args.arch_list}] in {time.perf_counter() - start:.1f} s -> {build}")
    return 0


def _sample(units: list[CompileUnit], k: int) -> list[CompileUnit]:
    """``k`` units spread evenly over the family (deterministic)."""
    if len(units) <= k:
        return list(units)
    step = len(units) / k
    return [units[int(i * step)] for i in range(k)]


def _command(build: Path, unit: CompileUnit) -> str:
    obj = next(line.split(":")[0].removeprefix("build ")
               for line in (build / "build.ninja").read_text(encoding="utf-8").splitlines()
               if line.startswith("build ") and f" {unit.source} " in f"{line} " and ".dir/" in line)
    out = subprocess.run(["ninja", "-C", str(build), "-t", "commands", "-s", obj], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()
    return out[-1]


def measure(args: argparse.Namespace) -> int:
    builds = {"upstream": args.upstream.resolve(), "plan": args.plan.resolve()}
    jobs: list[tuple[str, str, Path, str]] = []
    for cfg, build in builds.items():
        for fam, units in families((u for u in load_units(build) if u.language == "CUDA"), build).items():
            if args.family and not any(f in fam for f in args.family):
                continue
            jobs += [(cfg, fam, build, _command(build, u)) for u in _sample(units, args.sample)]
    print(f"{len(jobs)} sampled compiles, {args.parallel} at once, {os.cpu_count()} cores")

    def run(job: tuple[str, str, Path, str]) -> tuple[str, str, float | None, str]:
        cfg, fam, build, cmd = job
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, shell=True, cwd=build, capture_output=True, text=True,
                                  timeout=args.timeout, check=False)
        except subprocess.TimeoutExpired:
            print(f"TIMEOUT {cfg} {fam}", flush=True)
            return cfg, fam, None, "timeout"
        took = time.perf_counter() - start
        ok = proc.returncode == 0
        print(f"{'DONE' if ok else 'FAILED'} {cfg:8s} {fam}: {took:.1f} s"
              + ("" if ok else f"\n  {shlex.quote(cmd)[:300]}\n  {proc.stderr[-800:]}"), flush=True)
        return cfg, fam, took if ok else None, "ok" if ok else "failed"

    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as pool:
        results = list(pool.map(run, jobs))
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    timed_out: dict[str, dict[str, float]] = defaultdict(dict)
    for cfg, fam, took, status in results:
        if took is not None:
            per[fam][cfg].append(took)
        elif status == "timeout":
            timed_out[fam][cfg] = args.timeout  # took longer than this: a floor, not a time
    times = {fam: {cfg: statistics.fmean(v) for cfg, v in by_cfg.items()} for fam, by_cfg in sorted(per.items())}
    data = {"cores": os.cpu_count(), "parallel": args.parallel, "sample": args.sample, "timeout": args.timeout,
            "times": times, "timed_out": dict(sorted(timed_out.items()))}
    if args.json:
        args.json.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(data, indent=2))
    return 0


def count(args: argparse.Namespace) -> int:
    builds = {"upstream": args.upstream.resolve(), "plan": args.plan.resolve()}
    units = {cfg: load_units(b) for cfg, b in builds.items()}
    times = timed_out = None
    if args.times:
        measured = json.loads(args.times.read_text(encoding="utf-8"))
        times, timed_out = measured["times"], measured.get("timed_out")
    fams = {cfg: families(units[cfg], builds[cfg]) for cfg in CONFIGS}
    work = compile_work(fams, times, timed_out)
    per_target = {cfg: summary(units[cfg]) for cfg in CONFIGS}
    targets = sorted(set(per_target["upstream"]) | set(per_target["plan"]))
    print(f"{'target':28s} {'upstream units':>15s} {'plan units':>11s}  codes (plan)")
    for t in targets:
        up, pl = per_target["upstream"].get(t, {}), per_target["plan"].get(t, {})
        print(f"{t:28s} {up.get('units', 0):15d} {pl.get('units', 0):11d}  "
              + " ".join(f"{c}x{n}" for c, n in pl.get("codes", {}).items()))
    for cfg in CONFIGS:
        w = work[cfg]
        secs = f", ~{w['seconds']:.0f} s of compile time" if w["seconds"] else ""
        print(f"{cfg}: {w['units']} units, {w['proxy_items']} proxy work items{secs}"
              + (f"; untimed families (config mean used): {len(w['untimed_families'])}" if times else "")
              + (f"; past the timeout (counted at it): {len(w['timed_out_families'])}" if w["timed_out_families"]
                 else ""))
    print(f"ratio (proxy: SASS + PTX-only virtual archs per unit): {work['ratio_proxy']:.2f}x")
    if "ratio_seconds" in work:
        print(f"ratio (sampled times x unit counts): {work['ratio_seconds']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"per_target": per_target, "work": work}, indent=2, default=list) + "\n",
                             encoding="utf-8")
    return 0


def series_defines(cmake_args: str) -> list[str]:
    """The ``-DG4B_...`` definitions in a plan's CMAKE_ARGS (the kernel profile, FA2's head dims): what the wheel
    build gives vLLM's CMake beyond the arch list, so the benchmark's plan configures the units the build compiles.
    Launchers, the make program and the -C deps file are the build's own plumbing and stay out."""
    return [a.removeprefix("-D") for a in shlex.split(cmake_args) if a.startswith("-DG4B_")]


def plan_defines(args: argparse.Namespace) -> int:
    plan = json.load(sys.stdin)
    for d in series_defines(plan.get("env", {}).get("CMAKE_ARGS", "")):
        print(d)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("configure")
    c.add_argument("--tree", type=Path, required=True)
    c.add_argument("--build", type=Path, required=True)
    c.add_argument("--arch-list", required=True)
    c.add_argument("--deps-file", type=Path, help="the cmake -C file `g4build prefetch` / `g4build deps` wrote")
    c.add_argument("--define", action="append", help="NAME=VALUE, a cache entry the plan's build sets (repeatable)")
    sub.add_parser("plan-defines", help="the series' own CMake definitions (-DG4B_...) in a `g4build wheel "
                       "--dry-run --json` plan on stdin, one NAME=VALUE a line")
    m = sub.add_parser("measure")
    m.add_argument("--upstream", type=Path, required=True)
    m.add_argument("--plan", type=Path, required=True)
    m.add_argument("--sample", type=int, default=2, help="units timed per family and configuration")
    m.add_argument("--family", action="append", help="only families whose name contains this (repeatable)")
    m.add_argument("--parallel", type=int, default=1)
    m.add_argument("--timeout", type=float, default=900)
    m.add_argument("--json", type=Path)
    n = sub.add_parser("count")
    n.add_argument("--upstream", type=Path, required=True)
    n.add_argument("--plan", type=Path, required=True)
    n.add_argument("--times", type=Path, help="the JSON `measure` wrote (or times measured elsewhere, same shape)")
    n.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    return {"configure": configure, "measure": measure, "count": count, "plan-defines": plan_defines}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
