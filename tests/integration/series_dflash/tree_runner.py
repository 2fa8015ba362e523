"""The child interpreter of in_tree.run_scenarios: runs scenarios against one vLLM tree, imported for real.

Usage: python -I -B tree_runner.py TREE OUT, with a JSON list of scenario keys (``module:function``) on stdin.
Writes ``{key: ("ok", value) | ("error", {type, message, traceback})}`` pickled to OUT (whole, or not at all).
``vllm`` is the tree's and only the tree's: a ``vllm`` module found anywhere else is an import error.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import json
import os
import pickle
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TREE = Path(sys.argv[1]).resolve()
OUT = Path(sys.argv[2])
REPO = Path(__file__).resolve().parents[3]
# The repo first: a vLLM sdist has a ``tests`` package of its own at its root (vLLM never imports it).
sys.path[:0] = [str(REPO), str(TREE)]


class OnlyTheTree(importlib.abc.MetaPathFinder):
    """Resolves ``vllm`` and its submodules as the path finder does, and refuses any found outside the tree."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "vllm" and not fullname.startswith("vllm."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, [str(TREE)] if fullname == "vllm" else path)
        if spec is not None and spec.origin not in (None, "namespace"):
            origin = Path(spec.origin).resolve()
            if not origin.is_relative_to(TREE):
                raise ImportError(f"{fullname} resolved outside the tree under test: {origin}", name=fullname)
        return spec  # None: the tree has no such module, so importing it raises ModuleNotFoundError


def run(key: str) -> tuple[str, Any]:
    module_name, _, qualname = key.partition(":")
    try:
        func = getattr(importlib.import_module(module_name), qualname)
        value = func(TREE)
        pickle.dumps(value)  # the data must travel back; a failure to pickle is the scenario's failure
        return "ok", value
    except BaseException as exc:  # pytest's outcomes (a failed pytest.raises) are BaseExceptions
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return "error", {
            "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "message": str(exc),
            "traceback": traceback.format_exc(),
        }


def main() -> None:
    sys.meta_path.insert(0, OnlyTheTree())
    keys = json.loads(sys.stdin.read())
    outcomes = {key: run(key) for key in keys}
    vllm = sys.modules.get("vllm")
    if vllm is not None:  # what the scenarios imported really was the tree
        assert Path(str(vllm.__file__)).resolve().is_relative_to(TREE), vllm.__file__
    tmp = OUT.with_name(OUT.name + ".part")
    with tmp.open("wb") as f:
        pickle.dump(outcomes, f)
    os.replace(tmp, OUT)


if __name__ == "__main__":
    main()
