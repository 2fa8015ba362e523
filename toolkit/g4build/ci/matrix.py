"""The wheel matrix expanded into cells, and the target (release, pin) a run builds.

A cell is one (os, arch, cuda, python). Per (os, arch, cuda) one *build* cell compiles the wheel with
``build_python``; where the OS's wheel is abi3 the *check* cells of the other Pythons install that wheel and
import it (a cpXY-cpXY wheel, as on Windows, installs on its own Python only, so it has none). Cells of the
same (target, arch, CUDA, os) share one sccache namespace (``cache_key``) so reruns reuse compiled objects.
"""

from __future__ import annotations

import json
import os
import re
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from packaging.version import InvalidVersion, Version

from g4build.ci.spec import MatrixSpec
from g4build.errors import ConfigError, UsageError
from g4build.pins.index import project_files
from g4build.pins.model import PinSet, load_pins
from g4build.pins.page import IndexFile

Role = Literal["build", "check"]
_SDIST = re.compile(r"^vllm-(?P<version>[^-]+)\.tar\.gz$")


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
    role: Role
    os: str
    arch: str
    cuda: str
    python: str
    runner: str
    required: bool
    toolkit: str
    abi: str = "abi3"  # the wheel's tag kind: "abi3" or "cpython" (cpXY-cpXY)

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
            # a published wheel serves whatever its users load: every kernel family (`g4build wheel`'s default
            # for sm120 is the shorter gemma4 profile, which saves a desktop's time, not a nightly's), and one
            # version scheme on every OS (the Windows tree builds them all anyway)
            return (
                "g4build", "wheel", "--arch", self.arch, "--os", self.os, *target.args,
                "--python", self.python, "--cuda", self.cuda, "--kernels", "all", "--out", "wheelhouse", "--json",
            )
        return ("g4build", "validate", "--arch", self.arch, "--trust-fatbin", "--smoke", "--json",
                "dist/wheelhouse/vllm-*.whl")

    def builds(self, target: Target) -> str:
        if self.role == "build":
            return (
                f"{target.name} {self.wheel_tag} wheels ({self.contents}) for {self.arch}, CUDA {self.cuda}, "
                f"{self.os}, compiled with Python {self.python}"
            )
        return f"nothing: installs the wheel of {self.build_id} on Python {self.python} and imports it"

    @property
    def wheel_tag(self) -> str:
        return "abi3" if self.abi == "abi3" else "cp" + self.python.replace(".", "")

    @property
    def contents(self) -> str:
        # FlashInfer's ahead-of-time kernels are Linux-only (g4build wheel leaves them out on Windows)
        return "vLLM" if self.os == "windows" else "vLLM + FlashInfer AOT"

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
    abi = spec.wheel_abi[os_name]
    if not any(k["python"] == spec.build_python for k in kept):
        raise ConfigError(
            f"{spec.source}: exclude removes the build Python {spec.build_python} of os={os_name}, arch={arch}, "
            f"cuda={cuda} but keeps Pythons {', '.join(k['python'] for k in kept)}: nothing would build their wheel",
            hint="exclude the whole (os, arch, cuda) or keep its build_python cell",
        )
    runner = spec.runners[os_name]
    build_key = {"os": os_name, "arch": arch, "cuda": cuda, "python": spec.build_python}
    for rule in spec.runner_overrides:  # one runner per group: its cells share the build's wheel and cache
        if rule.runner and rule.match.matches(build_key):
            runner = rule.runner
    kept.sort(key=lambda k: k["python"] != spec.build_python)
    if abi != "abi3":  # a cpXY-cpXY wheel: a check cell of another Python could never install it
        kept = [k for k in kept if k["python"] == spec.build_python]
    return [
        Cell(
            role="build" if k["python"] == spec.build_python else "check",
            os=os_name, arch=arch, cuda=cuda, python=k["python"], runner=runner,
            required=arch not in spec.optional_arch and any(sel.matches(k) for sel in spec.required),
            toolkit=spec.cuda_toolkit[cuda], abi=abi,
        )
        for k in kept
    ]


def buildable(
    spec: MatrixSpec, cells: Sequence[Cell], target: Target, pins: PinSet,
) -> tuple[tuple[Cell, ...], tuple[str, ...]]:
    """The cells a target can build, and why the others are left out (an OS whose base tree the pin lacks)."""
    kept: list[Cell] = []
    notes: list[str] = []
    for os_name in spec.axes["os"]:
        mine = [c for c in cells if c.os == os_name]
        if not mine:
            continue
        if os_name in spec.needs_base:
            if target.pin is None:
                notes.append(f"{os_name}: left out: vLLM {target.release} is not pinned, so no {os_name} base "
                             f"tree is known (add a pin with bases.{os_name} to patches/pins.yaml)")
                continue
            if os_name not in pins.get(target.pin).bases:
                notes.append(f"{os_name}: left out: pin {target.pin} names no {os_name} base tree "
                             f"(patches/pins.yaml: pins.{target.pin}.bases.{os_name})")
                continue
        kept.extend(mine)
    if not kept:
        raise UsageError(
            f"nothing to build for {target.name}: " + "; ".join(notes),
            hint="pin a base tree for that OS or choose another pin / release",
        )
    return tuple(kept), tuple(notes)


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


def latest_release() -> str:
    """The newest final vLLM release on the package index (``newest_release`` of its file list)."""
    return newest_release(project_files("vllm"))


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
        version = str(Version(version))  # the normal form: no space, newline or 'v' of the text given survives
    except InvalidVersion as exc:
        raise UsageError(f"release {version!r} is not a version: expected e.g. 0.33.0") from exc
    pinned = [p.name for p in pins.pins.values() if p.parsed_version == Version(version)]
    return Target(release=version, pin=pinned[0] if pinned else None)


def github_outputs(
    spec: MatrixSpec, target: Target, cells: Sequence[Cell], notes: Sequence[str] = (),
) -> dict[str, str]:
    """One-line values for ``$GITHUB_OUTPUT``: the target, the two job matrices and why cells were left out."""
    builds = [c.to_entry(target) for c in cells if c.role == "build"]
    checks = [c.to_entry(target) for c in cells if c.role == "check"]
    smoke = smoke_build(spec, cells)
    return {
        "release": target.release,
        "pin": target.pin or "",
        "torch": load_pins().get(target.pin).torch if target.pin else "",
        "build_matrix": json.dumps({"include": builds}, separators=(",", ":")),
        "check_matrix": json.dumps({"include": checks}, separators=(",", ":")),
        "has_checks": "true" if checks else "false",
        "smoke_artifact": smoke.artifact if smoke else "",
        "left_out": json.dumps(list(notes)),
    }


_OUTPUT_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def append_github_outputs(path: Path, outputs: dict[str, str]) -> None:
    """Append ``outputs`` to a ``$GITHUB_OUTPUT`` (or ``$GITHUB_ENV``) file in GitHub's delimiter form, one
    ``key<<DELIMITER`` block each (LF line ends on every OS): a value holding a newline, or a line like
    ``key=value``, stays one value and adds no key. The delimiter is random and checked absent from the value."""
    blocks = []
    for key, value in outputs.items():
        if not _OUTPUT_KEY.fullmatch(key):
            raise UsageError(f"output name {key!r}: expected letters, digits, '_' and '-'")
        delimiter = f"g4build_{secrets.token_hex(16)}"
        while delimiter in value:  # 128 random bits: never in practice, but proven, not hoped
            delimiter = f"g4build_{secrets.token_hex(16)}"
        blocks.append(f"{key}<<{delimiter}\n{value}\n{delimiter}\n")
    # appended to in place (the runner reads the file by its path), never through a link planted at that path
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    with os.fdopen(os.open(path, flags, 0o666), "w", encoding="utf-8", newline="\n") as fh:
        fh.write("".join(blocks))


def read_github_outputs(text: str) -> dict[str, str]:
    """The values of a ``$GITHUB_OUTPUT`` file as GitHub's runner reads it: ``key=value`` lines and
    ``key<<DELIMITER`` blocks (a later key wins)."""
    values: dict[str, str] = {}
    lines = text.split("\n")
    n = 0
    while n < len(lines):
        line = lines[n].removesuffix("\r")
        n += 1
        if not line:
            continue
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, delimiter = line.split("<<", 1)
            body: list[str] = []
            while n < len(lines) and lines[n].removesuffix("\r") != delimiter:
                body.append(lines[n])
                n += 1
            if n == len(lines):
                raise ConfigError(f"output {key}: its delimiter {delimiter!r} never closes the value")
            n += 1
            values[key] = "\n".join(body)
        else:
            key, _, value = line.partition("=")
            values[key] = value
    return values
