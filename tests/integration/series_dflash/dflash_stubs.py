"""Import modules of a patched vLLM tree for real, on CPU, with named stand-ins where a test needs behaviour.

Every ``vllm.*`` import resolves to the tree's own file: the modules under test and everything they import
(vLLM's Python imports on CPU with the packages of tests/requirements-vllm-cpu.txt; its compiled ``vllm._C`` is
absent, which vLLM itself tolerates). A module or name the tree does not have raises, as it would in a server.

``overrides`` replace single names (``"vllm.mod.attr"``) that a test must control (a GPU-only call, a config
the test cannot build), as the modules under test see them: their ``from vllm.mod import attr`` gets the
override, the rest of vLLM the real name. A name the real module lacks is an error, never silently supplied.

No module is stubbed: none of those these tests reach fails to import on CPU. Should one ever have to be, name
it in ``CPU_ONLY_STANDINS`` with the reason.

vLLM registers process-wide torch state on import (opaque types, custom ops), so a process can import one tree
once. The conftest runs each test of this folder in a forked child; ``patched_modules`` refuses a second tree.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# module name -> why it cannot be imported on CPU (then it is a module holding only the test's overrides)
CPU_ONLY_STANDINS: dict[str, str] = {}

_imported_tree: Path | None = None


class _Inert:
    """A plain stand-in object for tests that need a value of some class they do not exercise."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs = args, kwargs


def auto_stub(name: str) -> type:
    """A named class that accepts any constructor arguments and has no other behaviour."""
    return type(name, (_Inert,), {})


class _StandIn(importlib.abc.Loader):
    """A module of CPU_ONLY_STANDINS: only the overrides' names; any other name raises on import."""

    def __init__(self, overrides: Mapping[str, Any]) -> None:
        self.overrides = overrides

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        prefix = module.__name__ + "."
        for key, value in self.overrides.items():
            if key.startswith(prefix) and "." not in key.removeprefix(prefix):
                setattr(module, key.removeprefix(prefix), value)


class _View:
    """What ``from vllm.mod import …`` hands a module under test: the overrides, else the real module's names."""

    def __init__(self, module: types.ModuleType, overrides: Mapping[str, Any]) -> None:
        self._module, self._overrides = module, overrides

    def __getattr__(self, attr: str) -> Any:
        key = f"{self._module.__name__}.{attr}"
        return self._overrides[key] if key in self._overrides else getattr(self._module, attr)


class _UnderTest(importlib.abc.Loader):
    """Runs a module under test with an ``__import__`` of its own: its ``from vllm.mod import name`` gets the
    override for ``vllm.mod.name`` (also inside its functions); every other module sees the real name."""

    def __init__(self, inner: importlib.abc.Loader, overrides: Mapping[str, Any]) -> None:
        self.inner = inner
        self.overrides = overrides

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        overrides = self.overrides

        def importer(name: str, globals: Mapping[str, Any] | None = None, locals: Any = None,
                     fromlist: Sequence[str] = (), level: int = 0) -> Any:
            got = builtins.__import__(name, globals, locals, fromlist, level)
            if not fromlist or not isinstance(got, types.ModuleType):
                return got
            if any(f"{got.__name__}.{attr}" in overrides for attr in fromlist):
                return _View(got, overrides)
            return got

        module.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": importer}
        self.inner.exec_module(module)


class _TreeFinder(importlib.abc.MetaPathFinder):
    def __init__(self, tree: Path, real: Sequence[str], overrides: Mapping[str, Any]) -> None:
        self.tree = tree.resolve()
        self.real = set(real)
        self.overrides = overrides

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: Any = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        if fullname in CPU_ONLY_STANDINS:
            return importlib.machinery.ModuleSpec(fullname, _StandIn(self.overrides))
        search = [str(self.tree)] if fullname == "vllm" else path
        spec = importlib.machinery.PathFinder.find_spec(fullname, search)
        if spec is None or spec.loader is None:
            return None  # the tree has no such module: ModuleNotFoundError, as in a server
        origin = Path(spec.origin).resolve() if spec.origin else None
        if origin is not None and not origin.is_relative_to(self.tree):
            raise ImportError(f"{fullname} resolved outside the tree under test: {origin}")
        if fullname in self.real:
            spec.loader = _UnderTest(spec.loader, self.overrides)
        return spec


@contextmanager
def patched_modules(
    tree: Path, real: Sequence[str], overrides: Mapping[str, Any] | None = None
) -> Iterator[dict[str, types.ModuleType]]:
    """Import each module named in ``real`` from ``tree`` (in order), for real; yield them by name.

    ``overrides`` maps ``"vllm.mod.attr"`` to what the modules under test get for that existing name.
    """
    global _imported_tree
    if _imported_tree is not None:
        raise RuntimeError(
            f"this process already imported vLLM from {_imported_tree}: vLLM's import registers process-wide "
            "torch state, so each test imports one tree once (the conftest forks a process per test)"
        )
    _imported_tree = tree
    overrides = dict(overrides or {})
    for key in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
        del sys.modules[key]
    finder = _TreeFinder(tree, real, overrides)
    sys.meta_path.insert(0, finder)
    try:
        for key in overrides:  # an override stands in for a name the tree has, never for a missing one
            owner, _, attr = key.rpartition(".")
            module = importlib.import_module(owner)
            if owner not in CPU_ONLY_STANDINS and not hasattr(module, attr):
                raise AttributeError(f"override {key}: the tree's {owner} has no {attr!r}")
        yield {name: importlib.import_module(name) for name in real}
    finally:
        sys.meta_path.remove(finder)
