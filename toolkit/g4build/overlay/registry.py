"""The overlay route's default input: the pin's registry vLLM wheel for this platform, fetched once into the
cache and verified against the sha256 in pins.yaml (while downloading; a cached copy is not trusted as such: the
overlay hashes it while reading it and refuses it when it is not the pin's)."""

from __future__ import annotations

import sys
from pathlib import Path

from g4build.errors import UsageError
from g4build.overlay.wheel import PROJECT
from g4build.pins.index import Fetched, ProgressHook, cache_root, fetch_verified
from g4build.pins.model import FileRef, Pin


def platform_key() -> str:
    """The pins.yaml ``wheels`` key of this machine's platform."""
    if sys.platform == "win32":
        return "win_amd64"
    return "manylinux_x86_64"


def pin_wheel(pin: Pin) -> FileRef:
    """The registry wheel ``pin`` names for this platform; UsageError when it names none."""
    key = platform_key()
    ref = pin.wheels.get(key)
    if ref is None:
        raise UsageError(
            f"pin {pin.name} names no registry wheel for {key} (pins.yaml wheels: {', '.join(pin.wheels) or 'none'})",
            hint="pass the wheel file: `g4build overlay WHEEL --pin NAME`",
        )
    return ref


def fetch_pin_wheel(pin: Pin, *, progress: ProgressHook | None = None) -> Fetched:
    """The pin's registry wheel for this platform, verified against the pin's sha256, from the cache."""
    ref = pin_wheel(pin)
    return fetch_verified(PROJECT, ref.file, ref.sha256, cache_dir=cache_root() / "wheels", progress=progress)


def cached_pin_wheel(pin: Pin) -> Path | None:
    """The cached copy of the pin's registry wheel, unread (None: not cached). Its bytes are the pin's only if
    their sha256 says so; ``overlay_wheel(..., require_pin=True)`` computes it while it reads them."""
    path = cache_root() / "wheels" / pin_wheel(pin).file
    return path if path.is_file() else None
