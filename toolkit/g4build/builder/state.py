"""Resume: which steps of a plan finished, keyed by each step's inputs digest, kept in the build root."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from g4build.builder.plan import BuildPlan, Step


@dataclass(kw_only=True)
class BuildState:
    """Mutable on purpose: the executor records each finished step as it goes (and saves at once)."""

    path: Path
    done: dict[str, dict[str, Any]] = field(default_factory=dict)  # step name -> {digest, seconds}

    @classmethod
    def load(cls, path: Path) -> BuildState:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            done = raw.get("done", {}) if isinstance(raw, dict) else {}
        except (OSError, ValueError):
            done = {}
        return cls(path=path, done=done if isinstance(done, dict) else {})

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
        return {k: float(v.get("seconds", 0.0)) for k, v in self.done.items() if isinstance(v, dict)}


def digests(plan: BuildPlan) -> dict[str, str]:
    return {s.name: s.digest(plan.env, plan.identity) for s in plan.steps}
