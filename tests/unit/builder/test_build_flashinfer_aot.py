"""The scoped FlashInfer build's CPU side: FlashInfer's arch names, the jit-cache wheel (layout, version, the package
FlashInfer imports), `g4build validate` on it, and the checks made before nvcc runs. (The real compile:
tests/integration/flashinfer/test_flashinfer_aot_compile.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tests.support.wheelsfactory import build_wheel, container, elf, entry

from g4build.builder.flashinfer_aot import (
    RECORD_FILE,
    JitCacheInfo,
    arch_names,
    flashinfer_arch_name,
    manifest_record,
    pack_wheel,
    read_record,
)
from g4build.builder.flashinfer_aot_build import (
    SYSTEM_LIB_DIRS,
    Module,
    buildable,
    check_build_python,
    check_cuda_headers,
    compile_modules,
    path_free_flags,
)
from g4build.errors import BuildError, UsageError, ValidationError
from g4build.recipes.context import read_wheel_info
from g4build.validate.fatbin import FLAG_ARCH_SPECIFIC, FLAG_FAMILY, Arch
from g4build.validate.wheel import ValidateOptions, ValidationReport, validate_wheel

from .conftest import run_cli

SASS90A = entry(2, 90, b"cubin", flags=0x11 | FLAG_ARCH_SPECIFIC)
SASS120F = entry(2, 120, b"cubin", flags=0x11 | FLAG_FAMILY)
SASS80 = entry(2, 80, b"cubin")
SHA = "b" * 64


def info(modules: tuple[str, ...] = ("sampling",), arch_list: str = "9.0", **kw: object) -> JitCacheInfo:
    return JitCacheInfo(flashinfer="0.6.8.post1", source_file="flashinfer_python-0.6.8.post1.tar.gz",
                        source_sha256=SHA, arch_list=arch_list, modules=modules, **kw)  # type: ignore[arg-type]


def built(tmp_path: Path, libs: dict[str, bytes]) -> Path:
    folder = tmp_path / "built"
    for name, data in libs.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        (folder / name / f"{name}.so").write_bytes(data)
    return folder


def lib(*entries: bytes, units: int = 1) -> bytes:
    """A library as nvcc links it: one fatbin container per translation unit, each with every arch's entry."""
    return elf({".text": b"\x90" * 32, ".nv_fatbin": container(*entries) * units})


@pytest.mark.parametrize(("item", "name"), [("9.0", "sm90a"), ("12.0", "sm120f"), ("12.0f", "sm120f"),
                                            ("12.1", "sm121a"), ("10.0", "sm100a"), ("8.6", "sm86"),
                                            ("12.0a", "sm120a")])
def test_arch_names_as_flashinfer_normalises_them(item: str, name: str) -> None:
    assert flashinfer_arch_name(item) == name


def test_bad_arch_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match=r"expected MAJOR\.MINOR"):
        arch_names("sm120")


def test_wheel_layout_version_and_record(tmp_path: Path) -> None:
    wheel = pack_wheel(built(tmp_path, {"sampling": lib(SASS90A)}), tmp_path / "out", info(), "linux_x86_64")
    assert wheel.name.startswith("flashinfer_jit_cache-0.6.8.post1+g4jit.") and wheel.name.endswith(
        "-cp39-abi3-linux_x86_64.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        record = json.loads(zf.read("flashinfer_jit_cache/jit_cache/g4build-modules.json"))
    assert "flashinfer_jit_cache/jit_cache/sampling/sampling.so" in names
    assert record["modules"] == ["sampling"] and record["cuda_architectures"] == ["sm90a"]
    assert record["sdist"] == {"file": "flashinfer_python-0.6.8.post1.tar.gz", "sha256": SHA}
    assert not list((tmp_path / "out").glob(".*.part"))


def test_other_libraries_make_another_version(tmp_path: Path) -> None:
    one = pack_wheel(built(tmp_path / "a", {"sampling": lib(SASS90A)}), tmp_path / "o1", info(), "linux_x86_64")
    two = pack_wheel(built(tmp_path / "b", {"sampling": lib(SASS120F)}), tmp_path / "o2", info(), "linux_x86_64")
    assert one.name != two.name


def test_the_package_answers_flashinfer_06_and_07(tmp_path: Path) -> None:
    wheel = pack_wheel(built(tmp_path, {"sampling": lib(SASS90A)}), tmp_path / "out", info(), "linux_x86_64")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    probe = ("import json, pathlib, flashinfer_jit_cache as j; (p,) = j.get_jit_cache_providers(); "
             "print(json.dumps([j.__version__, (pathlib.Path(j.get_jit_cache_dir()) / 'sampling' / 'sampling.so')"
             ".is_file(), p.version, sorted(p.modules), sorted(p.cuda_architectures), p.distribution]))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=site, capture_output=True, text=True, check=True)
    version, present, pversion, modules, archs, dist = json.loads(out.stdout)
    assert version.startswith("0.6.8.post1+") and present and pversion == version
    assert (modules, archs, dist) == (["sampling"], ["sm90a"], "flashinfer-jit-cache")


def test_missing_module_library_is_refused_before_packing(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="expected the compiled module fp4_gemm_cutlass_sm120"):
        pack_wheel(built(tmp_path, {"sampling": lib(SASS90A)}), tmp_path / "out",
                   info(("sampling", "fp4_gemm_cutlass_sm120")), "linux_x86_64")
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def _report(wheel: Path, *archs: str) -> ValidationReport:
    return validate_wheel(wheel, ValidateOptions(archs=tuple(Arch.parse(a) for a in archs), trust_fatbin=True))


def _jit_checks(wheel: Path, *archs: str) -> dict[str, tuple[bool, str]]:
    return {c.name: (c.ok, c.detail) for c in _report(wheel, *archs).checks if c.name.startswith("jit-cache")}


def test_validate_passes_sass_for_every_listed_arch(tmp_path: Path) -> None:
    libs = {"sampling": lib(SASS90A, SASS120F), "fp4_gemm_cutlass_sm120": lib(SASS120F)}
    wheel = pack_wheel(built(tmp_path, libs), tmp_path / "out",
                       info(tuple(libs), "9.0 12.0f", majors=(("fp4_gemm_cutlass_sm120", (12,)),)), "linux_x86_64")
    checks = _jit_checks(wheel, "sm120")
    assert all(ok for ok, _ in checks.values()), checks
    report = _report(wheel, "sm120")  # the whole of `g4build validate`, as the plan's flashinfer-validate runs it
    assert report.ok, [(c.name, c.detail) for c in report.failures()]
    assert checks["jit-cache fp4_gemm_cutlass_sm120"][1] == "SASS for sm_120f in every fatbin"


def test_validate_fails_a_module_without_sass_for_its_arch(tmp_path: Path) -> None:
    # two translation units, one built for sm_80 only (as a missing gencode would leave it)
    two = elf({".nv_fatbin": container(SASS90A) + container(SASS80)})
    wheel = pack_wheel(built(tmp_path, {"sampling": two}), tmp_path / "out", info(), "linux_x86_64")
    ok, detail = _jit_checks(wheel)["jit-cache sampling"]
    assert not ok and "1 of 2 fatbins without SASS for sm_90a" in detail


def test_validate_fails_a_library_without_cuda_code(tmp_path: Path) -> None:
    wheel = pack_wheel(built(tmp_path, {"sampling": elf({".text": b"\x90" * 8})}), tmp_path / "out", info(),
                       "linux_x86_64")
    assert _jit_checks(wheel)["jit-cache sampling"] == (False, "sm_90a: no CUDA code at all")


def test_validate_fails_when_the_archs_do_not_cover_the_gpu(tmp_path: Path) -> None:
    wheel = pack_wheel(built(tmp_path, {"sampling": lib(SASS90A)}), tmp_path / "out", info(), "linux_x86_64")
    ok, detail = _jit_checks(wheel, "sm120")["jit-cache covers sm_120"]
    assert not ok and "none runs on sm_120" in detail


def test_validate_fails_a_module_not_listed(tmp_path: Path) -> None:
    wheel = pack_wheel(built(tmp_path, {"sampling": lib(SASS90A)}), tmp_path / "out", info(), "linux_x86_64")
    (tmp_path / "extra").mkdir()
    extra = tmp_path / "extra" / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(extra, "w") as dst:
        for item in src.infolist():
            dst.writestr(item, src.read(item))
        dst.writestr("flashinfer_jit_cache/jit_cache/topk/topk.so", lib(SASS90A))
    ok, detail = _jit_checks(extra)["jit-cache modules"]
    assert not ok and "not listed: topk" in detail


def test_fp4_gemm_is_skipped_for_hopper() -> None:
    modules = [Module(name="sampling", generator="g:a"), Module(name="fp4_gemm_cutlass_sm120", generator="g:b",
                                                                majors=(12,))]
    keep, skipped = buildable(modules, "9.0")
    assert [m.name for m in keep] == ["sampling"] and skipped == ["fp4_gemm_cutlass_sm120"]
    assert buildable(modules, "12.0f")[1] == []


def _stub_libcuda(folder: Path) -> None:
    """A link-time libcuda.so as the toolkit's lib64/stubs has one (soname libcuda.so.1), built here by gcc."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "stub.c").write_text("void g4build_link_stub(void) {}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(folder / "libcuda.so"),
                    str(folder / "stub.c")], check=True)


def test_cuda_without_curand_headers_or_libcuda_is_refused(tmp_path: Path) -> None:
    (tmp_path / "cuda" / "include").mkdir(parents=True)
    with pytest.raises(UsageError, match=r"curand_kernel\.h is in none of"):
        check_cuda_headers({"CUDA_HOME": str(tmp_path / "cuda")})
    extra = tmp_path / "curand"
    extra.mkdir()
    (extra / "curand_kernel.h").write_text("/* header */\n")
    env = {"CUDA_HOME": str(tmp_path / "cuda"), "FLASHINFER_EXTRA_CUDAFLAGS": f"-I{extra}"}
    if not any((Path(d) / "libcuda.so").exists() for d in SYSTEM_LIB_DIRS):  # a machine with the driver's dev link
        with pytest.raises(UsageError, match=r"libcuda\.so is in none of"):
            check_cuda_headers(env)
    _stub_libcuda(tmp_path / "stub")
    check_cuda_headers({**env, "FLASHINFER_EXTRA_LDFLAGS": f"-L{tmp_path / 'stub'}"})
    _stub_libcuda(tmp_path / "cuda" / "lib64" / "stubs")  # where a full toolkit keeps it
    check_cuda_headers(env)


def test_cuda_home_must_be_named() -> None:
    with pytest.raises(UsageError, match="CUDA_HOME is not set"):
        check_cuda_headers({})


def test_record_for_the_manifest_is_read_back_with_its_wheel_rehashed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert read_record(out, "0.6.8.post1") is None  # no scoped build ran there
    wheel = pack_wheel(built(tmp_path, {"sampling": lib(SASS90A)}), out, info(), "linux_x86_64")
    record = manifest_record(info(), wheel, 12.3, {"sampling": 4})
    (out / RECORD_FILE).write_text(json.dumps(record))
    back = read_record(out, "0.6.8.post1")
    assert back is not None and back["source"] == "aot" and back["modules"] == ["sampling"]
    assert back["source"] == "aot" and back["wheels"][0]["file"] == wheel.name and back["seconds"] == 12.3
    with pytest.raises(ValidationError, match=r"expected FlashInfer 0.7.2.post1 \(the pin's\), found 0.6.8.post1"):
        read_record(out, "0.7.2.post1")
    wheel.write_bytes(wheel.read_bytes() + b"x")
    with pytest.raises(ValidationError, match=r"recorded in flashinfer-aot\.json"):
        read_record(out, "0.6.8.post1")


def test_a_failed_compile_says_why_and_keeps_the_log(tmp_path: Path) -> None:
    # the real driver, run by this Python, on a folder that is no flashinfer-python sdist
    (tmp_path / "cuda" / "include").mkdir(parents=True)
    (tmp_path / "cuda" / "include" / "curand_kernel.h").write_text("/* header */\n")
    _stub_libcuda(tmp_path / "cuda" / "lib64" / "stubs")
    (tmp_path / "tree").mkdir()
    with pytest.raises(BuildError, match="expected an unpacked flashinfer-python sdist") as info_:
        compile_modules(python=sys.executable, tree=tmp_path / "tree", work=tmp_path / "work",
                        modules=[Module(name="sampling", generator="flashinfer.jit.sampling:gen_sampling_module")],
                        arch_list="9.0", jobs=1, env={"CUDA_HOME": str(tmp_path / "cuda"), "PATH": os.environ["PATH"]})
    assert str(tmp_path / "work" / "compile.log") in (info_.value.hint or "")
    assert (tmp_path / "work" / "compile.log").is_file()


def test_linux_manifest_records_the_scoped_build_and_the_launch_installs_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "wheels"
    build_wheel(out, version="0.21.0+cu130", tag="cp38-abi3-manylinux_2_28_x86_64")  # the vLLM wheel it stamps
    wheel = pack_wheel(built(tmp_path, {"sampling": lib(SASS120F)}), out, info(arch_list="12.0f"), "linux_x86_64")
    (out / RECORD_FILE).write_text(json.dumps(manifest_record(info(arch_list="12.0f"), wheel, 99.0, {"sampling": 1})))
    base = ["manifest", "--pin", "vllm-0.21.0", "--out", str(out), "--os", "linux", "--json"]
    code, stdout, err = run_cli(base, capsys)
    assert code == 0, err
    record = json.loads(stdout)["manifest"]["flashinfer"]
    assert (record["source"], record["modules"], record["cuda_architectures"]) == ("aot", ["sampling"], ["sm120f"])
    assert record["sdist"]["sha256"] == SHA and record["wheels"][0]["file"] == wheel.name
    (vllm,) = out.glob("vllm-*.whl")
    stamped = read_wheel_info(vllm).flashinfer  # what `recipe render --wheel` reads: install the jit-cache beside
    assert stamped is not None and (stamped.presence, stamped.wheels) == ("present", (wheel.name,))


def test_build_python_without_flashinfers_imports_is_refused() -> None:
    # -S: this same interpreter without its site-packages, where torch and tvm_ffi live
    with pytest.raises(UsageError, match="cannot import torch, tvm_ffi") as found:
        check_build_python([sys.executable, "-S"], {"PATH": "/usr/bin:/bin"})
    assert "pip install torch apache-tvm-ffi" in (found.value.hint or "")
    with pytest.raises(UsageError, match="did not run"):
        check_build_python([sys.executable, "-c", "raise SystemExit(3)", "--"], {"PATH": "/usr/bin:/bin"})


def test_flashinfer_flags_map_the_build_folders_away(tmp_path: Path) -> None:
    """The build folders become fixed names in __FILE__ (host and nvcc alike), after the user's own flags; a tree
    outside the work folder gets its own mapping."""
    work = tmp_path / "work"
    inside = path_free_flags({"FLASHINFER_EXTRA_CUDAFLAGS": "-I/opt/curand"}, work / "src", work)
    assert inside["FLASHINFER_EXTRA_CFLAGS"] == f"-ffile-prefix-map={work.resolve()}=/g4build-flashinfer/0"
    assert inside["FLASHINFER_EXTRA_CUDAFLAGS"] == \
        f"-I/opt/curand -Xcompiler=-ffile-prefix-map={work.resolve()}=/g4build-flashinfer/0"
    apart = path_free_flags({"FLASHINFER_EXTRA_CFLAGS": "-O2"}, tmp_path / "tree", work)
    assert apart["FLASHINFER_EXTRA_CFLAGS"].split() == [
        "-O2", f"-ffile-prefix-map={work.resolve()}=/g4build-flashinfer/0",
        f"-ffile-prefix-map={(tmp_path / 'tree').resolve()}=/g4build-flashinfer/1"]
    assert all(f.startswith("-Xcompiler=-ffile-prefix-map=") for f in apart["FLASHINFER_EXTRA_CUDAFLAGS"].split())
