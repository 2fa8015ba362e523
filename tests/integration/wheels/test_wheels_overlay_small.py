"""`g4build overlay` on small real wheels: what the new wheel holds, and every refusal leaves nothing behind."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from tests.unit.wheels.wheelsfactory import (
    PRISTINE,
    SeriesSpec,
    build_wheel,
    git_patch,
    make_project,
    member_raw,
    run_g4build,
)

from g4build.errors import PatchConflictError, UsageError
from g4build.manifest import loads
from g4build.pins import load_pins
from g4build.series import load_all
from g4build.wheels.overlay import overlay_wheel, plan_overlay
from g4build.wheels.validate import ValidateOptions, validate_wheel


def _plan() -> object:
    return plan_overlay(load_pins().get("vllm-0.21.0"), load_all())


def test_overlay_patches_members_and_copies_the_rest_raw(tmp_path: Path, project: Path) -> None:
    src = build_wheel(tmp_path / "in", version="0.21.0+cu132")
    plan = plan_overlay(load_pins().get("vllm-0.21.0"), load_all())
    result = overlay_wheel(src, plan, tmp_path / "out")
    new_version = f"0.21.0+cu132.g4.{plan.digest}"
    assert result.wheel.name == f"vllm-{new_version}-cp38-abi3-manylinux_2_24_x86_64.whl"
    assert (result.changed, result.added, result.removed) == (
        ("vllm/spec/dflash.py", "vllm/spec/utils.py"), ("vllm/spec/added.py",), ("vllm/obsolete.py",))
    dist = f"vllm-{new_version}.dist-info"
    with zipfile.ZipFile(result.wheel) as zf:
        names = zf.namelist()
        assert "vllm/obsolete.py" not in names and not any(n.startswith("vllm-0.21.0+cu132.dist-info") for n in names)
        assert f"Version: {new_version}" in zf.read(f"{dist}/METADATA").decode()
        assert "G4 fix: step 7" in zf.read("vllm/spec/dflash.py").decode()
        assert zf.read("vllm/spec/utils.py").decode().startswith("LIMIT = 16")
        inner = loads(zf.read(f"{dist}/build-manifest.json"), "t")
        assert names[-1] == f"{dist}/RECORD"
    assert inner["route"] == "overlay" and [s["name"] for s in inner["series"]] == ["alpha", "beta"]
    assert loads((tmp_path / "out" / "build-manifest.json").read_bytes(), "t")["digest"] == plan.digest
    for same in ("vllm/__init__.py", "vllm/version.py"):
        assert member_raw(result.wheel, same) == member_raw(src, same)
    assert member_raw(result.wheel, f"{dist}/WHEEL") == member_raw(src, "vllm-0.21.0+cu132.dist-info/WHEEL")
    report = validate_wheel(result.wheel, ValidateOptions(pin="vllm-0.21.0"))
    assert report.ok, report.failures()
    assert "fingerprints present: alpha v1, beta v1" in {c.name: c.detail for c in report.checks}["series"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["build-manifest.json", result.wheel.name]


def test_validate_catches_a_missing_fingerprint(tmp_path: Path, project: Path) -> None:
    result = overlay_wheel(build_wheel(tmp_path / "in"), _plan(), tmp_path / "out")  # type: ignore[arg-type]
    meta = project / "patches" / "beta" / "series.yaml"
    meta.write_text(meta.read_text().replace("LIMIT = 16", "LIMIT = 32"))
    report = validate_wheel(result.wheel, ValidateOptions())
    failed = {c.name: c.detail for c in report.failures()}
    assert failed == {"series": "beta: vllm/spec/utils.py lacks 'LIMIT = 32'"}


def test_wheel_of_another_version_is_refused(tmp_path: Path, project: Path) -> None:
    src = build_wheel(tmp_path / "in", version="0.33.0")
    with pytest.raises(UsageError, match=r"is vLLM 0.33.0, pin vllm-0.21.0 expects 0.21.0"):
        overlay_wheel(src, _plan(), tmp_path / "out")  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()


def test_patch_that_does_not_apply_is_refused_with_its_hunk(tmp_path: Path, project: Path) -> None:
    drifted = {**PRISTINE, "vllm/spec/dflash.py": PRISTINE["vllm/spec/dflash.py"].replace("x + 7\n", "x + 70\n")}
    src = build_wheel(tmp_path / "in", drifted)
    (tmp_path / "out").mkdir()
    with pytest.raises(PatchConflictError) as err:
        overlay_wheel(src, _plan(), tmp_path / "out")  # type: ignore[arg-type]
    assert "patch alpha/vllm-0.21.0/0001-change.patch does not apply to" in str(err.value)
    assert "hunk #1 at vllm/spec/dflash.py:" in str(err.value)
    assert list((tmp_path / "out").iterdir()) == []


def test_series_that_is_not_python_only_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    patch = git_patch(PRISTINE, {"vllm/spec/utils.py": "LIMIT = 1\n"}, tmp_path / "g")
    root = make_project(tmp_path / "p", [SeriesSpec(name="kernels", patches=[patch], python_only=False)])
    monkeypatch.setenv("G4BUILD_HOME", str(root))
    done = run_g4build("overlay", str(build_wheel(tmp_path / "in")), "--pin", "vllm-0.21.0", "--out",
                       str(tmp_path / "out"))
    assert done.returncode == 2
    assert "series kernels for pin vllm-0.21.0 is not Python-only" in done.stderr
    assert not (tmp_path / "out").exists()


def test_overlaid_wheel_is_not_overlaid_twice(tmp_path: Path, project: Path) -> None:
    result = overlay_wheel(build_wheel(tmp_path / "in"), _plan(), tmp_path / "out")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="already carries g4 series"):
        overlay_wheel(result.wheel, _plan(), tmp_path / "again")  # type: ignore[arg-type]


def test_cli_json_overlays_then_validates(tmp_path: Path, project: Path) -> None:
    done = run_g4build("overlay", str(build_wheel(tmp_path / "in")), "--pin", "vllm-0.21.0", "--out",
                       str(tmp_path / "out"), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["validation"]["ok"] is True and Path(out["wheel"]).is_file()
    assert out["version"].startswith("0.21.0+g4.")


def test_wheel_already_holding_a_build_manifest_is_refused(tmp_path: Path, project: Path) -> None:
    # Without the refusal the new wheel would hold two build-manifest.json members (the renamed old one and
    # the new one) and RECORD two rows for it.
    src = build_wheel(tmp_path / "in", extra_members={"vllm-0.21.0.dist-info/build-manifest.json": b"{}"})
    with pytest.raises(UsageError, match=r"already holds vllm-0.21.0.dist-info/build-manifest.json"):
        overlay_wheel(src, _plan(), tmp_path / "out")  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()


def test_cli_never_writes_an_overlaid_wheel_that_fails_validation(tmp_path: Path, project: Path) -> None:
    # a sound source whose overlaid wheel lacks a fingerprint the series now asks for (a tampered source is
    # refused before anything is written: test_wheels_hostile)
    meta = project / "patches" / "beta" / "series.yaml"
    meta.write_text(meta.read_text().replace("LIMIT = 16", "LIMIT = 32"))
    src = build_wheel(tmp_path / "in")
    done = run_g4build("overlay", str(src), "--pin", "vllm-0.21.0", "--out", str(tmp_path / "out"), "--json")
    assert done.returncode == 10, done.stderr
    assert "failed validation and was not written" in done.stderr and "lacks 'LIMIT = 32'" in done.stderr
    assert not (tmp_path / "out").exists()  # it did not exist before


def test_overlay_is_reproducible_and_honours_source_date_epoch(tmp_path: Path, project: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import hashlib
    import time

    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    src = build_wheel(tmp_path / "in", version="0.21.0+cu132")
    first = overlay_wheel(src, _plan(), tmp_path / "a")
    time.sleep(1.1)  # a clock-based timestamp would now differ
    second = overlay_wheel(src, _plan(), tmp_path / "b")
    digest = [hashlib.sha256(r.wheel.read_bytes()).hexdigest() for r in (first, second)]
    assert digest[0] == digest[1]
    with zipfile.ZipFile(src) as zf:
        y, mo, d, h, mi, s = zf.getinfo("vllm-0.21.0+cu132.dist-info/RECORD").date_time
    assert loads((tmp_path / "a" / "build-manifest.json").read_bytes(), "t")["created"].startswith(
        f"{y:04d}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}")

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    overlay_wheel(src, _plan(), tmp_path / "c")
    assert loads((tmp_path / "c" / "build-manifest.json").read_bytes(), "t")["created"] == "2023-11-14T22:13:20+00:00"

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(UsageError, match="SOURCE_DATE_EPOCH"):
        overlay_wheel(src, _plan(), tmp_path / "d")
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())
