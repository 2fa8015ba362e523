"""The pinned overlay path offline: a small real wheel pinned by the test project's pins.yaml (file name and
sha256) stands for the registry wheel. It is overlaid without verifying each member only because the sha256 of
its bytes, as the overlay reads them, is the pin's; a copy with one member changed, under the very same file
name, is verified member by member or refused, and never passed off as the pin's wheel; a damaged cached copy
is fetched again (from a package index on the loopback)."""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from tests.support.index_server import serve_index
from tests.support.wheelsfactory import PRISTINE, build_wheel, record_hash, run_g4build
from tests.support.yamltext import yaml_text

from g4build.errors import IntegrityError, ValidationError
from g4build.overlay.wheel import OverlayPlan, overlay_wheel, plan_overlay
from g4build.pins.model import load_pins
from g4build.series.model import load_all
from g4build.validate.wheel import ValidateOptions, validate_wheel

PIN = "vllm-0.21.0"
CHANGED = "vllm/version.py"  # a member no series touches: copied raw, so only its RECORD row could vouch for it
TAMPERED = PRISTINE[CHANGED] + "import os  # not the release's\n"


@dataclass
class Pinned:
    wheel: Path
    sha256: str
    plan: OverlayPlan


@pytest.fixture
def pinned(tmp_path: Path, project: Path) -> Pinned:
    """The small wheel, and the test project's pin naming it as its manylinux wheel."""
    wheel = build_wheel(tmp_path / "release")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    pins_file = project / "patches" / "pins.yaml"
    pins = yaml.safe_load(pins_file.read_text())
    pins["pins"][PIN]["wheels"] = {"manylinux_x86_64": {"file": wheel.name, "sha256": sha}}
    pins_file.write_text(yaml_text(pins))
    return Pinned(wheel=wheel, sha256=sha, plan=plan_overlay(load_pins().get(PIN), load_all()))


def tampered_copy(out: Path, *, regenerate_record: bool) -> Path:
    """The pinned wheel's name and members, CHANGED's text extended; its RECORD row rewritten to match
    (``regenerate_record``) or left as the release wrote it."""
    original = PRISTINE[CHANGED].encode()
    keep = {} if regenerate_record else {CHANGED: f"{CHANGED},{record_hash(original)},{len(original)}"}
    return build_wheel(out, {**PRISTINE, CHANGED: TAMPERED}, record_override=keep)


def test_the_pinned_wheel_is_not_verified_member_by_member_and_comes_out_valid(
    pinned: Pinned, tmp_path: Path, spy: list[int],
) -> None:
    result = overlay_wheel(pinned.wheel, pinned.plan, tmp_path / "out", require_pin=True)
    assert spy == []
    manifest = json.loads(result.manifest.read_text())
    assert manifest["source_wheel"] == {"file": pinned.wheel.name, "sha256": pinned.sha256}
    report = validate_wheel(result.wheel, ValidateOptions(pin=PIN))  # every carried RECORD row holds
    assert report.ok, report.failures()


def test_a_tampered_copy_with_a_matching_record_is_verified_and_never_called_the_pins(
    pinned: Pinned, tmp_path: Path, spy: list[int],
) -> None:
    copy = tampered_copy(tmp_path / "in", regenerate_record=True)
    sha = hashlib.sha256(copy.read_bytes()).hexdigest()
    assert copy.name == pinned.wheel.name and sha != pinned.sha256
    with pytest.raises(IntegrityError, match=f"not the wheel pin {PIN} records .sha256 {sha}, the pin's "
                                             f"{pinned.sha256}"):
        overlay_wheel(copy, pinned.plan, tmp_path / "refused", require_pin=True)
    assert not (tmp_path / "refused").exists() and spy == []
    # passed as a file of the user's own: its members agree with its RECORD, so it is overlaid, verified
    result = overlay_wheel(copy, pinned.plan, tmp_path / "out")
    assert len(spy) == 1 and spy[0] >= len(PRISTINE)
    assert json.loads(result.manifest.read_text())["source_wheel"] == {"file": copy.name, "sha256": sha}
    with zipfile.ZipFile(result.wheel) as zf:
        assert zf.read(CHANGED).decode() == TAMPERED


def test_a_tampered_copy_with_the_releases_record_is_refused(pinned: Pinned, tmp_path: Path,
                                                             spy: list[int]) -> None:
    copy = tampered_copy(tmp_path / "in", regenerate_record=False)
    assert copy.name == pinned.wheel.name
    with pytest.raises(ValidationError, match=f"refused to overlay.*{CHANGED}: RECORD says sha256="):
        overlay_wheel(copy, pinned.plan, tmp_path / "out")
    assert not (tmp_path / "out").exists() and len(spy) == 1
    with pytest.raises(IntegrityError, match=f"not the wheel pin {PIN} records"):
        overlay_wheel(copy, pinned.plan, tmp_path / "out", require_pin=True)
    assert not (tmp_path / "out").exists()


def test_a_tampered_cache_entry_is_fetched_again_not_overlaid(pinned: Pinned, tmp_path: Path, project: Path) -> None:
    cache = tmp_path / "cache"
    tampered_copy(cache / "wheels", regenerate_record=True)
    out = tmp_path / "out"
    with serve_index() as index:
        index.add(pinned.wheel)
        done = run_g4build("overlay", "--pin", PIN, "--out", str(out), "--no-validate", "--json",
                           env={"G4BUILD_HOME": str(project), "G4BUILD_CACHE": str(cache),
                                "PIP_INDEX_URL": index.url})
        assert done.returncode == 0, done.stderr
        assert index.hits[f"/files/{pinned.wheel.name}"] == 1
    assert json.loads((out / "build-manifest.json").read_text())["source_wheel"]["sha256"] == pinned.sha256
    assert hashlib.sha256((cache / "wheels" / pinned.wheel.name).read_bytes()).hexdigest() == pinned.sha256
    with zipfile.ZipFile(json.loads(done.stdout)["wheel"]) as zf:
        assert zf.read(CHANGED).decode() == PRISTINE[CHANGED]
