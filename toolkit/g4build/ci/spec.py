"""``ci/matrix.yaml`` as frozen data: axes, exclusions, required cells, runners, toolkits, pinned actions.

Loading checks every value a rule names against the axes, so a typo fails loudly instead of matching nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from g4build.data import ci_dir, load_yaml_mapping, require
from g4build.errors import ConfigError

AXES = ("os", "arch", "cuda", "python")
WHEEL_ABIS = ("abi3", "cpython")
KNOWN_OS = ("linux", "windows")  # hosted runners exist for these; WSL builds run on a user's machine
_PATTERNS = {
    "arch": re.compile(r"^sm\d{2,3}$"),
    "cuda": re.compile(r"^\d+\.\d+$"),
    "python": re.compile(r"^3\.\d+$"),
}
_SHA = re.compile(r"^[0-9a-f]{40}$")


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
    torch_index_variable: str
    smoke_cell: Selector
    port_token_secret: str  # a repository secret: a token that may push a branch and open a pull request
    # a repository variable: the URL the package index is served at (unset: the repository's GitHub Pages URL)
    index_url_variable: str
    # repository variables <prefix>_BUCKET, _ENDPOINT, _REGION and secrets <prefix>_KEY_ID, _SECRET_KEY: with
    # the bucket set, sccache keeps compiled units in that S3-compatible bucket instead of the Actions cache
    sccache_prefix: str


@dataclass(frozen=True, kw_only=True)
class TestsSpec:
    workflow: str
    runner: str
    python: tuple[str, ...]
    timeout_minutes: int
    install: str
    run: str
    # the tests the default run leaves out (pytest -m heavy), on a schedule and on demand
    heavy_run: str
    heavy_cron: str


@dataclass(frozen=True, kw_only=True)
class MatrixSpec:
    axes: dict[str, tuple[str, ...]]
    build_python: str
    optional_arch: tuple[str, ...]
    needs_base: tuple[str, ...]
    exclude: tuple[Rule, ...]
    required: tuple[Selector, ...]
    runners: dict[str, str]
    wheel_abi: dict[str, str]  # per OS: "abi3" (one wheel for every Python) or "cpython" (build_python's only)
    runner_overrides: tuple[Rule, ...]
    cuda_toolkit: dict[str, str]
    nightly: NightlySpec
    tests: TestsSpec
    actions: dict[str, ActionPin]
    source: Path


def _text(value: Any, where: str) -> str:
    """A scalar that must be a YAML string: an unquoted 3.10 reads as the number 3.1."""
    if isinstance(value, float):
        raise ConfigError(f"{where}: expected a quoted version string, found the number {value!r} "
                          "(YAML reads an unquoted 3.10 as 3.1)", hint=f'quote it: "{value}"')
    return str(value)


def _strings(raw: Any, where: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: expected a non-empty list, found {raw!r}")
    values = tuple(_text(v, where) for v in raw)
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
            if not pattern.fullmatch(value):
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
        if not _SHA.fullmatch(sha):
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
    build_python = _text(require(data, "build_python", (str, float), where), f"{where}: build_python")
    if build_python not in axes["python"]:
        raise ConfigError(f"{where}: build_python {build_python} is not in axes.python ({', '.join(axes['python'])})")
    optional = tuple(str(a) for a in data.get("optional_arch") or [])
    for arch in optional:
        if arch not in axes["arch"]:
            raise ConfigError(f"{where}: optional_arch names '{arch}', not in axes.arch")
    needs_base = tuple(str(o) for o in data.get("needs_base") or [])
    for os_name in needs_base:
        if os_name not in axes["os"]:
            raise ConfigError(f"{where}: needs_base names '{os_name}', not in axes.os")
    runners = {str(k): str(v) for k, v in require(data, "runners", dict, where).items()}
    for os_name in axes["os"]:
        if os_name not in runners:
            raise ConfigError(f"{where}: runners has no label for os '{os_name}'")
    wheel_abi = {str(k): str(v) for k, v in require(data, "wheel_abi", dict, where).items()}
    for os_name in axes["os"]:
        if wheel_abi.get(os_name) not in WHEEL_ABIS:
            raise ConfigError(
                f"{where}: wheel_abi.{os_name}: expected one of {', '.join(WHEEL_ABIS)}, found "
                f"{wheel_abi.get(os_name)!r}",
                hint="abi3 when the wheel is tagged cp38-abi3 (serves every Python), cpython when it is cpXY-cpXY",
            )
    toolkit = {_text(k, f"{where}: cuda_toolkit key"): str(v)
               for k, v in require(data, "cuda_toolkit", dict, where).items()}
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
        tool_python=_text(require(nightly_raw, "tool_python", (str, float), nw), f"{nw}.tool_python"),
        build_timeout_minutes=_int(nightly_raw, "build_timeout_minutes", nw),
        check_timeout_minutes=_int(nightly_raw, "check_timeout_minutes", nw),
        gpu_runner_variable=require(nightly_raw, "gpu_runner_variable", str, nw),
        torch_index_variable=require(nightly_raw, "torch_index_variable", str, nw),
        smoke_cell=_selector(require(nightly_raw, "smoke_cell", dict, nw), axes, f"{nw}.smoke_cell"),
        port_token_secret=require(nightly_raw, "port_token_secret", str, nw),
        index_url_variable=require(nightly_raw, "index_url_variable", str, nw),
        sccache_prefix=require(nightly_raw, "sccache_prefix", str, nw),
    )
    for key in ("gpu_runner_variable", "torch_index_variable", "port_token_secret", "index_url_variable",
                "sccache_prefix"):
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", getattr(nightly, key)):
            raise ConfigError(f"{nw}.{key}: not a variable name: {getattr(nightly, key)!r}")
    tests_raw = require(data, "tests", dict, where)
    tw = f"{where}: tests"
    tests = TestsSpec(
        workflow=require(tests_raw, "workflow", str, tw),
        runner=require(tests_raw, "runner", str, tw),
        python=_strings(require(tests_raw, "python", list, tw), f"{tw}.python"),
        timeout_minutes=_int(tests_raw, "timeout_minutes", tw),
        install=require(tests_raw, "install", str, tw),
        run=require(tests_raw, "run", str, tw),
        heavy_run=require(tests_raw, "heavy_run", str, tw),
        heavy_cron=require(tests_raw, "heavy_cron", str, tw),
    )
    actions = _actions(require(data, "actions", dict, where), f"{where}: actions")
    return MatrixSpec(
        axes=axes,
        build_python=build_python,
        optional_arch=optional,
        needs_base=needs_base,
        exclude=_rules(data.get("exclude"), axes, f"{where}: exclude", runner=False),
        required=tuple(_selector(r, axes, f"{where}: required[{i}]") for i, r in enumerate(required_raw)),
        runners=runners,
        wheel_abi=wheel_abi,
        runner_overrides=_rules(data.get("runner_overrides"), axes, f"{where}: runner_overrides", runner=True),
        cuda_toolkit=toolkit,
        nightly=nightly,
        tests=tests,
        actions=actions,
        source=path,
    )


def exclusion_notes(spec: MatrixSpec) -> list[str]:
    return [f"{rule.match}: {rule.why}" for rule in spec.exclude]
