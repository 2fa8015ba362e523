"""What a wheel claims, held against what it holds, on small real wheels: the pin its build-manifest.json names,
the files its series' fingerprints live in, and the libraries vLLM uses only on some GPU generations."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.wheelsfactory import PRISTINE, build_wheel, container, elf, entry

from g4build.emit.manifest import make_manifest
from g4build.overlay.wheel import overlay_wheel, plan_overlay
from g4build.pins.model import load_pins
from g4build.series.model import load_all
from g4build.validate.fatbin import Arch
from g4build.validate.wheel import ValidateOptions, validate_wheel
from g4build.wheelfile.manifestfile import dumps

FA3 = "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"
FLASHMLA = "vllm/_flashmla_C.abi3.so"


def _overlaid(tmp_path: Path) -> Path:
    """A wheel that claims the test project's series alpha and beta for pin vllm-0.21.0 (its manifest says so)."""
    plan = plan_overlay(load_pins().get("vllm-0.21.0"), load_all())
    return overlay_wheel(build_wheel(tmp_path / "in"), plan, tmp_path / "out").wheel


def _checks(wheel: Path, options: ValidateOptions) -> dict[str, tuple[bool, str]]:
    return {c.name: (c.ok, c.detail) for c in validate_wheel(wheel, options).checks}


def test_a_wheel_made_for_another_pin_fails_the_series_check(tmp_path: Path, project: Path) -> None:
    wheel = _overlaid(tmp_path)
    assert _checks(wheel, ValidateOptions(pin="vllm-0.21.0"))["series"][0]
    ok, detail = _checks(wheel, ValidateOptions(pin="vllm-0.26.0"))["series"]
    assert not ok and detail == "the wheel was made for pin vllm-0.21.0, not vllm-0.26.0"


def test_a_fingerprinted_file_missing_from_the_wheel_is_reported(tmp_path: Path, project: Path) -> None:
    wheel = _overlaid(tmp_path)
    meta = project / "patches" / "beta" / "series.yaml"
    meta.write_text(meta.read_text().replace("vllm/spec/utils.py:", "vllm/spec/gone.py:"))
    ok, detail = _checks(wheel, ValidateOptions())["series"]
    assert not ok and detail == "beta: vllm/spec/gone.py is not in the wheel"


def test_the_local_label_must_end_with_the_manifests_digest(tmp_path: Path, project: Path) -> None:
    manifest = make_manifest(load_pins().get("vllm-0.21.0"), [], route="build")
    for label, ok in ((f"cu130.g4.{manifest['digest']}", True), ("cu130.g4.0123abcd", False)):
        version = f"0.21.0+{label}"
        files: dict[str, str | bytes] = {**PRISTINE, f"vllm-{version}.dist-info/build-manifest.json": dumps(manifest)}
        wheel = build_wheel(tmp_path / label, files, version=version)
        got, detail = _checks(wheel, ValidateOptions())["metadata"]
        assert got is ok, detail
    assert detail == (f"local label 'cu130.g4.0123abcd' does not end with g4.{manifest['digest']} "
                      "(the build-manifest's digest)")
    # a label that claims g4 series without a manifest to say which
    bare = build_wheel(tmp_path / "bare", version="0.21.0+cu130.g4.0123abcd")
    got, detail = _checks(bare, ValidateOptions())["metadata"]
    assert not got and "claims g4 series but there is no build-manifest.json" in detail


@pytest.mark.parametrize(
    ("library", "used_on", "unused_on"),
    [(FA3, "sm90", "sm120"), (FLASHMLA, "sm100", "sm120"), (FA3, "sm90", "sm100")],
)
def test_an_arch_specific_library_is_checked_on_the_generations_that_use_it(
    tmp_path: Path, project: Path, library: str, used_on: str, unused_on: str,
) -> None:
    """sm_80 code only: on the generation vLLM launches the library on that is a failure; on another it is not
    used, so no failure of the wheel."""
    only_sm80 = elf({".nv_fatbin": container(entry(2, 80, b"cubin"))})
    wheel = build_wheel(tmp_path, {**PRISTINE, library: only_sm80})
    used, unused = Arch.parse(used_on).sm(), Arch.parse(unused_on).sm()
    # the headers alone (no cuobjdump here), as the nightly's check job reads them
    checks = _checks(wheel, ValidateOptions(archs=(Arch.parse(used_on), Arch.parse(unused_on)), trust_fatbin=True))
    ok, detail = checks[f"arch {used} {library}"]
    assert not ok and detail.startswith(f"no code for {used}"), detail
    ok, detail = checks[f"verdict {used}"]
    assert not ok and "1 have no code for it" in detail
    ok, detail = checks[f"arch {unused} {library}"]
    assert ok and detail.startswith(f"not used on {unused}")
    assert checks[f"verdict {unused}"][0]
