"""Compile named FlashInfer JIT modules ahead of time with FlashInfer's own generators (a standalone script).

Run by the Python of the build environment (the one with torch and apache-tvm-ffi, which FlashInfer's JIT layer
imports), never imported by g4build itself, so it uses the standard library only:

    python flashinfer_aot_driver.py --source TREE --build DIR --out DIR --module NAME=PKG.MOD:FUNC ...

``TREE`` is the pin's flashinfer-python sdist, unpacked (``flashinfer/``, ``csrc/``, ``include/``,
``3rdparty/cutlass``...). The architectures come from ``FLASHINFER_CUDA_ARCH_LIST`` (set by the caller), the job
count from ``MAX_JOBS``. Each generator (e.g. ``flashinfer.jit.sampling:gen_sampling_module``) returns FlashInfer's
``JitSpec``; its name must be the module name the caller expects, so a FlashInfer that renamed a module fails here
instead of shipping a library FlashInfer would never look up. FlashInfer's ``build_jit_specs`` writes and runs the
ninja files; each ``NAME/NAME.so`` is then copied under ``--out`` (the jit-cache layout FlashInfer reads).
A JSON line on stdout says what was built.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import sys
import time
import types
from pathlib import Path


def _stub_package(tree: Path) -> None:
    """Make ``flashinfer`` the tree's package without running its ``__init__`` (which imports every kernel API and
    their optional dependencies); ``flashinfer.jit`` needs only torch, tvm_ffi and its own files."""
    package = types.ModuleType("flashinfer")
    package.__path__ = [str(tree / "flashinfer")]
    sys.modules["flashinfer"] = package


def _point_at_tree(jit_env: types.ModuleType, tree: Path, build: Path) -> None:
    """FlashInfer's JIT reads sources and headers from its installed ``data/`` folder: aim it at the sdist's
    folders, and its work folders at ``build`` (the same variables FlashInfer's AOT script sets)."""
    jit_env.FLASHINFER_CSRC_DIR = tree / "csrc"  # type: ignore[attr-defined]
    jit_env.FLASHINFER_INCLUDE_DIR = tree / "include"  # type: ignore[attr-defined]
    cutlass = tree / "3rdparty" / "cutlass"
    jit_env.CUTLASS_INCLUDE_DIRS = [cutlass / "include", cutlass / "tools" / "util" / "include"]  # type: ignore[attr-defined]
    jit_env.SPDLOG_INCLUDE_DIR = tree / "3rdparty" / "spdlog" / "include"  # type: ignore[attr-defined]
    cccl = tree / "3rdparty" / "cccl"
    if hasattr(jit_env, "CCCL_INCLUDE_DIRS") and cccl.is_dir():  # FlashInfer 0.6.14 and later bundle CCCL
        jit_env.CCCL_INCLUDE_DIRS = [cccl / "cub", cccl / "libcudacxx" / "include", cccl / "thrust"]  # type: ignore[attr-defined]
    jit_env.FLASHINFER_WORKSPACE_DIR = build  # type: ignore[attr-defined]
    jit_env.FLASHINFER_JIT_DIR = build / "cached_ops"  # type: ignore[attr-defined]
    jit_env.FLASHINFER_GEN_SRC_DIR = build / "generated"  # type: ignore[attr-defined]
    for folder in (build / "cached_ops", build / "generated"):
        folder.mkdir(parents=True, exist_ok=True)


def _generator(target: str) -> object:
    module_name, _, function = target.partition(":")
    if not module_name.startswith("flashinfer.jit") or not function.isidentifier():
        raise SystemExit(f"error: --module target {target!r}: expected flashinfer.jit.MODULE:FUNCTION")
    return getattr(importlib.import_module(module_name), function)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--build", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--module", action="append", required=True, metavar="NAME=PKG.MOD:FUNC")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if not os.environ.get("FLASHINFER_CUDA_ARCH_LIST"):
        raise SystemExit("error: FLASHINFER_CUDA_ARCH_LIST is not set: expected the archs to build, e.g. '12.0f'")
    tree, build = args.source.resolve(), args.build.resolve()
    if not (tree / "flashinfer" / "jit" / "core.py").is_file():
        raise SystemExit(f"error: {tree}: expected an unpacked flashinfer-python sdist (flashinfer/jit/core.py)")
    _stub_package(tree)
    jit_env = importlib.import_module("flashinfer.jit.env")
    _point_at_tree(jit_env, tree, build)
    core = importlib.import_module("flashinfer.jit.core")
    specs = []
    for item in args.module:
        name, _, target = item.partition("=")
        spec = _generator(target)()  # type: ignore[operator]
        if spec.name != name:
            raise SystemExit(f"error: {target} makes the module {spec.name!r}, expected {name!r}: FlashInfer "
                             "renamed it; update the module table")
        specs.append(spec)
    for spec in specs:  # FlashInfer 0.6 writes a module's ninja file only when none exists: a rerun with other
        spec.write_ninja()  # flags or archs must not reuse a stale one (unchanged text: ninja keeps the objects)
    start = time.monotonic()
    core.build_jit_specs(specs, verbose=args.verbose, skip_prebuilt=False)
    seconds = time.monotonic() - start
    built = {}
    for spec in specs:
        library = build / "cached_ops" / spec.name / f"{spec.name}.so"
        dest = args.out / spec.name / f"{spec.name}.so"
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(library, dest)
        built[spec.name] = dest.stat().st_size
    print(json.dumps({"modules": built, "seconds": round(seconds, 1),
                      "arch_list": os.environ["FLASHINFER_CUDA_ARCH_LIST"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
