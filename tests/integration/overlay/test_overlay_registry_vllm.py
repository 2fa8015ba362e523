"""The registry's vLLM 0.21.0 manylinux wheel (248 MB): overlay, validate, install; and its real fatbins.

Uses the checkout's series when some carry patches for the pin, else a small real patch to a vLLM .py
file made here from the wheel's own copy of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.support.wheelsfactory import SeriesSpec, git_patch, make_project, run_g4build

from g4build.overlay.wheel import OverlayResult, overlay_wheel, plan_overlay
from g4build.pins.index import cache_root, fetch_verified
from g4build.pins.model import load_pins
from g4build.series.model import load_all
from g4build.validate.wheel import ValidateOptions, validate_wheel

pytestmark = [pytest.mark.heavy, pytest.mark.network]

PIN = "vllm-0.21.0"
TARGET = "vllm/v1/spec_decode/dflash.py"
MARK = "# g4build overlay test: this line was added by a patch"


@dataclass
class Overlaid:
    source: Path
    result: OverlayResult
    fingerprints: dict[str, list[str]]
    env: dict[str, str]


def registry_wheel() -> Path:
    pin = load_pins().get(PIN)
    ref = pin.wheels["manylinux_x86_64"]
    return fetch_verified("vllm", ref.file, ref.sha256, cache_dir=cache_root() / "wheels").path


@pytest.fixture(scope="module")
def overlaid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Overlaid]:
    tmp = tmp_path_factory.mktemp("registry")
    source = registry_wheel()
    with pytest.MonkeyPatch.context() as mp:
        series = [s for s in load_all() if s.patches_for(PIN)]
        if not series:
            with zipfile.ZipFile(source) as zf:
                original = zf.read(TARGET).decode()
            head, sep, rest = original.partition("\nimport ")
            patch = git_patch({TARGET: original}, {TARGET: f"{head}\n{MARK}{sep}{rest}"}, tmp / "g")
            root = make_project(tmp / "project", [SeriesSpec(name="overlay-test", patches=[patch],
                                                             fingerprints={TARGET: [MARK]})])
            mp.setenv("G4BUILD_HOME", str(root))
            series = load_all()
        fingerprints: dict[str, list[str]] = {}
        for s in series:
            variant = s.variant(PIN)
            fingerprints.update({p: list(t) for p, t in (variant.fingerprints if variant else {}).items()})
        plan = plan_overlay(load_pins().get(PIN), series)
        result = overlay_wheel(source, plan, tmp / "out")
        home = os.environ.get("G4BUILD_HOME")
        yield Overlaid(source=source, result=result, fingerprints=fingerprints,
                       env={"G4BUILD_HOME": home} if home else {})


def test_overlay_validates_and_installs_with_the_patches(overlaid: Overlaid, tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in overlaid.env.items():
            mp.setenv(k, v)
        report = validate_wheel(overlaid.result.wheel, ValidateOptions(pin=PIN))
    assert report.ok, report.failures()
    assert overlaid.result.changed
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
                    str(overlaid.result.wheel)], check=True)
    assert overlaid.fingerprints
    for rel, texts in overlaid.fingerprints.items():
        content = (target / rel).read_text()
        assert all(t in content for t in texts), rel
    (dist,) = target.glob("vllm-*.dist-info")
    assert dist.name == f"vllm-{overlaid.result.version}.dist-info"
    assert (dist / "build-manifest.json").is_file()


def test_arch_check_names_the_ptx_only_flash_attention_library(overlaid: Overlaid) -> None:
    done = run_g4build("validate", str(overlaid.result.wheel), "--arch", "sm120", "--pin", PIN, "--json",
                       env=overlaid.env)
    assert done.returncode == 10, done.stderr
    (out,) = json.loads(done.stdout)["wheels"]
    checks = {c["name"]: c for c in out["checks"]}
    fa2 = checks["arch sm_120 vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"]
    assert fa2["ok"] is False
    assert fa2["detail"].startswith("PTX-only for sm_120 (SASS sm_80; PTX compute_80)") and "JIT" in fa2["detail"]
    assert checks["arch sm_120 vllm/_C.abi3.so"]["ok"] is True
    assert all(checks[n]["ok"] for n in ("filename", "metadata", "record", "series"))
    libs = {a["file"]: a for a in out["archs"]}
    assert "sm_120" in libs["vllm/_C.abi3.so"]["sass"] and libs["vllm/_C.abi3.so"]["verdicts"]["sm_120"] == "sass"
    assert libs["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"]["sass"] == ["sm_80"]
    for name, check in checks.items():
        if name.startswith("cuobjdump "):  # present when cuobjdump is installed
            assert check["ok"], check
    # Hopper-only libraries are not failures on sm_120: vLLM never uses them there
    for lib in ("vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so", "vllm/_flashmla_C.abi3.so"):
        assert checks[f"arch sm_120 {lib}"]["ok"] is True
        assert checks[f"arch sm_120 {lib}"]["detail"].startswith("not used on sm_120")
    verdict = checks["verdict sm_120"]
    assert verdict["ok"] is False
    assert "1 JIT-compile from PTX at load (_vllm_fa2_C.abi3.so" in verdict["detail"]
    assert "g4build wheel --arch sm120" in verdict["detail"]
    assert [n for n, c in checks.items() if not c["ok"]] == [
        "arch sm_120 vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "verdict sm_120"]
    assert "g4build wheel --arch sm120" in done.stderr  # the hint


def test_arch_check_on_hopper_uses_fa3(overlaid: Overlaid) -> None:
    done = run_g4build("validate", str(overlaid.result.wheel), "--arch", "sm90", "--no-cuobjdump", "--json",
                       env=overlaid.env)
    checks = {c["name"]: c for c in json.loads(done.stdout)["wheels"][0]["checks"]}
    assert checks["arch sm_90 vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so"]["detail"].startswith("sm_90: SASS")
    assert not checks["arch sm_90 vllm/_flashmla_C.abi3.so"]["detail"].startswith("not used")
