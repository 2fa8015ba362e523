"""The overlay route's default input: the pin's registry wheel for this platform, from the cache when it is
there with the pinned sha256 (no index needed), refused with the way out when the pin names none."""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from pathlib import Path

import pytest

from g4build.errors import UsageError
from g4build.overlay.registry import fetch_pin_wheel, pin_wheel, platform_key
from g4build.pins.model import FileRef, load_pins


def test_platform_key_is_the_pins_yaml_key_of_this_machine() -> None:
    assert platform_key() == ("win_amd64" if sys.platform == "win32" else "manylinux_x86_64")
    pin = load_pins().get("vllm-0.21.0")
    assert pin_wheel(pin) == pin.wheels[platform_key()]


def test_a_pin_without_this_platforms_wheel_is_refused_with_the_way_out() -> None:
    pin = dataclasses.replace(load_pins().get("vllm-0.21.0"), wheels={})
    with pytest.raises(UsageError, match=f"names no registry wheel for {platform_key()}") as info:
        pin_wheel(pin)
    assert info.value.hint == "pass the wheel file: `g4build overlay WHEEL --pin NAME`"


def test_a_cached_wheel_with_the_pinned_sha256_needs_no_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("G4BUILD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # nothing answers there
    data = b"not really a wheel"
    name = "vllm-0.21.0-cp38-abi3-manylinux_2_24_x86_64.whl"
    (tmp_path / "cache" / "wheels").mkdir(parents=True)
    (tmp_path / "cache" / "wheels" / name).write_bytes(data)
    ref = FileRef(file=name, sha256=hashlib.sha256(data).hexdigest())
    pin = dataclasses.replace(load_pins().get("vllm-0.21.0"), wheels={platform_key(): ref})
    got = fetch_pin_wheel(pin)
    assert got.cached and got.path == tmp_path / "cache" / "wheels" / name and got.sha256 == ref.sha256
