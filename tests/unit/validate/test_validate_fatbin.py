"""The fatbin reader on containers laid out as nvcc writes them, inside ELF and PE files built here."""

from __future__ import annotations

import pytest
from tests.support.wheelsfactory import container, elf, entry, pe

from g4build.validate.fatbin import (
    FLAG_ARCH_SPECIFIC,
    FLAG_FAMILY,
    FLAG_ZSTD,
    Arch,
    FatbinFormatError,
    is_native,
    library_archs,
    parse_containers,
)

SASS120 = entry(2, 120, b"\x7fELF-cubin")
SASS90A = entry(2, 90, b"cubin", flags=0x11 | FLAG_ARCH_SPECIFIC)
SASS120F_ZSTD = entry(2, 120, b"zstd-bytes", flags=0x11 | FLAG_FAMILY | FLAG_ZSTD, header=112)
PTX80 = entry(1, 80, b"ptx", flags=0x11 | FLAG_ZSTD, header=80)


def test_entries_kinds_archs_suffixes_and_compression() -> None:
    found = parse_containers(container(SASS120, SASS90A, SASS120F_ZSTD, PTX80))
    (fatbin,) = found
    assert [(e.kind, e.name, e.compression) for e in fatbin.entries] == [
        ("sass", "sm_120", None), ("sass", "sm_90a", None), ("sass", "sm_120f", "zstd"), ("ptx", "compute_80", "zstd"),
    ]


def test_elf_section_with_padding_between_containers() -> None:
    blob = container(SASS120) + b"\0" * 8 + container(PTX80)
    lib = library_archs(elf({".text": b"\x90" * 40, ".nv_fatbin": blob}), "lib.so")
    assert len(lib.fatbins) == 2
    assert lib.names("sass") == ["sm_120"] and lib.names("ptx") == ["compute_80"]


def test_pe_section_is_read() -> None:
    lib = library_archs(pe({b".text\0\0\0": b"\xc3" * 16, b".nv_fatb": container(SASS90A, PTX80)}), "x.pyd")
    assert lib.names("sass") == ["sm_90a"] and lib.names("ptx") == ["compute_80"]


def test_library_without_cuda_code_has_no_fatbins() -> None:
    assert library_archs(elf({".text": b"\x90" * 8}), "plain.so").fatbins == ()


def test_truncated_container_is_an_error() -> None:
    blob = container(SASS120)[:-4]
    with pytest.raises(FatbinFormatError, match="claims"):
        library_archs(elf({".nv_fatbin": blob}), "bad.so")


def test_verdicts_for_sm120() -> None:
    target = Arch.parse("sm120")
    native = library_archs(elf({".nv_fatbin": container(SASS120) + container(SASS90A)}), "a.so")
    assert native.verdict(target).verdict == "sass"
    assert "1 of 2 fatbins" in native.verdict(target).detail
    fa2_like = library_archs(elf({".nv_fatbin": container(entry(2, 80, b"c"), PTX80)}), "fa2.so")
    v = fa2_like.verdict(target)
    assert (v.verdict, v.ok) == ("ptx-only", False) and "JIT" in v.detail and "sm_80" in v.detail
    hopper = library_archs(elf({".nv_fatbin": container(SASS90A)}), "fa3.so")
    assert hopper.verdict(target).verdict == "none"


@pytest.mark.parametrize(
    ("sass", "target", "runs"),
    [("sm_120", "sm_121", True), ("sm_120a", "sm_121", False), ("sm_120f", "sm_121", True),
     ("sm_86", "sm_89", True), ("sm_89", "sm_86", False), ("sm_90", "sm_120", False)],
)
def test_sass_compatibility(sass: str, target: str, runs: bool) -> None:
    a = Arch.parse(sass)
    flags = 0x11 | (FLAG_ARCH_SPECIFIC if a.suffix == "a" else FLAG_FAMILY if a.suffix == "f" else 0)
    lib = library_archs(elf({".nv_fatbin": container(entry(2, a.number, b"c", flags=flags))}), "x.so")
    assert lib.entries[0].runs_on(Arch.parse(target)) is runs


@pytest.mark.parametrize(
    ("ptx", "target", "jits"),
    [("compute_100f", "sm_103", True), ("compute_100f", "sm_120", False), ("compute_120f", "sm_100", False),
     ("compute_120a", "sm_120", True), ("compute_120a", "sm_121", False), ("compute_90", "sm_120", True),
     ("compute_120", "sm_90", False)],
)
def test_ptx_jit_compatibility(ptx: str, target: str, jits: bool) -> None:
    """Plain PTX JIT-compiles for any newer arch; family (f) PTX only within its major, arch-specific (a) PTX
    only for its own arch."""
    a = Arch.parse(ptx.replace("compute_", ""))
    flags = 0x11 | (FLAG_ARCH_SPECIFIC if a.suffix == "a" else FLAG_FAMILY if a.suffix == "f" else 0)
    lib = library_archs(elf({".nv_fatbin": container(entry(1, a.number, b"ptx", flags=flags))}), "x.so")
    assert lib.entries[0].name == ptx
    assert lib.entries[0].jits_for(Arch.parse(target)) is jits
    assert lib.verdict(Arch.parse(target)).verdict == ("ptx-only" if jits else "none")


def test_arch_parsing() -> None:
    assert Arch.parse("sm120") == Arch.parse("sm_120") == Arch.parse("12.0") == Arch.parse("120")
    assert Arch.parse("sm_90a").sm() == "sm_90a"
    with pytest.raises(ValueError, match="not a GPU arch"):
        Arch.parse("hopper")


def test_native_names() -> None:
    assert is_native("vllm/_C.abi3.so") and is_native("x/y.PYD") and is_native("lib/libcudart.so.13")
    assert not is_native("vllm/sol.py") and not is_native("vllm/so/x.py")
