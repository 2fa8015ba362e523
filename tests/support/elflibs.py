"""Real ELF shared libraries for the ELF, tag and stamp tests, compiled here with the system's gcc/g++: against
libc alone, libm (``exp``/``log``/``pow``: ``GLIBC_2.29`` on x86_64), libstdc++ (``GLIBCXX_``/``CXXABI_``), a
versioned ``libfoo.so.1``, and consumers of a library whose version script names a forged version (so the need
for ``GLIBC_999.99`` is one the linker wrote, not bytes patched in). The hostile variants edit one field of a
real library in place (``SectionTable`` finds it)."""

from __future__ import annotations

import platform
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

CC = shutil.which("gcc") or shutil.which("cc")
CXX = shutil.which("g++") or shutil.which("c++")
MACHINE = {"x86_64": "x86_64", "aarch64": "aarch64"}.get(platform.machine(), platform.machine())
needs_cc = pytest.mark.skipif(CC is None or platform.system() != "Linux", reason="needs a C compiler on Linux")
needs_cxx = pytest.mark.skipif(CXX is None or platform.system() != "Linux", reason="needs a C++ compiler on Linux")

OLD_C = "#include <string.h>\nint g(const char *s) { return (int)strlen(s); }\n"
LIBM_C = ("#include <math.h>\n"  # exp, log and pow got new versions in glibc 2.29 (x86_64 and aarch64)
          "double f(double x) { return exp(x) + log(x) + pow(x, 2.5); }\n")
CXX_SRC = ("#include <sstream>\n#include <stdexcept>\n#include <string>\n"
           "std::string h(int x) { std::ostringstream o; o << x; if (x < 0) throw std::runtime_error(o.str());"
           " return o.str(); }\n")


def compile_library(folder: Path, name: str, source: str, *, cxx: bool = False, args: tuple[str, ...] = ()) -> Path:
    """``folder/name`` (a shared library) compiled from ``source``; ``args`` go to the linker line."""
    compiler = CXX if cxx else CC
    assert compiler is not None
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / f"{name}.src.{'cpp' if cxx else 'c'}"
    src.write_text(source)
    out = folder / name
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(out), str(src), *args], check=True,
                   capture_output=True, cwd=folder)
    return out


def needing_version(folder: Path, version: str, name: str = "libuse.so") -> Path:
    """A library that binds ``fake_fn@version`` from ``libfake.so``: the linker writes the need itself."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "fake.map").write_text(f"{version} {{ global: fake_fn; local: *; }};\n")
    compile_library(folder, "libfake.so", "int fake_fn(void) { return 1; }\n", args=("-Wl,--version-script=fake.map",))
    return compile_library(folder, name, "int fake_fn(void);\nint use(void) { return fake_fn(); }\n",
                           args=("-L.", "-lfake"))


def versioned_libfoo(folder: Path) -> tuple[Path, Path]:
    """``libfoo.so.1`` (soname and version node FOO_1.0, itself needing libm's GLIBC_2.29) and a library using it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "foo.map").write_text("FOO_1.0 { global: foo; local: *; };\n")
    lib = compile_library(folder, "libfoo.so.1", "#include <math.h>\ndouble foo(double x) { return exp(x); }\n",
                          args=("-Wl,-soname,libfoo.so.1", "-Wl,--version-script=foo.map", "-lm"))
    (folder / "libfoo.so").unlink(missing_ok=True)
    (folder / "libfoo.so").symlink_to("libfoo.so.1")
    user = compile_library(folder, "libbar.so", "double foo(double);\ndouble bar(double x) { return foo(x); }\n",
                           args=("-L.", "-lfoo"))
    return lib, user


@dataclass
class Section:
    index: int
    at: int  # where its header is in the file
    type: int
    offset: int
    size: int
    link: int
    info: int


class SectionTable:
    """The section headers of a little-endian ELF64 library, to edit one field of a real file (test material
    only: the code under test reads ELF through pyelftools)."""

    def __init__(self, data: bytearray) -> None:
        self.data = data
        self.shoff = struct.unpack_from("<Q", data, 0x28)[0]
        self.entsize, self.count = struct.unpack_from("<HH", data, 0x3A)

    def sections(self) -> list[Section]:
        out = []
        for i in range(self.count):
            at = self.shoff + i * self.entsize
            _, kind, _, _, off, size, link, info = struct.unpack_from("<IIQQQQII", self.data, at)
            out.append(Section(i, at, kind, off, size, link, info))
        return out

    def verneed(self) -> Section:
        return next(s for s in self.sections() if s.type == 0x6FFFFFFE)

    def put(self, section: Section, field: str, value: int) -> None:
        fmt, where = {"type": ("<I", 4), "offset": ("<Q", 24), "size": ("<Q", 32), "link": ("<I", 40),
                      "info": ("<I", 44)}[field]
        struct.pack_into(fmt, self.data, section.at + where, value)
