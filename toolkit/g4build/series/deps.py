"""Build series: patch series for what only a compiled build reads (CMake logic), in ``patches/deps/``.

Layout::

    patches/deps/series.yaml                     order: [name, ...]
    patches/deps/<name>/series.yaml              a series (the model of ``g4build.series.model``) plus the keys below
    patches/deps/<name>/<pin>/NNNN-*.patch       per-pin patches, git diff format, relative to the project's root

Extra keys: ``project`` — the CMake FetchContent name of a dependency as the pin's CMake declares it
(``vllm-flash-attn``), or ``vllm`` for the vLLM tree's own CMake; per pin ``commit`` — the dependency commit the
variant is written for (the pin's CMake must name exactly it; not used for ``vllm``) and ``files`` — the sha256
of each file the patches touch as that commit has it (a changed file is drift even where the context still
matches); ``decisions`` — what each kernel family is compiled for on the target and why (documentation that
the tests hold against the pin's CMake), each optionally with ``units`` (globs of the units it compiles),
``left_out_in`` (the kernel profiles that leave it out) and ``cmake_family`` (the G4B_NO_<name> definitions,
comma-separated, that the patched bindings read then).

These series are never part of ``patches/series.yaml``: an overlay (Python only) never sees them, and a build
applies them after the series, to the vLLM tree (``vllm``) or to a patched copy of the prefetched dependency
that the CMake initial cache then names.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from g4build.data import load_yaml_mapping, patches_dir, require
from g4build.errors import ConfigError, UsageError
from g4build.pins.model import FULL_SHA_RE, PIN_NAME_RE, SHA256_RE, Pin
from g4build.series.model import Series, load_series
from g4build.series.patchfile import parse_patch, touched_paths
from g4build.util.safeload import read_patch
from g4build.util.yamlsafe import confined, tree_relative

DEPS_FOLDER = "deps"
VLLM_PROJECT = "vllm"  # the vLLM tree itself (its CMakeLists.txt), not a FetchContent dependency
# Kernel profiles the vllm-kernel-archs series knows (its CMake cache variable G4B_KERNEL_PROFILE); `all` first:
# the default, what a build gets when the variable is unset.
KERNEL_PROFILES = ("all", "gemma4")
_CMAKE_FAMILY_RE = re.compile(r"[A-Z][A-Z0-9_]*")


@dataclass(frozen=True, kw_only=True)
class Decision:
    """One kernel family: the arch list upstream's CMake gives it, what a target list gets, what we do."""

    family: str
    cmake: str  # the CMake variable (or the file) that holds the family's arch list
    upstream: str  # the SRC list upstream intersects with (as written in the CMake)
    decision: str  # keep | patch | dependency-series
    why: str
    units: tuple[str, ...] = ()  # globs of the units it compiles (tree-relative; fetched projects as <name>/...)
    left_out_in: tuple[str, ...] = ()  # kernel profiles that leave it out
    cmake_families: tuple[str, ...] = ()  # the G4B_NO_<name> definitions the bindings read when it is left out

    def to_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"family": self.family, "cmake": self.cmake, "upstream": self.upstream,
                                 "decision": self.decision, "why": self.why}
        for key, value in (("units", self.units), ("left_out_in", self.left_out_in),
                           ("cmake_family", self.cmake_families)):
            if value:
                found[key] = list(value)
        return found


@dataclass(frozen=True, kw_only=True)
class DepVariant:
    commit: str | None  # the dependency commit this variant patches (None for the vLLM tree: the pin fixes it)
    files: dict[str, str]  # touched path -> sha256 of the pristine file at that commit


@dataclass(frozen=True, kw_only=True)
class BuildSeries:
    series: Series
    project: str
    variants: dict[str, DepVariant]
    decisions: tuple[Decision, ...] = ()

    @property
    def name(self) -> str:
        return self.series.name

    @property
    def version(self) -> int:
        return self.series.version

    @property
    def is_dependency(self) -> bool:
        return self.project != VLLM_PROJECT

    def variant(self, pin_name: str) -> DepVariant | None:
        return self.variants.get(pin_name)

    def applies_to(self, pin_name: str) -> bool:
        return bool(self.series.patches_for(pin_name))

    def record(self, pin_name: str) -> dict[str, Any]:
        """What a plan lists and a manifest keeps: name, version, project, commit, patches with sha256."""
        v = self.variants.get(pin_name)
        return {
            "name": self.name,
            "version": self.version,
            "project": self.project,
            "commit": v.commit if v else None,
            "patches": [{"file": p.file, "subject": p.subject, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                        for p in self.series.patches_for(pin_name)],
        }


def _sha256(value: Any, where: str) -> str:
    if not isinstance(value, str) or not SHA256_RE.fullmatch(value):
        raise ConfigError(f"{where}: expected a sha256 (64 lower-case hex digits), found {value!r}")
    return value


def _dep_variant(raw: Any, project: str, where: str) -> DepVariant:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, found {type(raw).__name__}")
    commit = raw.get("commit")
    if project != VLLM_PROJECT:
        if not isinstance(commit, str) or not FULL_SHA_RE.fullmatch(commit):
            raise ConfigError(f"{where}.commit: expected the dependency's full commit (40 hex digits), found "
                              f"{commit!r}", hint="the GIT_TAG the pin's CMake declares for it")
    elif commit is not None:
        raise ConfigError(f"{where}.commit: project {VLLM_PROJECT} is the pin's own tree; drop the commit")
    files_raw = raw.get("files") or {}
    if not isinstance(files_raw, dict):
        raise ConfigError(f"{where}.files: expected a mapping path -> sha256")
    files = {tree_relative(str(k), f"{where}.files"): _sha256(v, f"{where}.files.{k}") for k, v in files_raw.items()}
    return DepVariant(commit=commit if isinstance(commit, str) else None, files=files)


def _decisions(raw: Any, where: str) -> tuple[Decision, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{where}.decisions: expected a list")
    found = []
    for i, d in enumerate(raw):
        w = f"{where}.decisions[{i}]"
        decision = require(d, "decision", str, w)
        if decision not in ("keep", "patch", "dependency-series"):
            raise ConfigError(f"{w}.decision: expected keep, patch or dependency-series, found {decision!r}")
        found.append(Decision(family=require(d, "family", str, w), cmake=require(d, "cmake", str, w),
                              upstream=require(d, "upstream", str, w), decision=decision,
                              why=" ".join(require(d, "why", str, w).split()), **_profile_keys(d, w)))
    return tuple(found)


def _profile_keys(d: dict[str, Any], w: str) -> dict[str, tuple[str, ...]]:
    units = d.get("units") or []
    if not isinstance(units, list) or not all(isinstance(u, str) and u for u in units):
        raise ConfigError(f"{w}.units: expected a list of path globs, found {units!r}")
    left_out = d.get("left_out_in") or []
    if not isinstance(left_out, list) or not set(left_out) <= set(KERNEL_PROFILES):
        raise ConfigError(f"{w}.left_out_in: expected a list of kernel profiles ({', '.join(KERNEL_PROFILES)}), "
                          f"found {left_out!r}")
    raw = d.get("cmake_family") or ""
    families = tuple(f.strip() for f in raw.split(",") if f.strip()) if isinstance(raw, str) else ()
    if not isinstance(raw, str) or not all(_CMAKE_FAMILY_RE.fullmatch(f) for f in families):
        raise ConfigError(f"{w}.cmake_family: expected CMake family names (PAGED_ATTENTION, ...) separated by "
                          f"commas, found {raw!r}")
    if bool(left_out) != bool(families):
        raise ConfigError(f"{w}: left_out_in and cmake_family go together (a family a profile leaves out names "
                          "the G4B_NO_<name> definition its bindings read)")
    return {"units": tuple(units), "left_out_in": tuple(left_out), "cmake_families": families}


def load_build_series(folder: Path) -> BuildSeries:
    series = load_series(folder)
    meta_path = folder / "series.yaml"
    data = load_yaml_mapping(meta_path)
    where = str(meta_path)
    project = require(data, "project", str, where)
    if not PIN_NAME_RE.fullmatch(project.lower()):
        raise ConfigError(f"{where}.project: {project!r} is not a FetchContent name")
    variants: dict[str, DepVariant] = {}
    for pin, raw in require(data, "pins", dict, where).items():
        v = _dep_variant(raw, project, f"{where}: pins.{pin}")
        touched = {p for sp in series.patches_for(pin) for p in _touched(sp.path)}
        missing = sorted(touched - set(v.files))
        if missing:
            raise ConfigError(f"{where}: pins.{pin}.files: no sha256 for {', '.join(missing)}, which the patches "
                              "touch", hint="record each touched file's sha256 as the pinned commit has it")
        variants[pin] = v
    return BuildSeries(series=series, project=project, variants=variants,
                       decisions=_decisions(data.get("decisions"), where))


def _touched(patch: Path) -> set[str]:
    return touched_paths(parse_patch(read_patch(patch), where=str(patch)))


def deps_root(root: Path | None = None) -> Path:
    return (root or patches_dir()) / DEPS_FOLDER


def load_all_build(root: Path | None = None) -> list[BuildSeries]:
    """Every build series named in ``patches/deps/series.yaml``, in order (none when the file is absent)."""
    base = deps_root(root)
    order_path = base / "series.yaml"
    if not order_path.is_file():
        return []
    order = require(load_yaml_mapping(order_path), "order", list, str(order_path))
    result: list[BuildSeries] = []
    for name in order:
        if not isinstance(name, str) or not PIN_NAME_RE.fullmatch(name) or name in {b.name for b in result}:
            raise ConfigError(f"{order_path}.order: {name!r} is a duplicate or not a series folder name")
        folder = confined(base, name, f"{order_path}.order")
        if not (folder / "series.yaml").is_file():
            raise ConfigError(f"{order_path}.order: build series '{name}' has no {folder / 'series.yaml'}")
        result.append(load_build_series(folder))
    return result


def build_series_for(pin: Pin, root: Path | None = None, *, base_os: str | None = None) -> list[BuildSeries]:
    """The build series with patches for ``pin``, in order. On an OS base tree (Windows: the fork's tree) only
    those for a FetchContent dependency: the base tree declares its own dependency commits, and applying checks
    the declared commit against the variant's (a different one stops the build, exit 2); vLLM's own CMake files
    there are the fork's, not the ones a ``project: vllm`` variant is written and checked against."""
    return [b for b in load_all_build(root) if b.applies_to(pin.name) and (base_os is None or b.is_dependency)]


def uncovered(pin: Pin, root: Path | None = None, *, base_os: str | None = None) -> list[BuildSeries]:
    """Build series a build of ``pin`` goes without (the plan says so: their fix is missing from that build):
    those with no variant for the pin, and on an OS base tree those for vLLM's own CMake."""
    return [b for b in load_all_build(root)
            if b.series.variant(pin.name) is None or (base_os is not None and not b.is_dependency)]


def get_build_series(name: str, root: Path | None = None) -> BuildSeries:
    found = load_all_build(root)
    for b in found:
        if b.name == name:
            return b
    known = ", ".join(b.name for b in found) or "none"
    raise UsageError(f"unknown build series '{name}': expected one of {known}", hint="run `g4build deps list`")


def chosen_build_series(pin: Pin, names: Sequence[str] | None = None) -> list[BuildSeries]:
    """The build series to apply for ``pin``: ``names`` (each must have patches for it), else all that do."""
    if not names:
        return build_series_for(pin)
    chosen = [get_build_series(n) for n in names]
    empty = [b.name for b in chosen if not b.applies_to(pin.name)]
    if empty:
        raise UsageError(f"build series {', '.join(empty)} has no patches for pin {pin.name}",
                         hint="`g4build deps list` shows the pins each build series covers")
    return chosen


def series_of(build: Iterable[BuildSeries]) -> list[Series]:
    return [b.series for b in build]


def patched_copy_key(pristine_name: str, build: Sequence[BuildSeries], pin_name: str) -> str:
    """Names the patched copy of a dependency: the pristine copy plus each series' name, version and patches."""
    h = hashlib.sha256(f"{pristine_name}\0{pin_name}\0".encode())
    for b in build:
        h.update(f"{b.name}\0{b.version}\0".encode())
        for p in b.series.patches_for(pin_name):
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:10]
