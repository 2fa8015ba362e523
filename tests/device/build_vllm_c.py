"""Device check: configure vLLM (pin vllm-0.21.0, our series applied) for sm_120 and build its ``_C`` target
through g4build's plan and native executor, offline, and print what compiled and how long.

Inputs (a folder passed as the first argument): the pin's sdist (its sha256 is checked against the pin),
``deps/*.tar.xz`` prefetched CMake dependencies named ``<FetchContent name>.tar.xz`` and ``patches/`` (series
patch files, applied in name order). Run by build_vllm_c.sh; nothing here needs the network.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from g4build.builder.arch import parse_arch
from g4build.builder.deps import find_deps, initial_cache
from g4build.builder.executors.native import NativeExecutor
from g4build.builder.plan import BuildPlan, Layout, Options, Step, Target
from g4build.builder.planner import make_plan
from g4build.pins.model import load_pins


def main(inputs: Path, work: Path, jobs: int, target_name: str, limit_s: int) -> int:
    pin = load_pins().get("vllm-0.21.0")
    sdist = inputs / pin.sdist.file
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != pin.sdist.sha256:
        print(f"sdist sha256 {digest} != pinned {pin.sdist.sha256}")
        return 4
    print(f"sdist {sdist.name}: sha256 verified")
    src = work / "src"
    if not (src / "CMakeLists.txt").is_file():
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        (work / f"vllm-{pin.version}").rename(src)
        for patch in sorted((inputs / "patches").glob("*.patch")):
            subprocess.run(["git", "apply", "--whitespace=nowarn", str(patch)], cwd=src, check=True)
            print(f"applied {patch.name}")
    deps_dir = work / "deps"
    entries = []
    for dep in find_deps(src):
        dest = deps_dir / dep.cache_name
        archive = inputs / "deps" / f"{dep.name}.tar.xz"
        if not dest.exists():
            dest.mkdir(parents=True)
            if archive.is_file():
                with tarfile.open(archive) as tar:
                    tar.extractall(dest, filter="data")
                print(f"dependency {dep.name} @ {dep.tag}: from {archive.name}")
            else:
                print(f"dependency {dep.name} @ {dep.tag}: not carried (empty; compiles nothing for sm_120)")
        entries.append((dep, dest))
    layout = Layout(root=str(work), out=str(work / "wheels"), cache=str(deps_dir))
    Path(layout.deps_file).write_text(initial_cache(entries))
    target = Target(os="linux", arch=parse_arch("sm120"), python="3.12", cuda="13.0")
    plan = make_plan(pin, [], target, layout=layout, opts=Options(jobs=jobs), cuda_home="/usr/local/cuda")
    build = work / "build"
    py = sys.executable
    configure = Step(
        name="configure", title="cmake configure (plan env)",
        command=("cmake", "-G", "Ninja", "-S", str(src), "-B", str(build), "-C", layout.deps_file,
                 f"-DCMAKE_BUILD_TYPE={plan.env['CMAKE_BUILD_TYPE']}",
                 f"-DVLLM_TARGET_DEVICE={plan.env['VLLM_TARGET_DEVICE']}",
                 f"-DVLLM_PYTHON_EXECUTABLE={py}", f"-DFETCHCONTENT_BASE_DIR={plan.env['FETCHCONTENT_BASE_DIR']}",
                 f"-DNVCC_THREADS={plan.env['NVCC_THREADS']}", "-DCMAKE_JOB_POOL_COMPILE:STRING=compile",
                 f"-DCMAKE_JOB_POOLS:STRING=compile={plan.env['MAX_JOBS']}"),
        cwd=str(work))
    compile_ = Step(name="build-" + target_name, title=f"ninja {target_name}",
                    command=("timeout", str(limit_s), "cmake", "--build", str(build), "--target", target_name,
                             "-j", plan.env["MAX_JOBS"]),
                    cwd=str(work))
    device_plan = BuildPlan(target=plan.target, pin=plan.pin, version=plan.version, layout=layout, env=plan.env,
                            setup=(), steps=(configure, compile_))
    print("plan env:", json.dumps({k: plan.env[k] for k in ("TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS",
                                                              "CMAKE_BUILD_TYPE", "CMAKE_ARGS")}))
    start = time.monotonic()
    try:
        result = NativeExecutor().run(device_plan)
    finally:
        logs = sorted(Path(layout.log_dir).glob("*.log"))
        for log in logs:
            text = log.read_text(errors="replace")
            if "configure" in log.name:
                for ln in text.splitlines():
                    if re.search(r"CUDA supported target|CUDA target arch|Building .* for archs|archs:|FATAL|"
                                 r"Error", ln):
                        print("  configure:", ln.strip()[:200])
            else:
                units = re.findall(r"\[(\d+)/(\d+)\] Building (?:CUDA|CXX) object (\S+)", text)
                print(f"  {log.name}: {len(units)} CUDA objects compiled")
                for _, _, obj in units:
                    print("    ", obj)
                print("  last lines:", *text.splitlines()[-5:], sep="\n    ")
    for s in result.steps:
        print(f"step {s.name}: {s.status} in {s.seconds:.1f}s")
    print(f"total {time.monotonic() - start:.1f}s")
    libs = sorted(build.glob("_C*.so"))
    for lib in libs:
        print(f"built {lib.name}: {lib.stat().st_size / 1e6:.1f} MB")
        out = subprocess.run(["cuobjdump", "--list-elf", str(lib)], capture_output=True, text=True, check=False)
        archs = sorted(set(re.findall(r"sm_\d+[af]?", out.stdout)))
        print(f"  cuobjdump --list-elf: {len(out.stdout.splitlines())} cubins, archs {archs}")
    return 0 if libs else 1


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(main(Path(args[0]), Path(args[1]), int(args[2]), args[3] if len(args) > 3 else "_C",
                  int(args[4]) if len(args) > 4 else 3600))
