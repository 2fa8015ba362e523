"""Verdicts that fail closed: a series claim whose fingerprints cannot be looked up, and an arch verdict no tool
cross-checked, are no pass (hostile input, round 3)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.support.wheelsfactory import DFLASH_NEW, PRISTINE, build_wheel, container, elf, entry, run_g4build

from g4build.validate.fatbin import Arch
from g4build.validate.wheel import ValidateOptions, validate_wheel

DIGEST = "0123456789ab"
VERSION = f"0.21.0+g4.{DIGEST}"
DIST = f"vllm-{VERSION}.dist-info"


def _claiming(out: Path, pin: dict[str, Any] | None, series: str = "alpha") -> Path:
    """A wheel whose build-manifest.json (listed in RECORD) claims ``series`` for ``pin``; its files carry the
    alpha series' fingerprint, so only the pin decides."""
    manifest: dict[str, Any] = {"schema": 1, "series": [{"name": series, "version": 1}], "digest": DIGEST,
                                "route": "overlay"}
    if pin is not None:
        manifest["pin"] = pin
    files: dict[str, str | bytes] = {**PRISTINE, "vllm/spec/dflash.py": DFLASH_NEW,
                                     f"{DIST}/build-manifest.json": json.dumps(manifest)}
    return build_wheel(out, files, version=VERSION)


def _series(wheel: Path, pin: str | None = None) -> tuple[bool, str]:
    (check,) = [c for c in validate_wheel(wheel, ValidateOptions(pin=pin)).checks if c.name == "series"]
    return check.ok, check.detail


def test_a_claim_for_the_known_pin_is_checked_and_passes(tmp_path: Path, project: Path) -> None:
    ok, detail = _series(_claiming(tmp_path, {"name": "vllm-0.21.0"}))
    assert ok and detail == "fingerprints present: alpha v1", detail


@pytest.mark.parametrize(("pin", "named"), [
    ({"name": "vllm-9.9.9"}, "an unknown pin 'vllm-9.9.9'"),
    ({"name": ""}, "no pin"),
    (None, "no pin"),
])
def test_a_claim_without_a_known_pin_fails(tmp_path: Path, project: Path, pin: dict[str, Any] | None,
                                           named: str) -> None:
    ok, detail = _series(_claiming(tmp_path, pin))
    assert not ok
    assert f"the wheel claims series alpha but names {named}" in detail and "cannot be checked" in detail


def test_a_series_without_a_variant_for_the_named_pin_fails(tmp_path: Path, project: Path) -> None:
    # vllm-0.33.0 is a pin of the project; the test series has a variant for vllm-0.21.0 only
    ok, detail = _series(_claiming(tmp_path, {"name": "vllm-0.33.0"}))
    assert not ok and "series alpha has no variant for pin vllm-0.33.0" in detail, detail


NATIVE = elf({".nv_fatbin": container(entry(2, 120, b"cubin"))})


def test_an_arch_verdict_no_tool_checked_fails_unless_the_headers_are_trusted(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, {**PRISTINE, "vllm/_C.abi3.so": NATIVE})
    sm120 = (Arch.parse("sm120"),)
    failed = {c.name: c.detail for c in validate_wheel(wheel, ValidateOptions(archs=sm120)).failures()}
    assert list(failed) == ["verdict sm_120"]
    assert "by the fatbin headers alone: no cuobjdump cross-checked them" in failed["verdict sm_120"]
    assert "--trust-fatbin" in failed["verdict sm_120"]
    trusted = validate_wheel(wheel, ValidateOptions(archs=sm120, trust_fatbin=True))
    assert trusted.ok
    (verdict,) = [c for c in trusted.checks if c.name == "verdict sm_120"]
    assert "fatbin headers alone" in verdict.detail and "--trust-fatbin accepts them" in verdict.detail


def test_the_cli_fails_the_arch_without_cuobjdump_and_passes_it_with_trust_fatbin(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, {**PRISTINE, "vllm/_C.abi3.so": NATIVE})
    done = run_g4build("validate", str(wheel), "--arch", "sm120", "--no-cuobjdump", "--json")
    assert done.returncode == 10, done.stderr
    checks = {c["name"]: c for c in json.loads(done.stdout)["wheels"][0]["checks"]}
    assert not checks["verdict sm_120"]["ok"] and "--trust-fatbin" in done.stderr
    done = run_g4build("validate", str(wheel), "--arch", "sm120", "--no-cuobjdump", "--trust-fatbin", "--json")
    assert done.returncode == 0, done.stderr
