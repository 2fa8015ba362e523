"""Which ``manylinux_2_X`` a library's versioned needs allow: every need from glibc (``GLIBC_``), libstdc++
(``GLIBCXX_``, ``CXXABI_``) and libgcc (``GCC_``), as auditwheel decides a policy, not glibc alone.

A manylinux_2_X distribution ships a glibc 2.X and a libstdc++/libgcc of its own age, so a library built with a
newer g++ binds ``GLIBCXX_3.4.30`` and cannot load on a glibc-2.31 system even though its GLIBC needs are older.
``TABLE`` says, for each glibc release g4build tags, the newest version of each of the other three such a system
has (the facts auditwheel's policy data records; our own table, checked against it by a test). A library's tag is
the oldest row that admits every need; a need newer than the newest row gets no manylinux tag; a need past any
real release (``GLIBC_999.99``, twenty digits) is refused as forged, never turned into a tag.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

Version = tuple[int, ...]
CONSTRAINED = ("GLIBC", "GLIBCXX", "CXXABI", "GCC")
# the major every real release of each has had (glibc 2.x since 1997, libstdc++'s 3.4 line since GCC 3.4)
REAL_MAJOR = {"GLIBC": 2, "GLIBCXX": 3, "CXXABI": 1}
MAX_PART_DIGITS = 3  # no real version has a part of four digits: GLIBC_2.<20 digits> is forged
_NUMERIC = re.compile(r"[0-9]+(?:\.[0-9]+){0,3}", re.ASCII)


@dataclass(frozen=True)
class Row:
    """A manylinux_2_X system: its glibc, and the newest GLIBCXX / CXXABI / GCC version it provides."""

    glibc: tuple[int, int]
    glibcxx: Version
    cxxabi: Version
    gcc: Version


def _rows(*rows: tuple[tuple[int, int], Version, Version, Version]) -> tuple[Row, ...]:
    return tuple(Row(g, x, a, c) for g, x, a, c in rows)


# The glibc releases g4build tags for (2.17 = manylinux2014 is the floor; a need between two rows takes the
# next row up, as auditwheel does). 2.37 is left out: auditwheel's x86_64 row for it admits GLIBC only up to 2.36.
TABLE: dict[str, tuple[Row, ...]] = {
    "x86_64": _rows(
        ((2, 17), (3, 4, 19), (1, 3, 7), (4, 8, 0)),
        ((2, 24), (3, 4, 22), (1, 3, 10), (4, 8, 0)),
        ((2, 26), (3, 4, 22), (1, 3, 10), (4, 8, 0)),
        ((2, 27), (3, 4, 24), (1, 3, 11), (7, 0, 0)),
        ((2, 28), (3, 4, 24), (1, 3, 11), (7, 0, 0)),
        ((2, 31), (3, 4, 28), (1, 3, 12), (7, 0, 0)),
        ((2, 34), (3, 4, 29), (1, 3, 13), (7, 0, 0)),
        ((2, 35), (3, 4, 30), (1, 3, 13), (12, 0, 0)),
        ((2, 36), (3, 4, 30), (1, 3, 13), (12, 0, 0)),
        ((2, 38), (3, 4, 30), (1, 3, 13), (12, 0, 0)),
        ((2, 39), (3, 4, 33), (1, 3, 15), (14, 0, 0)),
        ((2, 40), (3, 4, 33), (1, 3, 15), (14, 0, 0)),
        ((2, 41), (3, 4, 33), (1, 3, 15), (14, 0, 0)),
    ),
    "aarch64": _rows(
        ((2, 17), (3, 4, 19), (1, 3, 7), (4, 7, 0)),
        ((2, 24), (3, 4, 22), (1, 3, 10), (4, 7, 0)),
        ((2, 26), (3, 4, 24), (1, 3, 11), (7, 0, 0)),
        ((2, 27), (3, 4, 24), (1, 3, 11), (7, 0, 0)),
        ((2, 28), (3, 4, 24), (1, 3, 11), (7, 0, 0)),
        ((2, 31), (3, 4, 28), (1, 3, 12), (7, 0, 0)),
        ((2, 34), (3, 4, 29), (1, 3, 13), (11, 0)),
        ((2, 35), (3, 4, 30), (1, 3, 13), (11, 0)),
        ((2, 36), (3, 4, 30), (1, 3, 13), (11, 0)),
        ((2, 38), (3, 4, 30), (1, 3, 13), (11, 0)),
        ((2, 39), (3, 4, 33), (1, 3, 15), (14, 0, 0)),
        ((2, 40), (3, 4, 33), (1, 3, 15), (14, 0, 0)),
        ((2, 41), (3, 4, 33), (1, 3, 15), (14, 0, 0)),
    ),
}
# version names that are not numbers: the first glibc row that has them, per arch (FLOAT128 is x86 only)
NAMED: dict[str, dict[str, tuple[int, int]]] = {
    "x86_64": {"CXXABI_TM_1": (2, 17), "CXXABI_FLOAT128": (2, 24), "GLIBC_ABI_DT_RELR": (2, 36)},
    "aarch64": {"CXXABI_TM_1": (2, 17), "GLIBC_ABI_DT_RELR": (2, 36)},
}


class ForgedVersion(ValueError):
    """A version need no real glibc, libstdc++ or libgcc ever had: the library is forged or corrupt."""


@dataclass(frozen=True, kw_only=True)
class Policy:
    """What a set of needs allows on one arch: ``glibc`` the oldest row admitting all (None: no row does), and
    ``blocker`` the need that kept every row out."""

    glibc: tuple[int, int] | None
    blocker: str | None = None


def parse_need(name: str) -> tuple[str, Version] | None:
    """(``GLIBCXX``, (3, 4, 30)) for ``GLIBCXX_3.4.30``; None for a name outside the four or not a number
    (``CXXABI_TM_1``, ``GLIBC_PRIVATE``). Raises ForgedVersion for a number no real release has."""
    prefix, _, rest = name.partition("_")
    if prefix not in CONSTRAINED or not _NUMERIC.fullmatch(rest):
        if prefix in CONSTRAINED and rest[:1].isdigit():  # digits, but not a short dotted number: 5000 digits
            raise ForgedVersion(f"{name[:40]}{'...' if len(name) > 40 else ''}: not a {prefix} version any "
                                "release has (expected e.g. GLIBC_2.17)")
        return None
    parts = rest.split(".")
    if any(len(p) > MAX_PART_DIGITS for p in parts) or \
            (prefix in REAL_MAJOR and int(parts[0]) != REAL_MAJOR[prefix]):
        raise ForgedVersion(f"{name[:40]}{'...' if len(name) > 40 else ''}: past any real {prefix} release "
                            f"(every one is {REAL_MAJOR.get(prefix, 'at most 999')}.x)")
    return prefix, tuple(int(p) for p in parts)


def _admits(row: Row, prefix: str, version: Version) -> bool:
    if prefix == "GLIBC":
        return version <= row.glibc
    limit = {"GLIBCXX": row.glibcxx, "CXXABI": row.cxxabi, "GCC": row.gcc}[prefix]
    return version <= limit


def policy(needs: Iterable[str], arch: str) -> Policy:
    """The oldest manylinux glibc of ``TABLE`` whose system has every one of ``needs`` (version names) on
    ``arch``. Names outside GLIBC/GLIBCXX/CXXABI/GCC do not constrain (a library's own versioned deps); a
    non-numeric name of those four that no row lists (``GLIBC_PRIVATE``) admits no row, as in auditwheel."""
    parsed_needs = [(name, parse_need(name)) for name in sorted(set(needs))]  # a forged one raises on any arch
    rows = TABLE.get(arch)
    if rows is None:
        return Policy(glibc=None, blocker=f"no manylinux table for {arch}")
    start = 0
    for name, parsed in parsed_needs:
        if parsed is None:
            if name.partition("_")[0] not in CONSTRAINED:
                continue
            first = NAMED[arch].get(name)
            fits = [i for i, r in enumerate(rows) if first is not None and r.glibc >= first]
        else:
            fits = [i for i, r in enumerate(rows) if _admits(r, *parsed)]
        if not fits:
            return Policy(glibc=None, blocker=name)
        start = max(start, fits[0])
    return Policy(glibc=rows[start].glibc)
