"""Windows knowledge that can be checked anywhere: which CUDA needs the cuda.h shim, vcvars output, setup lines.
(The shim itself: test_build_cudashim.py.)"""

from __future__ import annotations

import pytest

from g4build.builder.platforms import windows


@pytest.mark.parametrize(("cuda", "needed"), [("12.8", False), ("12.9", False), ("13.0", True), ("13.1", True),
                                              ("13.2", True), ("13.3", False)])
def test_which_cuda_needs_the_shim(cuda: str, needed: bool) -> None:
    assert windows.needs_align_shim(cuda) is needed


def test_parse_set_output() -> None:
    env = windows.parse_set_output("PATH=C:\\a;C:\\b\r\n=C:=C:\\x\r\nINCLUDE=C:\\vc\\include\r\nnoise\r\n")
    assert env == {"PATH": "C:\\a;C:\\b", "INCLUDE": "C:\\vc\\include"}
