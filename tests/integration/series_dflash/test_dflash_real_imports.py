"""The loader of these behaviour tests imports the tree's real modules: a patch that imports a name or module
the pinned tree lacks fails here as it would in a server, and an override cannot supply a missing name."""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.integration.series_dflash.dflash_stubs import patched_modules

pytestmark = pytest.mark.network

DFLASH = "vllm.v1.spec_decode.dflash"
FILE = "vllm/v1/spec_decode/dflash.py"
ANCHOR = "from vllm.v1.attention.backend import CommonAttentionMetadata\n"


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _tree_with_patch(tree: Path, dest: Path, added_line: str) -> Path:
    """A copy of ``tree`` (hard links, the changed file written anew) with a real patch applied by git that
    adds ``added_line`` after the module's CommonAttentionMetadata import."""
    shutil.copytree(tree, dest, symlinks=True, copy_function=_link_or_copy)
    target = dest / FILE
    text = target.read_text(encoding="utf-8")
    target.unlink()  # never write through a hard link into the shared tree
    target.write_text(text, encoding="utf-8")
    assert text.count(ANCHOR) == 1
    changed = text.replace(ANCHOR, ANCHOR + added_line, 1)
    patch = "".join(difflib.unified_diff(text.splitlines(keepends=True), changed.splitlines(keepends=True),
                                         fromfile=f"a/{FILE}", tofile=f"b/{FILE}"))
    (dest.parent / "added.patch").write_text(patch, encoding="utf-8")
    subprocess.run(["git", "apply", "--whitespace=nowarn", str(dest.parent / "added.patch")], cwd=dest,
                   check=True, capture_output=True)
    assert (dest / FILE).read_text(encoding="utf-8") == changed
    return dest


def test_a_patch_importing_a_name_the_tree_has_imports_from_the_tree_itself(patched_021: Path, tmp_path: Path) -> None:
    tree = _tree_with_patch(patched_021, tmp_path / "tree", "from vllm.v1.attention.backend import AttentionType\n")
    with patched_modules(tree, [DFLASH]) as mods:
        dflash = mods[DFLASH]
        assert Path(dflash.__file__).resolve() == (tree / FILE).resolve()
        base = dflash.SpecDecodeBaseProposer  # a real class of the same tree, not a stand-in
        assert base.__module__ == "vllm.v1.spec_decode.llm_base_proposer"
        assert Path(__import__(base.__module__, fromlist=["x"]).__file__).resolve().is_relative_to(tree.resolve())
        assert dflash.AttentionType.DECODER == "decoder"


def test_a_patch_importing_a_name_the_tree_lacks_fails(patched_021: Path, tmp_path: Path) -> None:
    tree = _tree_with_patch(patched_021, tmp_path / "tree",
                            "from vllm.v1.attention.backend import AttentionMetadataFromTheFuture\n")
    with pytest.raises(ImportError, match="cannot import name 'AttentionMetadataFromTheFuture'"), patched_modules(
        tree, [DFLASH]
    ):
        pass


def test_a_patch_importing_a_module_the_tree_lacks_fails(patched_021: Path, tmp_path: Path) -> None:
    tree = _tree_with_patch(patched_021, tmp_path / "tree", "from vllm.v1.spec_decode.from_the_future import X\n")
    with pytest.raises(ModuleNotFoundError, match=re.escape("vllm.v1.spec_decode.from_the_future")), patched_modules(
        tree, [DFLASH]
    ):
        pass


def test_an_override_cannot_supply_a_name_the_tree_lacks(patched_021: Path) -> None:
    missing = {"vllm.v1.attention.backend.NotInThisTree": object()}
    with pytest.raises(AttributeError, match=re.escape("the tree's vllm.v1.attention.backend has no 'NotInThisTree'")
                       ), patched_modules(patched_021, [DFLASH], missing):
        pass


def test_a_second_tree_in_one_process_is_refused(patched_021: Path, pristine_021: Path) -> None:
    with patched_modules(patched_021, [DFLASH]):
        pass
    with pytest.raises(RuntimeError, match="already imported vLLM from"), patched_modules(pristine_021, [DFLASH]):
        pass
