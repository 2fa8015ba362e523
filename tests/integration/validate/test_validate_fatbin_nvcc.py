"""Real device code from this machine's nvcc, read by the fatbin reader and compared with cuobjdump."""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from tests.support.wheelsfactory import PRISTINE, build_wheel, container, elf, entry

from g4build.validate import cudatools
from g4build.validate.fatbin import Arch, elf_sections, library_archs, parse_containers
from g4build.validate.wheel import ValidateOptions, validate_wheel

pytestmark = pytest.mark.nvcc

KERNEL = """
__global__ void axpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
extern "C" void run(float a, const float* x, float* y, int n) { axpy<<<(n + 255) / 256, 256>>>(a, x, y, n); }
"""


def _nvcc() -> str:
    found = shutil.which("nvcc")
    if not found:
        pytest.skip("nvcc is not on PATH")
    return found


def _compile(tmp_path: Path, name: str, *gencode: str, shared: bool = True) -> Path:
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    out = tmp_path / name
    flags = ["-shared", "-Xcompiler", "-fPIC"] if shared else ["-fatbin"]
    subprocess.run([_nvcc(), *flags, *gencode, "-o", str(out), str(src)], check=True, capture_output=True)
    return out


SM120_AND_PTX90 = ("-gencode", "arch=compute_120,code=sm_120", "-gencode", "arch=compute_90,code=compute_90")


def test_reader_matches_cuobjdump_on_a_real_sm120_library(tmp_path: Path) -> None:
    lib = _compile(tmp_path, "libk.so", *SM120_AND_PTX90, "-gencode", "arch=compute_90a,code=sm_90a")
    archs = library_archs(lib.read_bytes(), lib.name)
    assert archs.names("sass") == ["sm_90a", "sm_120"] and archs.names("ptx") == ["compute_90"]
    assert archs.verdict(Arch.parse("sm120")).ok
    tool = cudatools.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (PATH, CUDA_HOME, or the nvidia-cuda-cuobjdump package)")
    listed = cudatools.list_archs(tool, lib)
    assert listed == cudatools.counts(archs)
    assert Counter({"sass sm_120": 1, "sass sm_90a": 1, "ptx sm_90": 1}) <= Counter(listed)


def test_fatbin_inside_a_pe_image(tmp_path: Path) -> None:
    """nvcc's own fatbin file, placed in the `.nv_fatb` section of a PE image as MSVC links it."""
    blob = _compile(tmp_path, "k.fatbin", *SM120_AND_PTX90, shared=False).read_bytes()
    dos = b"MZ" + b"\0" * 58 + struct.pack("<I", 0x40)
    coff = b"PE\0\0" + struct.pack("<HHIIIHH", 0x8664, 1, 0, 0, 0, 0, 0x2022)
    section = struct.pack("<8sIIIIIIHHI", b".nv_fatb", len(blob), 0x1000, len(blob), 0x40 + 24 + 40, 0, 0, 0, 0, 0)
    archs = library_archs(dos + coff + section + blob, "k.pyd")
    assert archs.names("sass") == ["sm_120"] and archs.names("ptx") == ["compute_90"]


def test_validate_arch_on_a_wheel_with_real_libraries(tmp_path: Path, project: Path) -> None:
    native = _compile(tmp_path, "native.so", *SM120_AND_PTX90).read_bytes()
    ptx_only = _compile(tmp_path, "ptx.so", "-gencode", "arch=compute_80,code=sm_80",
                        "-gencode", "arch=compute_80,code=compute_80").read_bytes()
    wheel = build_wheel(tmp_path / "w", {**PRISTINE, "vllm/_C.abi3.so": native, "vllm/fa/_fa2_C.abi3.so": ptx_only})
    report = validate_wheel(wheel, ValidateOptions(archs=(Arch.parse("sm120"),), cuobjdump=cudatools.find_cuobjdump()))
    checks = {c.name: c for c in report.checks}
    assert checks["arch sm_120 vllm/_C.abi3.so"].ok
    fa2 = checks["arch sm_120 vllm/fa/_fa2_C.abi3.so"]
    assert not fa2.ok and "PTX-only for sm_120" in fa2.detail and "JIT" in fa2.detail
    assert not report.ok
    if cudatools.find_cuobjdump():
        assert checks["cuobjdump vllm/_C.abi3.so"].ok and checks["cuobjdump vllm/fa/_fa2_C.abi3.so"].ok
    libs = {r.file: r for r in report.archs}
    assert libs["vllm/fa/_fa2_C.abi3.so"].verdicts == {"sm_120": "ptx-only"}


def test_a_library_cuobjdump_cannot_read_fails_with_cuobjdumps_own_message(tmp_path: Path, project: Path) -> None:
    # A container the reader parses but with no real cubin inside: cuobjdump exits non-zero on it, and the
    # check must say so rather than report that cuobjdump "lists nothing".
    tool = cudatools.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (PATH, CUDA_HOME, or the nvidia-cuda-cuobjdump package)")
    fake = elf({".nv_fatbin": container(entry(2, 120, b"\0" * 32))})
    wheel = build_wheel(tmp_path / "w", {**PRISTINE, "vllm/_C.abi3.so": fake})
    report = validate_wheel(wheel, ValidateOptions(archs=(Arch.parse("sm120"),), cuobjdump=tool))
    check = {c.name: c for c in report.checks}["cuobjdump vllm/_C.abi3.so"]
    assert not check.ok
    assert check.detail.startswith("cuobjdump --list-elf exited ") and "the reader found 1x sass sm_120" in check.detail


def _rdc(tmp_path: Path, name: str, *gencode: str, shared: bool = True) -> Path:
    """Relocatable device code: a device-linked shared library, or (``shared=False``) a relocatable object."""
    src = tmp_path / "k.cu"
    src.write_text(KERNEL)
    out = tmp_path / name
    flags = ["-shared"] if shared else ["-c"]
    subprocess.run([_nvcc(), "-rdc=true", *flags, "-Xcompiler", "-fPIC", *gencode, "-o", str(out), str(src)],
                   check=True, capture_output=True)
    return out


def test_rdc_library_archs_come_from_its_linked_image_as_cuobjdump_lists_them(tmp_path: Path) -> None:
    lib = _rdc(tmp_path, "librdc.so", *SM120_AND_PTX90)
    data = lib.read_bytes()
    assert elf_sections(data, ("__nv_relfatbin",), lib.name)  # nvcc kept the relocatable copy beside
    archs = library_archs(data, lib.name)
    # the relocatable copy's compute_90 PTX is never JIT-compiled at load: only the linked sm_120 SASS counts
    assert archs.names("sass") == ["sm_120"] and archs.names("ptx") == [] and len(archs.fatbins) == 1
    tool = cudatools.find_cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (PATH, CUDA_HOME, or the nvidia-cuda-cuobjdump package)")
    assert cudatools.list_archs(tool, lib) == cudatools.counts(archs)


def test_rdc_library_of_ptx_only_has_no_code_for_sm120(tmp_path: Path, project: Path) -> None:
    # its __nv_relfatbin carries the device runtime's SASS for sm_75..sm_121: read as the library's own, a
    # library that cannot run anywhere would pass as native on sm_120
    lib = _rdc(tmp_path, "libptx.so", "-gencode", "arch=compute_90,code=compute_90")
    relocatable = [e.arch.sm() for span in elf_sections(lib.read_bytes(), ("__nv_relfatbin",), lib.name)
                   for f in parse_containers(lib.read_bytes(), span, lib.name) for e in f.entries]
    assert "sm_120" in relocatable
    archs = library_archs(lib.read_bytes(), lib.name)
    assert archs.verdict(Arch.parse("sm120")).verdict == "none"
    wheel = build_wheel(tmp_path / "w", {**PRISTINE, "vllm/_rdc_C.abi3.so": lib.read_bytes()})
    report = validate_wheel(wheel, ValidateOptions(archs=(Arch.parse("sm120"),), cuobjdump=cudatools.find_cuobjdump()))
    failed = {c.name: c.detail for c in report.failures()}
    assert "no code for sm_120" in failed["arch sm_120 vllm/_rdc_C.abi3.so"], failed
    assert "cuobjdump vllm/_rdc_C.abi3.so" not in failed  # the reader and cuobjdump agree


def test_relocatable_object_archs_are_read_from_nv_relfatbin(tmp_path: Path) -> None:
    obj = _rdc(tmp_path, "k.o", *SM120_AND_PTX90, shared=False)
    data = obj.read_bytes()
    assert not elf_sections(data, (".nv_fatbin",), obj.name)
    archs = library_archs(data, obj.name)
    assert archs.names("sass") == ["sm_120"] and archs.names("ptx") == ["compute_90"]
