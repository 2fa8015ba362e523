"""--kernels and --flash-attn: what the plan passes to CMake, prints and the manifest step records; what is refused.

The CMake side (the build series reading G4B_FLASH_ATTN / G4B_KERNEL_PROFILE) is judged by real CMake configures
in tests/integration/builder; here the plan's half: the variables reach CMAKE_ARGS (vLLM's setup.py hands them to
CMake, and FetchContent's sub-builds see them), the manifest step carries the choice, and the defaults change
nothing."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from tests.support.wheelsfactory import build_wheel

from g4build.builder.kernels import build_option_args
from g4build.builder.plan import Options
from g4build.builder.planner import default_layout, make_plan
from g4build.errors import UsageError
from g4build.pins.model import Pin
from g4build.series.deps import build_series_for

from .conftest import OPTS, run_cli, target


def _plan(pin: Pin, opts: Options, arch: str = "sm90", os_name: str = "linux"):  # type: ignore[no-untyped-def]
    t = target(os_name, arch, "13.0")
    return make_plan(pin, [], t, layout=default_layout(pin, t, base="/home/u/.cache/g4build"), opts=opts,
                     build=build_series_for(pin))


def test_defaults_leave_cmake_args_as_they_were(pin21: Pin) -> None:
    plan = _plan(pin21, OPTS)
    assert plan.env["CMAKE_ARGS"] == f"-C {plan.layout.deps_file}"
    assert "G4B_" not in json.dumps(plan.to_dict()["env"])
    manifest = plan.step("manifest").command
    assert manifest[manifest.index("--kernels") + 1] == "all" and manifest[manifest.index("--flash-attn") + 1] == "all"
    assert not any(n.startswith(("kernel profile", "FlashAttention 2 alone")) for n in plan.notes)


def test_options_reach_cmake_the_notes_and_the_manifest_step(pin21: Pin) -> None:
    plan = _plan(pin21, dataclasses.replace(OPTS, kernels="gemma4", flash_attn="2"))
    args = plan.env["CMAKE_ARGS"].split()
    assert args[:2] == ["-C", plan.layout.deps_file]  # the dependency cache stays first
    assert "-DG4B_KERNEL_PROFILE=gemma4" in args and "-DG4B_FLASH_ATTN=2" in args
    assert "-DG4B_FA2_HEADDIMS=128;256" in args  # one CMake list word: vLLM's setup.py splits CMAKE_ARGS on spaces
    assert any("FlashAttention 2 for head dims 128, 256 only" in n for n in plan.notes)
    manifest = plan.step("manifest").command
    assert manifest[manifest.index("--kernels") + 1] == "gemma4"
    assert manifest[manifest.index("--flash-attn") + 1] == "2"
    assert any(n.startswith("kernel profile gemma4") for n in plan.notes)
    assert any(n.startswith("FlashAttention 2 alone") for n in plan.notes)


def test_options_survive_the_compiler_cache(pin21: Pin) -> None:
    """The compiler cache rewrites CMAKE_ARGS with its launchers: the options must still be there after it."""
    plan = _plan(pin21, dataclasses.replace(OPTS, kernels="gemma4", flash_attn="2", launcher="sccache"))
    args = plan.env["CMAKE_ARGS"].split()
    assert "-DCMAKE_CUDA_COMPILER_LAUNCHER=sccache" in args
    assert "-DG4B_KERNEL_PROFILE=gemma4" in args and "-DG4B_FLASH_ATTN=2" in args


@pytest.mark.parametrize(("kernels", "flash_attn", "expected"), [
    ("all", "all", ""), ("gemma4", "all", "-DG4B_KERNEL_PROFILE=gemma4 -DG4B_FA2_HEADDIMS=128;256"),
    ("all", "2", "-DG4B_FLASH_ATTN=2"),
])
def test_build_option_args(kernels: str, flash_attn: str, expected: str) -> None:
    assert build_option_args(kernels, flash_attn) == expected


@pytest.mark.parametrize(("field", "value", "flag"), [("kernels", "gemma5", "--kernels"),
                                                       ("flash_attn", "3", "--flash-attn")])
def test_unknown_choice_is_refused_before_any_step(pin21: Pin, field: str, value: str, flag: str) -> None:
    with pytest.raises(UsageError, match=f"{flag} '{value}': expected one of"):
        _plan(pin21, dataclasses.replace(OPTS, **{field: value}))


def test_cli_refuses_an_unknown_profile_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["wheel", "--arch", "sm90", "--os", "linux", "--no-flashinfer", "--kernels", "tiny",
                            "--dry-run"], capsys)
    assert code == 2 and "--kernels 'tiny': expected one of auto, all, gemma4" in err


def test_cli_plan_json_carries_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["wheel", "--arch", "sm90", "--os", "linux", "--no-flashinfer", "--kernels", "GEMMA4",
                            "--flash-attn", "2", "--dry-run", "--json"], capsys)
    assert code == 0
    plan = json.loads(out)
    assert "-DG4B_KERNEL_PROFILE=gemma4" in plan["env"]["CMAKE_ARGS"]
    manifest = next(s for s in plan["steps"] if s["name"] == "manifest")["command"]
    assert manifest[manifest.index("--kernels") + 1] == "gemma4"


def test_manifest_records_the_options_or_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "wheels"
    build_wheel(out, version="0.21.0+cu130", tag="cp312-cp312-linux_x86_64")  # the vLLM wheel it stamps
    base = ["manifest", "--pin", "vllm-0.21.0", "--out", str(out), "--os", "linux", "--json"]
    code, stdout, _ = run_cli([*base, "--kernels", "gemma4", "--flash-attn", "2"], capsys)
    assert code == 0
    assert json.loads(stdout)["manifest"]["build_options"] == {"kernels": "gemma4", "flash_attn": "2"}
    on_disk = json.loads((out / "build-manifest.json").read_text())
    assert on_disk["build_options"] == {"kernels": "gemma4", "flash_attn": "2"}
    code, stdout, _ = run_cli(base, capsys)  # an older plan's manifest step: nothing claimed
    assert code == 0 and "build_options" not in json.loads(stdout)["manifest"]
    code, _, err = run_cli([*base, "--kernels", "none"], capsys)
    assert code == 2 and "--kernels 'none'" in err


def _cli_plan(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    code, out, err = run_cli(["wheel", *args, "--no-flashinfer", "--dry-run", "--json"], capsys)
    return code, (json.loads(out) if code == 0 else {}), err


def _profile_of(plan: dict) -> str:  # type: ignore[type-arg]
    manifest = next(s for s in plan["steps"] if s["name"] == "manifest")["command"]
    return str(manifest[manifest.index("--kernels") + 1])


def test_auto_is_gemma4_for_sm120_and_all_elsewhere(capsys: pytest.CaptureFixture[str]) -> None:
    """The default (--kernels auto) resolves in the plan: CMake, the manifest step, the notes and the estimate all
    see the resolved profile, never "auto"."""
    code, plan, _ = _cli_plan(capsys, "--arch", "sm120", "--os", "linux", "--jobs", "16")
    assert code == 0 and _profile_of(plan) == "gemma4"
    assert "-DG4B_KERNEL_PROFILE=gemma4" in plan["env"]["CMAKE_ARGS"]
    assert any(n.startswith("kernel profile gemma4: the default for sm120 (--kernels auto)") for n in plan["notes"])
    assert "12,442 CPU-seconds" in plan["estimate"]
    assert "auto" not in plan["env"]["CMAKE_ARGS"]
    code, plan, _ = _cli_plan(capsys, "--arch", "sm90", "--os", "linux")
    assert code == 0 and _profile_of(plan) == "all" and "G4B_KERNEL_PROFILE" not in plan["env"]["CMAKE_ARGS"]
    assert not any(n.startswith("kernel profile") for n in plan["notes"])
    code, plan, _ = _cli_plan(capsys, "--arch", "sm120", "--os", "linux", "--kernels", "all", "--jobs", "16")
    assert code == 0 and _profile_of(plan) == "all" and "18,094 CPU-seconds" in plan["estimate"]


def test_a_tree_without_the_profiles_series_gets_all_by_default_and_refuses_it_by_name(
        capsys: pytest.CaptureFixture[str]) -> None:
    """vllm-kernel-archs (which implements G4B_KERNEL_PROFILE) has no variant for 0.21.0's Windows base tree: the
    plan once said `kernel profile gemma4`, passed the variable to a CMake that never reads it and quoted gemma4's
    compile work, while every vLLM kernel was built."""
    code, plan, _ = _cli_plan(capsys, "--arch", "sm120", "--os", "windows", "--jobs", "16")
    assert code == 0 and _profile_of(plan) == "all" and "G4B_KERNEL_PROFILE" not in plan["env"]["CMAKE_ARGS"]
    (note,) = [n for n in plan["notes"] if n.startswith("kernel profile all (--kernels auto)")]
    assert "vllm-kernel-archs" in note and "windows base tree" in note
    assert "18,094 CPU-seconds" in plan["estimate"]
    code, _, err = _cli_plan(capsys, "--arch", "sm120", "--os", "windows", "--kernels", "gemma4")
    assert code == 2
    assert "--kernels gemma4: the build series vllm-kernel-archs" in err and "windows base tree" in err
    assert "--os wsl" in err
    code, plan, _ = _cli_plan(capsys, "--arch", "sm120", "--os", "wsl", "--kernels", "gemma4")
    assert code == 0 and _profile_of(plan) == "gemma4"


def test_the_wheel_version_names_a_build_of_fewer_kernels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With gemma4 sm120's default, the fix its errors give ("rebuild with --kernels all") once made a wheel of the
    very version already installed: a launch script skips a version it finds installed, pip calls it satisfied,
    and the two wheels overwrite each other in --out. The label names what was left out; `all` keeps its version."""
    common = ("--arch", "sm120", "--os", "linux", "--jobs", "16")
    versions = {}
    for kernels, flash_attn in (("auto", "all"), ("all", "all"), ("all", "2"), ("gemma4", "2")):
        code, plan, _ = _cli_plan(capsys, *common, "--kernels", kernels, "--flash-attn", flash_attn)
        assert code == 0
        versions[kernels, flash_attn] = version = plan["target"]["version"]
        (vllm,) = [s for s in plan["steps"] if s["name"] == "vllm"]
        assert plan["env"]["SETUPTOOLS_SCM_PRETEND_VERSION"] == version
        assert next(s for s in plan["steps"] if s["name"] == "validate")["command"][2].endswith(
            f"vllm-{version}-*.whl") and vllm
    label = versions["all", "all"].split("+")[1]
    assert label.startswith("cu130.g4.")  # unchanged: the wheels built and recorded before keep their names
    assert versions["auto", "all"] == "0.21.0+" + label.replace("cu130.", "cu130.gemma4.")
    assert versions["all", "2"] == "0.21.0+" + label.replace("cu130.", "cu130.fa2.")
    assert versions["gemma4", "2"] == "0.21.0+" + label.replace("cu130.", "cu130.gemma4.fa2.")
    # the manifest step stamps the wheel of its own options, and validate's label check holds for it
    out = tmp_path / "wheels"
    gemma4 = build_wheel(out, version=versions["auto", "all"], tag="cp38-abi3-linux_x86_64")
    whole = build_wheel(out, version=versions["all", "all"], tag="cp38-abi3-linux_x86_64")
    before = whole.read_bytes()
    code, stdout, _ = run_cli(["manifest", "--pin", "vllm-0.21.0", "--out", str(out), "--os", "linux", "--arch",
                               "sm120", "--cuda", "13.0", "--kernels", "gemma4", "--flash-attn", "all", "--json"],
                              capsys)
    assert code == 0 and json.loads(stdout)["wheels_stamped"] == [gemma4.name]
    assert whole.read_bytes() == before
    stamped = next(out.glob(f"vllm-{versions['auto', 'all']}-*.whl"))
    code, stdout, _ = run_cli(["validate", str(stamped), "--pin", "vllm-0.21.0", "--json"], capsys)
    (report,) = json.loads(stdout)["wheels"]
    (metadata,) = [c for c in report["checks"] if c["name"] == "metadata"]
    assert metadata["ok"], metadata


def test_a_pin_without_the_profiles_series_is_told_which_pins_have_it(capsys: pytest.CaptureFixture[str]) -> None:
    """vllm-kernel-archs has a variant for vllm-0.21.0 only: for 0.26.0 (any OS) the way out is that pin, not WSL
    (which has no variant of it either); only 0.21.0's Windows base tree is told about --os wsl."""
    for os_name in ("wsl", "linux"):
        code, _, err = _cli_plan(capsys, "--arch", "sm120", "--os", os_name, "--pin", "vllm-0.26.0", "--kernels",
                                 "gemma4")
        assert code == 2 and "has no variant for vllm-0.26.0" in err
        assert "--os wsl" not in err and "--pin vllm-0.21.0" in err
        code, plan, _ = _cli_plan(capsys, "--arch", "sm120", "--os", os_name, "--pin", "vllm-0.26.0")
        (note,) = [n for n in plan["notes"] if n.startswith("kernel profile all (--kernels auto)")]
        assert "has no variant for vllm-0.26.0" in note and "--pin vllm-0.21.0" in note
        assert code == 0 and _profile_of(plan) == "all" and "18,094 CPU-seconds" in plan["estimate"]
    code, _, err = _cli_plan(capsys, "--arch", "sm120", "--os", "windows", "--kernels", "gemma4")
    assert code == 2 and "--os wsl" in err
    code, plan, _ = _cli_plan(capsys, "--arch", "sm120", "--os", "windows")
    (note,) = [n for n in plan["notes"] if n.startswith("kernel profile all (--kernels auto)")]
    assert "--os wsl" in note


def test_the_manifest_step_names_only_the_profiles_it_records(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`manifest --kernels` records the profile a build resolved: `auto` is refused there, and its error must not
    list auto among the choices it expects (it once said "--kernels 'auto': expected one of auto, all, gemma4")."""
    out = tmp_path / "wheels"
    build_wheel(out, version="0.21.0+cu130", tag="cp312-cp312-linux_x86_64")
    for value in ("auto", "tiny"):
        code, _, err = run_cli(["manifest", "--pin", "vllm-0.21.0", "--out", str(out), "--kernels", value], capsys)
        assert code == 2 and f"--kernels {value!r}: expected one of all, gemma4" in " ".join(err.split())
        assert "auto (the default)" not in err
    assert not (out / "build-manifest.json").exists()


def test_flash_attn_2_on_a_pin_without_its_series_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """vllm-flash-attn (which reads G4B_FLASH_ATTN) has no variant for vllm-0.29.0 or 0.33.0: `--flash-attn 2`
    there printed "no FA3 even for a Hopper arch", recorded flash_attn 2 in the manifest and passed the variable
    to a CMake that never reads it, while FA3 was compiled: the same claim --kernels gemma4 is refused for."""
    for pin in ("vllm-0.29.0", "vllm-0.33.0"):
        code, _, err = _cli_plan(capsys, "--arch", "sm90", "--os", "linux", "--pin", pin, "--flash-attn", "2")
        assert code == 2, err
        text = " ".join(err.split())
        assert "--flash-attn 2: the build series vllm-flash-attn" in text and f"has no variant for {pin}" in text
        assert "--pin vllm-0.21.0 or --pin vllm-0.26.0" in text
        code, plan, _ = _cli_plan(capsys, "--arch", "sm90", "--os", "linux", "--pin", pin)  # the default: fine
        assert code == 0 and "G4B_FLASH_ATTN" not in plan["env"]["CMAKE_ARGS"]
    code, plan, _ = _cli_plan(capsys, "--arch", "sm90", "--os", "linux", "--pin", "vllm-0.26.0", "--flash-attn", "2")
    assert code == 0 and "-DG4B_FLASH_ATTN=2" in plan["env"]["CMAKE_ARGS"]
