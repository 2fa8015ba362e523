"""The one small interface every executor satisfies, and what a run reports."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from g4build.builder.plan import BuildPlan


@dataclass(frozen=True, kw_only=True)
class StepResult:
    name: str
    status: str  # "done" | "skipped"
    seconds: float
    log: str | None


@dataclass(frozen=True, kw_only=True)
class RunResult:
    steps: tuple[StepResult, ...]

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.steps)


class Executor(Protocol):
    def run(self, plan: BuildPlan, *, clean: bool = False) -> RunResult:
        """Run every step of ``plan`` in order (skipping finished ones unless ``clean``); raise BuildError."""
        ...
