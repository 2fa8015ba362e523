"""vllm-flash-attn's FA2 head-dim dispatch as the build series patches it (0003, G4B_FA2_HEADDIMS), compiled for
real with the system C++ compiler around the patched ``static_switch.h``: with some head dims kept, the program
links with only those kernels defined and a call needing another raises; without the definitions the same
dispatch needs every head dim's kernel (what the series keeps a reduced build from losing at import)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from g4build.series.deps import get_build_series

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_flash_attn_f5bc33c"
SWITCH = Path("csrc/flash_attn/src/static_switch.h")
CXX = shutil.which("c++") or shutil.which("g++")

# Stands in for flash_api.cpp's run_mha_fwd: TORCH_CHECK as torch's (an exception with the parts joined), one
# kernel per head dim, defined only for the dims kept (as the build compiles only their units)
DRIVER = r"""
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <stdexcept>
template <typename... A> std::string g4_join(const A&... a) { std::ostringstream o; (o << ... << a); return o.str(); }
#define TORCH_CHECK(COND, ...) do { if (!(COND)) throw std::runtime_error(g4_join(__VA_ARGS__)); } while (0)
#include "static_switch.h"
template <int D> int run_kernel();
KERNELS
int dispatch(int d) { int got = 0; HEADDIM_SWITCH(d, [&] { got = run_kernel<kHeadDim>(); }); return got; }
int main(int argc, char** argv) {
  try { std::printf("%d\n", dispatch(std::atoi(argv[1]))); } catch (const std::exception& e) {
    std::printf("error: %s\n", e.what()); return 3; }
  return 0;
}
"""

pytestmark = pytest.mark.skipif(CXX is None, reason="needs a C++ compiler")


@pytest.fixture(scope="module")
def patched_switch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("fa")
    shutil.copy2(FIXTURE / "CMakeLists.txt", tree / "CMakeLists.txt")
    (tree / SWITCH).parent.mkdir(parents=True)
    shutil.copy2(FIXTURE / SWITCH, tree / SWITCH)
    for patch in get_build_series("vllm-flash-attn").series.patches_for("vllm-0.21.0"):
        subprocess.run(["git", "apply", "-C3", str(patch.path)], cwd=tree, check=True, capture_output=True)
    return tree / SWITCH


def _build(folder: Path, switch: Path, kept: tuple[int, ...], defines: list[str]) -> subprocess.CompletedProcess[str]:
    folder.mkdir()
    shutil.copy2(switch, folder / "static_switch.h")
    kernels = "\n".join(f"template <> int run_kernel<{d}>() {{ return {d}; }}" for d in kept)
    (folder / "driver.cpp").write_text(DRIVER.replace("KERNELS", kernels), encoding="utf-8")
    assert CXX is not None
    return subprocess.run([CXX, "-std=c++17", *defines, "driver.cpp", "-o", "driver"], cwd=folder,
                          capture_output=True, text=True, timeout=300, check=False)


def _call(folder: Path, head_dim: int) -> tuple[int, str]:
    done = subprocess.run([str(folder / "driver"), str(head_dim)], capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout.strip()


def test_kept_head_dims_dispatch_and_the_others_raise(tmp_path: Path, patched_switch: Path) -> None:
    build = _build(tmp_path / "kept", patched_switch, (128, 256),
                   ["-DG4B_FA2_HEADDIMS_ONLY", "-DG4B_FA2_HEADDIM_128", "-DG4B_FA2_HEADDIM_256"])
    assert build.returncode == 0, build.stderr[-2000:]
    assert _call(tmp_path / "kept", 128) == (0, "128")
    assert _call(tmp_path / "kept", 100) == (0, "128")  # rounded up as upstream rounds
    assert _call(tmp_path / "kept", 256) == (0, "256")
    code, said = _call(tmp_path / "kept", 64)
    assert code == 3 and said == ("error: FlashAttention 2 for head dim 64 (kernel 64) is not compiled into this "
                                  "build (g4build kernel profile): rebuild with --kernels all")
    assert _call(tmp_path / "kept", 72)[1].startswith("error: FlashAttention 2 for head dim 72 (kernel 96)")


def test_without_the_definitions_every_head_dim_is_needed(tmp_path: Path, patched_switch: Path) -> None:
    """The patched header dispatches as upstream's when the build keeps every head dim: then all six kernels must
    exist, and a build with only two fails to link (upstream's header behaves the same, shown below)."""
    every = _build(tmp_path / "every", patched_switch, (32, 64, 96, 128, 192, 256), [])
    assert every.returncode == 0, every.stderr[-2000:]
    assert [_call(tmp_path / "every", d)[1] for d in (1, 33, 65, 97, 129, 193)] == \
        ["32", "64", "96", "128", "192", "256"]
    two = _build(tmp_path / "two", patched_switch, (128, 256), [])
    assert two.returncode != 0 and "run_kernel<32>" in two.stderr
    upstream = _build(tmp_path / "upstream", FIXTURE / SWITCH, (128, 256),
                      ["-DG4B_FA2_HEADDIMS_ONLY", "-DG4B_FA2_HEADDIM_128", "-DG4B_FA2_HEADDIM_256"])
    assert upstream.returncode != 0  # the definitions alone do nothing: the patch is what makes them count
