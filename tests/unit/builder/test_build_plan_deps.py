"""Build series in the plan, the wheel version and the manifest (the real patches/deps data)."""

from __future__ import annotations

import hashlib
import json

import pytest

from g4build.builder.plan import base_os_of
from g4build.builder.planner import default_layout, make_plan
from g4build.emit.manifest import make_manifest
from g4build.pins.model import Pin, load_pins
from g4build.series.deps import build_series_for, load_all_build, uncovered

from .conftest import OPTS, run_cli, target


def _plan(pin: Pin, os_name: str = "linux"):  # type: ignore[no-untyped-def]
    """As `g4build wheel` plans: the build series of the pin (on an OS base tree, the dependency ones)."""
    t = target(os_name)
    lay = default_layout(pin, t, base="/home/u/.cache/g4build")
    base_os = base_os_of(pin, os_name)
    return make_plan(pin, [], t, layout=lay, opts=OPTS, build=build_series_for(pin, base_os=base_os),
                     uncovered=uncovered(pin, base_os=base_os))


@pytest.mark.parametrize("os_name", ["linux", "wsl"])
def test_each_build_series_is_a_step_after_the_prefetch(pin21: Pin, os_name: str) -> None:
    plan = _plan(pin21, os_name)
    names = [s.name for s in plan.steps]
    assert names.index("prefetch") + 1 == names.index("deps-vllm-flash-attn")
    assert names.index("deps-vllm-flash-attn") + 1 == names.index("deps-vllm-kernel-archs") < names.index("vllm")
    assert "patch vllm: vllm-kernel-archs v4" in plan.step("deps-vllm-kernel-archs").title
    step = plan.step("deps-vllm-flash-attn")
    lay = plan.layout
    assert step.command[1:] == ("deps", "apply", "--pin", "vllm-0.21.0", "--tree", lay.src, "--series",
                                "vllm-flash-attn", "--cache", lay.cache, "--write", lay.deps_file)
    assert not step.resumable  # a prefetch that ran again rewrote the initial cache: always point it again
    assert "vllm-flash-attn @ f5bc33cfc02c" in step.title


def test_the_windows_base_takes_the_dependency_series_only_and_says_so(pin21: Pin) -> None:
    """The fork declares vllm-flash-attn at the pin's commit (checked when applying): its FA2-for-the-arch patch
    applies there too, or the Windows wheel's FA2 is 8.0+PTX and fails validate --arch sm120. vLLM's own CMake is
    the fork's: vllm-kernel-archs is left out, and the notes say so."""
    plan = _plan(pin21, "windows")
    names = [s.name for s in plan.steps]
    assert names.index("prefetch") + 1 == names.index("deps-vllm-flash-attn") and "deps-vllm-kernel-archs" not in names
    assert [b["name"] for b in plan.to_dict()["build_series"]] == ["vllm-flash-attn"]
    notes = [n for n in plan.notes if "vllm-0.21.0's windows base tree" in n]
    assert len(notes) == 1 and "vllm-kernel-archs" in notes[0]


def test_plan_json_lists_the_build_series_with_patch_sha256(pin21: Pin) -> None:
    record, _ = _plan(pin21).to_dict()["build_series"]
    series, _ = load_all_build()
    patches = series.series.patches_for(pin21.name)
    assert [p.file for p in patches] == ["vllm-0.21.0/0001-fa2-requested-archs-fa3-hopper-only.patch",
                                         "vllm-0.21.0/0002-fa2-only-when-asked.patch",
                                         "vllm-0.21.0/0003-fa2-head-dims.patch"]
    assert record == {"name": "vllm-flash-attn", "version": series.version, "project": "vllm-flash-attn",
                      "commit": "f5bc33cfc02c744d24a2e9d50e6db656de40611c",
                      "patches": [{"file": p.file, "subject": p.subject,
                                   "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in patches]}


def test_build_series_are_part_of_the_wheel_version_and_the_manifest_agrees(pin21: Pin) -> None:
    with_build = _plan(pin21)
    t = target("linux")
    without = make_plan(pin21, [], t, layout=default_layout(pin21, t, base="/x"), opts=OPTS)
    assert with_build.version != without.version
    manifest = make_manifest(pin21, [], route="build", build=build_series_for(pin21))
    assert with_build.version.endswith(f".g4.{manifest['digest']}")  # what validate compares
    assert manifest["build_series"] == list(with_build.build_series)
    assert manifest["series"] == []  # build series are not series: validate never looks for their fingerprints


def test_a_pin_without_a_variant_says_what_its_build_lacks(pin33: Pin) -> None:
    plan = _plan(pin33)
    assert not [s for s in plan.steps if s.name.startswith("deps-")] and plan.build_series == ()
    assert any("vllm-flash-attn has no variant for vllm-0.33.0" in n for n in plan.notes)
    assert any("vllm-kernel-archs has no variant for vllm-0.33.0" in n for n in plan.notes)


@pytest.mark.parametrize(("pin_name", "covered", "lacking"), [
    ("vllm-0.26.0", ["vllm-flash-attn"], ["vllm-kernel-archs"]),  # 0.26.0's FA commit has a variant
    ("vllm-0.29.0", [], ["vllm-flash-attn", "vllm-kernel-archs"]),  # its FA commit could not be read
])
def test_the_new_pins_build_what_has_a_variant_and_say_what_not(pin_name: str, covered: list[str],
                                                                lacking: list[str]) -> None:
    plan = _plan(load_pins().get(pin_name))
    assert [s.name for s in plan.steps if s.name.startswith("deps-")] == [f"deps-{n}" for n in covered]
    assert [b["name"] for b in plan.build_series] == covered
    for name in lacking:
        assert any(f"{name} has no variant for {pin_name}" in n for n in plan.notes), plan.notes


def test_wheel_dry_run_json_lists_the_build_series(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["wheel", "--arch", "sm120", "--os", "linux", "--no-flashinfer", "--dry-run", "--json"],
                           capsys)
    assert code == 0
    data = json.loads(out)
    assert [b["name"] for b in data["build_series"]] == ["vllm-flash-attn", "vllm-kernel-archs"]
    assert "deps-vllm-flash-attn" in [s["name"] for s in data["steps"]]


def test_deps_list_json_names_project_commit_and_patches(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["deps", "list", "--json"], capsys)
    assert code == 0
    fa, kernels = json.loads(out)["build_series"]
    assert fa["project"] == "vllm-flash-attn" and fa["python_only"] is False
    assert fa["commits"] == {"vllm-0.21.0": "f5bc33cfc02c744d24a2e9d50e6db656de40611c",
                             "vllm-0.26.0": "caaa4eb59845388a20b1f435ecaafb4bd9517ad8"}
    assert kernels["project"] == "vllm" and kernels["commits"] == {"vllm-0.21.0": None}
    assert {d["decision"] for d in kernels["decisions"]} == {"keep", "patch", "dependency-series"}
