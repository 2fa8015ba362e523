"""A Linux wheel's tags, from what its libraries are: abi3 when every extension module is built for the stable
ABI, ``manylinux_2_X`` from the newest glibc symbol version any library binds to (as auditwheel reads it).

``pip wheel`` of vLLM's setup.py names the wheel after the interpreter that built it
(``cp312-cp312-linux_x86_64``), although every extension is abi3 and ``linux_*`` is a tag no public index takes;
upstream's wheels are ``cp38-abi3-manylinux_2_x``. :func:`expected_tag` says what the libraries justify (the
build's ``manifest`` step retags with it), :func:`check_tags` holds a wheel's claimed tags to the same facts
(validate). Neither vendors a library: torch and CUDA's libraries stay outside, as upstream's wheels have them.
"""

from __future__ import annotations

import mmap
import re
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from g4build.validate.check import Check
from g4build.validate.elf import ElfFormatError, ElfNeeds, read_elf_needs
from g4build.validate.fatbin import is_native
from g4build.validate.manylinux import CONSTRAINED, ForgedVersion
from g4build.wheelfile.safety import check_limits, stream_member

MANYLINUX_FLOOR = (2, 17)  # manylinux2014: what pip and every current distribution take
LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_PLATFORM = re.compile(r"(?:manylinux_([0-9]{1,9})_([0-9]{1,9})|(manylinux1|manylinux2010|manylinux2014)|linux)_(\w+)",
                       re.ASCII)
_CPYTHON_EXT = re.compile(r"\.cpython-([0-9]+)[a-z]*-[\w-]+\.so$", re.ASCII)
_MIN_PYTHON = re.compile(r">=\s*([0-9]+)\.([0-9]+)", re.ASCII)


@dataclass(frozen=True, kw_only=True)
class Needed:
    """What a wheel's libraries allow on one arch: the oldest manylinux glibc (None: none), the library that
    decides it, and what keeps any manylinux tag out (a need no row admits) or refuses the wheel (forged)."""

    glibc: tuple[int, int] | None
    newest: str | None = None  # the library with the newest need
    blocked: tuple[str, ...] = ()  # "<member>: GLIBC_PRIVATE" ...
    forged: tuple[str, ...] = ()  # "<member>: GLIBC_999.99: past any real glibc release"


@dataclass(frozen=True, kw_only=True)
class TagFacts:
    """What a wheel's native members say about its tags."""

    libraries: dict[str, ElfNeeds]  # member -> needs (ELF libraries only)
    unreadable: dict[str, str]  # member -> why its ELF could not be read
    extensions: dict[str, str]  # Python extension member -> "abi3" / "cpXY"

    def needed(self, arch: str) -> Needed:
        """Every library's versioned needs (GLIBC, GLIBCXX, CXXABI, GCC) held to the manylinux table for
        ``arch``: the tag is the newest any library needs."""
        glibc: tuple[int, int] | None = None
        newest, blocked, forged = None, [], []
        for member, needs in sorted(self.libraries.items()):
            try:
                p = needs.policy(arch)
            except ForgedVersion as exc:
                forged.append(f"{member}: {exc}")
                continue
            if p.glibc is None:
                blocked.append(f"{member}: {p.blocker}")
            elif glibc is None or p.glibc > glibc:
                glibc, newest = p.glibc, member
        return Needed(glibc=glibc, newest=newest, blocked=tuple(blocked), forged=tuple(forged))

    def forged(self) -> list[str]:
        """The libraries that bind a version no real release has (on any machine, whatever the wheel's tag)."""
        found = []
        for member, needs in sorted(self.libraries.items()):
            try:
                needs.policy()
            except ForgedVersion as exc:
                found.append(f"{member}: {exc}")
        return found

    def refusals(self) -> list[str]:
        """Why no tag may be computed at all: a library that cannot be read, a version no release has."""
        return [*(f"{n}: its ELF cannot be read ({e})" for n, e in sorted(self.unreadable.items())), *self.forged()]

    @property
    def machines(self) -> set[str]:
        return {n.machine for n in self.libraries.values()}


def extension_kind(name: str) -> str | None:
    """``abi3`` / ``cpXY`` for a Python extension module's file name, None for anything else."""
    base = name.rsplit("/", 1)[-1]
    if base.endswith(".abi3.so"):
        return "abi3"
    m = _CPYTHON_EXT.search(base)
    return f"cp{m[1]}" if m else None


def facts_from(needs: Mapping[str, ElfNeeds], unreadable: Mapping[str, str], names: list[str]) -> TagFacts:
    return TagFacts(libraries=dict(needs), unreadable=dict(unreadable),
                    extensions={n: k for n in names if (k := extension_kind(n)) is not None})


def read_tag_facts(wheel: Path) -> TagFacts:
    """Read every ELF member of ``wheel`` (one at a time, spooled to a scratch file and mapped), after the
    sizes validate allows (wheelfile.safety.check_limits): a zip bomb is refused before anything is inflated."""
    needs: dict[str, ElfNeeds] = {}
    unreadable: dict[str, str] = {}
    # the scratch copy beside the wheel: the stamp writes nothing outside the folder it is given
    with zipfile.ZipFile(wheel) as zf, tempfile.TemporaryDirectory(prefix=".g4build-tags-", dir=wheel.parent) as tmp:
        check_limits(zf.infolist(), wheel.name)
        names = [i.filename for i in zf.infolist() if not i.is_dir()]
        for info in zf.infolist():
            if info.is_dir() or not is_native(info.filename) or info.filename.lower().endswith((".pyd", ".dll")):
                continue
            spool = Path(tmp) / "member"
            with spool.open("w+b") as dst:
                stream_member(zf, info, dst)
                dst.flush()
                if dst.tell() < 4:
                    continue
                with mmap.mmap(dst.fileno(), 0, access=mmap.ACCESS_READ) as data:
                    if data[:4] != b"\x7fELF":
                        continue
                    try:
                        needs[info.filename] = read_elf_needs(data)
                    except ElfFormatError as exc:
                        unreadable[info.filename] = str(exc)
    return facts_from(needs, unreadable, names)


def min_python(requires_python: str | None) -> str | None:
    """``cp310`` for ``>=3.10`` (the lowest Python a Requires-Python admits), None when it names no floor."""
    m = _MIN_PYTHON.search(requires_python or "")
    return f"cp{m[1]}{m[2]}" if m else None


def expected_tag(current: str, facts: TagFacts, requires_python: str | None) -> tuple[str, list[str]]:
    """The tag a Linux wheel's libraries justify, and why; ``current`` (``cp312-cp312-linux_x86_64``) is kept
    wherever they justify nothing better (a Windows wheel, an extension outside the stable ABI, an unreadable
    library, libraries of another machine than the tag's)."""
    interp, abi, plat = current.split("-")
    m = _PLATFORM.fullmatch(plat)
    if m is None:
        return current, [f"platform {plat}: not a Linux tag, kept"]
    arch = m[4]
    why: list[str] = []
    if facts.unreadable:
        return current, [f"kept: {n} is not a readable ELF library ({e})" for n, e in facts.unreadable.items()]
    if not facts.libraries:
        return current, ["kept: no ELF library in the wheel to justify another tag"]
    if facts.machines - {arch}:
        return current, [f"kept: libraries for {', '.join(sorted(facts.machines))} in a {arch} wheel"]
    kinds = set(facts.extensions.values())
    floor = min_python(requires_python)
    if kinds == {"abi3"} and floor:
        interp, abi = floor, "abi3"
        why.append(f"abi3: all {len(facts.extensions)} extension modules are built for the stable ABI; "
                   f"{floor} is the lowest Python the wheel admits (Requires-Python {requires_python})")
    elif kinds - {"abi3"}:
        why.append(f"{interp}-{abi} kept: {', '.join(n for n, k in facts.extensions.items() if k != 'abi3')} "
                   "not built for the stable ABI")
    needed = facts.needed(arch)
    if needed.forged or needed.blocked or needed.glibc is None:
        return current, [f"kept: {w} (no manylinux tag admits it)" for w in (*needed.forged, *needed.blocked)] or \
            [f"kept: no manylinux table for {arch}"]
    glibc = needed.glibc
    plat = f"manylinux_{glibc[0]}_{glibc[1]}_{arch}"
    if glibc > MANYLINUX_FLOOR and needed.newest is not None:
        lib = facts.libraries[needed.newest]
        why.append(f"{plat}: the oldest manylinux whose glibc, libstdc++ and libgcc have every versioned need of "
                   f"{needed.newest} ({_constrained(lib)}); torch and CUDA libraries are not vendored (as "
                   "upstream's wheels)")
    else:
        why.append(f"{plat}: no library needs a glibc, libstdc++ or libgcc newer than the manylinux2014 floor")
    return f"{interp}-{abi}-{plat}", why


def claimed_glibc(plat: str) -> tuple[tuple[int, int] | None, str | None]:
    """(glibc a platform tag promises to need at most, its arch); (None, None) for a tag that is not Linux."""
    m = _PLATFORM.fullmatch(plat)
    if m is None:
        return None, None
    if m[1]:
        return (int(m[1]), int(m[2])), m[4]
    if m[3]:
        return LEGACY[m[3]], m[4]
    return None, m[4]  # linux_<arch>: promises nothing


def check_tags(tags: tuple[str, ...], facts: TagFacts) -> Check:
    """A wheel's tags against its libraries: a manylinux tag must not promise an older glibc than a library
    binds to, and the arch must match; an extension module outside the stable ABI in an abi3 wheel is named."""
    problems: list[str] = [f"{n}: its ELF version needs cannot be read ({e})" for n, e in facts.unreadable.items()]
    problems.extend(facts.forged())  # whatever the tag: a forged need is no library a build makes
    notes: list[str] = []
    for tag in tags:
        _, abi, plat = tag.split("-")
        glibc, arch = claimed_glibc(plat)
        if arch is None:
            continue
        if foreign := sorted(n for n, e in facts.libraries.items() if e.machine != arch):
            problems.append(f"{tag}: {', '.join(foreign[:3])} built for another machine than {arch}")
        needed = facts.needed(arch)
        if glibc is not None:
            problems.extend(f"{tag} promises manylinux, but {w}: no manylinux admits it" for w in needed.blocked)
            if needed.glibc is not None and needed.glibc > glibc and needed.newest:
                problems.append(f"{tag} promises glibc {glibc[0]}.{glibc[1]}, but {needed.newest} needs the "
                                f"glibc, libstdc++ and libgcc of manylinux_{needed.glibc[0]}_{needed.glibc[1]} "
                                f"({_constrained(facts.libraries[needed.newest])})")
        if glibc is None:
            notes.append(f"{plat} is a local-only tag (no public index takes it)")
        if abi == "abi3" and (bad := sorted(n for n, k in facts.extensions.items() if k != "abi3")):
            # upstream's own wheels do this (vllm/third_party/deep_gemm/_C.cpython-312-*.so in a cp38-abi3
            # wheel): such a module imports on its one Python only, the rest of the wheel everywhere. Said, not
            # refused, so the registry wheels stay valid; a wheel g4build tags keeps cpXY-cpXY instead
            notes.append(f"{tag}: {', '.join(bad[:3])} built for one Python only (imports on that Python alone)")
    if problems:
        return Check(name="tags", ok=False, detail="; ".join(problems))
    needs = [g for lib in facts.libraries.values() if (g := lib.glibc_needed) is not None]
    need = max(needs) if needs else None
    detail = (f"{', '.join(tags)} fit the libraries ({len(facts.libraries)} ELF, newest glibc "
              f"{'.'.join(map(str, need)) if need else 'none'}, {len(facts.extensions)} extension modules)")
    return Check(name="tags", ok=True, detail="; ".join([detail, *notes]))


def _constrained(lib: ElfNeeds) -> str:
    """A library's newest GLIBC / GLIBCXX / CXXABI / GCC needs, for a message."""
    return ", ".join(n for p in CONSTRAINED if (n := lib.newest(p + "_")) is not None) or "no versioned needs"
