"""Run the series_dflash behaviour checks against a pinned vLLM tree's real modules, one fresh interpreter per tree.

A check is a *scenario*: a function of this folder's test modules, ``scenario(tree: Path) -> data``, declared with
the trees it runs on. It runs in a child interpreter (tree_runner.py) whose ``vllm`` is the tree and nothing else:
every ``vllm.*`` import is the tree's own file, imported for real on CPU (the packages of
tests/requirements-vllm-cpu.txt), so a module or name the tree lacks raises as it would in a server. Nothing is
stubbed: vLLM's compiled extensions (``vllm._C``, ``vllm._C_stable_libtorch``, ``vllm._moe_C``) are absent from a
source tree, and vLLM's Python tolerates that on import; no module these checks reach needs more.

Where a check must control behaviour that needs a GPU, a process group or a model it cannot build, the modules under
test are executed afresh from the tree's files with named *overrides* (``under_test``): their own
``from vllm.mod import name`` statements get the override for ``vllm.mod.name``, every other module keeps the real
name. An override must name something the tree has, and must be imported by a module under test.

One tree per interpreter: vLLM's import registers process-wide torch state, so the scenarios of one tree run in one
child, together (``Tree.result`` runs every scenario declared for the tree on first use and keeps the outcomes for
the session), and the test process itself never imports vLLM. The test asserts on the data the scenario returns
(plain values and tensors, pickled back), or on the exception it raised (``Tree.failure``).
"""

from __future__ import annotations

import builtins
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import pickle
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
RUNNER = Path(__file__).with_name("tree_runner.py")
RESULT_PREFIX = "TREE_RUNNER_DONE "

# Tree labels a scenario can be declared for.
PATCHED = "patched"  # every pin's tree with all series applied
PATCHED_021 = "patched-vllm-0.21.0"
PRISTINE_021 = "pristine-vllm-0.21.0"

Scenario = Callable[[Path], Any]
_DECLARED: dict[str, frozenset[str]] = {}  # scenario key -> labels


def scenario_key(func: Scenario) -> str:
    """``tests.x.test_y:func``: the module named from its file, so the child imports the same file."""
    source = inspect.getsourcefile(func)
    assert source is not None, func
    module = ".".join(Path(source).resolve().relative_to(REPO).with_suffix("").parts)
    return f"{module}:{func.__qualname__}"


def scenario(*labels: str) -> Callable[[Scenario], Scenario]:
    """Declare a scenario for the trees with these labels (it runs in their child interpreters)."""
    assert labels, "a scenario names the trees it runs on"

    def register(func: Scenario) -> Scenario:
        _DECLARED[scenario_key(func)] = frozenset(labels)
        return func

    return register


@dataclass(frozen=True)
class Failure:
    """An exception a scenario raised in the child: its qualified type name, message and traceback."""

    type: str
    message: str
    traceback: str


@dataclass(frozen=True)
class Outcome:
    value: Any = None
    failure: Failure | None = None


class TreeRunFailed(AssertionError):
    """The child interpreter did not report (crashed, timed out, or the scenario's data could not be sent)."""


def run_scenarios(tree: Path, keys: Sequence[str], *, timeout: float = 900) -> dict[str, Outcome]:
    """Run the scenarios ``keys`` in one fresh interpreter on ``tree``; their outcomes by key."""
    with tempfile.TemporaryDirectory(prefix="series-dflash-") as tmp:
        out = Path(tmp) / "outcomes.pickle"
        env = dict(os.environ)
        env["VLLM_LOGGING_LEVEL"] = "WARNING"
        proc = subprocess.run(
            # -I: no PYTHONPATH, user site or script folder on sys.path (the runner puts the tree and the repo
            # there itself); -B: the shared pristine tree stays byte-for-byte as extracted.
            [sys.executable, "-I", "-B", str(RUNNER), str(tree), str(out)],
            input=json.dumps(list(keys)),
            env=env,
            cwd=tmp,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if proc.returncode != 0 or not out.is_file():
            raise TreeRunFailed(
                f"the child interpreter on {tree} ended without outcomes (rc={proc.returncode}):\n"
                f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
            )
        with out.open("rb") as f:
            raw: dict[str, tuple[str, Any]] = pickle.load(f)  # written by our own child, in this folder's format
    outcomes = {}
    for key, (kind, payload) in raw.items():
        outcomes[key] = Outcome(value=payload) if kind == "ok" else Outcome(failure=Failure(**payload))
    missing = set(keys) - set(outcomes)
    if missing:
        raise TreeRunFailed(f"the child on {tree} reported no outcome for {sorted(missing)}")
    return outcomes


@dataclass
class Tree:
    """A pinned tree (its path and labels) and the outcomes of its scenarios, run on first use."""

    path: Path
    labels: frozenset[str]
    _outcomes: dict[str, Outcome] = field(default_factory=dict)

    def _outcome(self, func: Scenario) -> Outcome:
        key = scenario_key(func)
        declared = _DECLARED.get(key)
        if declared is None or not declared & self.labels:
            raise AssertionError(f"{key} is not declared for this tree ({sorted(self.labels)}): see @scenario")
        if key not in self._outcomes:
            # Every scenario declared for this tree (those of the test modules collected in this session) in one
            # child: one vLLM import per tree.
            batch = sorted(k for k, labels in _DECLARED.items() if labels & self.labels and k not in self._outcomes)
            self._outcomes.update(run_scenarios(self.path, batch))
        return self._outcomes[key]

    def result(self, func: Scenario) -> Any:
        """What the scenario returned in the tree's interpreter; its exception, with the child's traceback, fails."""
        outcome = self._outcome(func)
        if outcome.failure is not None:
            raise AssertionError(
                f"{scenario_key(func)} raised {outcome.failure.type} in {self.path}:\n{outcome.failure.traceback}"
            )
        return outcome.value

    def failure(self, func: Scenario) -> Failure:
        """The exception the scenario raised in the tree's interpreter (a scenario that returned fails)."""
        outcome = self._outcome(func)
        if outcome.failure is None:
            raise AssertionError(f"{scenario_key(func)} returned {outcome.value!r} in {self.path}: expected a raise")
        return outcome.failure


# --- the child's side: only ever called inside tree_runner.py's interpreter ---------------------------------------


class _View:
    """What ``from vllm.mod import …`` hands a module under test: overrides and fresh modules, else the real names."""

    def __init__(
        self, module: types.ModuleType, overrides: Mapping[str, Any], fresh: Mapping[str, Any], used: set[str]
    ) -> None:
        self._module, self._overrides, self._fresh, self._used = module, overrides, fresh, used

    def __getattr__(self, attr: str) -> Any:
        key = f"{self._module.__name__}.{attr}"
        if key in self._overrides:
            self._used.add(key)
            return self._overrides[key]
        if key in self._fresh:
            return self._fresh[key]
        return getattr(self._module, attr)


def _importer(overrides: Mapping[str, Any], fresh: Mapping[str, Any], used: set[str]) -> Callable[..., Any]:
    def importer(
        name: str,
        globals: Mapping[str, Any] | None = None,
        locals: Any = None,
        fromlist: Sequence[str] | None = (),
        level: int = 0,
    ) -> Any:
        got = builtins.__import__(name, globals, locals, fromlist, level)
        if fromlist and isinstance(got, types.ModuleType):
            if got.__name__ in fresh:
                got = fresh[got.__name__]
            prefix = got.__name__ + "."
            if any(k.startswith(prefix) for k in (*overrides, *fresh)):
                return _View(got, overrides, fresh, used)
        return got

    return importer


def _check_overrides(overrides: Iterable[str]) -> None:
    for key in overrides:
        owner, _, attr = key.rpartition(".")
        if not owner.startswith("vllm"):
            raise ValueError(f"override {key}: only names of vllm modules are overridden")
        if not hasattr(importlib.import_module(owner), attr):
            raise AttributeError(f"override {key}: the tree's {owner} has no {attr!r}")


@contextmanager
def under_test(modules: Sequence[str], overrides: Mapping[str, Any] | None = None) -> Iterator[dict[str, Any]]:
    """The tree's ``modules``, each imported for real and then executed afresh (in order) with ``overrides``
    (``"vllm.mod.name"`` -> what the modules under test get for that name); yields the fresh modules by name.

    A later module under test importing an earlier one gets the fresh one. The real modules, and everything else
    in ``sys.modules``, are untouched: other scenarios in the same interpreter see no override."""
    overrides = dict(overrides or {})
    _check_overrides(overrides)
    used: set[str] = set()
    fresh: dict[str, Any] = {}
    for name in modules:
        real = importlib.import_module(name)  # the module imports as itself (a missing name raises here)
        assert real.__file__ is not None and real.__spec__ is not None, name
        loader = importlib.machinery.SourceFileLoader(name, real.__file__)
        spec = importlib.util.spec_from_file_location(name, real.__file__, loader=loader)
        assert spec is not None, name
        module = importlib.util.module_from_spec(spec)
        module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": _importer(overrides, fresh, used)}
        loader.exec_module(module)
        fresh[name] = module
    yield fresh
    unused = sorted(set(overrides) - used)
    if unused:
        raise AssertionError(f"overrides the modules under test never imported: {unused}")


@contextmanager
def default_vllm_config() -> Iterator[Any]:
    """The tree's own default VllmConfig on the CPU, set as the current one (vLLM's layers and layout helpers read
    it: a server always has one)."""
    config = importlib.import_module("vllm.config")
    default = config.VllmConfig(device_config=config.DeviceConfig(device="cpu"))
    with config.set_current_vllm_config(default):
        yield default
