"""Resume: which steps of a plan finished, keyed by each step's inputs digest, kept in the build root."""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from g4build.builder.plan import BuildPlan, Step
from g4build.errors import ConfigError
from g4build.util.safeload import read_json

STATE_MAX_BYTES = 1 << 20  # a plan has a few dozen steps, each a name, a digest and a number
MAX_STEP_SECONDS = 30 * 24 * 3600.0  # no step of a build runs for a month: a larger figure is not a timing
STEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", re.ASCII)
_DIGEST = re.compile(r"[0-9a-f]{1,128}", re.ASCII)


def seconds_problem(value: object) -> str | None:
    """Why ``value`` is no step timing (a finite number of seconds, 0 to ``MAX_STEP_SECONDS``), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"expected a number of seconds, found {type(value).__name__}"
    if not math.isfinite(value) or not 0 <= value <= MAX_STEP_SECONDS:
        return f"expected 0 to {MAX_STEP_SECONDS:.0f} seconds, found {value!r}"
    return None


def _entry_problem(name: str, entry: Any) -> str | None:
    if not STEP_NAME.fullmatch(name):
        return "expected a step name of ASCII letters, digits and . _ -"
    if not isinstance(entry, dict):
        return f"expected a mapping with digest and seconds, found {type(entry).__name__}"
    digest = entry.get("digest")
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        return f"expected a hex digest, found {digest!r:.40}"
    return seconds_problem(entry.get("seconds"))


def _checked_done(raw: Any, path: Path) -> dict[str, dict[str, Any]]:
    """The ``done`` mapping of a state file, every entry typed; else ConfigError naming the entry."""
    hint = f"remove {path} (every step then runs again) or pass the state file this build wrote"
    done = raw.get("done") if isinstance(raw, dict) else None
    if not isinstance(done, dict):
        found = "no done mapping" if isinstance(raw, dict) else type(raw).__name__
        raise ConfigError(f"{path}: expected a build's resume state ({{\"done\": {{STEP: {{digest, seconds}}}}}}), "
                          f"found {found}", hint=hint)
    for name, entry in done.items():
        if (problem := _entry_problem(name, entry)) is not None:
            raise ConfigError(f"{path}: step {name[:60]!r}: {problem}", hint=hint)
    return done


@dataclass(kw_only=True)
class BuildState:
    """Mutable on purpose: the executor records each finished step as it goes (and saves at once)."""

    path: Path
    done: dict[str, dict[str, Any]] = field(default_factory=dict)  # step name -> {digest, seconds}

    @classmethod
    def load(cls, path: Path) -> BuildState:
        """The state at ``path`` (none yet: nothing finished). A state that is not one g4build writes (a FIFO, a
        device, too large, wrong types, a timing that is no finite count of seconds) is a ConfigError."""
        if not os.path.lexists(path):
            return cls(path=path)
        raw = read_json(path, STATE_MAX_BYTES, "a build's resume state")
        return cls(path=path, done=_checked_done(raw, path))

    def finished(self, step: Step, digest: str) -> bool:
        entry = self.done.get(step.name)
        return step.resumable and isinstance(entry, dict) and entry.get("digest") == digest

    def record(self, step: Step, digest: str, seconds: float) -> None:
        self.done[step.name] = {"digest": digest, "seconds": round(seconds, 2)}
        self.save()

    def forget(self, name: str) -> None:
        self.done.pop(name, None)
        self.save()

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"done": self.done}, indent=2, sort_keys=True), encoding="utf-8")
        tmp.replace(self.path)

    def timings(self) -> dict[str, float]:
        return {k: float(v["seconds"]) for k, v in self.done.items()}


def digests(plan: BuildPlan) -> dict[str, str]:
    return {s.name: s.digest(plan.env, plan.identity) for s in plan.steps}
