"""Patches applied to a plain folder with git apply: touched paths, zero fuzz, and the failing hunk named."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.support.wheelsfactory import PRISTINE, git_patch

from g4build.errors import ConfigError, PatchConflictError
from g4build.series.scratch import PatchFile, apply_patches, touched_paths


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_touched_paths_cover_new_deleted_and_renamed(tmp_path: Path) -> None:
    before = {"a/x.py": "-- a/evil.py\n" * 3, "a/old.py": "O = 1\n", "a/gone.py": "G = 1\n"}
    patch = git_patch(before, {"a/x.py": "--- b/evil\n" + "-- a/evil.py\n" * 2, "a/new.py": "N = 1\n",
                               "a/gone.py": None}, tmp_path / "g")
    assert touched_paths(patch) == {"a/x.py", "a/new.py", "a/gone.py"}


def test_paths_leaving_the_tree_are_refused() -> None:
    with pytest.raises(ConfigError, match="leaves the tree"):
        touched_paths(b"diff --git a/../x b/../x\n--- a/../x\n+++ b/../x\n@@ -1 +1 @@\n-a\n+b\n")


def test_series_applies_in_order_inside_a_git_repository(tmp_path: Path) -> None:
    first_after = {**PRISTINE, "vllm/spec/utils.py": "LIMIT = 9\n"}
    p1 = git_patch(PRISTINE, {"vllm/spec/utils.py": "LIMIT = 9\n"}, tmp_path / "g1")
    p2 = git_patch(first_after, {"vllm/spec/utils.py": "LIMIT = 10\n"}, tmp_path / "g2")
    (tmp_path / "p1.patch").write_bytes(p1)
    (tmp_path / "p2.patch").write_bytes(p2)
    # the scratch folder sits inside another repository: paths must still resolve from the scratch top
    outer = tmp_path / "g1"
    scratch = outer / "nested" / "scratch"
    _write(scratch, {"vllm/spec/utils.py": PRISTINE["vllm/spec/utils.py"]})
    apply_patches(scratch, [PatchFile(label="s/1", path=tmp_path / "p1.patch"),
                            PatchFile(label="s/2", path=tmp_path / "p2.patch")], target="t")
    assert (scratch / "vllm/spec/utils.py").read_text() == "LIMIT = 10\n"


def test_conflict_names_patch_file_and_hunk(tmp_path: Path) -> None:
    new = PRISTINE["vllm/spec/dflash.py"].replace("x + 3\n", "x + 3  # a\n").replace("x + 30\n", "x + 30  # b\n")
    patch = git_patch(PRISTINE, {"vllm/spec/dflash.py": new}, tmp_path / "g")
    (tmp_path / "p.patch").write_bytes(patch)
    drifted = PRISTINE["vllm/spec/dflash.py"].replace("def step_30(x)", "def step_thirty(x)")
    _write(tmp_path / "scratch", {"vllm/spec/dflash.py": drifted})
    with pytest.raises(PatchConflictError) as err:
        apply_patches(tmp_path / "scratch", [PatchFile(label="alpha/0001-x.patch", path=tmp_path / "p.patch")],
                      target="vllm-0.21.0-x.whl")
    expected = "patch alpha/0001-x.patch does not apply to vllm-0.21.0-x.whl: hunk #2 at vllm/spec/dflash.py:"
    assert expected in str(err.value)
    assert (tmp_path / "scratch/vllm/spec/dflash.py").read_text() == drifted  # nothing was changed
