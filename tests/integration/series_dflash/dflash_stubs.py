"""Load single modules of a patched vLLM tree with stand-ins for everything they import from vLLM.

The module under test is the real file of the patched tree, executed as itself; only its vLLM imports are
replaced: by other real files of the same tree where named (``real``), by explicit stand-ins where the test needs
behaviour (``overrides``), and by inert auto-stubs otherwise (a class that accepts any arguments and answers any
attribute). That keeps the behaviour tests to torch + numpy (+ triton for kernels), without vLLM's whole import
graph, its compiled extensions or a GPU.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class _AutoMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return auto_stub(name)


class _Auto(metaclass=_AutoMeta):
    """Inert stand-in: any constructor arguments, any attribute, callable."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return auto_stub(name)()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return auto_stub("result")()


def auto_stub(name: str) -> type:
    return _AutoMeta(name, (_Auto,), {})


class _StubModule(types.ModuleType):
    def __init__(self, name: str, overrides: Mapping[str, Any]) -> None:
        super().__init__(name)
        self.__path__: list[str] = []  # a package, so that submodules resolve
        self._overrides = overrides

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        key = f"{self.__name__}.{attr}"
        value = self._overrides[key] if key in self._overrides else auto_stub(attr)
        setattr(self, attr, value)
        return value


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, tree: Path, real: Sequence[str], overrides: Mapping[str, Any]) -> None:
        self.tree = tree
        self.real = set(real)
        self.overrides = overrides

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        if fullname in self.real:
            file = _module_file(self.tree, fullname)
            return importlib.util.spec_from_file_location(fullname, file)
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _StubModule(spec.name, self.overrides)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _module_file(tree: Path, fullname: str) -> Path:
    rel = Path(*fullname.split("."))
    for candidate in (tree / rel.with_suffix(".py"), tree / rel / "__init__.py"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"{fullname}: neither {rel}.py nor {rel}/__init__.py in {tree}")


@contextmanager
def patched_modules(
    tree: Path, real: Sequence[str], overrides: Mapping[str, Any] | None = None
) -> Iterator[dict[str, types.ModuleType]]:
    """Import each module named in ``real`` from ``tree`` (in order); yield them by name.

    Every other ``vllm.*`` import is a stand-in: ``overrides`` maps ``"vllm.mod.attr"`` to the object that
    ``from vllm.mod import attr`` must get. ``sys.modules`` is restored afterwards.
    """
    saved = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
    for key in saved:
        del sys.modules[key]
    finder = _Finder(tree, real, overrides or {})
    sys.meta_path.insert(0, finder)
    try:
        loaded = {name: importlib.import_module(name) for name in real}
        yield loaded
    finally:
        sys.meta_path.remove(finder)
        for key in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[key]
        sys.modules.update(saved)
