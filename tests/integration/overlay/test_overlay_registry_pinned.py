"""The registry's vLLM 0.21.0 wheel (248 MB) is overlaid without verifying each member only because the sha256
of its bytes, as the overlay reads them, is the pin's; a copy of it with one member changed, under the very same
file name (its RECORD regenerated to match, or not), is verified member by member or refused, and never passed
off as the pin's wheel. Uses the checkout's series when some carry patches for the pin, else a small real patch.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tests.support.wheelsfactory import SeriesSpec, git_patch, make_project, record_hash, run_g4build

from g4build.errors import IntegrityError, ValidationError
from g4build.overlay.wheel import OverlayPlan, overlay_wheel, plan_overlay
from g4build.pins.index import cache_root, fetch_verified
from g4build.pins.model import load_pins
from g4build.series.model import load_all
from g4build.validate.wheel import ValidateOptions, validate_wheel
from g4build.wheelfile.safety import hash_members, record_problems
from g4build.wheelfile.sources import Snapshot
from g4build.wheelfile.wheelfile import format_record, parse_record
from g4build.wheelfile.zipraw import RawZipWriter

pytestmark = [pytest.mark.heavy, pytest.mark.network]

PIN = "vllm-0.21.0"
TARGET = "vllm/v1/spec_decode/dflash.py"
CHANGED = "vllm/version.py"  # a member no series touches: copied raw, so only its RECORD row could vouch for it
DIST = "vllm-0.21.0.dist-info"


@dataclass
class Registry:
    wheel: Path
    sha256: str
    plan: OverlayPlan
    env: dict[str, str]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    tmp = tmp_path_factory.mktemp("pinned")
    ref = load_pins().get(PIN).wheels["manylinux_x86_64"]
    wheel = fetch_verified("vllm", ref.file, ref.sha256, cache_dir=cache_root() / "wheels").path
    with pytest.MonkeyPatch.context() as mp:
        series = [s for s in load_all() if s.patches_for(PIN)]
        env: dict[str, str] = {}
        if not series:
            with zipfile.ZipFile(wheel) as zf:
                original = zf.read(TARGET).decode()
            head, sep, rest = original.partition("\nimport ")
            patch = git_patch({TARGET: original}, {TARGET: f"{head}\n# g4build test{sep}{rest}"}, tmp / "g")
            root = make_project(tmp / "project", [SeriesSpec(name="pinned-test", patches=[patch])])
            mp.setenv("G4BUILD_HOME", str(root))
            env = {"G4BUILD_HOME": str(root)}
            series = load_all()
        yield Registry(wheel=wheel, sha256=ref.sha256.lower(), plan=plan_overlay(load_pins().get(PIN), series),
                       env=env)


def tampered_copy(source: Path, out: Path, *, regenerate_record: bool) -> Path:
    """``source`` under its own file name in ``out`` with CHANGED's text extended; RECORD's row for it
    rewritten to match (``regenerate_record``) or left as the release wrote it. Other members copied raw."""
    snap = Snapshot.read(source)
    path = out / source.name
    out.mkdir(parents=True)
    with zipfile.ZipFile(snap.file()) as zf, path.open("xb") as fh:
        new = zf.read(CHANGED) + b"\nimport os  # not the release's\n"
        rows = parse_record(zf.read(f"{DIST}/RECORD"), source.name)
        if regenerate_record:
            rows = [type(r)(path=r.path, hash=record_hash(new), size=str(len(new))) if r.path == CHANGED else r
                    for r in rows]
        writer = RawZipWriter(fh)
        for info in sorted(zf.infolist(), key=lambda i: i.header_offset):
            if info.filename == CHANGED:
                writer.write(CHANGED, new, date_time=info.date_time, external_attr=info.external_attr)
            elif info.filename == f"{DIST}/RECORD":
                writer.write(info.filename, format_record(rows), date_time=info.date_time)
            else:
                writer.copy_raw(snap, info)
        writer.close()
    return path


def test_the_pinned_wheel_is_not_verified_member_by_member_and_comes_out_valid(
    registry: Registry, tmp_path: Path, spy: list[int],
) -> None:
    result = overlay_wheel(registry.wheel, registry.plan, tmp_path / "out", require_pin=True)
    assert spy == []
    manifest = json.loads(result.manifest.read_text())
    assert manifest["source_wheel"] == {"file": registry.wheel.name, "sha256": registry.sha256}
    report = validate_wheel(result.wheel, ValidateOptions(pin=PIN))  # every carried RECORD row holds
    assert report.ok, report.failures()
    # what the skip relies on: the release's members all match its RECORD
    snap = Snapshot.read(registry.wheel)
    with zipfile.ZipFile(snap.file()) as zf:
        infos = [i for i in zf.infolist() if not i.is_dir()]
        rows = parse_record(zf.read(f"{DIST}/RECORD"), "t")
    assert snap.sha256 == registry.sha256
    assert record_problems(hash_members(snap.data, infos, 2), rows, DIST) == []


def test_a_tampered_copy_with_a_matching_record_is_verified_and_never_called_the_pins(
    registry: Registry, tmp_path: Path, spy: list[int],
) -> None:
    copy = tampered_copy(registry.wheel, tmp_path / "in", regenerate_record=True)
    sha = hashlib.sha256(copy.read_bytes()).hexdigest()
    assert copy.name == registry.wheel.name and sha != registry.sha256
    with pytest.raises(IntegrityError, match=f"not the wheel pin {PIN} records .sha256 {sha}"):
        overlay_wheel(copy, registry.plan, tmp_path / "refused", require_pin=True)
    assert not (tmp_path / "refused").exists() and spy == []
    # passed as a file of the user's own: its members agree with its RECORD, so it is overlaid, verified
    result = overlay_wheel(copy, registry.plan, tmp_path / "out")
    assert len(spy) == 1 and spy[0] > 3000
    assert json.loads(result.manifest.read_text())["source_wheel"]["sha256"] == sha
    with zipfile.ZipFile(result.wheel) as zf:
        assert zf.read(CHANGED).endswith(b"# not the release's\n")


def test_a_tampered_copy_with_the_releases_record_is_refused(registry: Registry, tmp_path: Path,
                                                             spy: list[int]) -> None:
    copy = tampered_copy(registry.wheel, tmp_path / "in", regenerate_record=False)
    with pytest.raises(ValidationError, match=f"refused to overlay.*{CHANGED}: RECORD says sha256="):
        overlay_wheel(copy, registry.plan, tmp_path / "out")
    assert not (tmp_path / "out").exists() and len(spy) == 1


def test_a_tampered_cache_entry_is_fetched_again_not_overlaid(registry: Registry, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    tampered_copy(registry.wheel, cache / "wheels", regenerate_record=True)
    out = tmp_path / "out"
    done = run_g4build("overlay", "--pin", PIN, "--out", str(out), "--no-validate", "--json",
                       env={**registry.env, "G4BUILD_CACHE": str(cache)})
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "build-manifest.json").read_text())["source_wheel"]["sha256"] == registry.sha256
    assert hashlib.sha256((cache / "wheels" / registry.wheel.name).read_bytes()).hexdigest() == registry.sha256
