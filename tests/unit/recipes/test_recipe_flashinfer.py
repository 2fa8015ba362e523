"""FlashInfer in a launch: which switches reach it, whether a wheel brings it, what the rules and the launch plan
do with that. (The switches against the pinned sdists' own code: tests/integration/recipes.)"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from g4build.errors import RecipeError
from g4build.pins.model import load_pins
from g4build.recipes.flashinfer import FlashInferInfo, off_switches, requires_flashinfer, wheel_flashinfer
from g4build.recipes.model import Recipe, parse_recipe
from g4build.recipes.rules import CheckContext, Finding, WheelInfo, check
from g4build.recipes.script import plan_launch

PINS = load_pins()
KNOWN_GOOD = {"VLLM_USE_FLASHINFER_MOE_FP4": "0", "VLLM_NVFP4_GEMM_BACKEND": "flashinfer-cutlass",
              "VLLM_USE_FLASHINFER_SAMPLER": "1"}
WIN = "vllm-0.21.0+cu132-cp312-cp312-win_amd64.whl"
LINUX = "vllm-0.21.0-cp38-abi3-manylinux_2_24_x86_64.whl"
# METADATA as a Windows base build writes it: requirements/cuda.txt's FlashInfer pins limited to non-Windows
METADATA = """Metadata-Version: 2.4
Name: vllm
Version: 0.21.0
Requires-Dist: torch==2.11.0
Requires-Dist: flashinfer-python==0.6.8.post1; platform_system != "Windows"
Requires-Dist: flashinfer-cubin==0.6.8.post1; platform_system != "Windows"
Requires-Dist: winloop; platform_system == "Windows"
Provides-Extra: bench

Requires-Dist: flashinfer-python; this is the description, not a header
"""


def test_off_switches_of_the_known_good_env() -> None:
    got = {(s.name, s.value, s.was) for s in off_switches(KNOWN_GOOD)}
    assert got == {("VLLM_USE_FLASHINFER_SAMPLER", "0", "1"),
                   ("VLLM_NVFP4_GEMM_BACKEND", "cutlass", "flashinfer-cutlass")}


@pytest.mark.parametrize(("env", "names"), [
    ({}, ["VLLM_USE_FLASHINFER_SAMPLER"]),  # on by default in vLLM: unset still opens it
    ({"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NVFP4_GEMM_BACKEND": "cutlass"}, []),
    ({"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NVFP4_GEMM_BACKEND": "marlin"}, []),
    ({"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_USE_FLASHINFER_MOE_FP8": "1", "VLLM_ALLREDUCE_USE_FLASHINFER": "true",
      "VLLM_USE_FLASHINFER_MOE_FP4": "0"}, ["VLLM_USE_FLASHINFER_MOE_FP8", "VLLM_ALLREDUCE_USE_FLASHINFER"]),
    ({"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_NVFP4_GEMM_BACKEND": "flashinfer-trtllm"}, ["VLLM_NVFP4_GEMM_BACKEND"]),
])
def test_off_switches_only_touch_open_paths(env: dict[str, str], names: list[str]) -> None:
    assert [s.name for s in off_switches(env)] == names


def test_requires_dist_is_judged_for_the_wheels_own_platform() -> None:
    assert requires_flashinfer(METADATA, WIN) is None
    assert requires_flashinfer(METADATA, LINUX) == 'flashinfer-python==0.6.8.post1; platform_system != "Windows"'
    extra = "Name: vllm\nRequires-Dist: flashinfer-python==0.6.8.post1; extra == \"flashinfer\"\n"
    assert requires_flashinfer(extra, LINUX) is None  # only with the extra


def test_wheel_flashinfer_reads_the_manifest_first() -> None:
    absent = wheel_flashinfer(WIN, METADATA, None)
    assert absent.presence == "absent" and "requires no flashinfer-python for its platform" in absent.why
    assert wheel_flashinfer(LINUX, METADATA, None).presence == "present"
    none = wheel_flashinfer(WIN, METADATA, {"flashinfer": {"source": "none"}})
    assert none.presence == "absent" and none.why.endswith("and its build recorded no FlashInfer wheels")
    files = ["flashinfer_python-0.6.8.post1-py3-none-any.whl"]
    given = wheel_flashinfer(WIN, METADATA, {"flashinfer": {"source": "wheels",
                                                           "wheels": [{"file": files[0], "sha256": "0" * 64}]}})
    assert (given.presence, given.wheels) == ("present", tuple(files))
    assert wheel_flashinfer(WIN, "", None).presence == "unknown"  # no METADATA: nothing to judge by


def _recipe(base: dict[str, Any], **changes: Any) -> Recipe:
    return parse_recipe({**base, **changes}, "test.yaml")


def _ctx(presence: str, why: str = "its METADATA requires no flashinfer-python for its platform") -> CheckContext:
    info = FlashInferInfo(presence=presence, why=why)  # type: ignore[arg-type]
    return CheckContext(pin=PINS.get("vllm-0.21.0"), known_pins=tuple(PINS.pins),
                        wheel=WheelInfo(file=WIN, pin=None, flashinfer=info) if presence != "unknown" else None)


def _found(findings: tuple[Finding, ...], rule: str, severity: str) -> list[Finding]:
    return [f for f in findings if f.rule == rule and f.severity == severity]


def test_rule_says_which_case_applies(base_data: dict[str, Any]) -> None:
    r = _recipe(base_data, env=KNOWN_GOOD)
    [absent] = _found(check(r, _ctx("absent")), "flashinfer", "info")
    assert absent.message.startswith(f"FlashInfer: absent from {WIN} (its METADATA requires no flashinfer-python")
    assert "the launch script sets VLLM_USE_FLASHINFER_SAMPLER=0, VLLM_NVFP4_GEMM_BACKEND=cutlass" in absent.message
    [unknown] = _found(check(r, _ctx("unknown")), "flashinfer", "info")
    assert "checks at start that flashinfer is importable" in unknown.message
    assert not _found(check(r, _ctx("absent")), "flashinfer", "error")


def test_a_flashinfer_backend_without_flashinfer_is_an_error(base_data: dict[str, Any]) -> None:
    spec = {"method": "dflash", "model": "d", "num_speculative_tokens": 15, "attention_backend": "FLASHINFER"}
    r = _recipe(base_data, speculative=spec, args={**base_data["args"], "attention-backend": "flashinfer"})
    errors = _found(check(r, _ctx("absent")), "flashinfer", "error")
    assert [e.message.split(" needs")[0] for e in errors] == ["--attention-backend flashinfer",
                                                              "speculative attention_backend FLASHINFER"]
    assert "--flashinfer-wheel" in errors[0].hint
    assert not _found(check(r, _ctx("present")), "flashinfer", "error")


def test_mm_processor_cache_rule(base_data: dict[str, Any]) -> None:
    warned = _found(check(_recipe(base_data), _ctx("unknown")), "mm-processor-cache", "warning")
    assert warned and warned[0].hint == "--set args.mm-processor-cache-gb=0"
    fixed = _recipe(base_data, args={**base_data["args"], "mm-processor-cache-gb": 0})
    assert not _found(check(fixed, _ctx("unknown")), "mm-processor-cache", "warning")
    later = dataclasses.replace(_ctx("unknown"), pin=PINS.get("vllm-0.33.0"))
    assert not _found(check(_recipe(base_data), later), "mm-processor-cache", "warning")


def test_launch_plan_turns_the_switches_off_for_a_wheel_without_flashinfer(base_data: dict[str, Any]) -> None:
    r = _recipe(base_data, env={**KNOWN_GOOD, "X": "1"})
    absent = FlashInferInfo(presence="absent", why="w")
    plan = plan_launch(r, flashinfer=absent)
    assert plan.env == (("VLLM_USE_FLASHINFER_MOE_FP4", "0"), ("VLLM_NVFP4_GEMM_BACKEND", "cutlass"),
                        ("VLLM_USE_FLASHINFER_SAMPLER", "0"), ("X", "1"))
    assert not plan.probe_flashinfer
    unknown = plan_launch(r)
    assert dict(unknown.env)["VLLM_USE_FLASHINFER_SAMPLER"] == "1" and unknown.probe_flashinfer
    unset = plan_launch(_recipe(base_data, env={"X": "1"}), flashinfer=absent)
    assert unset.env == (("X", "1"), ("VLLM_USE_FLASHINFER_SAMPLER", "0"))  # vLLM's default closed too
    with pytest.raises(RecipeError, match=r"--set env.VLLM_USE_FLASHINFER_SAMPLER opens a FlashInfer path, but the "
                                          r"wheel does not bring FlashInfer \(w\)"):
        plan_launch(r, flashinfer=absent, overrides=["env.VLLM_USE_FLASHINFER_SAMPLER=1"])
