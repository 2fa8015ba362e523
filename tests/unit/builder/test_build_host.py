from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from g4build.builder.host import HostFacts, preflight, probe
from g4build.builder.planner import make_plan
from g4build.errors import BuildError, UsageError
from g4build.pins.model import Pin

from .conftest import OPTS, linux_layout, target

GOOD = HostFacts(os="linux", cores=16, mem_gb=64, free_gb=200, nvcc="/usr/local/cuda/bin/nvcc",
                 nvcc_version="13.0", cxx="/usr/bin/g++", launcher=None)


def _plan(pin: Pin, os_name: str = "linux"):  # type: ignore[no-untyped-def]
    return make_plan(pin, [], target(os_name), layout=linux_layout(), opts=OPTS)


def test_good_host_passes(pin21: Pin) -> None:
    preflight(_plan(pin21), GOOD)


@pytest.mark.parametrize(("change", "text"), [
    ({"nvcc": None, "nvcc_version": None}, "nvcc not found"),
    ({"nvcc_version": "12.8"}, "expected CUDA >= 13.0"),
    ({"cxx": None}, "C\\+\\+ compiler"),
    ({"free_gb": 12.0}, "expected at least 30 GB"),
])
def test_missing_prerequisites_fail_before_any_step(pin21: Pin, change: dict[str, object], text: str) -> None:
    with pytest.raises(BuildError, match=text):
        preflight(_plan(pin21), dataclasses.replace(GOOD, **change))  # type: ignore[arg-type]


def test_a_build_for_another_os_is_a_usage_error(pin21: Pin) -> None:
    with pytest.raises(UsageError, match="must run on linux"):
        preflight(_plan(pin21), dataclasses.replace(GOOD, os="windows"))


def test_probe_reads_this_machine(tmp_path: object) -> None:
    facts = probe(str(tmp_path) + "/not/yet/created")
    assert facts.cores >= 1 and facts.mem_gb > 0 and facts.free_gb > 0


def test_free_disk_is_reported_where_it_was_measured(pin21: Pin) -> None:
    low = dataclasses.replace(GOOD, free_gb=5.0)
    with pytest.raises(BuildError, match="GB free at /home/me/docker-work: expected at least 30 GB"):
        preflight(_plan(pin21), low, at="/home/me/docker-work")


def test_cuda_home_follows_an_nvcc_wrapper_to_its_toolkit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from g4build.builder.host import cuda_home_of

    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "bin").mkdir(parents=True)
    real = toolkit / "bin" / "nvcc"  # answers --dryrun the way nvcc does
    real.write_text(f"#!/bin/sh\necho '#$ TOP={toolkit}/bin/..' >&2\n")
    real.chmod(0o755)
    wrapper = tmp_path / "local" / "bin" / "nvcc"  # e.g. /usr/local/bin/nvcc: a script that execs the real one
    wrapper.parent.mkdir(parents=True)
    wrapper.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    assert cuda_home_of(str(wrapper)) == str(toolkit)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "chosen"))
    assert cuda_home_of(str(wrapper)) == str(tmp_path / "chosen")
