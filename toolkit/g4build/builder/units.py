"""Compile units of a configured CMake build, read from its ``build.ninja``: target, source, language, and the
codes each CUDA unit is compiled for (``sm_120`` SASS, ``compute_80`` PTX ...).

vLLM and vllm-flash-attn set ``-gencode`` flags per source file (``set_gencode_flags_for_srcs``), so what a
configure decided for every kernel family is in the generated build file, before anything compiles. Pure text
in, data out: the compile-work benchmark and the tests read real CMake output with it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

_BUILD = re.compile(r"^build (?P<out>\S+): (?P<rule>(?P<lang>CUDA|CXX|C)_COMPILER__\S+) (?P<src>\S+)")
_OBJ = re.compile(r"CMakeFiles/(?P<target>[^/]+)\.dir/")
# -gencode arch=compute_90a,code=sm_90a | -gencode=arch=... | --generate-code=arch=compute_75,code=[compute_75,sm_75]
_GENCODE = re.compile(
    r"(?:-gencode[= ]|--generate-code=)\"?arch=(?P<arch>compute_\w+),code=(?P<code>\[[^\]]*\]|[\w]+)")


@dataclass(frozen=True, kw_only=True)
class CompileUnit:
    target: str  # the CMake target (``_C``, ``_vllm_fa2_C`` ...)
    source: str
    language: str  # CUDA, CXX or C
    codes: tuple[str, ...]  # sorted: sm_XY (SASS) and compute_XY (PTX) the unit embeds

    @property
    def sass(self) -> tuple[str, ...]:
        return tuple(c for c in self.codes if c.startswith("sm_"))

    @property
    def ptx(self) -> tuple[str, ...]:
        return tuple(c for c in self.codes if c.startswith("compute_"))


def _unescape(path: str) -> str:
    return path.replace("$ ", " ").replace("$:", ":").replace("$$", "$")


def gencode_codes(flags: str) -> tuple[str, ...]:
    """The codes a compiler command line asks for (each -gencode's code list)."""
    codes: set[str] = set()
    for m in _GENCODE.finditer(flags):
        codes.update(c.strip() for c in m["code"].strip("[]").split(",") if c.strip())
    return tuple(sorted(codes, key=_code_key))


def _code_key(code: str) -> tuple[int, str, str]:
    kind, _, num = code.partition("_")
    digits = re.match(r"\d+", num)
    return (int(digits[0]) if digits else 0, num, kind)


def units_from_ninja(text: str) -> list[CompileUnit]:
    """Every C, C++ and CUDA object a ``build.ninja`` compiles (custom commands and links are left out)."""
    units: list[CompileUnit] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _BUILD.match(lines[i])
        i += 1
        if not m:
            continue
        target_m = _OBJ.search(m["out"])
        flags = ""
        while i < len(lines) and lines[i].startswith("  "):
            key, _, value = lines[i].strip().partition(" = ")
            if key == "FLAGS":
                flags = value
            i += 1
        units.append(CompileUnit(
            target=target_m["target"] if target_m else "?", source=_unescape(m["src"]), language=m["lang"],
            codes=gencode_codes(flags) if m["lang"] == "CUDA" else (),
        ))
    return units


def summary(units: list[CompileUnit]) -> dict[str, dict[str, Any]]:
    """Per target: units by language, and how many CUDA units embed each code (``sm_120``: 52 ...)."""
    out: dict[str, dict[str, Any]] = {}
    for u in units:
        entry = out.setdefault(u.target, {"units": 0, "cuda_units": 0, "codes": Counter()})
        entry["units"] += 1
        if u.language == "CUDA":
            entry["cuda_units"] += 1
            entry["codes"].update(u.codes)
    return {t: {**e, "codes": dict(sorted(e["codes"].items(), key=lambda kv: _code_key(kv[0])))}
            for t, e in sorted(out.items())}
