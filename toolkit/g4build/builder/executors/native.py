"""The native executor: each step a subprocess on this machine, full output to a log file, a live status."""

from __future__ import annotations

import glob
import os
import re
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path

from rich.console import Console
from rich.status import Status

from g4build.builder.executors.base import RunResult, StepResult
from g4build.builder.plan import BuildPlan, Step
from g4build.builder.state import BuildState
from g4build.errors import BuildError
from g4build.fsutil import remove_tree

_NINJA = re.compile(r"\[(\d+)/(\d+)\]")
_ERROR = re.compile(r"error|FAILED|Killed|fatal|Traceback|No space left", re.IGNORECASE)
TAIL_LINES = 25


_PATH_GLOB = re.compile(r"^[^\s*?]+[/\\][A-Za-z0-9._+-]*\*[A-Za-z0-9._*+-]*$")


def expand_globs(argv: tuple[str, ...]) -> list[str]:
    """Expand path arguments whose last part holds a ``*`` (``out/vllm-*.whl``), as a shell would."""
    out: list[str] = []
    for a in argv:
        if _PATH_GLOB.match(a):
            hits = sorted(glob.glob(a))
            if not hits:
                raise BuildError(f"no file matches {a}: expected the previous step to produce it")
            out += hits
        else:
            out.append(a)
    return out


def error_tail(lines: list[str], n: int = TAIL_LINES) -> list[str]:
    """The lines worth showing after a failure: the last error-looking ones, else the last lines."""
    errors = [ln for ln in lines if _ERROR.search(ln)]
    return (errors or lines)[-n:]


class NativeExecutor:
    def __init__(
        self,
        *,
        console: Console | None = None,
        base_env: Mapping[str, str] | None = None,
        activate: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        """``base_env`` defaults to this process's environment; ``activate`` (Windows: MSVC) adds to it."""
        self.console = console or Console(stderr=True)
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.activate = activate

    def _env(self, plan: BuildPlan, step: Step, activated: Mapping[str, str]) -> dict[str, str]:
        env = {**self.base_env, **activated, **plan.env, **step.env}
        return env

    def run(self, plan: BuildPlan, *, clean: bool = False) -> RunResult:
        root = Path(plan.layout.root)
        root.mkdir(parents=True, exist_ok=True)
        # --clean starts over without reading the old state: a damaged one must not stop the way out of it
        state_file = Path(plan.layout.state_file)
        state = BuildState(path=state_file) if clean else BuildState.load(state_file)
        if clean:
            state.done.clear()
            state.save()
            _remove(plan.layout.src)
        activated = dict(self.activate()) if self.activate else {}
        logs = Path(plan.layout.log_dir)
        logs.mkdir(parents=True, exist_ok=True)
        results: list[StepResult] = []
        for i, step in enumerate(plan.steps, 1):
            digest = step.digest(plan.env, plan.identity)
            if not clean and state.finished(step, digest):
                self.console.print(f"[dim]{i}/{len(plan.steps)} {step.name}: finished before, skipped[/]")
                results.append(StepResult(name=step.name, status="skipped", seconds=0.0, log=None))
                continue
            log = logs / f"{i:02d}-{step.name}.log"
            if step.fresh:  # e.g. a new source: the tree of an earlier build (patched, built) must not remain
                _remove(step.fresh)
            seconds = self._run_step(step, self._env(plan, step, activated), log, f"{i}/{len(plan.steps)}")
            state.record(step, digest, seconds)
            results.append(StepResult(name=step.name, status="done", seconds=seconds, log=str(log)))
        return RunResult(steps=tuple(results))

    def _run_step(self, step: Step, env: dict[str, str], log: Path, counter: str) -> float:
        argv = expand_globs(step.command)
        Path(step.cwd).mkdir(parents=True, exist_ok=True)
        title = step.title or step.name
        start = time.monotonic()
        recent: deque[str] = deque(maxlen=400)
        progress = ""
        with log.open("w", encoding="utf-8", errors="replace") as fh, \
                Status(f"{counter} {title}", console=self.console) as status:
            fh.write(f"$ {' '.join(argv)}\n# cwd: {step.cwd}\n")
            try:
                proc = subprocess.Popen(argv, cwd=step.cwd, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
            except OSError as exc:
                raise BuildError(f"step {step.name}: cannot start {argv[0]}: {exc}",
                                 hint="is it installed and on PATH?") from exc
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                line = line.rstrip("\n")
                recent.append(line)
                m = _NINJA.search(line)
                if m:
                    progress = f" [{m[1]}/{m[2]}]"
                status.update(f"{counter} {title}{progress}  {time.monotonic() - start:5.0f}s")
            code = proc.wait()
        seconds = time.monotonic() - start
        if code != 0:
            lines = error_tail(list(recent))
            tail = "\n".join(f"    {ln}" for ln in lines)
            oom = any("Killed" in ln for ln in lines) or code in (-9, 137)
            raise BuildError(
                f"step {step.name} failed (exit {code}) after {seconds:.0f}s: {' '.join(argv)}\n{tail}",
                hint=(f"a compiler was killed, most likely out of memory: rerun with a lower --jobs "
                      f"(MAX_JOBS={env.get('MAX_JOBS', '?')} now); " if oom else "") + f"full log: {log}",
            )
        self.console.print(f"{counter} {title}: done in {seconds:.1f}s")
        return seconds


def _remove(path: str) -> None:
    """Remove a folder a step must start without; one that cannot go (a file in use) stops the build here."""
    if not remove_tree(path):
        raise BuildError(f"could not remove {path}: expected to start this step without it",
                         hint="close programs using files in it (an editor, a terminal in that folder) and rerun")
