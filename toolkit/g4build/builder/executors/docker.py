"""The docker executor: the plan's bash script inside a CUDA devel image, wheels copied out.

Uses the docker SDK (``docker.from_env()``); the client is injected so tests can record the calls. The
source, prefetched dependencies, logs and the container's output folder live in host folders mounted into the
container, so a second run resumes; the wheels are copied out of the output folder with ``get_archive``.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from rich.console import Console

from g4build.builder.executors.base import RunResult, StepResult
from g4build.builder.executors.native import error_tail
from g4build.builder.plan import BuildPlan, Layout
from g4build.builder.script import render_bash
from g4build.errors import BuildError, ImageError
from g4build.util.shellquote import bash_word

WORK = "/g4b/work"
DEPS = "/g4b/deps"
OUT = "/g4b/out"
TOOL = "/g4b/g4build"


def container_layout() -> Layout:
    """The layout a plan for the docker executor is made with (paths inside the container)."""
    return Layout(root=WORK, out=OUT, cache=DEPS, sep="/")


def image_for(cuda: str, *, distro: str = "ubuntu24.04") -> str:
    return f"nvidia/cuda:{cuda}.0-devel-{distro}"


TOOL_COPY = "/g4b/g4build-src"  # a writable copy: installing writes build/ and *.egg-info into the source


def copy_tool(src: str, dst: str) -> list[str]:
    """Shell lines copying the g4build project (without .git and build outputs) from ``src`` to ``dst``."""
    q_src, q_dst = bash_word(src), bash_word(dst)
    return [
        f"rm -rf {q_dst} && mkdir -p {q_dst}",
        f"tar -C {q_src} --exclude=./.git --exclude=./build --exclude='*.egg-info' -cf - . | tar -C {q_dst} -xf -",
    ]


def venv_lines(python: str) -> list[str]:
    """Shell lines making /g4b/venv with Python ``python``, or stopping with what the image has instead (the
    plan's steps call ``python{X.Y}``: a venv of another Python would fail later with "command not found")."""
    exe = f"python{python}"
    return [
        f"if ! command -v {exe} >/dev/null; then",
        f'  echo "error: the image has no {exe}: expected it for --python {python}, found '
        '$(python3 --version 2>&1 || echo no python3)" >&2',
        '  echo "hint: pass --python with the version the image has, or build with --executor native" >&2',
        "  exit 2",
        "fi",
        f"{exe} -m venv /g4b/venv",
    ]


def bootstrap(python: str) -> str:
    """Shell lines that give the CUDA image a Python, git and g4build (mounted read-only at TOOL, installed
    from a copy: setuptools writes into the source it builds, which a read-only mount refuses)."""
    return "\n".join([
        "set -euo pipefail",
        "export DEBIAN_FRONTEND=noninteractive",
        "if ! command -v git >/dev/null || ! command -v python3 >/dev/null; then",
        "  apt-get update -q && apt-get install -y -q git python3 python3-venv python3-dev ccache",
        "fi",
        *venv_lines(python),
        ". /g4b/venv/bin/activate",
        *copy_tool(TOOL, TOOL_COPY),
        f"pip install -q {TOOL_COPY} build",
    ])


@dataclass(frozen=True, kw_only=True)
class HostPaths:
    work: Path  # mounted at WORK (source, logs, resume state)
    deps: Path  # mounted at DEPS (prefetched CMake dependencies)
    out: Path  # wheels are copied here
    tool: Path  # the g4build project, mounted read-only at TOOL


class DockerExecutor:
    def __init__(self, host: HostPaths, *, client_factory: Callable[[], Any] | None = None,
                 console: Console | None = None, image: str | None = None) -> None:
        self.host = host
        self.client_factory = client_factory
        self.console = console or Console(stderr=True)
        self.image = image

    def _client(self) -> Any:
        if self.client_factory is not None:
            return self.client_factory()
        import docker  # the SDK; only needed on a machine that runs this executor

        try:
            return docker.from_env()
        except docker.errors.DockerException as exc:
            raise ImageError(f"no Docker engine reachable: {exc}",
                             hint="start Docker (Docker Desktop's WSL integration on Windows) or use "
                                  "--executor native") from exc

    def run(self, plan: BuildPlan, *, clean: bool = False) -> RunResult:
        if plan.layout != container_layout():
            raise BuildError("a plan for the docker executor must use the container layout",
                             hint="make it with g4build.builder.executors.docker.container_layout()")
        client = self._client()
        image = self.image or image_for(plan.target.cuda)
        for p in (self.host.work, self.host.deps, self.host.out):
            p.mkdir(parents=True, exist_ok=True)
        script = bootstrap(plan.target.python) + "\n" + render_bash(plan)
        # OUT lives in the work folder too: a resumed run skips the wheel step, so its wheel must still be there
        kept_out = self.host.work / "out"
        kept_out.mkdir(parents=True, exist_ok=True)
        volumes = {
            str(self.host.work): {"bind": WORK, "mode": "rw"},
            str(kept_out): {"bind": OUT, "mode": "rw"},
            str(self.host.deps): {"bind": DEPS, "mode": "rw"},
            str(self.host.tool): {"bind": TOOL, "mode": "ro"},
        }
        env = {"G4BUILD_CLEAN": "1" if clean else "0"}
        self.console.print(f"docker: {image}")
        client.images.pull(image)
        container = client.containers.run(
            image, command=["bash", "-c", script], volumes=volumes, environment=env, working_dir=WORK,
            detach=True, shm_size="8g",
        )
        start = time.monotonic()
        log = self.host.work / "logs" / "docker.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        lines: list[str] = []
        try:
            with log.open("w", encoding="utf-8") as fh:
                for chunk in container.logs(stream=True, follow=True):
                    text = chunk.decode("utf-8", errors="replace")
                    fh.write(text)
                    lines += text.splitlines()
                    for ln in text.splitlines():
                        if ln.startswith("== "):
                            self.console.print(ln[3:])
            code = int(container.wait().get("StatusCode", 1))
            if code != 0:
                tail = "\n".join(f"    {ln}" for ln in error_tail(lines))
                raise BuildError(f"the build in {image} failed (exit {code})\n{tail}", hint=f"full log: {log}")
            copied = self._copy_out(container)
        finally:
            container.remove(force=True)
        seconds = time.monotonic() - start
        self.console.print(f"docker: copied {', '.join(copied) or 'nothing'} to {self.host.out}")
        return RunResult(steps=(StepResult(name="docker", status="done", seconds=seconds, log=str(log)),))

    def _copy_out(self, container: Any) -> list[str]:
        stream, _stat = container.get_archive(OUT)
        data = io.BytesIO(b"".join(stream))
        copied: list[str] = []
        with tarfile.open(fileobj=data) as tar:
            for member in tar.getmembers():
                name = PurePosixPath(member.name).name
                if member.isfile() and (name.endswith(".whl") or name == "build-manifest.json"):
                    src = tar.extractfile(member)
                    assert src is not None
                    (self.host.out / name).write_bytes(src.read())
                    copied.append(name)
        return copied
