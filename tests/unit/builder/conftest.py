"""Shared builders for the build-engine tests: real pins from patches/pins.yaml, targets, layouts."""

from __future__ import annotations

import pytest

from g4build.builder.arch import parse_arch
from g4build.builder.plan import Layout, Options, Target
from g4build.pins.model import Pin, load_pins


@pytest.fixture(scope="session")
def pin21() -> Pin:
    return load_pins().get("vllm-0.21.0")


@pytest.fixture(scope="session")
def pin33() -> Pin:
    return load_pins().get("vllm-0.33.0")


def target(os_name: str = "linux", arch: str = "sm120", cuda: str = "13.0", executor: str = "native") -> Target:
    return Target(os=os_name, arch=parse_arch(arch), python="3.12", cuda=cuda, executor=executor)


def linux_layout(root: str = "/home/u/g4b/v21") -> Layout:
    return Layout(root=root, out=f"{root}/wheels", cache="/home/u/g4b/deps")


OPTS = Options(jobs=4)


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """g4build's main() in-process: (exit code, stdout, stderr)."""
    from g4build.cli import main

    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err
