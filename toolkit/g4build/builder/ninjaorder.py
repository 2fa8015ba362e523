"""Long units first: the recorded longest compile units moved to the front of a CMake ``build.ninja``.

Ninja (1.12 and later: ``Plan::ComputeCriticalPath`` in src/build.cc) starts ready edges by critical-path
weight, which counts edges (``EdgeWeightHeuristic``: 1 for each, 0 for phony) and never reads ``.ninja_log``
durations; equal weights go in ascending edge id (``EdgePriorityLess`` in src/graph.h), and an edge's id is its
place in the manifest (``State::AddEdge``); a pool (vLLM's ``compile`` pool) releases its delayed edges by the
same priority (``Pool::WeightedEdgeCmp`` in src/state.h). Every object of vLLM's build weighs the same (object,
link), so the manifest's order is the start order: CMake writes the top directory's targets (``_C``,
``_moe_C``) before the FlashAttention subproject's. Seeding ``.ninja_log`` would change nothing but ninja's ETA.

The build is ``pip wheel``: setup.py configures and builds in one go, so ninja is reached through
``CMAKE_MAKE_PROGRAM`` naming a wrapper (``write_wrapper``) that reorders the build file it is about to read,
then runs the real ninja with the same arguments. The rewrite only moves whole build statements earlier, past
other build statements, never past a rule, pool, include or variable, and keeps the file's mtime, so ninja
sees the same graph and does not rerun CMake. Anything it cannot read is left as it was.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from g4build.builder.buildcosts import BuildCosts, costs_file, load_costs, parse_costs
from g4build.errors import BuildError, ConfigError

WRAPPER = "ninja"
COSTS = "unit-costs.json"
_ENV_CHANGING = ("rule", "pool", "include", "subninja")


@dataclass(frozen=True)
class _Block:
    lines: list[str]
    kind: str  # build, default, rule ..., var (a top-level binding), trivia (comments, blank lines)

    @property
    def output(self) -> str:
        """A build statement's first output, its ``$`` escapes undone."""
        head, out, i = self.lines[0][len("build "):], [], 0
        while i < len(head):
            c = head[i]
            if c == "$" and i + 1 < len(head):
                out.append(head[i + 1] if head[i + 1] in " :$" else head[i:i + 2])
                i += 2
                continue
            if c in " :|\r\n":
                break
            out.append(c)
            i += 1
        return "".join(out)


def _continues(line: str) -> bool:
    """A line ending in an odd run of ``$`` goes on on the next line."""
    body = line.rstrip("\r\n")
    return (len(body) - len(body.rstrip("$"))) % 2 == 1


def _blocks(text: str) -> list[_Block]:
    lines = text.splitlines(keepends=True)
    blocks: list[_Block] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            blocks.append(_Block([line], "trivia"))
            i += 1
            continue
        if line[0] in " \t":
            raise ValueError(f"line {i + 1}: an indented line outside a declaration")
        word = stripped.split(None, 1)[0]
        kind = word if word in ("build", "default", *_ENV_CHANGING) else "var"
        chunk = [line]
        cont = _continues(line)
        i += 1
        # the declaration's own continuation lines, then its indented bindings (and theirs)
        while i < len(lines) and (cont or (kind not in ("var", "default", "include", "subninja")
                                           and lines[i][:1] in (" ", "\t") and lines[i].strip())):
            cont = _continues(lines[i])
            chunk.append(lines[i])
            i += 1
        blocks.append(_Block(chunk, kind))
    return blocks


def reorder(text: str, costs: BuildCosts) -> tuple[str, int]:
    """``text`` with the build statements of recorded units moved, longest first, to the front of the build
    statements that follow the last rule, pool, include or variable; and how many moved."""
    blocks = _blocks(text)
    start = max((i for i, b in enumerate(blocks) if b.kind in (*_ENV_CHANGING, "var")), default=-1) + 1
    known: list[tuple[float, int, _Block]] = []
    rest: list[_Block] = []
    for i, b in enumerate(blocks[start:], start):
        seconds = costs.seconds_of(b.output) if b.kind == "build" else None
        if seconds is None:
            rest.append(b)
        else:
            known.append((-seconds, i, b))
    known.sort(key=lambda k: (k[0], k[1]))
    head = [line for b in blocks[:start] for line in b.lines]
    moved = [line for _, _, b in known for line in b.lines]
    return "".join(head + moved + [line for b in rest for line in b.lines]), len(known)


def reorder_file(build_ninja: Path, costs: BuildCosts) -> str:
    """Rewrite ``build_ninja`` in place (same mtime); one line saying what was done."""
    try:
        raw = build_ninja.read_bytes()
        stat = build_ninja.stat()
        text = raw.decode("utf-8")
        new, n = reorder(text, costs)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return f"{build_ninja}: left in its order ({e})"
    if n == 0:
        return f"{build_ninja}: none of the {len(costs.units)} recorded units is built here"
    if new != text:
        tmp = build_ninja.with_name(build_ninja.name + ".g4build-tmp")
        tmp.write_bytes(new.encode("utf-8"))
        os.utime(tmp, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # ninja must not think CMake has to run again
        os.replace(tmp, build_ninja)
    return f"{build_ninja}: {n} recorded units start first, longest first ({costs.pin} {costs.arch})"


def _manifest(args: Sequence[str]) -> Path | None:
    """The build file a ninja command line reads; None for a tool or query run (-t, --version ...)."""
    folder, name = Path("."), "build.ninja"
    it = iter(args)
    for a in it:
        if a in ("-t", "--version", "-h", "--help") or a.startswith("-t"):
            return None
        if a == "-C":
            folder = folder / next(it, ".")
        elif a.startswith("-C"):
            folder = folder / a[2:]
        elif a == "-f":
            name = next(it, name)
        elif a.startswith("-f"):
            name = a[2:]
    return folder / name


def real_ninja(skip: Path) -> str:
    """The ninja on PATH that is not the wrapper in ``skip``."""
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and Path(p).resolve() != skip.resolve())
    found = shutil.which("ninja", path=path)
    if found is None:
        raise BuildError("no ninja on PATH besides g4build's wrapper: expected the one vLLM's build requirements "
                         "install", hint="install ninja (python -m pip install ninja) and rerun")
    return found


def _old_ninja(ninja: str) -> str:
    """A note when ``ninja`` predates 1.12: it hands out pooled edges (vLLM's compile pool) in the order it finds
    them from the targets (``Plan::ScheduleWork`` as each is added), so the build file's order may not hold."""
    try:
        out = subprocess.run([ninja, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
        version = tuple(int(x) for x in out.split(".")[:2])
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return ""
    if version >= (1, 12):
        return ""
    return f"; ninja {out.strip()} may not keep that order for pooled units: ninja 1.12 or later does"


def main(argv: Sequence[str] | None = None) -> NoReturn:
    """The wrapper: ``--costs FILE --dir WRAPPER_DIR -- NINJA_ARGS...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    split = args.index("--") if "--" in args else len(args)
    mine, ninja_args = args[:split], args[split + 1:]
    costs_path = Path(mine[mine.index("--costs") + 1])
    wrapper_dir = Path(mine[mine.index("--dir") + 1])
    manifest = _manifest(ninja_args)
    ninja = real_ninja(wrapper_dir)
    if manifest is not None and manifest.is_file():
        try:
            costs = parse_costs(json.loads(costs_path.read_text(encoding="utf-8")), costs_path)
            print(f"g4build: {reorder_file(manifest, costs)}{_old_ninja(ninja)}", file=sys.stderr, flush=True)
        except (OSError, ValueError, ConfigError) as e:  # the order is an optimisation: build anyway
            print(f"g4build: build.ninja left in its order ({e})", file=sys.stderr, flush=True)
    os.execv(ninja, [ninja, *ninja_args])


def write_wrapper(folder: Path, patches: Path, pin: str, arch: str, python: str = sys.executable) -> str:
    """The ninja wrapper and its copy of the recorded costs in ``folder``; one line saying what was written."""
    costs = load_costs(patches, pin, arch)
    if costs is None or not costs.units:
        raise ConfigError(f"no recorded unit costs for {pin} {arch}: expected {costs_file(patches, pin, arch)}",
                          hint="record them with tests/device/unit_costs.py from a build's .ninja_log")
    real_ninja(folder)  # refuse now, not in the middle of CMake, when there is no ninja to run
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(costs_file(patches, pin, arch), folder / COSTS)
    package_parent = Path(__file__).resolve().parents[2]  # the folder holding g4build: no PYTHONPATH leaks to ninja
    code = (f"import sys; sys.path.insert(0, {str(package_parent)!r}); "
            "from g4build.builder.ninjaorder import main; sys.exit(main())")
    script = folder / WRAPPER
    script.write_text(
        "#!/bin/sh\n"
        f"# written by g4build: runs ninja with {pin} {arch}'s recorded longest units first in build.ninja\n"
        f"exec {shlex.quote(python)} -c {shlex.quote(code)} --costs {shlex.quote(str(folder / COSTS))} "
        f"--dir {shlex.quote(str(folder))} -- \"$@\"\n", encoding="utf-8")
    script.chmod(0o755)
    return f"{script}: {len(costs.units)} recorded units of {pin} {arch} start first"
