"""The real scoped compile: FlashInfer 0.6.8.post1's ``sampling`` module built by nvcc for 9.0 (sm_90a) from the
pin's sdist through ``flashinfer_aot_driver`` (FlashInfer's own generator and ninja file), packed as the jit-cache
wheel and validated by the fatbin reader (SASS for sm_90a in every fatbin). Minutes of nvcc on a small machine.

A toolkit without cuRAND's headers gets them from the registry's nvidia-curand wheel of its CUDA major
(FLASHINFER_EXTRA_CUDAFLAGS), as the build step's error tells a user to do.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from g4build.builder.flashinfer_aot import JitCacheInfo, pack_wheel
from g4build.builder.flashinfer_aot_build import CURAND_HEADER, Module, compile_modules, source_tree
from g4build.recipes.flashinfer_modules import load_table
from g4build.validate.fatbin import Arch
from g4build.validate.wheel import ValidateOptions, validate_wheel

pytestmark = [pytest.mark.nvcc, pytest.mark.heavy, pytest.mark.network]
VERSION = "0.6.8.post1"  # vllm-0.21.0's FlashInfer
LOAD = """
import json, pathlib, shutil, sys, types
tree = sys.argv[1]
package = types.ModuleType("flashinfer"); package.__path__ = [tree + "/flashinfer"]; sys.modules["flashinfer"] = package
from flashinfer.jit import env
from flashinfer.jit.sampling import gen_sampling_module
spec = gen_sampling_module()
module = spec.build_and_load()
names = ("top_p_sampling_from_probs", "top_k_sampling_from_probs", "top_k_top_p_sampling_from_probs",
         "top_k_mask_logits")
mapped = sorted({line.split()[-1] for line in open("/proc/self/maps") if line.rstrip().endswith("/sampling.so")})
print(json.dumps({"nvcc": shutil.which("nvcc"), "is_aot": spec.is_aot, "mapped": mapped,
                  "compiled": [str(p) for p in pathlib.Path(env.FLASHINFER_JIT_DIR).rglob("*.so")],
                  "functions": {n: bool(module.implements_function(n)) for n in names}}))
"""


def _cuda_home() -> Path:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("no nvcc on PATH")
    home = os.environ.get("CUDA_HOME")
    if home:
        return Path(home)
    # nvcc may be a wrapper script: ask it where its toolkit is
    out = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull], capture_output=True,
                         text=True, check=False)
    for line in (out.stdout + out.stderr).splitlines():
        if "TOP=" in line:
            return Path(line.split("TOP=", 1)[1].strip()).resolve()
    return Path(nvcc).resolve().parent.parent


def _curand_flags(home: Path, tmp: Path) -> str:
    if (home / "include" / CURAND_HEADER).is_file():
        return ""
    major = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout
    cu = "13" if "release 13" in major else "12"
    project = "nvidia-curand" if cu == "13" else "nvidia-curand-cu12"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
                    "-d", str(tmp), project], check=True)
    (wheel,) = tmp.glob("nvidia_curand*.whl")
    with zipfile.ZipFile(wheel) as zf:
        headers = [n for n in zf.namelist() if n.endswith(".h")]
        zf.extractall(tmp / "x", members=headers)
    (folder,) = {str((tmp / "x" / h).parent) for h in headers if h.endswith(CURAND_HEADER)}
    return f"-I{folder}"


def test_sampling_compiles_for_sm90a_packs_and_validates(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("tvm_ffi")
    home = _cuda_home()
    env = {**os.environ, "CUDA_HOME": str(home)}
    flags = _curand_flags(home, tmp_path / "curand")
    if flags:
        env["FLASHINFER_EXTRA_CUDAFLAGS"] = flags
    if not (home / "lib64" / "stubs" / "libcuda.so").exists():  # a bare toolkit: the link stub it lacks, by gcc
        stub = tmp_path / "stub"
        stub.mkdir()
        (stub / "stub.c").write_text("void g4build_link_stub(void) {}\n")
        subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub / "libcuda.so"),
                        str(stub / "stub.c")], check=True)
        env["FLASHINFER_EXTRA_LDFLAGS"] = f"-L{stub}"
    source = load_table().sources[VERSION]
    tree = source_tree(VERSION, source.file, source.sha256, tmp_path / "work")
    sampling = Module(name="sampling", generator="flashinfer.jit.sampling:gen_sampling_module")
    built_dir, built = compile_modules(python=sys.executable, tree=tree, work=tmp_path / "work" / "9.0",
                                       modules=[sampling], arch_list="9.0", jobs=1, env=env)
    assert built.modules == ("sampling",) and built.sizes["sampling"] > 0
    # FlashInfer's checks print __FILE__: the build folders are mapped away, none of this machine's paths ships
    library = (built_dir / "sampling" / "sampling.so").read_bytes()
    assert str(tmp_path).encode() not in library and b"/g4build-flashinfer/" in library
    info = JitCacheInfo(flashinfer=VERSION, source_file=source.file, source_sha256=source.sha256, arch_list="9.0",
                        modules=built.modules)
    wheel = pack_wheel(built_dir, tmp_path / "out", info, "linux_x86_64")
    report = validate_wheel(wheel, ValidateOptions(archs=(Arch.parse("sm90a"),), trust_fatbin=True))
    checks = {c.name: (c.ok, c.detail) for c in report.checks if c.name.startswith("jit-cache")}
    assert checks["jit-cache sampling"] == (True, "SASS for sm_90a in every fatbin"), checks
    assert all(ok for ok, _ in checks.values()), checks
    # FlashInfer's own JitSpec loads it from the installed wheel with JIT unavailable (no nvcc on PATH, its switch
    # on, an empty workspace) and compiles nothing; the functions vLLM's sampler calls are there (no GPU: no launch)
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    probe_env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(home / "lib64"), "PYTHONPATH": str(site),
                 "FLASHINFER_DISABLE_JIT": "1", "FLASHINFER_CUDA_ARCH_LIST": "9.0", "HOME": str(tmp_path),
                 "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "ws")}
    done = subprocess.run([sys.executable, "-c", LOAD, str(tree)], env=probe_env, capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded["nvcc"] is None and loaded["is_aot"] and loaded["compiled"] == []
    assert loaded["mapped"] == [str(site / "flashinfer_jit_cache" / "jit_cache" / "sampling" / "sampling.so")]
    assert all(loaded["functions"].values()), loaded["functions"]
    # what the issue asks to record: time and size
    print(json.dumps({"module": "sampling", "arch": "sm90a", "seconds": round(built.seconds, 1),
                      "so_bytes": built.sizes["sampling"], "wheel_bytes": wheel.stat().st_size}))
