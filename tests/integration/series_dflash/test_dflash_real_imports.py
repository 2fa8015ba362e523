"""The checks of this folder run on the tree's real modules: a patch importing a name or a module the pinned tree
lacks fails as it would in a server, nothing of vLLM is stubbed or found outside the tree, and an override can
neither supply a name the tree lacks nor go unused."""

from __future__ import annotations

import difflib
import importlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.integration.series_dflash.in_tree import PATCHED, PATCHED_021, Tree, scenario, under_test

pytestmark = pytest.mark.network

MUTATED = "mutated"  # a copy of the patched 0.21.0 tree with the patches below applied on top
DFLASH, GEMMA4 = "vllm.v1.spec_decode.dflash", "vllm.v1.spec_decode.gemma4"
ADDED = {
    # file: (the line after which one is added, the added line)
    "vllm/v1/spec_decode/dflash.py": (
        "from vllm.v1.attention.backend import CommonAttentionMetadata\n",
        "from vllm.v1.attention.backend import AttentionMetadataFromTheFuture\n",
    ),
    "vllm/v1/spec_decode/gemma4.py": (
        "from vllm.v1.attention.backend import CommonAttentionMetadata\n",
        "from vllm.v1.spec_decode.from_the_future import DraftHelper\n",
    ),
}


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _tree_with_patch(tree: Path, dest: Path) -> Path:
    """A copy of ``tree``'s vllm package (hard links; the changed files written anew, never through a link) with a
    real patch applied by git that adds the ADDED lines."""
    shutil.copytree(tree / "vllm", dest / "vllm", symlinks=True, copy_function=_link_or_copy)
    patch = []
    for file, (anchor, added) in ADDED.items():
        target = dest / file
        text = target.read_text(encoding="utf-8")
        target.unlink()
        target.write_text(text, encoding="utf-8")
        assert text.count(anchor) == 1, file
        changed = text.replace(anchor, anchor + added, 1)
        patch += difflib.unified_diff(
            text.splitlines(keepends=True), changed.splitlines(keepends=True), f"a/{file}", f"b/{file}"
        )
    (dest.parent / "added.patch").write_text("".join(patch), encoding="utf-8")
    subprocess.run(["git", "apply", str(dest.parent / "added.patch")], cwd=dest, check=True, capture_output=True)
    for file, (_, added) in ADDED.items():
        assert added in (dest / file).read_text(encoding="utf-8")
    return dest


@scenario(MUTATED)
def import_dflash(tree: Path) -> str:
    return str(importlib.import_module(DFLASH).__file__)


@scenario(MUTATED)
def import_gemma4(tree: Path) -> str:
    return str(importlib.import_module(GEMMA4).__file__)


@pytest.fixture(scope="module")
def mutated(patched_021: Tree, tmp_path_factory: pytest.TempPathFactory) -> Tree:
    return Tree(_tree_with_patch(patched_021.path, tmp_path_factory.mktemp("mutated") / "tree"), frozenset({MUTATED}))


def test_a_patch_importing_a_name_the_tree_lacks_fails(mutated: Tree) -> None:
    failure = mutated.failure(import_dflash)
    assert failure.type == "builtins.ImportError", failure.traceback
    assert "cannot import name 'AttentionMetadataFromTheFuture' from 'vllm.v1.attention.backend'" in failure.message


def test_a_patch_importing_a_module_the_tree_lacks_fails(mutated: Tree) -> None:
    failure = mutated.failure(import_gemma4)
    assert failure.type == "builtins.ModuleNotFoundError", failure.traceback
    assert failure.message == "No module named 'vllm.v1.spec_decode.from_the_future'"


@scenario(PATCHED)
def where_vllm_comes_from(tree: Path) -> dict[str, Any]:
    """Import what the checks of this folder import; report where every vllm module came from."""
    for name in (
        DFLASH,
        GEMMA4,
        "vllm.model_executor.models.qwen3_dflash",
        "vllm.v1.attention.backends.triton_attn",
        "vllm.v1.attention.backends.flash_attn",
        "vllm.v1.worker.gpu_model_runner",
    ):
        importlib.import_module(name)
    vllm = {name: mod for name, mod in sys.modules.items() if name == "vllm" or name.startswith("vllm.")}
    return {
        "count": len(vllm),
        "outside": sorted(
            name
            for name, mod in vllm.items()
            if not Path(str(getattr(mod, "__file__", None) or "/")).resolve().is_relative_to(tree.resolve())
        ),
        "compiled": sorted(n for n in ("vllm._C", "vllm._C_stable_libtorch", "vllm._moe_C") if n in sys.modules),
    }


def test_every_vllm_module_is_the_trees_own_file(patched: Tree) -> None:
    got = patched.result(where_vllm_comes_from)
    assert got["count"] > 200  # vLLM's import graph, not a handful of loaded files
    assert got["outside"] == []  # no stub, namespace or module from elsewhere
    assert got["compiled"] == []  # absent from a source tree; nothing stands in for them


@scenario(PATCHED_021)
def override_of_a_missing_name(tree: Path) -> None:
    with under_test([DFLASH], {"vllm.v1.attention.backend.NotInThisTree": object()}):
        pass


@scenario(PATCHED_021)
def override_never_imported(tree: Path) -> None:
    # dflash.py imports nothing named this from vllm.config, though vllm.config has it
    with under_test([DFLASH], {"vllm.config.set_current_vllm_config": object()}):
        pass


def test_an_override_cannot_supply_a_name_the_tree_lacks(patched_021: Tree) -> None:
    failure = patched_021.failure(override_of_a_missing_name)
    assert failure.type == "builtins.AttributeError"
    assert failure.message == (
        "override vllm.v1.attention.backend.NotInThisTree: the tree's vllm.v1.attention.backend has no 'NotInThisTree'"
    )


def test_an_override_no_module_under_test_imports_is_refused(patched_021: Tree) -> None:
    failure = patched_021.failure(override_never_imported)
    assert failure.type == "builtins.AssertionError"
    assert "['vllm.config.set_current_vllm_config']" in failure.message
