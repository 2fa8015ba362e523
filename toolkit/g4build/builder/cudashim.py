"""The ``cuda.h`` alignment workaround for CUDA 13.0-13.2 with MSVC, idempotent on every header it may meet.

CUDA 13.0-13.2 declare ``CUtensorMap`` with ``alignas(128)`` (``_Alignas(128)`` in C); MSVC refuses to pass such
an over-aligned type by value, which CUTLASS and vLLM's kernels do. CUDA 12.x and 13.3+ align it to 64 bytes.
Users fix it two ways: the Windows fork's ``fix_cuda_13_align.py`` rewrites the *installed* header (as
administrator) so the struct is aligned through a macro that is 64 under ``_MSC_VER`` and 128 elsewhere; g4build's
build writes a private copy with the same effect and puts it first on the include path of cl.exe and nvcc
(``CL``, ``NVCC_PREPEND_FLAGS``), leaving the installed header alone.

``inspect`` reads a header and says which of these it is; ``apply`` acts on it:

- ``patched``: an unpatched 13.0-13.2 header; a private copy was written.
- ``already patched``: the installed header already aligns ``CUtensorMap`` to 64 bytes under MSVC (the fork's
  script, or an edit by hand); no copy is needed, and a stale one is removed so it cannot shadow the header.
- ``not needed``: a CUDA outside 13.0-13.2; no copy, a stale one removed.

The private copy covers the build only. Whatever compiles at run time (FlashInfer's JIT, torch extensions built
on first use) reads the installed header, so on 13.0-13.2 that needs the fork's script once (or CUDA 13.3+).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from g4build.errors import BuildError, UsageError

State = Literal["patched", "already patched", "not needed"]
GUARD = "G4BUILD_TENSOR_MAP_ALIGN"
FIRST, LAST_NEEDING = (13, 0), (13, 2)  # 13.3 aligns CUtensorMap to 64 bytes again

_VERSION = re.compile(r"^[ \t]*#[ \t]*define[ \t]+CUDA_VERSION[ \t]+(\d+)\b", re.M)
_STRUCT = re.compile(r"typedef[ \t]+struct[ \t]+CUtensorMap_st[ \t]*\{(?P<body>.*?)\}[ \t]*CUtensorMap[ \t]*;",
                     re.S)
_MSVC_BRANCH = re.compile(
    r"#[ \t]*if[ \t]+defined[ \t]*\(?[ \t]*_MSC_VER[ \t]*\)?[ \t]*\r?\n(?P<body>.*?)#[ \t]*(?:else|elif|endif)", re.S)
_ALIGN = re.compile(r"\b(?P<kw>alignas|_Alignas)\((?P<arg>[^()]*)\)")
FIX_INSTALLED = ("to cover run-time JIT too (FlashInfer, torch extensions compiled at first use), patch the installed "
                 "header once as administrator with the Windows fork's fix_cuda_13_align.py, or install CUDA 13.3+")


@dataclass(frozen=True, kw_only=True)
class HeaderState:
    """What a ``cuda.h`` says about the workaround."""

    cuda: str  # "13.0"
    needs_shim: bool  # an unpatched 13.0-13.2 header: the build needs the private copy
    already: bool  # 13.0-13.2 and already 64-byte aligned under MSVC (by whom: ``how``)
    how: str

    @property
    def state(self) -> State:
        return "patched" if self.needs_shim else "already patched" if self.already else "not needed"


def _version(text: str, where: str) -> tuple[int, int]:
    m = _VERSION.search(text)
    if not m:
        raise BuildError(f"{where}: expected a CUDA toolkit cuda.h (with #define CUDA_VERSION), found none",
                         hint="set CUDA_HOME to the CUDA install folder (the one holding include\\cuda.h)")
    number = int(m[1])  # major * 1000 + minor * 10
    return number // 1000, (number % 1000) // 10


def _msvc_value(text: str, macro: str) -> str | None:
    """The value ``#define MACRO`` gets in the ``#if defined(_MSC_VER)`` branch of the header, if any."""
    define = re.compile(rf"#[ \t]*define[ \t]+{re.escape(macro)}[ \t]+(\S+)")
    for branch in _MSVC_BRANCH.finditer(text):
        if m := define.search(branch["body"]):
            return m[1]
    return None


def inspect(text: str, where: str = "cuda.h") -> HeaderState:
    """Classify a ``cuda.h``; raises BuildError (what was expected, what was found) on one it cannot read."""
    major, minor = _version(text, where)
    cuda = f"{major}.{minor}"
    if not FIRST <= (major, minor) <= LAST_NEEDING:
        return HeaderState(cuda=cuda, needs_shim=False, already=False,
                           how=f"CUDA {cuda} aligns CUtensorMap as MSVC accepts (only 13.0-13.2 need the workaround)")
    struct = _STRUCT.search(text)
    if not struct:
        raise BuildError(f"{where}: CUDA {cuda}, but no 'typedef struct CUtensorMap_st {{ ... }} CUtensorMap;' "
                         "found: expected the tensor map declaration the workaround changes",
                         hint="reinstall the CUDA toolkit (the header looks edited), or build with CUDA 12.8/12.9")
    args = {m["arg"].strip() for m in _ALIGN.finditer(struct["body"])}
    if args == {"128"}:
        return HeaderState(cuda=cuda, needs_shim=True, already=False,
                           how=f"CUDA {cuda} declares CUtensorMap with alignas(128)")
    if args == {"64"}:
        return HeaderState(cuda=cuda, needs_shim=False, already=True, how="CUtensorMap is aligned to 64 bytes")
    if len(args) == 1 and re.fullmatch(r"[A-Za-z_]\w*", (macro := next(iter(args)))):
        value = _msvc_value(text, macro)
        if value == "64":
            who = "g4build" if macro == GUARD else "fix_cuda_13_align.py" if macro == "TENSOR_MAP_ALIGN" else "hand"
            return HeaderState(cuda=cuda, needs_shim=False, already=True,
                               how=f"CUtensorMap is aligned through {macro}, 64 under MSVC (patched by {who})")
    found = ", ".join(sorted(args)) or "no alignas"
    raise BuildError(
        f"{where}: CUDA {cuda}: expected CUtensorMap aligned with alignas(128) (unpatched), alignas(64), or a macro "
        f"that is 64 under _MSC_VER (the fork's fix_cuda_13_align.py), found {found}",
        hint="reinstall the CUDA toolkit to get its original cuda.h, or install CUDA 13.3+",
    )


def shim_text(text: str) -> str:
    """An unpatched 13.0-13.2 header with ``CUtensorMap`` aligned to 64 bytes under MSVC only (128 elsewhere)."""
    struct = _STRUCT.search(text)
    assert struct is not None
    start, end = struct.span()
    block = _ALIGN.sub(lambda m: f"{m['kw']}({GUARD})", text[start:end])
    nl = "\r\n" if "\r\n" in text else "\n"  # the header's own line ends (CRLF on Windows)
    prelude = nl.join(["#if defined(_MSC_VER)", f"#define {GUARD} 64", "#else", f"#define {GUARD} 128", "#endif", ""])
    return text[:start] + prelude + block + text[end:]


@dataclass(frozen=True, kw_only=True)
class ShimResult:
    header: Path
    state: State
    cuda: str
    detail: str
    written: Path | None = None  # the private copy (``patched``)
    removed: Path | None = None  # a stale private copy from an earlier run

    def to_dict(self) -> dict[str, Any]:
        return {"header": str(self.header), "state": self.state, "cuda": self.cuda, "detail": self.detail,
                "written": str(self.written) if self.written else None,
                "removed": str(self.removed) if self.removed else None}

    def message(self) -> str:
        if self.state == "patched":
            return (f"patched: {self.detail}; wrote {self.written} (64-byte alignment under MSVC), first on the "
                    f"build's include path. The installed {self.header} is unchanged: {FIX_INSTALLED}")
        extra = f"; removed the stale copy {self.removed}" if self.removed else ""
        if self.state == "already patched":
            return f"already patched: {self.detail} in {self.header}; no private copy needed{extra}"
        return f"not needed for this version: {self.detail}{extra}"


def apply(cuda_home: Path, dest: Path) -> ShimResult:
    """Act on ``cuda_home``'s ``include/cuda.h``: write ``dest/cuda.h`` when it needs the workaround, else make sure
    no copy is left in ``dest``. Running it again gives the same result; the copy is replaced atomically."""
    header = cuda_home / "include" / "cuda.h"
    if not header.is_file():
        raise BuildError(f"{header} not found: expected the CUDA toolkit's cuda.h",
                         hint="set CUDA_HOME (or pass --cuda-home) to the CUDA install folder")
    text = header.read_bytes().decode("utf-8", errors="surrogateescape")  # bytes: CRLF stays as it is
    found = inspect(text, str(header))
    copy = dest / "cuda.h"
    dest.mkdir(parents=True, exist_ok=True)  # on the include path either way: an existing, maybe empty, folder
    if not found.needs_shim:
        stale = copy if copy.is_file() else None
        if stale is not None:
            stale.unlink()
        return ShimResult(header=header, state=found.state, cuda=found.cuda, detail=found.how, removed=stale)
    data = shim_text(text).encode("utf-8", errors="surrogateescape")
    if not copy.is_file() or copy.read_bytes() != data:
        tmp = dest / ".cuda.h.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, copy)
    return ShimResult(header=header, state="patched", cuda=found.cuda, detail=found.how, written=copy)


def resolve_cuda_home(given: Path | None, environ: Mapping[str, str] | None = None) -> Path:
    """The CUDA install folder: ``given`` (``--cuda-home``) when set, else ``CUDA_HOME``, else ``CUDA_PATH``."""
    env = os.environ if environ is None else environ
    home = given or Path(env.get("CUDA_HOME") or env.get("CUDA_PATH") or "")
    if not str(home) or str(home) == ".":
        raise UsageError("no CUDA folder: expected --cuda-home or CUDA_HOME (or CUDA_PATH), found none",
                         hint="pass --cuda-home to the CUDA install folder (the one holding include\\cuda.h)")
    return home
