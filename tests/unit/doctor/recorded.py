"""A Probe that answers from recorded tool outputs (``fixtures/<scenario>/``) and records what was asked."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from g4build.builder.probe import CommandResult

FIXTURES = Path(__file__).parent / "fixtures"


def _program(argv0: str) -> str:
    return re.split(r"[\\/]", argv0)[-1].lower().removesuffix(".exe")


class RecordedProbe:
    def __init__(self, scenario: str) -> None:
        self.folder = FIXTURES / scenario
        self.host: dict[str, Any] = yaml.safe_load((self.folder / "host.yaml").read_text())
        self.system = str(self.host["system"])
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, timeout: float = 30.0) -> CommandResult | None:
        self.calls.append(("run", *argv))
        commands = self.host.get("commands") or {}
        whole = " ".join(argv)  # a recording for one exact command line wins over one for the program
        key = whole if whole in commands else argv[0] if argv[0] in commands else _program(argv[0])
        entry = commands.get(key)
        if entry is None:
            return None
        text = (self.folder / entry["stdout"]).read_bytes().decode() if entry.get("stdout") else ""
        return CommandResult(returncode=int(entry.get("rc", 0)), stdout=text, stderr=entry.get("stderr", ""))

    def read_text(self, path: str) -> str | None:
        self.calls.append(("read", path))
        name = (self.host.get("files") or {}).get(path)
        return (self.folder / name).read_text() if name else None

    def env(self, name: str) -> str | None:
        value = (self.host.get("env") or {}).get(name)
        return None if value is None else str(value)

    def cpu_count(self) -> int | None:
        return self.host.get("cpus")

    def memory_bytes(self) -> int | None:
        return self.host.get("memory_bytes")

    def free_disk_bytes(self, path: str) -> int | None:
        self.calls.append(("disk", path))
        return self.host.get("free_disk_bytes")

    def registry_dword(self, key: str, name: str) -> int | None:
        self.calls.append(("registry", key, name))
        return (self.host.get("registry") or {}).get(f"{key}:{name}")

    def docker_ping(self, timeout: float) -> str:
        docker = self.host.get("docker") or {}
        if "error" in docker:
            raise ConnectionError(docker["error"])
        return str(docker["version"])
