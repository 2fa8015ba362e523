"""The cuda.h alignment step on every header it can meet: unpatched 13.0-13.2, patched by the Windows fork's
fix_cuda_13_align.py (or by hand, or by an earlier run), and CUDA versions that never needed it.

The samples reproduce the shape of the declarations the step reads, as CUDA's cuda.h has them: the version
define, the tensor map size define and the ``CUtensorMap_st`` typedef with its C++/C11 alignment branches (plus
an unrelated ``_MSC_VER`` block before them, as the real header has). The fork-patched sample is made the way
that script leaves the header: a macro block (64 under ``_MSC_VER``, 128 elsewhere) inserted before the
typedef, and every ``alignas(128)`` / ``_Alignas(128)`` turned into ``alignas(TENSOR_MAP_ALIGN)``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.unit.builder.conftest import run_cli

from g4build.builder import cudashim
from g4build.errors import BuildError, UsageError


def header(version: int, align: str = "128", *, crlf: bool = False) -> str:
    text = f"""#ifndef __cuda_cuda_h__
#define __cuda_cuda_h__
#if defined(_MSC_VER) && !defined(__CUDA_DEPRECATED_NO_WARN)
#define __CUDA_DEPRECATED __declspec(deprecated)
#endif
#include <stdlib.h>
typedef unsigned long long cuuint64_t;
/**
 * CUDA API version number
 */
#define CUDA_VERSION {version}

/**
 * Size of tensor map descriptor
 */
#define CU_TENSOR_MAP_NUM_QWORDS 16

/**
 * Tensor map descriptor. Requires compiler support for aligning to {align} bytes.
 */
typedef struct CUtensorMap_st {{
#if defined(__cplusplus) && (__cplusplus >= 201103L)
    alignas({align})
#elif __STDC_VERSION__ >= 201112L
    _Alignas({align})
#endif
    cuuint64_t opaque[CU_TENSOR_MAP_NUM_QWORDS];
}} CUtensorMap;

typedef enum CUtensorMapDataType_enum {{
    CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0
}} CUtensorMapDataType;
#endif
"""
    return text.replace("\n", "\r\n") if crlf else text


def fork_patched(text: str) -> str:
    """The header as the Windows fork's fix_cuda_13_align.py leaves it (see the module docstring)."""
    block = "\n#if defined(_MSC_VER)\n  #define TENSOR_MAP_ALIGN 64\n#else\n  #define TENSOR_MAP_ALIGN 128\n#endif\n\n"
    text = text.replace("typedef struct CUtensorMap_st {", block + "typedef struct CUtensorMap_st {")
    text = text.replace("_Alignas(128)", "_Alignas(TENSOR_MAP_ALIGN)")
    return text.replace(" alignas(128)", " alignas(TENSOR_MAP_ALIGN)")


def install(root: Path, text: str) -> Path:
    (root / "include").mkdir(parents=True, exist_ok=True)
    (root / "include" / "cuda.h").write_bytes(text.encode())
    return root


@pytest.mark.parametrize("version", [13000, 13010, 13020])
def test_unpatched_13_0_to_13_2_gets_a_private_copy_aligned_64_under_msvc(tmp_path: Path, version: int) -> None:
    home = install(tmp_path / "cuda", header(version))
    result = cudashim.apply(home, tmp_path / "shim")
    assert result.state == "patched" and result.written == tmp_path / "shim" / "cuda.h"
    text = result.written.read_text()
    assert "alignas(128)" not in text and "_Alignas(128)" not in text
    assert "    alignas(G4BUILD_TENSOR_MAP_ALIGN)\n" in text and "    _Alignas(G4BUILD_TENSOR_MAP_ALIGN)\n" in text
    assert "#if defined(_MSC_VER)\n#define G4BUILD_TENSOR_MAP_ALIGN 64\n#else\n#define G4BUILD_TENSOR_MAP_ALIGN 128\n" \
           "#endif\ntypedef struct CUtensorMap_st {" in text
    assert (home / "include" / "cuda.h").read_text() == header(version)  # the installed header is untouched
    assert "patched: " in result.message() and "fix_cuda_13_align.py" in result.message()  # what JIT still sees


def test_running_again_changes_nothing(tmp_path: Path) -> None:
    home = install(tmp_path / "cuda", header(13000))
    first = cudashim.apply(home, tmp_path / "shim").written
    assert first is not None
    data, mtime = first.read_bytes(), first.stat().st_mtime_ns
    again = cudashim.apply(home, tmp_path / "shim")
    assert again.state == "patched" and again.written is not None and again.written.read_bytes() == data
    assert again.written.stat().st_mtime_ns == mtime  # not rewritten
    # the private copy itself reads as patched by g4build, not as a header that needs patching
    assert cudashim.inspect(data.decode()).state == "already patched"
    assert "patched by g4build" in cudashim.inspect(data.decode()).how
    assert sorted(p.name for p in (tmp_path / "shim").iterdir()) == ["cuda.h"]  # no temporary file left


@pytest.mark.parametrize("version", [13000, 13020])
def test_header_patched_by_the_forks_script_is_already_patched(tmp_path: Path, version: int) -> None:
    home = install(tmp_path / "cuda", fork_patched(header(version)))
    result = cudashim.apply(home, tmp_path / "shim")
    assert (result.state, result.written) == ("already patched", None)
    assert "TENSOR_MAP_ALIGN, 64 under MSVC (patched by fix_cuda_13_align.py)" in result.detail
    assert result.message().startswith("already patched: ")
    assert list((tmp_path / "shim").iterdir()) == []  # the folder on the include path exists, empty


def test_a_stale_copy_is_removed_once_the_installed_header_no_longer_needs_it(tmp_path: Path) -> None:
    home = install(tmp_path / "cuda", header(13000))
    assert cudashim.apply(home, tmp_path / "shim").state == "patched"
    install(home, fork_patched(header(13000)))  # the user ran the fork's script afterwards
    result = cudashim.apply(home, tmp_path / "shim")
    assert result.state == "already patched" and result.removed == tmp_path / "shim" / "cuda.h"
    assert not (tmp_path / "shim" / "cuda.h").exists()  # a copy of the old header would shadow the new one
    assert "removed the stale copy" in result.message()
    install(home, header(13030, "64"))  # then upgraded to 13.3
    assert cudashim.apply(home, tmp_path / "shim").state == "not needed"


@pytest.mark.parametrize(("version", "cuda"), [(12080, "12.8"), (12090, "12.9"), (13030, "13.3"), (13100, "13.10")])
def test_other_versions_are_not_needed(tmp_path: Path, version: int, cuda: str) -> None:
    home = install(tmp_path / "cuda", header(version, "64"))
    result = cudashim.apply(home, tmp_path / "shim")
    assert (result.state, result.cuda, result.written) == ("not needed", cuda, None)
    assert result.message().startswith("not needed for this version: CUDA " + cuda)


def test_a_13_3_header_is_judged_by_its_version_not_its_alignment(tmp_path: Path) -> None:
    assert cudashim.inspect(header(13030, "128")).state == "not needed"


def test_hand_edited_64_is_already_patched() -> None:
    assert cudashim.inspect(header(13010, "64")).state == "already patched"


def test_crlf_header_keeps_its_line_ends(tmp_path: Path) -> None:
    home = install(tmp_path / "cuda", header(13000, crlf=True))
    out = cudashim.apply(home, tmp_path / "shim").written
    assert out is not None
    data = out.read_bytes()
    assert b"\r\n#define G4BUILD_TENSOR_MAP_ALIGN 64\r\n" in data and b"\n" not in data.replace(b"\r\n", b"")
    assert cudashim.inspect(fork_patched(header(13000, crlf=True).replace("\r\n", "\n")).replace("\n", "\r\n")
                            ).state == "already patched"


@pytest.mark.parametrize(("text", "found"), [
    (header(13020, "256"), "found 256"),
    (header(13000).replace("alignas(128)", "alignas(SOME_ALIGN)", 1).replace("_Alignas(128)", "_Alignas(SOME_ALIGN)"),
     "found SOME_ALIGN"),
    (header(13000).replace(" alignas(128)", " alignas(64)"), "found 128, 64"),
])
def test_unknown_alignment_is_refused_with_what_was_found(tmp_path: Path, text: str, found: str) -> None:
    with pytest.raises(BuildError, match=rf"expected CUtensorMap aligned with alignas\(128\).*{found}"):
        cudashim.apply(install(tmp_path / "cuda", text), tmp_path / "shim")
    assert not (tmp_path / "shim" / "cuda.h").exists()


def test_not_a_cuda_header_or_no_header(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=r"expected a CUDA toolkit cuda\.h"):
        cudashim.inspect("typedef int CUtensorMap;\n")
    with pytest.raises(BuildError, match="no 'typedef struct CUtensorMap_st"):
        cudashim.inspect("#define CUDA_VERSION 13000\n")
    with pytest.raises(BuildError, match=r"cuda\.h not found"):
        cudashim.apply(tmp_path / "nowhere", tmp_path / "shim")


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs a C++ compiler")
def test_the_copy_compiles_to_64_under_msvc_and_128_elsewhere(tmp_path: Path) -> None:
    """g++ stands in for both compilers: with _MSC_VER defined the copy's typedef takes the MSVC branch."""
    home = install(tmp_path / "cuda", header(13000))
    shim = cudashim.apply(home, tmp_path / "shim").written
    assert shim is not None
    for defines, want in (([], 128), (["-D_MSC_VER=1940"], 64)):
        src = tmp_path / "t.cpp"
        src.write_text(f'#include <cuda.h>\nstatic_assert(alignof(CUtensorMap) == {want}, "alignment");\n')
        done = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", *defines, f"-I{shim.parent}",
                               f"-I{home / 'include'}", str(src)], capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr


def test_cli_says_what_it_did(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = install(tmp_path / "cuda", header(13000))
    argv = ["cuda-shim", "--dest", str(tmp_path / "shim"), "--cuda-home", str(home)]
    code, out, _ = run_cli([*argv, "--json"], capsys)
    assert code == 0 and json.loads(out)["state"] == "patched"
    install(home, fork_patched(header(13000)))
    code, out, _ = run_cli(argv, capsys)
    assert code == 0 and out.startswith("already patched: ")
    install(home, header(13020, "256"))
    code, _, err = run_cli(argv, capsys)
    assert code == 9 and "found 256" in err


def test_cuda_home_flag_wins_over_the_environment(tmp_path: Path) -> None:
    env = {"CUDA_HOME": str(tmp_path / "home"), "CUDA_PATH": str(tmp_path / "path")}
    assert cudashim.resolve_cuda_home(tmp_path / "flag", env) == tmp_path / "flag"
    assert cudashim.resolve_cuda_home(None, env) == tmp_path / "home"


def test_cuda_home_falls_back_to_cuda_path(tmp_path: Path) -> None:
    assert cudashim.resolve_cuda_home(None, {"CUDA_PATH": str(tmp_path / "path")}) == tmp_path / "path"
    assert cudashim.resolve_cuda_home(None, {"CUDA_HOME": "", "CUDA_PATH": str(tmp_path)}) == tmp_path


def test_no_cuda_home_is_a_usage_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(UsageError) as raised:
        cudashim.resolve_cuda_home(None, {})
    assert raised.value.message == ("no CUDA folder: expected --cuda-home or CUDA_HOME (or CUDA_PATH), found none")
    assert raised.value.hint == "pass --cuda-home to the CUDA install folder (the one holding include\\cuda.h)"
    assert raised.value.exit_code == 2
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    code, _, err = run_cli(["cuda-shim", "--dest", str(tmp_path / "shim")], capsys)
    assert code == 2 and "no CUDA folder" in err
