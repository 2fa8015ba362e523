"""Refresh a series from a tree's commits or uncommitted diff, and start a new series from a diff."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from tests.unit.series.series_support import (
    BASE,
    PIN,
    TEN,
    TWENTY,
    Diff,
    Home,
    git,
    make_tree,
    replace_line,
)

from g4build.errors import SourceError, UsageError
from g4build.series.apply import apply_stack
from g4build.series.check import check_stack
from g4build.series.model import load_all
from g4build.series.refresh import diff_patch, new_series, patches_from_commits, refresh
from g4build.util.yamlsafe import load_mapping

OTHER_PIN = "vllm-2.0.0"


def _series(home: Home, mkdiff: Diff, tmp_path: Path) -> Path:
    other = tmp_path / "other.patch"
    other.write_bytes(mkdiff({"m.py": BASE}, {"m.py": TWENTY}))
    (home.patches / "a" / OTHER_PIN).mkdir(parents=True)
    (home.patches / "a" / OTHER_PIN / "0001-all.patch").write_bytes(other.read_bytes())
    home.add_series(
        "a", [("Patch ten", mkdiff({"m.py": BASE}, {"m.py": TEN})),
              ("Patch twenty", mkdiff({"m.py": TEN}, {"m.py": TWENTY}))],
        fingerprints={"m.py": ["line 10 patched"]},
        extra_pins={OTHER_PIN: {"patches": [{"file": f"{OTHER_PIN}/0001-all.patch", "subject": "All"}],
                                "fingerprints": {"m.py": ["line 20 patched"]}, "note": "kept"}},
    )
    return other


def test_refresh_round_trip_after_resolving_a_conflict(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    other = _series(home, mkdiff, tmp_path)
    old_other = (home.patches / "a" / OTHER_PIN / "0001-all.patch").read_bytes()
    assert old_other == other.read_bytes()
    tree = make_tree(tmp_path / "t", {"m.py": BASE})
    apply_stack(tree, home.stack(), pin=PIN, version="1.0.0")
    # a developer edits the second commit (keeps its message and trailers)
    (tree / "m.py").write_text(replace_line(TWENTY, "line 21", "line 21 also"))
    git(tree, "commit", "-q", "-a", "--amend", "--no-edit")

    series = home.get("a")
    result = refresh(series, PIN, patches_from_commits(tree, series, PIN))
    assert (result.changed, result.old_version, result.new_version) == (True, 1, 2)
    assert result.written == (f"{PIN}/0001-p1.patch", f"{PIN}/0002-p2.patch")

    again = home.get("a")
    assert again.version == 2
    assert [p.subject for p in again.patches_for(PIN)] == ["Patch ten", "Patch twenty"]
    assert b"+line 21 also" in again.patches_for(PIN)[1].read_bytes()
    # metadata and the other pin's variant are untouched
    assert again.why == "because\nreasons"
    assert again.pins[PIN].fingerprints == {"m.py": ("line 10 patched",)}
    assert again.pins[OTHER_PIN].note == "kept"
    assert (home.patches / "a" / OTHER_PIN / "0001-all.patch").read_bytes() == old_other
    assert (home.patches / "a" / "series.yaml").read_text().startswith("# test series\n")
    # the refreshed series applies to a pristine tree and gives the developer's result
    fresh = make_tree(tmp_path / "fresh", {"m.py": BASE})
    apply_stack(fresh, load_all(home.patches), pin=PIN, version="1.0.0")
    assert (fresh / "m.py").read_text() == (tree / "m.py").read_text()
    # refreshing again changes nothing and keeps the version
    assert refresh(again, PIN, patches_from_commits(tree, again, PIN)).changed is False
    assert home.get("a").version == 2


def test_refresh_refuses_untagged_commit_between_series_commits(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    _series(home, mkdiff, tmp_path)
    tree = make_tree(tmp_path / "t", {"m.py": BASE})
    apply_stack(tree, home.stack(), pin=PIN, version="1.0.0")
    git(tree, "reset", "-q", "--hard", "HEAD~1")
    (tree / "x.txt").write_text("fix\n")
    git(tree, "add", "x.txt")
    git(tree, "commit", "-q", "-m", "a fixup without trailers")
    git(tree, "cherry-pick", "ORIG_HEAD")
    series = home.get("a")
    with pytest.raises(SourceError, match="no G4build-Series trailer"):
        patches_from_commits(tree, series, PIN)


def test_refresh_refuses_dirty_tree_and_tree_without_commits(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    _series(home, mkdiff, tmp_path)
    tree = make_tree(tmp_path / "t", {"m.py": BASE})
    series = home.get("a")
    with pytest.raises(SourceError, match="no commit"):
        patches_from_commits(tree, series, PIN)
    (tree / "m.py").write_text(TEN)
    with pytest.raises(SourceError, match="uncommitted"):
        patches_from_commits(tree, series, PIN)


def test_refresh_from_uncommitted_diff_writes_a_new_pin_variant(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    _series(home, mkdiff, tmp_path)
    # a new upstream release moved the code: the developer ports the series by hand, uncommitted
    moved = "header\n" * 5 + BASE
    tree = make_tree(tmp_path / "t", {"m.py": moved})
    (tree / "m.py").write_text("header\n" * 5 + TWENTY)
    series = home.get("a")
    result = refresh(series, "vllm-3.0.0", [diff_patch(tree, "vllm-3.0.0", series.title)])
    assert result.new_version == 2
    again = home.get("a")
    assert [p.file for p in again.patches_for("vllm-3.0.0")] == ["vllm-3.0.0/0001-a-title.patch"]
    assert [p.file for p in again.patches_for(PIN)] == [f"{PIN}/0001-p1.patch", f"{PIN}/0002-p2.patch"]
    pristine = make_tree(tmp_path / "p", {"m.py": moved}, repo=False)
    report = check_stack(pristine, [again], variant_pin="vllm-3.0.0", version="3.0.0")
    assert report.series[0].status == "needed"


def test_new_series_from_uncommitted_diff(home: Home, mkdiff: Diff, tmp_path: Path) -> None:
    _series(home, mkdiff, tmp_path)
    tree = make_tree(tmp_path / "t", {"m.py": BASE, "k.cu": "kernel\n"})
    (tree / "m.py").write_text(TEN)
    (tree / "new_mod.py").write_text("VALUE = 1\n")  # untracked files are part of the diff
    git(tree, "add", "-N", "new_mod.py")
    (tree / "__pycache__").mkdir()
    (tree / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0junk")  # never part of a patch
    index_before = (tree / ".git" / "index").read_bytes()
    patch = diff_patch(tree, PIN, "Fix the thing")
    result = new_series(home.patches, name="fix-thing", pin=PIN, patch=patch, title="Fix the thing",
                        refs=["#99"])
    assert result.new_version == 1
    assert (tree / ".git" / "index").read_bytes() == index_before  # the user's index is untouched
    order = yaml.safe_load((home.patches / "series.yaml").read_text())["order"]
    assert order == ["a", "fix-thing"]
    assert (home.patches / "series.yaml").read_text().startswith("# order\n")
    created = home.get("fix-thing")
    assert created.python_only is True
    assert created.refs == ("#99",)
    assert b"+VALUE = 1" in created.patches_for(PIN)[0].read_bytes()
    assert b"__pycache__" not in created.patches_for(PIN)[0].read_bytes()
    pristine = make_tree(tmp_path / "p", {"m.py": BASE}, repo=False)
    assert check_stack(pristine, [created], variant_pin=PIN, version="1.0.0").series[0].status == "needed"
    with pytest.raises(UsageError, match="already exists"):
        new_series(home.patches, name="fix-thing", pin=PIN, patch=patch, title="again")
    # '$' matches before a final newline: a name with one made a folder 'evil\n' and broke series.yaml
    with pytest.raises(UsageError, match=r"series name 'evil\\n': expected"):
        new_series(home.patches, name="evil\n", pin=PIN, patch=patch, title="t")
    assert not (home.patches / "evil\n").exists()
    # names YAML would read as something else go into the order quoted, and the series is made whole
    for odd in ("yes", "1e5", "010"):
        new_series(home.patches, name=odd, pin=PIN, patch=patch, title="odd name")
        assert home.get(odd).name == odd
    assert load_mapping(home.patches / "series.yaml")["order"] == ["a", "fix-thing", "yes", "1e5", "010"]


def test_new_series_detects_non_python_changes(home: Home, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"k.cu": "kernel\n"})
    (tree / "k.cu").write_text("kernel v2\n")
    created = new_series(home.patches, name="kern", pin=PIN, patch=diff_patch(tree, PIN, "Kernel"), title="K")
    assert created.written == (f"{PIN}/0001-kernel.patch",)
    assert home.get("kern").python_only is False
    clean = make_tree(tmp_path / "c", {"k.cu": "kernel\n"})
    with pytest.raises(UsageError, match="no uncommitted changes"):
        diff_patch(clean, PIN, "nothing")
