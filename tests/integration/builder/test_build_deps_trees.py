"""The FetchContent parser on the real pinned source trees (the registry's sdists, cached)."""

from __future__ import annotations

import pytest
from tests.support.trees import sdist_tree

from g4build.builder.deps import find_deps

pytestmark = pytest.mark.network

EXPECTED = {  # name -> (tag, the project's own *_SRC_DIR override), read from each pin's cmake files
    "vllm-0.21.0": {
        "cutlass": ("v4.4.2", "VLLM_CUTLASS_SRC_DIR"),
        "vllm-flash-attn": ("f5bc33cfc02c744d24a2e9d50e6db656de40611c", "VLLM_FLASH_ATTN_SRC_DIR"),
        "flashmla": ("a6ec2ba7bd0a7dff98b3f4d3e6b52b159c48d78b", "FLASH_MLA_SRC_DIR"),
        "qutlass": ("830d2c4537c7396e14a02a46fbddd18b5d107c65", "QUTLASS_SRC_DIR"),
        "deepgemm": ("891d57b4db1071624b5c8fa0d1e51cb317fa709f", "DEEPGEMM_SRC_DIR"),
        "triton_kernels": ("v3.6.0", "TRITON_KERNELS_SRC_DIR"),
    },
    "vllm-0.33.0": {
        "cutlass": ("v4.7.1", "VLLM_CUTLASS_SRC_DIR"),
        "vllm-flash-attn": ("b273a02621d3c94bc747df67204f591b67f38fae", "VLLM_FLASH_ATTN_SRC_DIR"),
        "triton_kernels": ("v3.5.1", "TRITON_KERNELS_SRC_DIR"),
        "flashkda": ("17a037d98da546deb4591e967cf961a43c034d8b", "FLASH_KDA_SRC_DIR"),
    },
}


@pytest.mark.parametrize("pin", sorted(EXPECTED))
def test_parser_reads_every_git_dependency_of_the_pin(pin: str) -> None:
    deps = {d.name: d for d in find_deps(sdist_tree(pin))}
    for name, (tag, var) in EXPECTED[pin].items():
        assert deps[name].tag == tag and deps[name].src_dir_var == var, deps[name]
        assert deps[name].repository.startswith("https://")
    assert all("${" not in d.tag + d.repository for d in deps.values())
    assert deps["cutlass"].declared_in == "CMakeLists.txt"
    # only vllm-flash-attn's switch does more than choose the source (FA4's cute folder symlinked): left out
    assert [n for n, d in deps.items() if d.src_dir_dev_mode] == ["vllm-flash-attn"]
    assert deps["vllm-flash-attn"].cache_vars == ("FETCHCONTENT_SOURCE_DIR_VLLM-FLASH-ATTN",)
    if pin == "vllm-0.21.0":
        assert set(deps) == set(EXPECTED[pin])
        assert deps["deepgemm"].submodules == ("third-party/cutlass", "third-party/fmt")
