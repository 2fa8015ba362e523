"""Our manylinux table and tag held to auditwheel's: the table against auditwheel's own policy data (every version
a manylinux_2_X row of auditwheel admits, ours admits by that row; every one it adds in its next row, ours does not
admit earlier), and the tag g4build's stamp computes against ``auditwheel show``'s symbol-version tag on wheels of
real libraries compiled here. Only the symbol-version tag is compared: g4build does not vendor torch's or CUDA's
libraries (as upstream's wheels do not), so auditwheel's external-library verdict is not ours to match. Below
manylinux2014 g4build claims the 2014 floor. (x86_64 glibc has no GLIBC_2.37 symbol version at all; auditwheel
admits such a name nowhere, ours at 2.38: no real library binds it, so that case is not compared.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from tests.support.elflibs import (
    CXX_SRC,
    LIBM_C,
    MACHINE,
    OLD_C,
    compile_library,
    needing_version,
    needs_cc,
    needs_cxx,
    versioned_libfoo,
)
from tests.support.wheelsfactory import build_wheel

from g4build.validate.manylinux import CONSTRAINED, TABLE, policy
from g4build.validate.tags import expected_tag, read_tag_facts

auditwheel = pytest.importorskip("auditwheel", reason="the test extras install auditwheel")


def _policies() -> list[dict[str, Any]]:
    data = resources.files("auditwheel.policy").joinpath("manylinux-policy.json").read_text()
    return [p for p in json.loads(data) if p["name"].startswith("manylinux_")]


def _names(p: dict[str, Any], arch: str) -> set[str]:
    versions = p["symbol_versions"].get(arch, {})
    return {f"{prefix}_{v}" for prefix in CONSTRAINED for v in versions.get(prefix, ())}


@pytest.mark.parametrize("arch", sorted(TABLE))
def test_the_table_admits_what_auditwheel_admits_and_nothing_earlier(arch: str) -> None:
    theirs = {tuple(int(x) for x in p["name"].split("_")[1:3]): _names(p, arch) for p in _policies()}
    checked = 0
    for row in TABLE[arch]:
        assert row.glibc in theirs, f"manylinux_{row.glibc[0]}_{row.glibc[1]} is no policy auditwheel knows"
        admitted = theirs[row.glibc]
        for name in sorted(admitted):
            if name.startswith("GLIBC_") and tuple(map(int, re.findall(r"[0-9]+", name))) > row.glibc:
                continue  # auditwheel's aarch64 2_17 admits GLIBC_2.18; ours takes the next row (stricter)
            got = policy([name], arch).glibc
            assert got is not None and got <= row.glibc, f"{name}: ours {got}, auditwheel's {row.glibc}"
            checked += 1
        earlier = [g for g in theirs if g < row.glibc and g >= TABLE[arch][0].glibc]
        if earlier:  # what this row adds is not admitted by the row before it
            for name in sorted(admitted - theirs[max(earlier)]):
                got = policy([name], arch).glibc
                assert got is not None and got > max(earlier), f"{name}: ours {got}, auditwheel's {row.glibc}"
    assert checked > 200


def _auditwheel_sym_tag(wheel: Path) -> str:
    run = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)], capture_output=True,
                         text=True, check=True, timeout=120)
    return str(json.loads(run.stdout)["sym_tag"])


def _ours(wheel: Path) -> str:
    current = wheel.name[:-len(".whl")].split("-", 2)[2]
    return expected_tag(current, read_tag_facts(wheel), ">=3.10")[0].split("-")[2]


def _case(folder: Path, case: str) -> dict[str, bytes]:
    if case == "libc":
        return {"pkg/_a.abi3.so": compile_library(folder, "liba.so", OLD_C).read_bytes()}
    if case == "libm":
        return {"pkg/_a.abi3.so": compile_library(folder, "liba.so", LIBM_C, args=("-lm",)).read_bytes()}
    if case == "libstdc++":
        return {"pkg/_a.abi3.so": compile_library(folder, "liba.so", CXX_SRC, cxx=True).read_bytes()}
    if case == "libfoo.so.1":
        lib, user = versioned_libfoo(folder)
        return {"pkg/libs/libfoo.so.1": lib.read_bytes(), "pkg/_a.abi3.so": user.read_bytes()}
    user = needing_version(folder, case)
    return {"pkg/_a.abi3.so": user.read_bytes(), "pkg/libs/libfake.so": (folder / "libfake.so").read_bytes()}


@needs_cc
@pytest.mark.parametrize("case", [
    "libc", "libm", pytest.param("libstdc++", marks=needs_cxx), "libfoo.so.1",
    "GLIBCXX_3.4.30", "CXXABI_1.3.13", "GCC_7.0.0", "CXXABI_TM_1", "GLIBC_ABI_DT_RELR", "GLIBC_2.38",
    "GLIBC_PRIVATE",
])
def test_our_tag_is_auditwheel_shows_symbol_tag(tmp_path: Path, case: str) -> None:
    wheel = build_wheel(tmp_path / "out", {"pkg/__init__.py": "", **_case(tmp_path, case)}, name="pkg",
                        version="1.0", tag=f"cp312-abi3-linux_{MACHINE}")
    theirs = _auditwheel_sym_tag(wheel)
    if (m := re.fullmatch(r"manylinux_2_([0-9]+)_(\w+)", theirs)) and int(m[1]) < 17:
        theirs = f"manylinux_2_17_{m[2]}"  # g4build's floor is manylinux2014 (what pip takes today)
    assert _ours(wheel) == theirs
