"""Pins: the upstream vLLM releases g4build builds on, loaded from ``patches/pins.yaml``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from g4build.data import load_yaml_mapping, patches_dir, require
from g4build.errors import ConfigError, UnknownPinError

_HEX = re.compile(r"^[0-9a-f]{7,40}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
FULL_SHA_RE = re.compile(r"^[0-9a-f]{40}$")
# Pin and OS names become folder names (patches/<os>-base/<pin>/); file names become cache paths.
PIN_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]*")
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*")
# A version as pins hold it: what `packaging` parses, spelt with these characters only (no quote, space or
# separator: the value is rendered into scripts and Python programs)
_VERSION_CHARS = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+!_-]*")
CUDA_RE = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}")
# A version range as pins hold it (PEP 440 specifiers), in the characters of one: it is rendered into scripts
_SPECIFIER_CHARS = re.compile(r"[0-9A-Za-z.,<>=!~*+ -]+")
# A git remote: a URL or a path, never an option (a leading '-'), never a space, quote or control character
_REMOTE = re.compile(r"[A-Za-z0-9_./~@][A-Za-z0-9_./:~@%+=-]*")


def version_problem(value: str) -> str | None:
    """Why ``value`` is not a version a pin may hold, or None."""
    if not _VERSION_CHARS.fullmatch(value) or len(value) > 64:
        return "characters outside a version's (letters, digits, '.+!_-')"
    try:
        Version(value)
    except InvalidVersion:
        return "no version (PEP 440)"
    return None


def cuda_problem(value: str) -> str | None:
    return None if CUDA_RE.fullmatch(value) else "no CUDA line (major.minor, e.g. 13.0)"


def remote_problem(value: str) -> str | None:
    if not _REMOTE.fullmatch(value) or "::" in value:
        return "characters a git URL or path does not have (or a leading '-', or a transport helper '::')"
    return None


@dataclass(frozen=True, kw_only=True)
class GitRef:
    remote: str
    commit: str  # full sha or a short id (verified as a prefix)

    def matches(self, full_sha: str) -> bool:
        return full_sha.lower().startswith(self.commit.lower())


@dataclass(frozen=True, kw_only=True)
class Base(GitRef):
    """A per-OS base tree: a fork's commit, used as it is or forward-ported onto the pin.

    Without ``onto`` the fork commit *is* the source (a fork release of the pin's version). With ``onto`` (the
    upstream commit the fork's changes sit on), the fork's own changes, ``onto..commit``, are merged file by
    file onto the pin's upstream tree; ``keep_pin`` lists files where the pin's version is kept instead (the
    fork's change there is upstream drift or is re-done by ``patches/<os>-base/<pin>/`` of our own).
    """

    onto: str | None = None
    keep_pin: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"remote": self.remote, "commit": self.commit}
        if self.onto:
            out |= {"onto": self.onto, "keep_pin": list(self.keep_pin)}
        return out


@dataclass(frozen=True, kw_only=True)
class FileRef:
    file: str
    sha256: str


@dataclass(frozen=True, kw_only=True)
class Pin:
    name: str
    version: str
    upstream: GitRef
    sdist: FileRef
    torch: str
    cuda: str
    flashinfer: str
    wheels: dict[str, FileRef] = field(default_factory=dict)
    bases: dict[str, Base] = field(default_factory=dict)  # per-OS base tree, e.g. "windows"
    # The transformers versions this release loads the published Gemma 4 checkpoints with (PEP 440 specifiers,
    # narrower than the release's own requirement where it cannot); None: the release's own requirement
    transformers: str | None = None

    @property
    def parsed_version(self) -> Version:
        return Version(self.version)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "remote": self.upstream.remote,
            "commit": self.upstream.commit,
            "sdist": self.sdist.file,
            "sha256": self.sdist.sha256,
            "torch": self.torch,
            "cuda": self.cuda,
            "flashinfer": self.flashinfer,
            "wheels": {k: {"file": v.file, "sha256": v.sha256} for k, v in self.wheels.items()},
            "bases": {k: v.to_dict() for k, v in self.bases.items()},
            "transformers": self.transformers,
        }


@dataclass(frozen=True, kw_only=True)
class PinSet:
    default: str
    pins: dict[str, Pin]
    source: Path

    def get(self, name: str | None) -> Pin:
        key = name or self.default
        if key not in self.pins:
            known = ", ".join(sorted(self.pins))
            raise UnknownPinError(
                f"unknown pin '{key}': expected one of {known}",
                hint="run `g4build pins list` to see the pins and what they hold",
            )
        return self.pins[key]

    def nearest(self, version: str) -> Pin:
        """The pin with the highest version not above ``version`` (else the lowest pin)."""
        target = Version(version)
        ordered = sorted(self.pins.values(), key=lambda p: p.parsed_version)
        below = [p for p in ordered if p.parsed_version <= target]
        return below[-1] if below else ordered[0]


def _git_ref(raw: Any, where: str) -> GitRef:
    remote = require(raw, "remote", str, where)
    if remote_problem(remote):
        raise ConfigError(f"{where}.remote: expected a git URL or path, found {remote!r}: it has "
                          f"{remote_problem(remote)}", hint="e.g. https://github.com/vllm-project/vllm.git")
    commit = str(require(raw, "commit", (str, int), where)).lower()
    if not _HEX.fullmatch(commit):
        raise ConfigError(f"{where}.commit: expected 7-40 hex digits, found {commit!r}")
    return GitRef(remote=remote, commit=commit)


def _base(raw: Any, where: str) -> Base:
    ref = _git_ref(raw, where)
    onto = raw.get("onto")
    keep = raw.get("keep_pin") or []
    if onto is not None:
        onto = str(onto).lower()
        if not FULL_SHA_RE.fullmatch(onto):
            raise ConfigError(f"{where}.onto: expected the fork's upstream commit as 40 hex digits, found {onto!r}")
        if not FULL_SHA_RE.fullmatch(ref.commit):
            raise ConfigError(f"{where}.commit: a forward-ported base needs the full 40-digit fork commit, "
                              f"found {ref.commit!r}")
    if not isinstance(keep, list) or not all(isinstance(k, str) and k for k in keep):
        raise ConfigError(f"{where}.keep_pin: expected a list of file paths, found {keep!r}")
    if keep and onto is None:
        raise ConfigError(f"{where}.keep_pin needs onto: files are kept only when the fork is forward-ported")
    bad = [k for k in keep if k.startswith("/") or ".." in k.split("/") or "\\" in k or re.match(r"[A-Za-z]:", k)]
    if bad:
        raise ConfigError(f"{where}.keep_pin: expected paths inside the tree, found {bad}")
    return Base(remote=ref.remote, commit=ref.commit, onto=onto, keep_pin=tuple(keep))


def _file_ref(raw: Any, where: str) -> FileRef:
    file = require(raw, "file", str, where)
    if not _FILE_NAME.fullmatch(file) or ".." in file:
        raise ConfigError(f"{where}.file: expected a plain file name as the package index lists it, found {file!r}",
                          hint="no folders, '..' or spaces: e.g. vllm-0.21.0.tar.gz")
    sha = require(raw, "sha256", str, where).lower()
    if not SHA256_RE.fullmatch(sha):
        raise ConfigError(f"{where}.sha256: expected 64 hex digits, found {sha!r}")
    return FileRef(file=file, sha256=sha)


def _version_text(raw: Any, key: str, where: str) -> str:
    """A version-like value, which must be a YAML string (unquoted ``2.10`` reads as the number 2.1), and a version
    (``cuda``: a CUDA line) in the characters of one: it is rendered into scripts and programs."""
    value = require(raw, key, (str, float, int), where)
    if not isinstance(value, str):
        raise ConfigError(
            f"{where}.{key}: expected a quoted version string, found the number {value!r} "
            "(YAML reads an unquoted 2.10 as 2.1)",
            hint=f'quote it, e.g. {key}: "{value}"',
        )
    why = cuda_problem(value) if key == "cuda" else version_problem(value)
    if why:
        raise ConfigError(f"{where}.{key}: not a version: {value!r} has {why}",
                          hint=f'e.g. {key}: "13.0"' if key == "cuda" else f'e.g. {key}: "2.11.0"')
    return value


def specifier_problem(value: str) -> str | None:
    """Why ``value`` is not a version range a pin may hold (PEP 440 specifiers), or None."""
    if not _SPECIFIER_CHARS.fullmatch(value) or len(value) > 200:
        return "characters outside a version range's (letters, digits, ' .,<>=!~*+-')"
    try:
        spec = SpecifierSet(value)
    except InvalidSpecifier:
        return "no version range (PEP 440 specifiers, e.g. >=5.5.1,<5.15)"
    return None if len(spec) else "no specifier at all"


def _specifier_text(raw: Any, key: str, where: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or specifier_problem(value):
        why = specifier_problem(value) if isinstance(value, str) else f"a {type(value).__name__}"
        raise ConfigError(f"{where}.{key}: expected a quoted version range, found {value!r}: it has {why}",
                          hint=f'e.g. {key}: ">=5.5.1,<5.15"')
    return value.strip()


def _name(key: Any, where: str) -> str:
    if not isinstance(key, str) or not PIN_NAME_RE.fullmatch(key):
        raise ConfigError(f"{where}: {key!r} is not a valid name: expected lower case letters, digits, '.', '-', '_'",
                          hint="names become folder names, e.g. vllm-0.21.0 or windows")
    return key


def _pin(name: str, raw: Any, where: str) -> Pin:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping of version, upstream, sdist, torch, cuda, flashinfer; "
                          f"found {type(raw).__name__} ({raw!r})")
    version = _version_text(raw, "version", where)
    wheels_raw = raw.get("wheels") or {}
    bases_raw = raw.get("bases") or {}
    if not isinstance(wheels_raw, dict) or not isinstance(bases_raw, dict):
        raise ConfigError(f"{where}: 'wheels' and 'bases' must be mappings")
    return Pin(
        name=name,
        version=version,
        upstream=_git_ref(require(raw, "upstream", dict, where), f"{where}.upstream"),
        sdist=_file_ref(require(raw, "sdist", dict, where), f"{where}.sdist"),
        torch=_version_text(raw, "torch", where),
        cuda=_version_text(raw, "cuda", where),
        flashinfer=_version_text(raw, "flashinfer", where),
        wheels={k: _file_ref(v, f"{where}.wheels.{k}") for k, v in wheels_raw.items()},
        bases={_name(k, f"{where}.bases"): _base(v, f"{where}.bases.{k}") for k, v in bases_raw.items()},
        transformers=_specifier_text(raw, "transformers", where),
    )


def load_pins(path: Path | None = None) -> PinSet:
    path = path or patches_dir() / "pins.yaml"
    data = load_yaml_mapping(path)
    where = str(path)
    pins_raw = require(data, "pins", dict, where)
    if not pins_raw:
        raise ConfigError(f"{where}.pins: expected at least one pin, found none")
    pins = {_name(name, f"{where}: pins"): _pin(name, raw, f"{where}: pins.{name}") for name, raw in pins_raw.items()}
    default = require(data, "default", str, where)
    if default not in pins:
        raise ConfigError(f"{where}: default pin '{default}' is not one of {', '.join(sorted(pins))}")
    return PinSet(default=default, pins=pins, source=path)
