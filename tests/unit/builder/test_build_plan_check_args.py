"""The build plan's manifest and validate steps carry the arguments that scope them, for every target: the
manifest step ``--cuda`` (with it the wheel's version is known and only this build's wheel is stamped; without
it every vLLM wheel in --out, earlier builds' too, would carry this build's manifest), the validate step
``--pin`` (without it a wheel of another pin passes the version and series checks). Each step's own command line
is run here through the real CLI, on real wheels, with and without the argument."""

from __future__ import annotations

import itertools
import json
import zipfile
from pathlib import Path

import pytest
from tests.support.wheelsfactory import PRISTINE, build_wheel

from g4build.builder.plan import BuildPlan, base_os_of
from g4build.builder.planner import default_layout, make_plan
from g4build.builder.request import series_for
from g4build.emit.manifest import make_manifest
from g4build.pins.model import Pin
from g4build.series.deps import build_series_for
from g4build.wheelfile.manifestfile import MANIFEST_NAME, dumps

from .conftest import OPTS, run_cli, target
from .test_build_plan import COMBOS


def _plan(pin: Pin, os_name: str = "linux", arch: str = "sm120", cuda: str = "13.0") -> BuildPlan:
    t = target(os_name, arch, cuda)
    # as `g4build wheel` plans it (builder.request.plan_wheel): the pin's series and build series
    return make_plan(pin, series_for(pin), t, layout=default_layout(pin, t, base="/home/u/.cache/g4build"),
                     opts=OPTS, build=build_series_for(pin, base_os=base_os_of(pin, os_name)))


def _pairs(command: tuple[str, ...]) -> set[tuple[str, str]]:
    return set(itertools.pairwise(command))


@pytest.mark.parametrize(("os_name", "arch", "cuda"), COMBOS)
def test_the_manifest_step_carries_cuda_and_validate_the_pin(pin21: Pin, os_name: str, arch: str,
                                                             cuda: str) -> None:
    plan = _plan(pin21, os_name, arch, cuda)
    manifest = plan.step("manifest").command
    assert {("--cuda", cuda), ("--pin", pin21.name), ("--os", os_name)} <= _pairs(manifest)
    assert ("--pin", pin21.name) in _pairs(plan.step("validate").command)


def _argv(command: tuple[str, ...], verb: str, replace: dict[str, str], drop: str | None = None) -> list[str]:
    """The step's own arguments after ``verb``, with paths of this machine, and ``drop`` (an option and its
    value) left out."""
    args = list(command[command.index(verb):])
    if drop is not None:
        at = args.index(drop)
        del args[at:at + 2]
    return [replace.get(a, a) for a in args]


def test_without_cuda_the_manifest_step_would_stamp_an_earlier_builds_wheel(
        tmp_path: Path, pin21: Pin, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _plan(pin21)
    command = plan.step("manifest").command
    paths = {plan.layout.out: "", plan.layout.state_file: str(tmp_path / "state.json")}
    for dropped in (None, "--cuda"):
        out = tmp_path / f"out-{dropped or 'plan'}"
        mine = build_wheel(out, version=plan.version, tag="cp312-cp312-linux_x86_64")
        earlier = build_wheel(out, version="0.21.0+cu129.g4.0123abcd", tag="cp312-cp312-linux_x86_64")
        before = earlier.read_bytes()
        argv = _argv(command, "manifest", {**paths, plan.layout.out: str(out)}, dropped)
        code, _, err = run_cli(argv, capsys)
        assert code == 0, err
        with zipfile.ZipFile(mine) as zf:  # this build's wheel carries the manifest either way
            assert f"vllm-{plan.version}.dist-info/{MANIFEST_NAME}" in zf.namelist()
        if dropped is None:
            assert earlier.read_bytes() == before  # the plan's step leaves an earlier build's wheel alone
        else:  # what --cuda prevents: the earlier wheel rewritten to claim this build's manifest
            with zipfile.ZipFile(earlier) as zf:
                assert f"vllm-0.21.0+cu129.g4.0123abcd.dist-info/{MANIFEST_NAME}" in zf.namelist()


def test_without_pin_the_validate_step_would_pass_another_pins_wheel(
        tmp_path: Path, pin21: Pin, pin33: Pin, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _plan(pin33)  # a 0.33.0 build's validate step, given a wheel made for vllm-0.21.0
    manifest = make_manifest(pin21, [], route="build")
    version = f"0.21.0+cu130.g4.{manifest['digest']}"
    wheel = build_wheel(tmp_path, {**PRISTINE, f"vllm-{version}.dist-info/{MANIFEST_NAME}": dumps(manifest)},
                        version=version)
    command = plan.step("validate").command
    wheel_arg = command[command.index("validate") + 1]

    def checks(drop: str | None) -> dict[str, bool]:
        argv = [*_argv(command, "validate", {wheel_arg: str(wheel)}, drop), "--no-cuobjdump", "--json"]
        code, out, _ = run_cli(argv, capsys)
        assert code == 10  # a wheel without sm_120 code fails either way: the checks below are what differ
        return {c["name"]: c["ok"] for c in json.loads(out)["wheels"][0]["checks"]}

    with_pin, without = checks(None), checks("--pin")
    assert not with_pin["series"] and not with_pin["metadata"]
    assert without["series"] and without["metadata"]
