"""The wheel matrix: ``ci/matrix.yaml`` loaded into frozen data and expanded into cells.

A cell is one (os, arch, cuda, python). The wheel is abi3, so per (os, arch, cuda) one *build* cell compiles it
with ``build_python`` and the *check* cells of the other Pythons install that wheel and import it. Cells of the
same (target, arch, CUDA, os) share one sccache namespace (``cache_key``) so reruns reuse compiled objects.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from g4build.data import ci_dir, load_yaml_mapping, require
from g4build.errors import ConfigError, UsageError
from g4build.index import IndexFile
from g4build.pins import PinSet

AXES = ("os", "arch", "cuda", "python")
KNOWN_OS = ("linux", "windows")  # hosted runners exist for these; WSL builds run on a user's machine
_PATTERNS = {
    "arch": re.compile(r"^sm\d{2,3}$"),
    "cuda": re.compile(r"^\d+\.\d+$"),
    "python": re.compile(r"^3\.\d+$"),
}
_SHA = re.compile(r"^[0-9a-f]{40}$")
_SDIST = re.compile(r"^vllm-(?P<version>[^-]+)\.tar\.gz$")


@dataclass(frozen=True, kw_only=True)
class Selector:
    """Axis values a cell must all have, e.g. ``{os: windows, arch: sm121}``."""

    values: tuple[tuple[str, str], ...]

    def matches(self, cell: Mapping[str, str]) -> bool:
        return all(cell[axis] == value for axis, value in self.values)

    def __str__(self) -> str:
        return ", ".join(f"{axis}={value}" for axis, value in self.values)


@dataclass(frozen=True, kw_only=True)
class Rule:
    match: Selector
    why: str
    runner: str | None = None  # set on a runner override


@dataclass(frozen=True, kw_only=True)
class ActionPin:
    repo: str
    sha: str
    version: str

    @property
    def ref(self) -> str:
        return f"{self.repo}@{self.sha}"


@dataclass(frozen=True, kw_only=True)
class NightlySpec:
    workflow: str
    cron: str
    tool_python: str
    build_timeout_minutes: int
    check_timeout_minutes: int
    gpu_runner_variable: str
    smoke_cell: Selector


@dataclass(frozen=True, kw_only=True)
class TestsSpec:
    workflow: str
    runner: str
    python: tuple[str, ...]
    timeout_minutes: int
    install: str
    run: str


@dataclass(frozen=True, kw_only=True)
class MatrixSpec:
    axes: dict[str, tuple[str, ...]]
    build_python: str
    optional_arch: tuple[str, ...]
    exclude: tuple[Rule, ...]
    required: tuple[Selector, ...]
    runners: dict[str, str]
    runner_overrides: tuple[Rule, ...]
    cuda_toolkit: dict[str, str]
    nightly: NightlySpec
    tests: TestsSpec
    actions: dict[str, ActionPin]
    source: Path


@dataclass(frozen=True, kw_only=True)
class Target:
    """What a run builds: an upstream release, through its pin when one exists."""

    release: str
    pin: str | None

    @property
    def name(self) -> str:
        return f"vllm-{self.release}"

    @property
    def args(self) -> tuple[str, ...]:
        return ("--pin", self.pin) if self.pin else ("--release", self.release)


@dataclass(frozen=True, kw_only=True)
class Cell:
    role: str  # "build" or "check"
    os: str
    arch: str
    cuda: str
    python: str
    runner: str
    required: bool
    toolkit: str

    @property
    def build_id(self) -> str:
        return f"{self.os}-{self.arch}-cu{self.cuda}"

    @property
    def id(self) -> str:
        return self.build_id if self.role == "build" else f"{self.build_id}-py{self.python}"

    @property
    def artifact(self) -> str:
        """The artifact holding the build cell's wheels, manifest and launch scripts."""
        return f"g4build-{self.build_id}"

    def cache_key(self, target: Target) -> str:
        """sccache's GitHub Actions cache namespace: target (pin) + arch + CUDA, and the OS whose compiler ran."""
        return f"g4build-{target.name}-{self.arch}-cu{self.cuda}-{self.os}"

    def command(self, target: Target) -> tuple[str, ...]:
        if self.role == "build":
            return (
                "g4build", "wheel", "--arch", self.arch, "--os", self.os, *target.args,
                "--python", self.python, "--cuda", self.cuda, "--out", "wheelhouse", "--json",
            )
        return ("g4build", "validate", "--arch", self.arch, "--smoke", "--json", "wheelhouse/<vllm wheel>")

    def builds(self, target: Target) -> str:
        if self.role == "build":
            return (
                f"{target.name} abi3 wheels (vLLM + FlashInfer AOT) for {self.arch}, CUDA {self.cuda}, {self.os}, "
                f"compiled with Python {self.python}"
            )
        return f"nothing: installs the wheel of {self.build_id} on Python {self.python} and imports it"

    def to_entry(self, target: Target) -> dict[str, Any]:
        """The fields a workflow job reads from ``matrix``."""
        return {
            "id": self.id,
            "build_id": self.build_id,
            "os": self.os,
            "arch": self.arch,
            "cuda": self.cuda,
            "python": self.python,
            "toolkit": self.toolkit,
            "runner": self.runner,
            "required": self.required,
            "cache_key": self.cache_key(target),
            "artifact": self.artifact,
        }

    def to_dict(self, target: Target) -> dict[str, Any]:
        return {
            "role": self.role,
            **self.to_entry(target),
            "builds": self.builds(target),
            "command": list(self.command(target)),
        }


# ---------------------------------------------------------------- loading


def _strings(raw: Any, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: expected a non-empty list, found {raw!r}")
    values = tuple(str(v) for v in raw)
    if len(set(values)) != len(values):
        raise ConfigError(f"{where}: duplicate values in {list(values)}")
    return values


def _selector(raw: Any, axes: Mapping[str, tuple[str, ...]], where: str) -> Selector:
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where}: expected a mapping of axis: value, found {raw!r}")
    pairs = []
    for axis, value in raw.items():
        if axis not in axes:
            raise ConfigError(f"{where}: unknown axis '{axis}': expected one of {', '.join(AXES)}")
        if str(value) not in axes[axis]:
            raise ConfigError(
                f"{where}.{axis}: '{value}' is not a value of that axis ({', '.join(axes[axis])})",
                hint="a typo here would silently match nothing",
            )
        pairs.append((str(axis), str(value)))
    return Selector(values=tuple(pairs))


def _rules(raw: Any, axes: Mapping[str, tuple[str, ...]], where: str, *, runner: bool) -> tuple[Rule, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: expected a list, found {type(raw).__name__}")
    rules = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        rules.append(Rule(
            match=_selector(require(item, "match", dict, at), axes, f"{at}.match"),
            why=require(item, "why", str, at),
            runner=require(item, "runner", str, at) if runner else None,
        ))
    return tuple(rules)


def _axes(raw: Any, where: str) -> dict[str, tuple[str, ...]]:
    axes = {axis: _strings(require(raw, axis, list, where), f"{where}.{axis}") for axis in AXES}
    for value in axes["os"]:
        if value not in KNOWN_OS:
            raise ConfigError(f"{where}.os: '{value}' is not one of {', '.join(KNOWN_OS)}")
    for axis, pattern in _PATTERNS.items():
        for value in axes[axis]:
            if not pattern.match(value):
                raise ConfigError(f"{where}.{axis}: '{value}' does not look like {pattern.pattern}")
    return axes


def _int(raw: Any, key: str, where: str) -> int:
    value = require(raw, key, int, where)
    if value <= 0:
        raise ConfigError(f"{where}.{key}: expected a positive number of minutes, found {value}")
    return int(value)


def _actions(raw: Any, where: str) -> dict[str, ActionPin]:
    actions = {}
    for key, item in raw.items():
        at = f"{where}.{key}"
        sha = require(item, "sha", str, at).lower()
        if not _SHA.match(sha):
            raise ConfigError(f"{at}.sha: expected a full 40-hex commit sha, found {sha!r}",
                              hint="pin actions to commits, not tags")
        repo = require(item, "repo", str, at)
        actions[key] = ActionPin(repo=repo, sha=sha, version=require(item, "version", str, at))
    return actions


def load_matrix(path: Path | None = None) -> MatrixSpec:
    path = path or ci_dir() / "matrix.yaml"
    data = load_yaml_mapping(path)
    where = str(path)
    axes = _axes(require(data, "axes", dict, where), f"{where}: axes")
    build_python = str(require(data, "build_python", (str, float), where))
    if build_python not in axes["python"]:
        raise ConfigError(f"{where}: build_python {build_python} is not in axes.python ({', '.join(axes['python'])})")
    optional = tuple(str(a) for a in data.get("optional_arch") or [])
    for arch in optional:
        if arch not in axes["arch"]:
            raise ConfigError(f"{where}: optional_arch names '{arch}', not in axes.arch")
    runners = {str(k): str(v) for k, v in require(data, "runners", dict, where).items()}
    for os_name in axes["os"]:
        if os_name not in runners:
            raise ConfigError(f"{where}: runners has no label for os '{os_name}'")
    toolkit = {str(k): str(v) for k, v in require(data, "cuda_toolkit", dict, where).items()}
    for cuda in axes["cuda"]:
        if not toolkit.get(cuda, "").startswith(cuda + "."):
            raise ConfigError(
                f"{where}: cuda_toolkit needs a {cuda}.x release for CUDA {cuda}, found {toolkit.get(cuda)!r}"
            )
    required_raw = require(data, "required", list, where)
    nightly_raw = require(data, "nightly", dict, where)
    nw = f"{where}: nightly"
    nightly = NightlySpec(
        workflow=require(nightly_raw, "workflow", str, nw),
        cron=require(nightly_raw, "cron", str, nw),
        tool_python=str(require(nightly_raw, "tool_python", (str, float), nw)),
        build_timeout_minutes=_int(nightly_raw, "build_timeout_minutes", nw),
        check_timeout_minutes=_int(nightly_raw, "check_timeout_minutes", nw),
        gpu_runner_variable=require(nightly_raw, "gpu_runner_variable", str, nw),
        smoke_cell=_selector(require(nightly_raw, "smoke_cell", dict, nw), axes, f"{nw}.smoke_cell"),
    )
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", nightly.gpu_runner_variable):
        raise ConfigError(f"{nw}.gpu_runner_variable: not a variable name: {nightly.gpu_runner_variable!r}")
    tests_raw = require(data, "tests", dict, where)
    tw = f"{where}: tests"
    tests = TestsSpec(
        workflow=require(tests_raw, "workflow", str, tw),
        runner=require(tests_raw, "runner", str, tw),
        python=_strings(require(tests_raw, "python", list, tw), f"{tw}.python"),
        timeout_minutes=_int(tests_raw, "timeout_minutes", tw),
        install=require(tests_raw, "install", str, tw),
        run=require(tests_raw, "run", str, tw),
    )
    actions = _actions(require(data, "actions", dict, where), f"{where}: actions")
    return MatrixSpec(
        axes=axes,
        build_python=build_python,
        optional_arch=optional,
        exclude=_rules(data.get("exclude"), axes, f"{where}: exclude", runner=False),
        required=tuple(_selector(r, axes, f"{where}: required[{i}]") for i, r in enumerate(required_raw)),
        runners=runners,
        runner_overrides=_rules(data.get("runner_overrides"), axes, f"{where}: runner_overrides", runner=True),
        cuda_toolkit=toolkit,
        nightly=nightly,
        tests=tests,
        actions=actions,
        source=path,
    )


# ---------------------------------------------------------------- expansion


def select_archs(spec: MatrixSpec, selection: str = "default") -> tuple[str, ...]:
    """``default``: the non-optional archs; ``all``; or one arch (``sm120`` / ``sm_120``)."""
    choice = selection.strip().lower().replace("_", "")
    if choice in ("", "default"):
        return tuple(a for a in spec.axes["arch"] if a not in spec.optional_arch)
    if choice == "all":
        return spec.axes["arch"]
    if choice in spec.axes["arch"]:
        return (choice,)
    raise UsageError(
        f"unknown arch selection '{selection}': expected default, all or one of {', '.join(spec.axes['arch'])}",
        hint="archs come from axes.arch in ci/matrix.yaml",
    )


def expand(spec: MatrixSpec, archs: Sequence[str] | None = None) -> tuple[Cell, ...]:
    """Every cell of the matrix for ``archs`` (default selection when None), exclusions applied."""
    chosen = tuple(archs) if archs is not None else select_archs(spec)
    cells: list[Cell] = []
    for os_name in spec.axes["os"]:
        for arch in spec.axes["arch"]:
            if arch not in chosen:
                continue
            for cuda in spec.axes["cuda"]:
                cells.extend(_group(spec, os_name, arch, cuda))
    if not cells:
        raise ConfigError(
            f"{spec.source}: the matrix has no cell for arch {', '.join(chosen)} once exclusions are applied",
            hint="check axes and exclude in ci/matrix.yaml",
        )
    return tuple(cells)


def _group(spec: MatrixSpec, os_name: str, arch: str, cuda: str) -> list[Cell]:
    """The cells of one (os, arch, cuda): its build cell first, then the check cells of the other Pythons."""
    keys = [{"os": os_name, "arch": arch, "cuda": cuda, "python": py} for py in spec.axes["python"]]
    kept = [k for k in keys if not any(rule.match.matches(k) for rule in spec.exclude)]
    if not kept:
        return []
    if not any(k["python"] == spec.build_python for k in kept):
        raise ConfigError(
            f"{spec.source}: exclude removes the build Python {spec.build_python} of os={os_name}, arch={arch}, "
            f"cuda={cuda} but keeps Pythons {', '.join(k['python'] for k in kept)}: nothing would build their wheel",
            hint="exclude the whole (os, arch, cuda) or keep its build_python cell",
        )
    runner = spec.runners[os_name]
    for rule in spec.runner_overrides:
        if rule.match.matches(keys[0] | {"python": spec.build_python}) and rule.runner:
            runner = rule.runner
    kept.sort(key=lambda k: k["python"] != spec.build_python)
    return [
        Cell(
            role="build" if k["python"] == spec.build_python else "check",
            os=os_name, arch=arch, cuda=cuda, python=k["python"], runner=runner,
            required=arch not in spec.optional_arch and any(sel.matches(k) for sel in spec.required),
            toolkit=spec.cuda_toolkit[cuda],
        )
        for k in kept
    ]


def smoke_build(spec: MatrixSpec, cells: Iterable[Cell]) -> Cell | None:
    """The build cell whose wheel the GPU smoke job runs, when the selection built it."""
    for cell in cells:
        keys = {"os": cell.os, "arch": cell.arch, "cuda": cell.cuda, "python": cell.python}
        if cell.role == "build" and spec.nightly.smoke_cell.matches(keys):
            return cell
    return None


# ---------------------------------------------------------------- targets


def newest_release(files: Iterable[IndexFile]) -> str:
    """The highest final (not pre-, not dev-) vLLM version with a non-yanked sdist on the index."""
    versions: list[Version] = []
    for f in files:
        m = _SDIST.match(f.filename)
        if not m or f.yanked:
            continue
        try:
            v = Version(m["version"])
        except InvalidVersion:
            continue
        if not v.is_prerelease and not v.is_devrelease:
            versions.append(v)
    if not versions:
        raise UsageError("the package index lists no final vllm sdist", hint="pass --release X.Y.Z or --pin NAME")
    return str(max(versions))


def resolve_target(
    pins: PinSet, *, pin: str | None, release: str | None, latest: Callable[[], str],
) -> Target:
    """A pin wins as given; a release maps to its pin when pinned; with neither, the newest release."""
    pin = (pin or "").strip() or None
    release = (release or "").strip() or None
    if pin and release:
        raise UsageError(f"give --pin or --release, not both (found {pin} and {release})")
    if pin:
        return Target(release=pins.get(pin).version, pin=pin)
    version = release or latest()
    try:
        Version(version)
    except InvalidVersion as exc:
        raise UsageError(f"release '{version}' is not a version: expected e.g. 0.33.0") from exc
    pinned = [p.name for p in pins.pins.values() if p.parsed_version == Version(version)]
    return Target(release=version, pin=pinned[0] if pinned else None)


def github_outputs(spec: MatrixSpec, target: Target, cells: Sequence[Cell]) -> dict[str, str]:
    """One-line values for ``$GITHUB_OUTPUT``: the target and the two job matrices."""
    builds = [c.to_entry(target) for c in cells if c.role == "build"]
    checks = [c.to_entry(target) for c in cells if c.role == "check"]
    smoke = smoke_build(spec, cells)
    return {
        "release": target.release,
        "pin": target.pin or "",
        "build_matrix": json.dumps({"include": builds}, separators=(",", ":")),
        "check_matrix": json.dumps({"include": checks}, separators=(",", ":")),
        "has_checks": "true" if checks else "false",
        "smoke_artifact": smoke.artifact if smoke else "",
    }
