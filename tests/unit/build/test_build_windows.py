"""Windows knowledge that can be checked anywhere: the cuda.h alignment shim, vcvars output, setup lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from g4build.build import windows
from g4build.errors import BuildError

CUDA_H = """#ifndef __cuda_cuda_h__
typedef struct CUtensorMap_st {
#if defined(__cplusplus) && (__cplusplus >= 201103L)
    alignas(128)
#elif __STDC_VERSION__ >= 201112L
    _Alignas(128)
#endif
    cuuint64_t opaque[16];
} CUtensorMap;
#endif
"""


def test_shim_makes_alignment_64_under_msvc_only(tmp_path: Path) -> None:
    home = tmp_path / "cuda"
    (home / "include").mkdir(parents=True)
    (home / "include" / "cuda.h").write_text(CUDA_H)
    out = windows.write_shim(home, tmp_path / "shim")
    text = out.read_text()
    assert "alignas(128)" not in text and "_Alignas(128)" not in text
    assert "alignas(G4BUILD_TENSOR_MAP_ALIGN)" in text and "_Alignas(G4BUILD_TENSOR_MAP_ALIGN)" in text
    assert text.index("#if defined(_MSC_VER)\n#define G4BUILD_TENSOR_MAP_ALIGN 64") < text.index("CUtensorMap_st")
    assert windows.shim_cuda_h(text) == text  # idempotent
    assert (home / "include" / "cuda.h").read_text() == CUDA_H  # the installed header is untouched


def test_shim_refuses_a_header_without_the_problem(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="does not need"):
        windows.shim_cuda_h("typedef int CUtensorMap;\n")
    with pytest.raises(BuildError, match=r"cuda\.h"):
        windows.write_shim(tmp_path / "nowhere", tmp_path / "shim")


@pytest.mark.parametrize(("cuda", "needed"), [("12.8", False), ("12.9", False), ("13.0", True), ("13.1", True),
                                              ("13.2", True), ("13.3", False)])
def test_which_cuda_needs_the_shim(cuda: str, needed: bool) -> None:
    assert windows.needs_align_shim(cuda) is needed


def test_parse_set_output() -> None:
    env = windows.parse_set_output("PATH=C:\\a;C:\\b\r\n=C:=C:\\x\r\nINCLUDE=C:\\vc\\include\r\nnoise\r\n")
    assert env == {"PATH": "C:\\a;C:\\b", "INCLUDE": "C:\\vc\\include"}
