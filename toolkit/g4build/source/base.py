"""A pin's OS base as the build's identity sees it: the fixup patches g4build adds after the port and the base's
digest (fork commit, onto, keep_pin, fixups). No git here: the series model and the manifest read this, and the
port engine (``forkport``) applies what it names."""

from __future__ import annotations

import hashlib
from pathlib import Path

from g4build.data import patches_dir
from g4build.pins.model import Pin
from g4build.util.safeload import read_patch

PORT_VERSION = 2  # bump when the port's rules change: cached Windows trees and wheel versions then change too


def fixup_patches(os_name: str, pin: Pin) -> list[Path]:
    """Our own patches for files the port keeps at the pin's version: ``patches/<os>-base/<pin>/*.patch``."""
    folder = patches_dir() / f"{os_name}-base" / pin.name
    return sorted(folder.glob("*.patch")) if folder.is_dir() else []


def base_digest(pin: Pin, os_name: str) -> str:
    """What the base adds to a build's identity: fork commit, onto, keep_pin and the fixups' bytes."""
    base = pin.bases[os_name]
    h = hashlib.sha256(f"{PORT_VERSION}\0{os_name}\0{base.remote}\0{base.commit}\0{base.onto}\0".encode())
    for path in base.keep_pin:
        h.update(f"{path}\0".encode())
    for patch in fixup_patches(os_name, pin) if base.onto else []:
        h.update(hashlib.sha256(read_patch(patch)).digest())
    return h.hexdigest()[:16]
