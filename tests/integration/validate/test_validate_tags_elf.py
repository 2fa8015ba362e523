"""validate's tags check on wheels of real libraries compiled here: it fails closed. A library whose fatbins are
refused is still read for its glibc needs (no "0 ELF" pass for a manylinux_2_17 wheel binding GLIBC_2.29), one
unreadable library among readable ones fails the check, libstdc++'s needs count as glibc's do, and a forged
version need is named; through the CLI each is exit 10 with a one-line reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.support.elflibs import (
    CXX_SRC,
    LIBM_C,
    MACHINE,
    OLD_C,
    SectionTable,
    compile_library,
    needing_version,
    needs_cc,
    needs_cxx,
)
from tests.support.wheelsfactory import build_wheel, run_g4build

from g4build.validate.wheel import ValidateOptions, validate_wheel

pytestmark = needs_cc
# a .nv_fatbin section nvcc never wrote: the fatbin reader refuses the library ("no fatbin container")
JUNK_FATBIN = ('__attribute__((section(".nv_fatbin"), used)) static const char junk[64] = "not a fatbin";\n'
               + LIBM_C)


def _tags(wheel: Path) -> tuple[bool, str]:
    checks = {c.name: c for c in validate_wheel(wheel, ValidateOptions()).checks}
    return checks["tags"].ok, checks["tags"].detail


def test_a_library_the_fatbin_reader_refuses_is_still_read_for_its_glibc(tmp_path: Path) -> None:
    lib = compile_library(tmp_path, "libjunk.so", JUNK_FATBIN, args=("-lm",)).read_bytes()
    wheel = build_wheel(tmp_path / "out", {"vllm/__init__.py": "", "vllm/_C.abi3.so": lib},
                        tag=f"cp38-abi3-manylinux_2_17_{MACHINE}")
    report = validate_wheel(wheel, ValidateOptions())
    checks = {c.name: c for c in report.checks}
    assert not checks["tags"].ok, checks["tags"].detail
    assert "vllm/_C.abi3.so" in checks["tags"].detail and "manylinux_2_31" in checks["tags"].detail
    assert "0 ELF" not in checks["tags"].detail
    done = run_g4build("validate", str(wheel), "--no-cuobjdump", "--json")
    assert done.returncode == 10, done.stderr
    tags = {c["name"]: c for c in json.loads(done.stdout)["wheels"][0]["checks"]}["tags"]
    assert not tags["ok"] and "GLIBC_2.29" in tags["detail"]


def test_one_unreadable_library_among_readable_ones_fails_the_check(tmp_path: Path) -> None:
    good = compile_library(tmp_path, "libold.so", OLD_C).read_bytes()
    bad = bytearray(compile_library(tmp_path, "libm_user.so", LIBM_C, args=("-lm",)).read_bytes())
    table = SectionTable(bad)
    table.put(table.sections()[table.verneed().link], "type", 8)  # its string table declared NOBITS
    files = {"vllm/__init__.py": "", "vllm/_C.abi3.so": good, "vllm/_moe_C.abi3.so": bytes(bad)}
    wheel = build_wheel(tmp_path / "out", files, tag=f"cp38-abi3-manylinux_2_17_{MACHINE}")
    ok, detail = _tags(wheel)
    assert not ok and "vllm/_moe_C.abi3.so" in detail and "NOBITS" in detail
    only_good = build_wheel(tmp_path / "good", {"vllm/__init__.py": "", "vllm/_C.abi3.so": good},
                            tag=f"cp38-abi3-manylinux_2_17_{MACHINE}")
    assert _tags(only_good)[0]


@needs_cxx
def test_libstdcxx_needs_count_as_glibc_needs_do(tmp_path: Path) -> None:
    lib = compile_library(tmp_path, "libcxx.so", CXX_SRC, cxx=True).read_bytes()
    claimed = build_wheel(tmp_path / "a", {"vllm/__init__.py": "", "vllm/_C.abi3.so": lib},
                          tag=f"cp38-abi3-manylinux_2_17_{MACHINE}")
    ok, detail = _tags(claimed)
    assert not ok and "GLIBCXX_3.4." in detail  # manylinux2014's libstdc++ is 3.4.19
    enough = build_wheel(tmp_path / "b", {"vllm/__init__.py": "", "vllm/_C.abi3.so": lib},
                         tag=f"cp38-abi3-manylinux_2_35_{MACHINE}")
    assert _tags(enough)[0]


@pytest.mark.parametrize("tag", [f"cp38-abi3-manylinux_2_17_{MACHINE}", f"cp312-cp312-linux_{MACHINE}",
                                 "cp312-cp312-win_amd64"])
def test_a_forged_version_need_fails_the_check_with_its_name(tmp_path: Path, tag: str) -> None:
    lib = needing_version(tmp_path, "GLIBC_999.99").read_bytes()
    wheel = build_wheel(tmp_path / "out", {"vllm/__init__.py": "", "vllm/_C.abi3.so": lib}, tag=tag)
    ok, detail = _tags(wheel)
    assert not ok and "GLIBC_999.99" in detail and "past any real" in detail


def test_libraries_of_two_machines_in_one_wheel(tmp_path: Path) -> None:
    """A library of another machine (its header says aarch64) among this machine's: no manylinux tag is
    computed for the mix, and a claim of one fails the check naming the foreign library."""
    from g4build.emit.stamp import stamp

    native = compile_library(tmp_path, "libold.so", OLD_C).read_bytes()
    other = bytearray(native)
    other[0x12:0x14] = (183 if MACHINE != "aarch64" else 62).to_bytes(2, "little")
    files = {"vllm/__init__.py": "", "vllm/_C.abi3.so": native, "vllm/_arm_C.abi3.so": bytes(other)}
    claimed = build_wheel(tmp_path / "claimed", files, tag=f"cp38-abi3-manylinux_2_17_{MACHINE}")
    ok, detail = _tags(claimed)
    assert not ok and "vllm/_arm_C.abi3.so" in detail and "another machine" in detail
    out = tmp_path / "out"
    build_wheel(out, files, version="0.21.0+cu130.local", tag=f"cp312-cp312-linux_{MACHINE}")
    assert stamp(out, {"schema": 1, "series": [], "digest": "x"}, version="0.21.0+cu130.local", retag=True) == \
        [f"vllm-0.21.0+cu130.local-cp312-cp312-linux_{MACHINE}.whl"]  # kept: nothing better is justified
