"""A Linux wheel's tags from its libraries: the ELF version needs of real shared libraries (built here with the C
compiler), hostile ELF data refused without reading out of range, the tag the build's manifest step gives a wheel
(validate.tags.expected_tag, emit.stamp), and validate's check of a wheel's claimed tags."""

from __future__ import annotations

import platform
import shutil
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest
from tests.support.wheelsfactory import build_wheel

from g4build.emit.stamp import stamp
from g4build.validate.elf import ElfFormatError, ElfNeeds, read_elf_needs
from g4build.validate.tags import check_tags, expected_tag, facts_from, read_tag_facts
from g4build.validate.wheel import ValidateOptions, validate_wheel

CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None or platform.system() != "Linux", reason="needs a C compiler on Linux")
MACHINE = {"x86_64": "x86_64", "aarch64": "aarch64"}.get(platform.machine(), platform.machine())


def _library(tmp_path: Path, name: str, body: str) -> bytes:
    src = tmp_path / f"{name}.c"
    src.write_text(body)
    out = tmp_path / f"{name}.so"
    assert CC is not None
    subprocess.run([CC, "-shared", "-fPIC", "-O1", "-o", str(out), str(src)], check=True, capture_output=True)
    return out.read_bytes()


# getrandom is versioned GLIBC_2.25 on every architecture; strlen is in the oldest version set
NEW = "#include <sys/random.h>\nint f(void *b) { return (int)getrandom(b, 4, 0); }\n"
OLD = "#include <string.h>\nint g(const char *s) { return (int)strlen(s); }\n"


@needs_cc
def test_the_version_needs_of_a_real_library(tmp_path: Path) -> None:
    needs = read_elf_needs(_library(tmp_path, "new", NEW))
    assert needs.machine == MACHINE
    assert "GLIBC_2.25" in needs.versions["libc.so.6"]
    assert needs.glibc_needed is not None and needs.glibc_needed >= (2, 25)
    old = read_elf_needs(_library(tmp_path, "old", OLD))
    assert old.glibc_needed is not None and old.glibc_needed < (2, 25)


@needs_cc
@pytest.mark.parametrize("damage", ["truncate", "shoff", "count", "string"])
def test_hostile_elf_data_is_refused_not_read_out_of_range(tmp_path: Path, damage: str) -> None:
    data = bytearray(_library(tmp_path, "lib", NEW))
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    verneed = next(i for i in range(shnum)
                   if struct.unpack_from("<I", data, shoff + i * shentsize + 4)[0] == 0x6FFFFFFE)
    at = shoff + verneed * shentsize
    if damage == "truncate":
        data = data[: len(data) // 3]
    elif damage == "shoff":
        struct.pack_into("<Q", data, 0x28, len(data) + 4096)
    elif damage == "count":  # sh_info: the number of version-need entries
        struct.pack_into("<I", data, at + 44, 10**9)
    else:  # the first entry's file name offset, far past its string table
        vn_off = struct.unpack_from("<Q", data, at + 24)[0]
        struct.pack_into("<I", data, vn_off + 4, 2**31)
    with pytest.raises(ElfFormatError):
        read_elf_needs(bytes(data))


def _needs(glibc: str, machine: str = "x86_64") -> ElfNeeds:
    return ElfNeeds(machine=machine, versions={"libc.so.6": ("GLIBC_2.2.5", f"GLIBC_{glibc}")})


def test_expected_tag_abi3_for_the_lowest_python_and_manylinux_from_the_newest_glibc() -> None:
    facts = facts_from({"vllm/_C.abi3.so": _needs("2.34"), "vllm/libx.so": _needs("2.17")}, {},
                       ["vllm/_C.abi3.so", "vllm/libx.so", "vllm/__init__.py"])
    tag, why = expected_tag("cp312-cp312-linux_x86_64", facts, ">=3.10,<3.15")
    assert tag == "cp310-abi3-manylinux_2_34_x86_64"
    assert any("GLIBC_2.34" in w and "vllm/_C.abi3.so" in w for w in why)
    # below the manylinux2014 floor the floor is claimed; one extension outside the stable ABI keeps cpXY-cpXY
    low = facts_from({"vllm/_C.abi3.so": _needs("2.14")}, {}, ["vllm/_C.abi3.so"])
    assert expected_tag("cp312-cp312-linux_x86_64", low, ">=3.10")[0] == "cp310-abi3-manylinux_2_17_x86_64"
    mixed = facts_from({"vllm/_C.abi3.so": _needs("2.28"), "vllm/_D.cpython-312-x86_64-linux-gnu.so": _needs("2.17")},
                       {}, ["vllm/_C.abi3.so", "vllm/_D.cpython-312-x86_64-linux-gnu.so"])
    assert expected_tag("cp312-cp312-linux_x86_64", mixed, ">=3.10")[0] == "cp312-cp312-manylinux_2_28_x86_64"


def test_expected_tag_keeps_what_it_cannot_justify() -> None:
    facts = facts_from({"vllm/_C.abi3.so": _needs("2.28")}, {}, ["vllm/_C.abi3.so"])
    assert expected_tag("cp312-cp312-win_amd64", facts, ">=3.10")[0] == "cp312-cp312-win_amd64"
    assert expected_tag("cp312-cp312-linux_x86_64", facts_from({}, {}, []), ">=3.10")[0] == \
        "cp312-cp312-linux_x86_64"  # no library: nothing to say
    foreign = facts_from({"vllm/_C.abi3.so": _needs("2.28", "aarch64")}, {}, ["vllm/_C.abi3.so"])
    assert expected_tag("cp312-cp312-linux_x86_64", foreign, ">=3.10")[0] == "cp312-cp312-linux_x86_64"
    broken = facts_from({}, {"vllm/_C.abi3.so": "not an ELF file"}, ["vllm/_C.abi3.so"])
    assert expected_tag("cp312-cp312-linux_x86_64", broken, ">=3.10")[0] == "cp312-cp312-linux_x86_64"


@pytest.mark.parametrize(("tag", "ok"), [
    ("cp310-abi3-manylinux_2_28_x86_64", True),
    ("cp310-abi3-manylinux_2_34_x86_64", True),
    ("cp310-abi3-manylinux_2_27_x86_64", False),  # promises less than _C needs
    ("cp310-abi3-manylinux2014_x86_64", False),  # = 2.17
    ("cp310-abi3-manylinux_2_28_aarch64", False),  # another machine
    ("cp312-cp312-linux_x86_64", True),  # promises nothing
    ("cp312-cp312-win_amd64", True),
])
def test_check_tags_holds_the_claim_to_the_libraries(tag: str, ok: bool) -> None:
    facts = facts_from({"vllm/_C.abi3.so": _needs("2.28"), "vllm/_D.cpython-312-x86_64-linux-gnu.so": _needs("2.17")},
                       {}, ["vllm/_C.abi3.so", "vllm/_D.cpython-312-x86_64-linux-gnu.so"])
    check = check_tags((tag,), facts)
    assert check.ok is ok, check.detail
    if ok and "abi3" in tag:  # upstream ships one-Python modules in abi3 wheels: named, not refused
        assert "_D.cpython-312" in check.detail


@needs_cc
def test_stamp_retags_the_wheel_and_validate_agrees(tmp_path: Path) -> None:
    lib = _library(tmp_path, "c", NEW)
    glibc = read_elf_needs(lib).policy().glibc
    assert glibc is not None
    out = tmp_path / "out"
    wheel = build_wheel(out, {"vllm/__init__.py": "", "vllm/_C.abi3.so": lib}, version="0.21.0+cu130.local",
                        tag="cp312-cp312-linux_x86_64")
    with zipfile.ZipFile(wheel) as zf:  # the factory writes no Requires-Python; pip's METADATA has one
        meta = zf.read("vllm-0.21.0+cu130.local.dist-info/METADATA").decode()
    assert "Requires-Python" not in meta
    older = build_wheel(tmp_path / "older", {"vllm/__init__.py": "", "vllm/_C.abi3.so": lib},
                        version="0.21.0+cu130.local", tag="cp312-cp312-linux_x86_64")
    names = stamp(out, {"schema": 1, "series": [], "digest": "x"}, version="0.21.0+cu130.local", retag=True)
    want = f"vllm-0.21.0+cu130.local-cp312-cp312-manylinux_2_{glibc[1]}_{MACHINE}.whl"
    assert names == [want] and not wheel.exists() and (out / want).is_file()  # no Requires-Python: cpXY kept
    with zipfile.ZipFile(out / want) as zf:
        assert f"Tag: {want[:-4].split('-', 2)[2]}" in zf.read("vllm-0.21.0+cu130.local.dist-info/WHEEL").decode()
    report = validate_wheel(out / want, ValidateOptions())
    checks = {c.name: c for c in report.checks}
    assert checks["record"].ok and checks["tags"].ok, checks
    # an older copy of the same version and tag in the folder is replaced by the newer one, not kept beside it
    shutil.copy(older, out / want)
    (out / want).touch()
    rebuilt = build_wheel(tmp_path / "again", {"vllm/__init__.py": "# newer\n", "vllm/_C.abi3.so": lib},
                          version="0.21.0+cu130.local", tag="cp312-cp312-linux_x86_64")
    shutil.copy(rebuilt, out / rebuilt.name)
    assert stamp(out, {"schema": 1, "series": [], "digest": "x"}, version="0.21.0+cu130.local", retag=True) == [want]
    assert sorted(p.name for p in out.glob("*.whl")) == [want]
    with zipfile.ZipFile(out / want) as zf:
        assert zf.read("vllm/__init__.py") == b"# newer\n"
    assert read_tag_facts(out / want).needed(MACHINE).glibc == glibc


def test_an_interrupted_stamp_leaves_the_wheel_as_it_was_and_no_copy(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = build_wheel(tmp_path, {"vllm/__init__.py": "", "vllm/big.py": "X = 1\n" * 1000},
                        version="0.21.0+cu130.local", tag="cp312-cp312-linux_x86_64")
    before = wheel.read_bytes()

    def interrupted(*_: object, **__: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("g4build.emit.stamp.shutil.copyfileobj", interrupted)
    with pytest.raises(KeyboardInterrupt):
        stamp(tmp_path, {"schema": 1, "series": [], "digest": "x"}, version="0.21.0+cu130.local", retag=True)
    # no copy, no manifest naming a new wheel (the stamp's lock file stays, as every lock of g4build's does)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".g4build-manifest.lock", wheel.name]
    assert wheel.read_bytes() == before


@needs_cc
def test_a_versioned_so_1_in_the_wheel_counts_for_the_tag(tmp_path: Path) -> None:
    from tests.support.elflibs import versioned_libfoo

    lib, user = versioned_libfoo(tmp_path / "libs")
    wheel = build_wheel(tmp_path / "out", {"vllm/__init__.py": "", "vllm/_C.abi3.so": user.read_bytes(),
                                           "vllm/libs/libfoo.so.1": lib.read_bytes()},
                        version="0.21.0+cu130.local", tag="cp312-cp312-linux_x86_64")
    facts = read_tag_facts(wheel)
    assert set(facts.libraries) == {"vllm/_C.abi3.so", "vllm/libs/libfoo.so.1"}
    assert facts.needed(MACHINE).glibc == (2, 31) and facts.needed(MACHINE).newest == "vllm/libs/libfoo.so.1"
