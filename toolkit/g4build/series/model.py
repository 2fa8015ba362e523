"""The series model: versioned patch series under ``patches/``, loaded from YAML.

Layout::

    patches/series.yaml                 order: [name, ...]   (which series apply, in which order)
    patches/<name>/series.yaml          metadata (below)
    patches/<name>/<pin>/NNNN-*.patch   per-pin patch files, in git diff format (a/ b/ prefixes)

Metadata keys: name, version (int, bumped on any content change), title, why, refs (list of upstream
issues/PRs), origin, bug, forwarded, applied_upstream (a version or null), python_only (bool), and
``pins``: a mapping pin name -> {patches: [{file, subject}], fingerprints: {path: [text, ...]},
note, requires}. A pin with an empty patch list needs nothing (upstream has the fix for that pin; ``note`` says why).
``requires`` (optional) names the series whose patches for that pin this variant is only correct with (a tree
carrying it without them is broken, not merely incomplete); applying a subset that breaks it is refused.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from g4build.data import load_yaml_mapping, patches_dir, require
from g4build.errors import ConfigError, UsageError
from g4build.pins.model import PIN_NAME_RE, Pin
from g4build.source.base import base_digest
from g4build.util.safeload import read_patch
from g4build.util.yamlsafe import confined, tree_relative


@dataclass(frozen=True, kw_only=True)
class SeriesPatch:
    file: str  # relative to the series folder
    subject: str
    path: Path  # absolute path of the patch file

    def read_bytes(self) -> bytes:
        """The patch's bytes, bounded (``safeload.read_patch``: no FIFO, device or oversized file)."""
        return read_patch(self.path)


@dataclass(frozen=True, kw_only=True)
class PinVariant:
    patches: tuple[SeriesPatch, ...]
    fingerprints: dict[str, tuple[str, ...]] = field(default_factory=dict)
    note: str = ""
    requires: tuple[str, ...] = ()  # series this variant is only correct with, on the same pin


@dataclass(frozen=True, kw_only=True)
class Series:
    name: str
    version: int
    title: str
    why: str
    refs: tuple[str, ...]
    origin: str
    bug: str
    forwarded: str
    applied_upstream: str | None
    python_only: bool
    pins: dict[str, PinVariant]
    folder: Path

    def variant(self, pin_name: str) -> PinVariant | None:
        return self.pins.get(pin_name)

    def patches_for(self, pin_name: str) -> tuple[SeriesPatch, ...]:
        """The pin's ordered patches (empty when the pin needs none or the series has no variant for it)."""
        variant = self.pins.get(pin_name)
        return variant.patches if variant else ()

    def upstream_in(self, version: str) -> bool:
        """True when the metadata says upstream carries the whole series at ``version``."""
        return self.applied_upstream is not None and Version(self.applied_upstream) <= Version(version)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "title": self.title,
            "why": self.why,
            "refs": list(self.refs),
            "origin": self.origin,
            "bug": self.bug,
            "forwarded": self.forwarded,
            "applied_upstream": self.applied_upstream,
            "python_only": self.python_only,
            "pins": {
                pin: {
                    "patches": [{"file": p.file, "subject": p.subject} for p in v.patches],
                    "fingerprints": {k: list(t) for k, t in v.fingerprints.items()},
                    "note": v.note,
                    "requires": list(v.requires),
                }
                for pin, v in self.pins.items()
            },
        }


def _variant(folder: Path, raw: Any, where: str) -> PinVariant:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, found {type(raw).__name__}")
    # Required even when empty: a pin entry without its list is a mistake, not "needs nothing" (an empty list
    # with a note says that).
    if "patches" not in raw:
        raise ConfigError(f"{where}: missing key 'patches'",
                          hint="list the pin's patches, or write `patches: []` with a note saying why none")
    patches_raw = raw["patches"]
    if not isinstance(patches_raw, list):
        raise ConfigError(f"{where}.patches: expected a list, found {type(patches_raw).__name__}")
    patches = []
    for i, entry in enumerate(patches_raw):
        pw = f"{where}.patches[{i}]"
        file = require(entry, "file", str, pw)
        subject = require(entry, "subject", str, pw)
        path = confined(folder, file, f"{pw}.file")
        if not path.is_file():
            found = "none" if not os.path.lexists(path) else "a folder" if path.is_dir() else \
                "a named pipe, a device or a dangling link"  # never opened: a FIFO would block
            raise ConfigError(f"{pw}.file: expected a patch file at {path}, found {found}",
                              hint="restore it (git checkout) or drop the entry from the list")
        patches.append(SeriesPatch(file=file, subject=subject, path=path))
    fps_raw = raw.get("fingerprints") or {}
    if not isinstance(fps_raw, dict):
        raise ConfigError(f"{where}.fingerprints: expected a mapping path -> [text]")
    fingerprints: dict[str, tuple[str, ...]] = {}
    for rel, texts in fps_raw.items():
        if not isinstance(rel, str):
            raise ConfigError(f"{where}.fingerprints: key {rel!r}: expected a path in the source tree")
        tree_relative(rel, f"{where}.fingerprints.{rel}")
        if isinstance(texts, str):
            texts = [texts]
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise ConfigError(f"{where}.fingerprints.{rel}: expected a list of strings")
        fingerprints[str(rel)] = tuple(texts)
    requires = raw.get("requires") or []
    if not isinstance(requires, list) or not all(isinstance(r, str) and PIN_NAME_RE.fullmatch(r) for r in requires):
        raise ConfigError(f"{where}.requires: expected a list of series names, found {requires!r}")
    return PinVariant(patches=tuple(patches), fingerprints=fingerprints, note=str(raw.get("note") or ""),
                      requires=tuple(requires))


def _pin_key(pin: Any, where: str) -> str:
    if not isinstance(pin, str) or not PIN_NAME_RE.fullmatch(pin):
        raise ConfigError(f"{where}: pins: {pin!r} is not a pin name (see patches/pins.yaml)")
    return pin


def load_series(folder: Path) -> Series:
    meta_path = folder / "series.yaml"
    data = load_yaml_mapping(meta_path)
    where = str(meta_path)
    name = require(data, "name", str, where)
    if name != folder.name:
        raise ConfigError(f"{where}.name: expected '{folder.name}' (the folder's name), found '{name}'")
    applied = data.get("applied_upstream")
    if applied is not None:
        try:
            Version(str(applied))
        except InvalidVersion as exc:
            raise ConfigError(f"{where}.applied_upstream: not a version: {applied!r}") from exc
    pins_raw = require(data, "pins", dict, where)
    refs = data.get("refs") or []
    if not isinstance(refs, list):
        raise ConfigError(f"{where}.refs: expected a list")
    return Series(
        name=name,
        version=require(data, "version", int, where),
        title=require(data, "title", str, where),
        why=str(data.get("why") or ""),
        refs=tuple(str(r) for r in refs),
        origin=str(data.get("origin") or ""),
        bug=str(data.get("bug") or ""),
        forwarded=str(data.get("forwarded") or "no"),
        applied_upstream=None if applied is None else str(applied),
        python_only=bool(require(data, "python_only", bool, where)),
        pins={_pin_key(pin, where): _variant(folder, raw, f"{where}: pins.{pin}") for pin, raw in pins_raw.items()},
        folder=folder,
    )


def load_all(root: Path | None = None) -> list[Series]:
    """Every series named in ``patches/series.yaml``'s ``order``, in that order."""
    root = root or patches_dir()
    order_path = root / "series.yaml"
    data = load_yaml_mapping(order_path)
    order = require(data, "order", list, str(order_path))
    seen: set[str] = set()
    result = []
    for name in order:
        if not isinstance(name, str) or name in seen:
            raise ConfigError(f"{order_path}.order: duplicate or non-string entry {name!r}")
        if not PIN_NAME_RE.fullmatch(name):
            raise ConfigError(f"{order_path}.order: {name!r} is not a series folder name: expected lower case "
                              "letters, digits, '.', '-', '_'", hint="name the series' folder under patches/")
        seen.add(name)
        folder = confined(root, name, f"{order_path}.order")
        if not (folder / "series.yaml").is_file():
            raise ConfigError(f"{order_path}.order: series '{name}' has no {folder / 'series.yaml'}",
                              hint="start it with `g4build patches new`, or remove it from the order")
        result.append(load_series(folder))
    check_requirements(result)
    return result


def unmet_requirements(chosen: Iterable[Series], every: Iterable[Series], pin: str) -> list[tuple[str, str]]:
    """(series, required series) for each series of ``chosen`` whose ``pin`` variant requires a series that is not
    chosen. A required series that ``every`` holds with nothing for the pin (upstream has it, or no variant) cannot
    be applied, so it is not asked for; one ``every`` lacks is missing."""
    chosen = list(chosen)
    names = {s.name for s in chosen}
    known = {s.name: s for s in every}
    missing = []
    for s in chosen:
        variant = s.variant(pin)
        if variant is None or not variant.patches:
            continue
        missing += [(s.name, req) for req in variant.requires
                    if req not in names and (req not in known or known[req].patches_for(pin))]
    return missing


def check_requirements(every: Iterable[Series]) -> None:
    """Every series a variant requires is a series of the order (checked when the series are loaded)."""
    every = list(every)
    known = {s.name for s in every}
    for s in every:
        for pin, variant in s.pins.items():
            for req in variant.requires:
                if req not in known or req == s.name:
                    raise ConfigError(f"{s.folder / 'series.yaml'}: pins.{pin}.requires: '{req}' is not another "
                                      "series of patches/series.yaml's order",
                                      hint="name a series listed by `g4build patches list`")


def get_series(name: str, root: Path | None = None) -> Series:
    all_series = load_all(root)
    for s in all_series:
        if s.name == name:
            return s
    known = ", ".join(s.name for s in all_series)
    raise UsageError(f"unknown series '{name}': expected one of {known}", hint="run `g4build patches list`")


def stack_digest(pin: Pin, series: Iterable[Series], base_os: str | None = None, build: Iterable[Series] = ()) -> str:
    """A short digest of pin + series contents, used in wheel versions (``+cu130.g4.<digest>``); with
    ``base_os`` the pin's base tree for that OS (fork commit, onto, keep_pin, fixups) counts too; ``build``: the
    build series a compiled wheel also carries (``patches/deps/``; none for an overlay)."""
    h = hashlib.sha256()
    h.update(f"{pin.name}\0{pin.upstream.commit}\0{pin.sdist.sha256}\0".encode())
    if base_os is not None and base_os in pin.bases:
        h.update(f"base\0{base_digest(pin, base_os)}\0".encode())
    for s in series:
        h.update(f"{s.name}\0{s.version}\0".encode())
        for p in s.patches_for(pin.name):
            h.update(hashlib.sha256(p.read_bytes()).digest())
    for s in build:  # after a marker, so a build series can never read as one of the series
        h.update(f"build\0{s.name}\0{s.version}\0".encode())
        for p in s.patches_for(pin.name):
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:10]


def local_label(cuda: str, pin: Pin, series: Iterable[Series], base_os: str | None = None,
                build: Iterable[Series] = (), words: Iterable[str] = ()) -> str:
    """The local version label g4build gives a wheel: ``cu130.g4.<digest>``; ``words`` go before ``g4`` (a build
    of fewer kernels: ``cu130.gemma4.g4.<digest>``), so the label still ends with the manifest's digest."""
    return ".".join([f"cu{cuda.replace('.', '')}", *words, "g4", stack_digest(pin, series, base_os, build)])
