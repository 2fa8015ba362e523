"""The ELF reader (validate.elf, through pyelftools within our limits) on real libraries compiled here, and on
hostile ones made by editing one field of a real library: each is an ElfFormatError (a one-line reason), never a
traceback, a hang or a read out of range. The policy they give (validate.manylinux) is held to every versioned
need: libm's GLIBC_2.29, libstdc++'s GLIBCXX/CXXABI, a forged GLIBC_999.99 refused."""

from __future__ import annotations

import re
import struct
import time
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
    versioned_libfoo,
)

from g4build.validate.elf import MAX_ENTRIES, MAX_NAME, ElfFormatError, read_elf_needs
from g4build.validate.manylinux import ForgedVersion, policy

pytestmark = needs_cc


def _read(path: Path) -> bytes:
    return path.read_bytes()


def test_libc_alone_is_the_floor_and_libm_binds_glibc_2_29(tmp_path: Path) -> None:
    old = read_elf_needs(_read(compile_library(tmp_path, "libold.so", OLD_C)))
    assert old.machine == MACHINE and old.policy().glibc == (2, 17)
    libm = read_elf_needs(_read(compile_library(tmp_path, "libm_user.so", LIBM_C, args=("-lm",))))
    # the need is read from libm's entry, not only libc's first one: GLIBC_2.29, not the GLIBC_2.2.5 base
    assert "GLIBC_2.29" in libm.versions["libm.so.6"]
    assert libm.glibc_needed == (2, 29)
    assert libm.policy().glibc == (2, 31)  # no row between: 2.29 takes the next manylinux g4build tags


@needs_cxx
def test_libstdcxx_needs_raise_the_tag_past_what_glibc_alone_says(tmp_path: Path) -> None:
    lib = read_elf_needs(_read(compile_library(tmp_path, "libcxx.so", CXX_SRC, cxx=True)))
    names = lib.names
    assert any(n.startswith("GLIBCXX_3.4.") for n in lib.versions["libstdc++.so.6"])
    assert any(n.startswith("CXXABI_1.3") for n in lib.versions["libstdc++.so.6"])
    glibc_only = policy({n for n in names if n.startswith("GLIBC_")}, MACHINE).glibc
    full = lib.policy().glibc
    assert glibc_only is not None and full is not None
    # std::string's C++11 ABI binds GLIBCXX_3.4.21, which manylinux2014's libstdc++ (3.4.19) lacks
    assert full > glibc_only and full >= (2, 24)
    assert lib.newest("GLIBCXX_") is not None


def test_a_versioned_so_1_and_its_user(tmp_path: Path) -> None:
    lib, user = versioned_libfoo(tmp_path)
    foo = read_elf_needs(_read(lib))
    bar = read_elf_needs(_read(user))
    assert bar.versions["libfoo.so.1"] == ("FOO_1.0",)
    assert bar.policy().glibc == (2, 17)  # a library's own version node constrains no tag
    assert foo.policy().glibc == (2, 31)  # libfoo.so.1 itself binds libm's GLIBC_2.29


@pytest.mark.parametrize("machine", [(183, "aarch64"), (3, "i686"), (999, "machine-999")])
def test_the_machine_of_a_crafted_header(tmp_path: Path, machine: tuple[int, str]) -> None:
    data = bytearray(_read(compile_library(tmp_path, "libold.so", OLD_C)))
    struct.pack_into("<H", data, 0x12, machine[0])
    assert read_elf_needs(bytes(data)).machine == machine[1]


@pytest.mark.parametrize(("version", "kind"), [
    ("GLIBC_999.99", "forged"), ("GLIBC_2." + "9" * 20, "forged"), ("GLIBC_3.1", "forged"),
    ("GLIBCXX_3.4.1234", "forged"), ("GLIBC_2." + "7" * 5000, "unreadable"),
    ("GLIBC_PRIVATE", "blocked"), ("GLIBCXX_3.4.99", "blocked"), ("GLIBC_2.99", "blocked"),
])
def test_versions_past_any_real_release_are_refused_not_tagged(tmp_path: Path, version: str, kind: str) -> None:
    data = _read(needing_version(tmp_path, version))
    if kind == "unreadable":
        with pytest.raises(ElfFormatError, match=f"at most {MAX_NAME} characters"):
            read_elf_needs(data)
        return
    needs = read_elf_needs(data)
    assert needs.versions["libfake.so"] == (version,)
    if kind == "forged":
        with pytest.raises(ForgedVersion, match="release"):
            needs.policy()
    else:  # real-looking, but no manylinux g4build tags has it: no tag, named
        assert needs.policy().glibc is None and needs.policy().blocker == version


def _hostile(tmp_path: Path, damage: str) -> bytes:
    data = bytearray(_read(compile_library(tmp_path, "libm_user.so", LIBM_C, args=("-lm",))))
    table = SectionTable(data)
    need = table.verneed()
    strtab = table.sections()[need.link]
    if damage == "nobits-strtab":  # a string table that occupies no bytes, claiming 2^64-1 of them
        table.put(strtab, "type", 8)
        table.put(strtab, "size", 2**64 - 1)
    elif damage == "huge-strtab":
        table.put(strtab, "size", 2**64 - 1)
    elif damage == "big-verneed":  # inside the file, but past what any version-needs section holds
        data += bytes(2 << 20)
        table.put(need, "size", 2 << 20)
    elif damage == "nobits-verneed":
        table.put(need, "type", 8)
    elif damage == "link-past-end":  # one past the last section: an off-by-one lets an IndexError out
        table.put(need, "link", table.count)
    elif damage == "link-not-strtab":
        table.put(need, "link", need.index)
    elif damage == "count":
        table.put(need, "info", 10**9)
    elif damage == "loop":  # vn_next 0: the first entry again and again, as often as the count says
        aux = need.offset + struct.unpack_from("<I", data, need.offset + 8)[0]
        struct.pack_into("<H", data, need.offset + 2, 2)  # vn_cnt: two entries, vna_next 0: the same one twice
        struct.pack_into("<I", data, aux + 12, 0)
        struct.pack_into("<I", data, need.offset + 12, 0)
        table.put(need, "info", MAX_ENTRIES)
    elif damage == "string-past-table":  # the table ends inside a name
        vna_name = struct.unpack_from("<I", data, need.offset + struct.unpack_from("<I", data, need.offset + 8)[0]
                                      + 8)[0]
        table.put(strtab, "size", vna_name + 3)
    elif damage == "no-nul":  # names pointed at 200 KiB without a NUL appended to the file
        table.put(strtab, "offset", len(data))
        table.put(strtab, "size", 200 << 10)
        data += b"A" * (200 << 10)
    elif damage == "sections-extended":  # e_shnum 0: the count is section 0's size, here 2^40
        struct.pack_into("<H", data, 0x3C, 0)
        struct.pack_into("<Q", data, table.shoff + 32, 2**40)
    elif damage == "shoff":
        struct.pack_into("<Q", data, 0x28, len(data) + 4096)
    elif damage == "truncate":
        del data[len(data) // 3:]
    return bytes(data)


@pytest.mark.parametrize(("damage", "says"), [
    ("nobits-strtab", "NOBITS"), ("huge-strtab", "claims bytes"), ("nobits-verneed", "DT_VERNEED"),
    ("big-verneed", f"the limit is {1 << 20}"),
    ("link-past-end", "links string table"), ("link-not-strtab", "expected a string table"),
    ("count", "version needs (at most"), ("loop", f"more than {MAX_ENTRIES}"),
    ("string-past-table", "inside its table"), ("no-nul", "runs past"), ("sections-extended", "section table"),
    ("shoff", ""), ("truncate", ""),
])
def test_hostile_elf_is_refused_quickly_with_a_reason(tmp_path: Path, damage: str, says: str) -> None:
    data = _hostile(tmp_path, damage)
    started = time.monotonic()
    with pytest.raises(ElfFormatError, match=re.escape(says) if says else None) as caught:
        read_elf_needs(data)
    assert time.monotonic() - started < 5
    assert "\n" not in str(caught.value) and str(caught.value)


def test_not_elf_and_too_short(tmp_path: Path) -> None:
    for data in (b"", b"\x7fEL", b"MZ" + bytes(100), b"\x7fELF" + bytes(10)):
        with pytest.raises(ElfFormatError):
            read_elf_needs(data)
