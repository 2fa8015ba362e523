"""The scoped FlashInfer build: the pin's flashinfer-python sdist (sha256-checked), its named JIT modules compiled
for an arch list by ``flashinfer_aot_driver`` in the build environment's Python, packed as a jit-cache wheel.

The sdist is all the source it needs: ``csrc/``, ``include/``, the ``flashinfer/jit`` generators and
``3rdparty/cutlass`` + ``spdlog`` (+ ``cccl`` from 0.6.14); no git clone, no submodules, so a build machine
without network works from g4build's cache. The CUDA toolkit must have cuRAND's headers (the sampler includes
``curand_kernel.h``) and a ``libcuda.so`` to link against (its ``lib64/stubs``); a toolkit without them (a bare
nvcc install) is refused before anything compiles, with the way to add them (``FLASHINFER_EXTRA_CUDAFLAGS=-I..``,
e.g. the ``nvidia-curand`` wheel's include folder; ``FLASHINFER_EXTRA_LDFLAGS=-L..``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from g4build.builder.flashinfer_aot import flashinfer_arch_name
from g4build.errors import BuildError, UsageError
from g4build.pins.index import cache_root, fetch_verified
from g4build.source.extract import safe_extract_tar

DRIVER = Path(__file__).with_name("flashinfer_aot_driver.py")
PROJECT = "flashinfer-python"
CURAND_HEADER = "curand_kernel.h"
LIBCUDA = "libcuda.so"  # FlashInfer links every module with -lcuda: the toolkit's stub, or the driver's dev link
SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib64")


@dataclass(frozen=True, kw_only=True)
class Module:
    name: str
    generator: str
    majors: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Built:
    modules: tuple[str, ...]
    skipped: tuple[str, ...]  # modules whose generator emits no code for any arch asked for
    seconds: float
    sizes: dict[str, int]


def source_tree(version: str, file: str, sha256: str, work: Path) -> Path:
    """The unpacked sdist of flashinfer-python ``version`` under ``work`` (fetched once into the cache, verified
    against ``sha256``; the cache alone serves it offline)."""
    got = fetch_verified(PROJECT, file, sha256, cache_dir=cache_root() / "sdists")
    dest = work / f"flashinfer-{version}-src"
    marker = dest / ".g4build-sha256"
    if marker.is_file() and marker.read_text().strip() == got.sha256:
        return next(p for p in dest.iterdir() if p.is_dir())
    if dest.exists():
        raise UsageError(f"{dest}: expected the unpacked sdist sha256 {got.sha256} (or nothing), found another tree",
                         hint="remove that folder; it is unpacked again from the cached sdist")
    top = safe_extract_tar(got.path, dest)
    marker.write_text(got.sha256 + "\n")
    return top


def source_commit(tree: Path) -> str | None:
    """The FlashInfer commit the sdist was made from, as its ``flashinfer/_build_meta.py`` records it."""
    meta = tree / "flashinfer" / "_build_meta.py"
    text = meta.read_text(encoding="utf-8", errors="replace") if meta.is_file() else ""
    found = re.search(r'^__git_(?:version|commit)__ = "([0-9a-f]{7,40})"$', text, re.MULTILINE)
    return found[1] if found else None


def arch_majors(arch_list: str) -> set[int]:
    """The compute-capability majors of a FLASHINFER_CUDA_ARCH_LIST (each item checked as FlashInfer reads it)."""
    return {int(a.split(".")[0]) for a in arch_list.split() if flashinfer_arch_name(a)}


def buildable(modules: Sequence[Module], arch_list: str) -> tuple[list[Module], list[str]]:
    """The modules whose generators emit code for some arch in ``arch_list``, and the names of the others."""
    majors = arch_majors(arch_list)
    keep = [m for m in modules if not m.majors or majors & set(m.majors)]
    return keep, [m.name for m in modules if m not in keep]


def check_cuda_headers(env: Mapping[str, str]) -> None:
    """cuRAND's device header where nvcc will look (CUDA_HOME/include or an -I of FLASHINFER_EXTRA_CUDAFLAGS), and
    a libcuda.so where the linker will (the toolkit's stubs, an -L of FLASHINFER_EXTRA_LDFLAGS, the system's)."""
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if not home:
        raise UsageError("CUDA_HOME is not set: expected the CUDA toolkit's folder (FlashInfer otherwise guesses it "
                         "from nvcc's path, wrong for a wrapper script)", hint="export CUDA_HOME=/usr/local/cuda")
    folders = [Path(home) / "include"]
    folders += [Path(f[2:]) for f in shlex.split(env.get("FLASHINFER_EXTRA_CUDAFLAGS", "")) if f.startswith("-I")]
    if not any((f / CURAND_HEADER).is_file() for f in folders):
        raise UsageError(f"{CURAND_HEADER} is in none of {', '.join(map(str, folders))}: FlashInfer's sampler "
                         "includes cuRAND's device header, which this CUDA toolkit lacks",
                         hint="install the toolkit's cuRAND development files, or unpack the nvidia-curand wheel of "
                              "this CUDA and export FLASHINFER_EXTRA_CUDAFLAGS=-I<its nvidia/cu13/include>")
    libs = [Path(home) / "lib64" / "stubs", Path(home) / "lib64"]
    libs += [Path(f[2:]) for f in shlex.split(env.get("FLASHINFER_EXTRA_LDFLAGS", "")) if f.startswith("-L")]
    libs += [Path(d) for d in SYSTEM_LIB_DIRS]
    if not any((d / LIBCUDA).exists() for d in libs):
        raise UsageError(f"{LIBCUDA} is in none of {', '.join(map(str, libs))}: FlashInfer links every module with "
                         "-lcuda, and this CUDA toolkit has no lib64/stubs/libcuda.so",
                         hint="install the toolkit's driver stubs (lib64/stubs), or export FLASHINFER_EXTRA_LDFLAGS="
                              "-L<a folder with a libcuda.so whose soname is libcuda.so.1>")


# what FlashInfer's JIT layer imports to write and run a module's build (module -> the package that brings it)
BUILD_IMPORTS = {"torch": "torch", "tvm_ffi": "apache-tvm-ffi", "jinja2": "jinja2", "filelock": "filelock",
                 "packaging": "packaging"}
_FIND = "import importlib.util as u, sys; print(' '.join(m for m in sys.argv[1:] if u.find_spec(m) is None))"


def check_build_python(python: Sequence[str], env: Mapping[str, str]) -> None:
    """The build environment's Python can import what FlashInfer's generators need, and ninja is on PATH."""
    done = subprocess.run([*python, "-c", _FIND, *BUILD_IMPORTS], env=dict(env), capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise UsageError(f"{' '.join(python)} did not run ({done.stderr.strip()[-200:]}): expected the build "
                         "environment's Python", hint="pass its path with --python-exe")
    missing = done.stdout.split()
    if missing:
        packages = " ".join(BUILD_IMPORTS[m] for m in missing)
        raise UsageError(f"{' '.join(python)} cannot import {', '.join(missing)}: FlashInfer's JIT generators need "
                         "them to write and run a module's build", hint=f"pip install {packages} into it")
    if shutil.which("ninja", path=env.get("PATH")) is None:
        raise UsageError("ninja is not on PATH: FlashInfer runs it to compile the modules",
                         hint="pip install ninja into the build environment")


def driver_command(python: str, tree: Path, build: Path, built: Path, modules: Sequence[Module]) -> list[str]:
    cmd = [python, str(DRIVER), "--source", str(tree), "--build", str(build), "--out", str(built)]
    for m in modules:
        cmd += ["--module", f"{m.name}={m.generator}"]
    return cmd


def path_free_flags(env: Mapping[str, str], tree: Path, work: Path) -> dict[str, str]:
    """FlashInfer's extra compile flags with the build folders mapped to fixed names (``-ffile-prefix-map``, for
    nvcc through ``-Xcompiler``): its sources print ``__FILE__`` in their checks, which would put the build
    machine's folders (a user's home) into the shipped libraries. The user's own extra flags come first."""
    prefixes = [work] if tree.resolve().is_relative_to(work.resolve()) else [work, tree]
    maps = [f"-ffile-prefix-map={p.resolve()}=/g4build-flashinfer/{i}" for i, p in enumerate(prefixes)]
    cflags = " ".join([env.get("FLASHINFER_EXTRA_CFLAGS", ""), *maps]).strip()
    cuda = " ".join([env.get("FLASHINFER_EXTRA_CUDAFLAGS", ""), *(f"-Xcompiler={m}" for m in maps)]).strip()
    return {"FLASHINFER_EXTRA_CFLAGS": cflags, "FLASHINFER_EXTRA_CUDAFLAGS": cuda}


def compile_modules(*, python: str | None, tree: Path, work: Path, modules: Sequence[Module], arch_list: str,
                    jobs: int, env: Mapping[str, str] | None = None) -> tuple[Path, Built]:
    """Compile ``modules`` for ``arch_list``; returns the folder holding ``NAME/NAME.so`` and what was built."""
    base = dict(os.environ if env is None else env)
    check_cuda_headers(base)
    keep, skipped = buildable(modules, arch_list)
    if not keep:
        raise UsageError(f"none of the FlashInfer modules {', '.join(m.name for m in modules)} builds for "
                         f"{arch_list}", hint="their generators emit code for other compute-capability majors")
    build, built = work / "build", work / "modules"
    run_env = {**base, "FLASHINFER_CUDA_ARCH_LIST": arch_list, "MAX_JOBS": str(jobs),
               **path_free_flags(base, tree, work)}
    check_build_python([python or sys.executable], run_env)
    cmd = driver_command(python or sys.executable, tree, build, built, keep)
    work.mkdir(parents=True, exist_ok=True)
    log = work / "compile.log"  # nvcc's output, kept: the compile takes minutes per module
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as sink:
        done = subprocess.run(cmd, env=run_env, stdout=sink, stderr=subprocess.STDOUT, check=False)
    seconds = time.monotonic() - start
    text = log.read_text(encoding="utf-8", errors="replace")
    if done.returncode != 0:
        tail = "\n".join(text.strip().splitlines()[-15:])
        raise BuildError(f"the FlashInfer module compile exited {done.returncode}:\n{tail}",
                         hint=f"the whole output is in {log}, the ninja files in {build}")
    lines = [ln for ln in text.splitlines() if ln.startswith("{")]
    report = json.loads(lines[-1]) if lines else {}
    sizes = {str(k): int(v) for k, v in (report.get("modules") or {}).items()}
    return built, Built(modules=tuple(m.name for m in keep), skipped=tuple(skipped), seconds=seconds, sizes=sizes)
