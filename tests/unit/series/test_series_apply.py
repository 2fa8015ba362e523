"""`apply_stack`: one commit per needed patch with trailers, all or nothing, refusals; `tree_status`."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.unit.series.series_support import (
    BASE,
    PIN,
    TEN,
    TWENTY,
    Diff,
    Home,
    git,
    make_tree,
    middle_upstream_series,
    replace_line,
    snapshot,
)

from g4build.errors import PatchConflictError, SourceError
from g4build.series.apply import apply_stack
from g4build.series.status import tree_status
from g4build.source.gittree import dirty_paths


def _three_series(home: Home, mkdiff: Diff) -> None:
    home.add_series("a", [("Patch ten", mkdiff({"m.py": BASE}, {"m.py": TEN})),
                          ("Patch twenty", mkdiff({"m.py": TEN}, {"m.py": TWENTY}))],
                    fingerprints={"m.py": ["line 10 patched"]})
    home.add_series("b", [("Add helper", mkdiff({"m.py": TWENTY}, {"m.py": TWENTY, "pkg/h.py": "X = 1\n"}))])


def test_apply_commits_each_patch_with_trailers(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    _three_series(home, mkdiff)
    tree = make_tree(tmp_path / "t", {"m.py": BASE})
    base = git(tree, "rev-parse", "HEAD").strip()
    result = apply_stack(tree, home.stack(), pin=PIN, version="1.0.0")
    assert result.head_before == base
    assert [(a.series, a.file) for a in result.applied] == [
        ("a", f"{PIN}/0001-p1.patch"), ("a", f"{PIN}/0002-p2.patch"), ("b", f"{PIN}/0001-p1.patch")]
    log = git(tree, "log", "--format=%s", f"{base}..HEAD").splitlines()
    assert log == ["Add helper", "Patch twenty", "Patch ten"]
    body = git(tree, "log", "-1", "--format=%B", result.applied[0].commit)
    assert "G4build-Series: a v1" in body
    assert f"G4build-Patch: {PIN}/0001-p1.patch" in body
    assert (tree / "m.py").read_text() == TWENTY
    assert (tree / "pkg/h.py").read_text() == "X = 1\n"
    assert git(tree, "status", "--porcelain") == ""

    status = tree_status(tree, home.stack())
    assert [(s.name, s.state, s.tree_version, s.pin) for s in status.series] == [
        ("a", "current", 1, PIN), ("b", "current", 1, PIN)]
    assert [c.patch for c in status.series[0].commits] == [f"{PIN}/0001-p1.patch", f"{PIN}/0002-p2.patch"]
    assert status.series[0].fingerprints == "present"


def test_apply_skips_upstream_patches(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    _three_series(home, mkdiff)
    tree = make_tree(tmp_path / "t", {"m.py": TEN})  # upstream already has "Patch ten"
    result = apply_stack(tree, home.stack(), pin=PIN, version="1.0.0")
    assert [a.file for a in result.applied] == [f"{PIN}/0002-p2.patch", f"{PIN}/0001-p1.patch"]
    assert result.to_dict()["skipped"][0]["file"] == f"{PIN}/0001-p1.patch"
    assert result.report.series[0].status == "partial"
    (a, b) = tree_status(tree, home.stack()).series
    assert (a.name, a.state, a.not_committed) == ("a", "current", (f"{PIN}/0001-p1.patch",))
    assert (b.state, b.not_committed) == ("current", ())


def test_conflict_in_the_middle_leaves_tree_unchanged(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    _three_series(home, mkdiff)
    # line 20 differs upstream: a's second patch (in the middle of the stack) conflicts
    tree = make_tree(tmp_path / "t", {"m.py": replace_line(BASE, "line 20", "line 20 theirs")})
    head = git(tree, "rev-parse", "HEAD")
    before = snapshot(tree)
    with pytest.raises(PatchConflictError) as err:
        apply_stack(tree, home.stack(), pin=PIN, version="1.0.0")
    assert f"{PIN}/0002-p2.patch of a" in err.value.message
    assert "refresh a" in (err.value.hint or "")
    assert git(tree, "rev-parse", "HEAD") == head
    assert snapshot(tree) == before
    assert git(tree, "status", "--porcelain", "--ignored") == ""


def test_failure_while_committing_rolls_back(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    # gen.py is in the tree but git-ignored: the scratch check passes, `git apply --index` then fails on it
    # after the first patch was already committed, which exercises the rollback.
    home.add_series("a", [("Patch ten", mkdiff({"m.py": BASE}, {"m.py": TEN, "pkg/sub/new.py": "N = 1\n"})),
                          ("Patch gen", mkdiff({"gen.py": BASE}, {"gen.py": TEN}))])
    tree = make_tree(tmp_path / "t", {"m.py": BASE, ".gitignore": "gen.py\n"})
    (tree / "gen.py").write_text(BASE)
    (tree / "__pycache__").mkdir()
    (tree / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0untracked, kept")  # untracked files stay
    head = git(tree, "rev-parse", "HEAD")
    before = snapshot(tree)
    with pytest.raises(PatchConflictError) as err:
        apply_stack(tree, home.stack(), pin=PIN, version="1.0.0")
    assert "failed after the check passed" in err.value.message
    assert git(tree, "rev-parse", "HEAD") == head
    assert snapshot(tree) == before
    assert git(tree, "status", "--porcelain") == "?? __pycache__/\n"
    assert not (tree / "pkg").exists()


def test_dirty_tree_is_refused(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    _three_series(home, mkdiff)
    tree = make_tree(tmp_path / "t", {"m.py": BASE, "notes.txt": "notes\n"})
    (tree / "notes.txt").write_text("wip\n")
    with pytest.raises(SourceError, match=r"uncommitted changes \(notes.txt\)"):
        apply_stack(tree, home.stack(), pin=PIN, version="1.0.0")
    assert git(tree, "log", "--format=%s") == "base\n"


def test_dirty_tree_names_renamed_paths_whole(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"longname.txt": "x\n"})
    git(tree, "mv", "longname.txt", "othername.txt")
    assert sorted(dirty_paths(tree)) == ["longname.txt", "othername.txt"]


def test_non_git_tree_is_refused_with_a_hint(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    _three_series(home, mkdiff)
    tree = make_tree(tmp_path / "t", {"m.py": BASE}, repo=False)
    with pytest.raises(SourceError) as err:
        apply_stack(tree, home.stack(), pin=PIN, version="1.0.0")
    assert "not a git repository" in err.value.message
    assert "g4build source fetch" in (err.value.hint or "")
    assert (tree / "m.py").read_text() == BASE


def test_status_of_a_plain_tree_uses_fingerprints(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    _three_series(home, mkdiff)
    patched = make_tree(tmp_path / "p", {"m.py": TWENTY}, repo=False)
    status = tree_status(patched, home.stack())
    assert not status.git
    assert [(s.name, s.state, s.fingerprints, s.pin) for s in status.series] == [
        ("a", "fingerprints only", "present", PIN)]
    pristine = make_tree(tmp_path / "q", {"m.py": BASE}, repo=False)
    assert tree_status(pristine, home.stack()).series == ()


def test_status_flags_outdated_series(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    _three_series(home, mkdiff)
    tree = make_tree(tmp_path / "t", {"m.py": BASE})
    apply_stack(tree, home.stack(), pin=PIN, version="1.0.0")
    meta = home.patches / "b" / "series.yaml"
    meta.write_text(meta.read_text().replace("version: 1", "version: 2"))
    states = {s.name: s.state for s in tree_status(tree, home.stack()).series}
    assert states == {"a": "current", "b": "outdated"}


def test_apply_and_status_skip_only_the_middle_patch_that_is_upstream(
    home: Home, mkdiff: Diff, tmp_path: Path,
) -> None:
    upstream_text, all_three = middle_upstream_series(home, mkdiff)
    tree = make_tree(tmp_path / "t", {"m.py": upstream_text})
    result = apply_stack(tree, home.stack(), pin=PIN, version="1.0.0")
    assert [a.file for a in result.applied] == [f"{PIN}/0001-p1.patch", f"{PIN}/0003-p3.patch"]
    assert [s["file"] for s in result.to_dict()["skipped"]] == [f"{PIN}/0002-p2.patch"]
    assert (tree / "m.py").read_text() == all_three
    assert git(tree, "log", "--format=%s", "-2").splitlines() == ["twenty-two", "ten"]
    (s,) = tree_status(tree, home.stack()).series
    assert (s.state, s.not_committed) == ("current", (f"{PIN}/0002-p2.patch",))
    assert [c.patch for c in s.commits] == [f"{PIN}/0001-p1.patch", f"{PIN}/0003-p3.patch"]
