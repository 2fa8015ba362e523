"""`g4build overlay --pin` on the registry's vLLM 0.26.0 and 0.29.0 manylinux wheels (~300 MB each, fetched by
g4build itself, sha256-checked, cached): the route a user of those releases takes, through the real CLI. Every
series of the pin is laid over the wheel's own files with zero fuzz, the result validates against the pin, installs,
and carries each series' fingerprints and a build manifest naming the series versions."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.support.wheelsfactory import run_g4build

from g4build.pins.index import cache_root
from g4build.pins.model import load_pins
from g4build.series.model import load_all, stack_digest

pytestmark = [pytest.mark.heavy, pytest.mark.network]

PINS = ["vllm-0.26.0", "vllm-0.29.0"]


@dataclass
class Overlaid:
    pin: str
    out: dict[str, Any]
    wheel: Path


@pytest.fixture(scope="module", params=PINS)
def overlaid(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Overlaid]:
    pin = str(request.param)
    out_dir = tmp_path_factory.mktemp(f"overlay-{pin}")
    # no WHEEL argument: the pin's registry wheel, fetched and verified by g4build
    done = run_g4build("overlay", "--pin", pin, "--out", str(out_dir), "--json")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    yield Overlaid(pin=pin, out=out, wheel=Path(out["wheel"]))


def test_every_series_applies_to_the_wheels_own_files(overlaid: Overlaid) -> None:
    pin = load_pins().get(overlaid.pin)
    series = [s for s in load_all() if s.patches_for(pin.name)]
    assert [s.name for s in series] == ["gemma4-backend-decoupling", "dflash-batched-verification", "mm-prefix-fa"]
    assert overlaid.out["version"] == f"{pin.version}+g4.{stack_digest(pin, series)}"
    # the release's own files: zero fuzz everywhere, nothing merged
    assert {f["how"] for f in overlaid.out["files"]} == {"applied"}
    touched = {f["path"] for f in overlaid.out["files"]}
    assert set(overlaid.out["changed"]) | set(overlaid.out["added"]) == touched
    assert overlaid.out["validation"]["ok"] is True


def test_the_overlay_validates_against_the_pin(overlaid: Overlaid) -> None:
    done = run_g4build("validate", str(overlaid.wheel), "--pin", overlaid.pin, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    (report,) = json.loads(done.stdout)["wheels"]
    checks = {c["name"]: c for c in report["checks"]}
    assert all(checks[n]["ok"] for n in ("filename", "metadata", "record", "series")), checks


def test_it_installs_with_every_fingerprint_and_the_manifest(overlaid: Overlaid, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
                    str(overlaid.wheel)], check=True)
    series = [s for s in load_all() if s.patches_for(overlaid.pin)]
    for s in series:
        variant = s.variant(overlaid.pin)
        assert variant is not None and variant.fingerprints
        for rel, texts in variant.fingerprints.items():
            content = (target / rel).read_text()
            assert all(t in content for t in texts), (s.name, rel)
    (dist,) = target.glob("vllm-*.dist-info")
    assert dist.name == f"vllm-{overlaid.out['version']}.dist-info"
    manifest = json.loads((dist / "build-manifest.json").read_text())
    pin = load_pins().get(overlaid.pin)
    assert (manifest["route"], manifest["pin"]["name"]) == ("overlay", pin.name)
    ref = pin.wheels["manylinux_x86_64"]
    assert (manifest["source_wheel"]["file"], manifest["source_wheel"]["sha256"]) == (ref.file, ref.sha256)
    assert [(m["name"], m["version"], m["patches"]) for m in manifest["series"]] == [
        (s.name, s.version, [p.file for p in s.patches_for(pin.name)]) for s in series]


def test_the_compiled_libraries_are_the_releases_untouched(overlaid: Overlaid) -> None:
    ref = load_pins().get(overlaid.pin).wheels["manylinux_x86_64"]
    source = cache_root() / "wheels" / ref.file  # fetched and verified by the overlay above
    with zipfile.ZipFile(source) as before, zipfile.ZipFile(overlaid.wheel) as after:
        libs = {i.filename: i.CRC for i in before.infolist() if i.filename.endswith(".so")}
        assert libs and {i.filename: i.CRC for i in after.infolist() if i.filename in libs} == libs
