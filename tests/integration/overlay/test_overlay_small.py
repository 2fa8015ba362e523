"""`g4build overlay` on small real wheels: what the new wheel holds, and every refusal leaves nothing behind."""

from __future__ import annotations

import json
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from tests.support.wheelsfactory import (
    DFLASH_NEW,
    PRISTINE,
    SeriesSpec,
    build_wheel,
    git_patch,
    make_project,
    member_raw,
    record_hash,
    run_g4build,
)

from g4build.errors import DownloadError, PatchConflictError, UsageError
from g4build.overlay.wheel import OverlayPlan, overlay_wheel, plan_overlay
from g4build.pins.model import load_pins
from g4build.series.model import load_all
from g4build.validate.wheel import ValidateOptions, validate_wheel
from g4build.wheelfile.manifestfile import loads


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
        metadata = zf.read(f"{dist}/METADATA")
        assert f"Version: {new_version}" in metadata.decode()
        # the pin's recorded transformers range (Gemma 4) narrows what pip installs beside it; RECORD agrees
        assert "Requires-Dist: transformers>=5.5.1,<5.15" in metadata.decode().splitlines()
        record = {row.split(",")[0]: row.split(",")[1] for row in zf.read(f"{dist}/RECORD").decode().splitlines()}
        assert record[f"{dist}/METADATA"] == record_hash(metadata)
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


def _validated_after_the_series_moved(tmp_path: Path, project: Path, version: int) -> dict[str, str]:
    """A wheel overlaid with beta v1, then validated by a checkout whose beta is ``version`` and asks for a
    fingerprint v1 lacks: the failed checks."""
    result = overlay_wheel(build_wheel(tmp_path / "in"), _plan(), tmp_path / "out")  # type: ignore[arg-type]
    meta = project / "patches" / "beta" / "series.yaml"
    text = meta.read_text()
    assert "version: 1\n" in text
    meta.write_text(text.replace("LIMIT = 16", "LIMIT = 32").replace("version: 1\n", f"version: {version}\n", 1))
    return {c.name: c.detail for c in validate_wheel(result.wheel, ValidateOptions()).failures()}


def test_a_wheel_of_an_older_series_version_is_told_so(tmp_path: Path, project: Path) -> None:
    """The checkout's series moved on (v2 asks for a fingerprint v1 lacks): validate names both versions and the
    way to the newer one, not only the missing text."""
    assert _validated_after_the_series_moved(tmp_path, project, 2) == {
        "series": "beta: the wheel carries v1, this checkout v2 (vllm/spec/utils.py lacks 'LIMIT = 32'): make it "
                  "again with this checkout (`g4build wheel`, or `g4build overlay` of the wheel it was overlaid on) "
                  "to have v2, or validate it with the checkout that made it"}


def test_a_wheel_of_a_newer_series_version_asks_for_a_newer_checkout(tmp_path: Path, project: Path) -> None:
    """The wheel was made by a checkout ahead of this one (its v1 against this v0 that asks for other text): the
    advice is to update the checkout, never to make the wheel again with the older series."""
    assert _validated_after_the_series_moved(tmp_path, project, 0) == {
        "series": "beta: the wheel carries v1, newer than this checkout's v0 (vllm/spec/utils.py lacks "
                  "'LIMIT = 32'): update this checkout, or validate the wheel with the one that made it"}


def test_wheel_of_another_version_is_refused(tmp_path: Path, project: Path) -> None:
    src = build_wheel(tmp_path / "in", version="0.33.0")
    with pytest.raises(UsageError, match=r"is vLLM 0.33.0, pin vllm-0.21.0 expects 0.21.0"):
        overlay_wheel(src, _plan(), tmp_path / "out")  # type: ignore[arg-type]
    assert not (tmp_path / "out").exists()


def _pristine(paths: Sequence[str]) -> dict[str, bytes]:
    """The test project's pin files (what its wheels are built from) for the three-way merge."""
    return {p: PRISTINE[p].encode() for p in paths if p in PRISTINE}


def _merge_plan() -> OverlayPlan:
    return plan_overlay(load_pins().get("vllm-0.21.0"), load_all(), pristine=_pristine)


def test_patch_that_does_not_apply_is_refused_with_its_hunk(tmp_path: Path, project: Path) -> None:
    # the wheel's copy changed the very line the patch changes: zero fuzz fails, and so does the merge
    drifted = {**PRISTINE, "vllm/spec/dflash.py": PRISTINE["vllm/spec/dflash.py"].replace("x + 7\n", "x + 70\n")}
    src = build_wheel(tmp_path / "in", drifted)
    (tmp_path / "out").mkdir()
    with pytest.raises(PatchConflictError) as err:
        overlay_wheel(src, _merge_plan(), tmp_path / "out")
    assert "patch alpha/vllm-0.21.0/0001-change.patch does not apply to" in str(err.value)
    assert "hunk #1 at vllm/spec/dflash.py:" in str(err.value)
    assert ("1 file(s) of vllm-0.21.0-cp38-abi3-manylinux_2_24_x86_64.whl are left (nothing was written): "
            "vllm/spec/dflash.py: alpha/vllm-0.21.0/0001-change.patch does not apply with zero fuzz; a three-way "
            "merge with vllm-0.21.0's own file conflicts: 1 conflicting hunk(s)") in str(err.value)
    assert list((tmp_path / "out").iterdir()) == []


FORK_STEP_8 = PRISTINE["vllm/spec/dflash.py"].replace("def step_8(x):\n", "def step_8(x):  # fork: Windows\n")


def test_change_near_a_hunk_is_merged_three_ways_and_reported_per_file(tmp_path: Path, project: Path) -> None:
    # step_8's line is in the context of the patch's hunk on step_7 (zero fuzz fails) but two lines from it
    src = build_wheel(tmp_path / "in", {**PRISTINE, "vllm/spec/dflash.py": FORK_STEP_8}, version="0.21.0+cu132")
    result = overlay_wheel(src, _merge_plan(), tmp_path / "out")
    how = {o.path: o.how for o in result.files}
    assert how == {"vllm/spec/dflash.py": "merged", "vllm/spec/added.py": "applied", "vllm/obsolete.py": "applied",
                   "vllm/spec/utils.py": "applied"}
    merged = {o.path: o.detail for o in result.files}["vllm/spec/dflash.py"]
    assert merged == ("alpha/vllm-0.21.0/0001-change.patch does not apply with zero fuzz; three-way merged with "
                      "vllm-0.21.0's own file (base) and its patched file")
    with zipfile.ZipFile(result.wheel) as zf:
        text = zf.read("vllm/spec/dflash.py").decode()
        assert "def step_8(x):  # fork: Windows\n" in text and "return x + 7  # G4 fix: step 7\n" in text
        assert "vllm/obsolete.py" not in zf.namelist() and zf.read("vllm/spec/added.py") == b"ADDED = 1\n"
    assert validate_wheel(result.wheel, ValidateOptions(pin="vllm-0.21.0")).ok
    assert result.to_dict()["files"][0] == {"path": "vllm/obsolete.py", "how": "applied",
                                            "detail": "the series' hunks apply with zero fuzz"}


def test_wheel_that_already_carries_the_change_is_already(tmp_path: Path, project: Path) -> None:
    src = build_wheel(tmp_path / "in", {**PRISTINE, "vllm/spec/dflash.py": DFLASH_NEW})
    result = overlay_wheel(src, _merge_plan(), tmp_path / "out")
    assert {o.path: o.how for o in result.files}["vllm/spec/dflash.py"] == "already"
    assert "vllm/spec/dflash.py" not in result.changed


def test_a_clean_merge_that_loses_a_fingerprint_is_refused(tmp_path: Path, project: Path) -> None:
    meta = project / "patches" / "alpha" / "series.yaml"
    meta.write_text(meta.read_text().replace("G4 fix: step 7", "def step_8(x):"))  # text the fork then changes
    renamed = PRISTINE["vllm/spec/dflash.py"].replace("def step_8(x):\n", "def step_8_windows(x):\n")
    src = build_wheel(tmp_path / "in", {**PRISTINE, "vllm/spec/dflash.py": renamed})
    with pytest.raises(PatchConflictError, match=r"vllm/spec/dflash.py: .*three-way merged .*, but the merged result "
                                                 r"lacks the series' fingerprint\(s\) alpha: 'def step_8\(x\):'"):
        overlay_wheel(src, _merge_plan(), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_clean_merge_that_is_not_python_is_refused(tmp_path: Path, project: Path) -> None:
    broken = PRISTINE["vllm/spec/dflash.py"].replace("def step_8(x):\n", "def step_8(x)\n")
    src = build_wheel(tmp_path / "in", {**PRISTINE, "vllm/spec/dflash.py": broken})
    with pytest.raises(PatchConflictError, match=r"but the merged file is not valid Python \(line 33: "):
        overlay_wheel(src, _merge_plan(), tmp_path / "out")


def test_merge_without_the_pins_files_keeps_the_failure_kind(tmp_path: Path, project: Path) -> None:
    def unreachable(paths: Sequence[str]) -> dict[str, bytes]:
        raise DownloadError("index unreachable: https://pypi.example/simple/vllm/")

    plan = plan_overlay(load_pins().get("vllm-0.21.0"), load_all(), pristine=unreachable)
    src = build_wheel(tmp_path / "in", {**PRISTINE, "vllm/spec/dflash.py": FORK_STEP_8})
    with pytest.raises(DownloadError, match=r"does not apply to .*; a three-way merge needs vllm-0.21.0's own files, "
                                            r"which could not be read: index unreachable"):
        overlay_wheel(src, plan, tmp_path / "out")
    # a wheel the stack applies to never needs them
    assert overlay_wheel(build_wheel(tmp_path / "ok"), plan, tmp_path / "out").files


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


def test_a_stack_without_a_series_another_requires_is_refused() -> None:
    """0.21.0's gemma4-backend-decoupling requires dflash-batched-verification (series.yaml): an overlay of a
    stack that leaves it out would put FlashAttention and Triton views over one raw KV tensor unrestrided."""
    pin = load_pins().get("vllm-0.21.0")
    stack = [s for s in load_all() if s.name != "dflash-batched-verification"]
    with pytest.raises(UsageError, match="gemma4-backend-decoupling needs dflash-batched-verification"):
        plan_overlay(pin, stack)
    assert plan_overlay(pin, load_all()).series  # the whole order overlays
